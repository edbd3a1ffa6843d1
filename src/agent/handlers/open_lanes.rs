//! `OpenLanes`: target side, before a stream over several connections.
//! The generation `Prepare` opened accepts that many `Receive`s with a
//! lane, each from its own agent on this host, filling its staging folder
//! side by side; `StagedDirect` then checks what they wrote together.

use crate::agent::session::Session;
use crate::err;
use crate::error::Result;
use crate::protocol::Response;

/// The most lanes a stream may take (one SSH connection, so one `sshd`
/// process and one agent, each).
pub const MAX_LANES: u32 = 64;

pub fn open_lanes(session: &mut Session, count: u32) -> Result<Response> {
    if count == 0 || count > MAX_LANES {
        return Err(err!(
            kind = Protocol,
            "a stream may take 1 to {MAX_LANES} lanes, not {count}"
        ));
    }
    let (_, g) = session.opened()?;
    g.open_lanes(count)?;
    Ok(Response::LanesOpen { count })
}
