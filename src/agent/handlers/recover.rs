//! `Recover`: finish an interrupted generation (roll it back, or with
//! `resume` complete it), with progress frames while it runs.

use std::io::Write;

use crate::agent::session::{Session, with_progress};
use crate::error::Result;
use crate::inventory::Counters;
use crate::protocol::Response;

pub fn recover(
    session: &mut Session,
    output: &mut dyn Write,
    venv: &str,
    resume: bool,
) -> Result<Response> {
    let counters = Counters::default();
    let state = session.state(venv)?;
    with_progress(output, &counters, || state.recover(resume, &counters))?.map(|outcome| {
        Response::Recovered {
            outcome: outcome.map(|(_, msg)| msg),
        }
    })
}
