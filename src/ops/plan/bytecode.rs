//! Phase 3 of a plan: stat the bytecode that travels with the `.py` files
//! that may change ([`bytecode_phase`]).

use crate::client::Client;
use crate::error::Result;
use crate::model::HashMode;
use crate::plan;

use super::connect::both;
use super::stat::{StatSide, index};

/// Phase 3: the bytecode that travels with the `.py` files that may
/// change ([`plan::bytecode_to_stat`]): the source's, and the target's of
/// the same names, stat'ed (not hashed: a carried file is hashed as it is
/// sent, and the target checks what it wrote against that).
pub fn bytecode_phase(
    (src_side, src): (&StatSide, &mut Client),
    (dst_side, dst): (&StatSide, &mut Client),
    src_entries: &mut plan::Entries,
    dst_entries: &mut plan::Entries,
) -> Result<()> {
    let plan::BytecodeToStat { source, target } = plan::bytecode_to_stat(src_entries, dst_entries);
    let (s, d) = both(
        || src_side.stat(src, source, HashMode::None, &crate::ops::Silent),
        || dst_side.stat(dst, target, HashMode::None, &crate::ops::Silent),
    );
    src_entries.extend(index(s?));
    dst_entries.extend(index(d?));
    Ok(())
}
