//! `History`: the venv's generations, after finishing an interrupted one.
//! A generation recovery cannot finish (damaged mid-switch) is listed as
//! such; history never fails for it.

use crate::agent::serve::Session;
use crate::error::Result;
use crate::inventory::Counters;
use crate::protocol::Response;

pub fn history(session: &mut Session, venv: &str) -> Result<Response> {
    let counters = Counters::default();
    let state = session.state(venv)?;
    let recovered = match state.recover(false, &counters) {
        Ok(r) => r.map(|(_, msg)| msg),
        Err(e) => Some(format!(
            "could not finish an interrupted generation: {}{}",
            e.message,
            e.hint.map(|h| format!(" ({h})")).unwrap_or_default()
        )),
    };
    state.history().map(|generations| Response::History {
        generations,
        recovered,
    })
}
