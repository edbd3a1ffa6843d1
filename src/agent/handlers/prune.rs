//! `Prune`: finish an interrupted generation, then keep only the newest
//! `keep` generations.

use crate::agent::session::Session;
use crate::error::Result;
use crate::inventory::Counters;
use crate::protocol::Response;

pub fn prune(session: &mut Session, venv: &str, keep: usize) -> Result<Response> {
    let counters = Counters::default();
    let state = session.state(venv)?;
    let recovered = state.recover(false, &counters)?.map(|(_, msg)| msg);
    state
        .prune(keep)
        .map(|removed| Response::Pruned { removed, recovered })
}
