//! `Stat`: describe paths of site-packages (type, size, mode, hash as
//! asked), with progress frames while it runs.

use std::io::Write;

use crate::agent::session::{Session, with_progress};
use crate::error::Result;
use crate::inventory::{self, Counters};
use crate::model::{HashMode, ShebangRewrite, StatEntry};
use crate::protocol::Response;

/// How a stat request wants its paths described.
pub struct StatHow {
    pub hash: HashMode,
    pub shebang: Option<ShebangRewrite>,
    pub pycache: bool,
}

/// Stat `paths` (with progress frames) into a `Stat` answer; of a bundle
/// read in place, from its index.
pub fn stat(
    session: &mut Session,
    output: &mut dyn Write,
    venv: &str,
    paths: &[String],
    how: &StatHow,
) -> Result<Response> {
    if let Some(b) = session.bundle_source(venv)? {
        return b
            .stat(paths, how.shebang.as_ref(), how.pycache)
            .map(|entries| Response::Stat {
                entries: entries.into_iter().map(StatEntry::from_entry).collect(),
            });
    }
    let counters = Counters::default();
    with_progress(output, &counters, || {
        inventory::stat(
            venv,
            paths,
            how.hash,
            how.shebang.as_ref(),
            how.pycache,
            &counters,
        )
    })?
    .map(|entries| Response::Stat {
        entries: entries.into_iter().map(StatEntry::from_entry).collect(),
    })
}
