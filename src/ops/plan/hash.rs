//! Phase 2 of a plan: hash only what decides something (`hash_phase`).

use crate::client::Client;
use crate::error::Result;
use crate::model::{Entry, HashMode, Kind};
use crate::ops::{Clock, Observer, Step};
use crate::plan;

use super::connect::both;
use super::stat::{StatSide, Stated, index};

/// Phase 2: hash only what decides something, as rsync --checksum does:
/// files on both sides with the same size (a size difference already
/// means "replace"), and scripts whose shebang is rewritten; and of
/// those only the sides the cache did not answer.
pub(super) fn hash_phase(
    (src_side, src): (&StatSide, &mut Client),
    (dst_side, dst): (&StatSide, &mut Client),
    stated: &mut Stated,
    clock: &Clock,
    obs: &dyn Observer,
) -> Result<()> {
    let unhashed =
        |e: Option<&Entry>| matches!(e.map(|e| &e.kind), Some(Kind::File { blake3: None, .. }));
    let (mut to_hash, mut src_hash, mut dst_hash) = (0usize, Vec::new(), Vec::new());
    for (p, s, d) in plan::needs_hash(&stated.src_entries, &stated.dst_entries) {
        to_hash += 1;
        if unhashed(Some(s)) {
            src_hash.push(p.to_string());
        }
        if unhashed(d) {
            dst_hash.push(p.to_string());
        }
    }
    let (n_src, n_dst) = (src_hash.len(), dst_hash.len());
    let smeter = obs.step(Step::Hash, src_side.host);
    let dmeter = obs.step(Step::Hash, dst_side.host);
    let (s, d) = both(
        || src_side.stat(src, src_hash, HashMode::All, &*smeter),
        || dst_side.stat(dst, dst_hash, HashMode::All, &*dmeter),
    );
    if s.is_ok() && d.is_ok() {
        smeter.finish();
        dmeter.finish();
    }
    stated.src_entries.extend(index(s?));
    stated.dst_entries.extend(index(d?));
    clock.mark(&format!(
        "hash ({} same-size pairs and scripts; read {} + {} files, the rest cached)",
        to_hash, n_src, n_dst
    ));
    Ok(())
}
