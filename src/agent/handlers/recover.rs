//! `Recover`: finish an interrupted generation (roll it back, or with
//! `resume` complete it, refused while processes run from the venv unless
//! allowed), with progress frames while it runs.

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
    allow_running: bool,
) -> Result<Response> {
    let counters = Counters::default();
    if resume {
        // Completing a generation switches files in: refused while
        // processes run from the venv, as `Prepare` is.
        let root = crate::inventory::Venv::open(venv)?.root;
        super::check(&root, "the resumed apply", allow_running)?;
    }
    let state = session.state(venv)?;
    with_progress(output, &counters, || state.recover(resume, &counters))?.map(|outcome| {
        Response::Recovered {
            outcome: outcome.map(|(_, msg)| msg),
        }
    })
}
