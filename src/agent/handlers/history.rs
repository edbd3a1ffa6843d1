//! `History`: the venv's generations, after finishing an interrupted one.
//! A generation recovery cannot finish (damaged mid-switch) is listed as
//! such; history never fails for it.
//!
//! An agent that may not write the state folder (a login user without
//! `sudo`) lists it read-only ([`State::open_to_read`]) when it can read
//! it: no lock of its own, no recovery (an interrupted generation is
//! named, for a user who may write to finish).

use crate::agent::session::{Session, permission_denied};
use crate::error::Result;
use crate::inventory::Counters;
use crate::journal::State;
use crate::model::Status;
use crate::protocol::Response;

pub fn history(session: &mut Session, venv: &str) -> Result<Response> {
    let counters = Counters::default();
    let state = match session.state(venv) {
        Ok(state) => state,
        Err(e) if permission_denied(&e) && !rustix::process::geteuid().is_root() => {
            let state = State::open_to_read(venv).map_err(|_| e)?;
            let generations = state.history()?;
            let recovered = generations
                .iter()
                .find(|g| {
                    matches!(
                        g.status,
                        Status::Prepared | Status::Staged | Status::Switching | Status::Switched
                    )
                })
                .map(|g| {
                    format!(
                        "generation {} was interrupted; it is finished by the next apply, rollback or history of a user who may write to {}",
                        g.id,
                        state.venv.root.display()
                    )
                });
            return Ok(Response::History {
                generations,
                recovered,
            });
        }
        Err(e) => return Err(e),
    };
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
