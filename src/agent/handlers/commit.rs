//! `Commit`: target side. Mark the open generation complete (keeping its
//! backup if asked, pruning to `keep` generations) and close it.

use crate::agent::serve::Session;
use crate::error::Result;
use crate::protocol::Response;

pub fn commit(session: &mut Session, keep_backup: bool, keep: Option<usize>) -> Result<Response> {
    let (state, g) = session.opened()?;
    g.meta.backup = keep_backup;
    let _ = state.commit(g, keep)?;
    let generation = g.meta.id.clone();
    session.generation = None;
    Ok(Response::Committed { generation })
}
