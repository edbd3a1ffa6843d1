//! `Abort`: target side. Give up the open generation (nothing was
//! switched); without one, there is nothing to do.

use crate::agent::serve::Session;
use crate::error::Result;
use crate::protocol::Response;

pub fn abort(session: &mut Session) -> Result<Response> {
    if let (Some(state), Some(g)) = (&session.state, session.generation.take()) {
        state.discard(g)?;
    }
    Ok(Response::Aborted)
}
