//! `Abort`: target side. Give up the open generation: discard what it
//! staged; one that was switched, in part or whole (Ctrl-C on the
//! controller while or just after it switched), is undone first, so the
//! venv is as before the apply. Without one, there is nothing to do.

use crate::agent::session::Session;
use crate::error::Result;
use crate::inventory::Counters;
use crate::model::Status;
use crate::protocol::Response;

pub fn abort(session: &mut Session) -> Result<Response> {
    if let (Some(state), Some(mut g)) = (&session.state, session.generation.take()) {
        if matches!(g.status(), Status::Switching | Status::Switched) {
            let undone = state.undo(&mut g)?;
            state.finish_undo(&g, &undone, &Counters::default())?;
            if !undone.edited.is_empty() {
                // Files edited since the switch are kept in the generation's
                // `undone/`: it stays, rolled back, in the history.
                return Ok(Response::Aborted);
            }
        }
        state.discard(g)?;
    }
    Ok(Response::Aborted)
}
