//! `Commit`: target side. Mark the open generation complete (keeping its
//! backup if asked, pruning to `keep` generations) and close it; the
//! answer says how many bytes the backup holds, and which of the
//! processes that ran from the venv at `Prepare` still run.

use crate::agent::session::Session;
use crate::error::Result;
use crate::protocol::Response;

pub fn commit(session: &mut Session, keep_backup: bool, keep: Option<usize>) -> Result<Response> {
    let (state, g) = session.opened()?;
    g.meta.backup = keep_backup;
    let _ = state.commit(g, keep)?;
    let generation = g.meta.id.clone();
    let backup_bytes = if keep_backup {
        g.info().backup_bytes
    } else {
        0
    };
    session.generation = None;
    let running = crate::running::still_running(&std::mem::take(&mut session.running));
    Ok(Response::Committed {
        generation,
        backup_bytes,
        running,
    })
}
