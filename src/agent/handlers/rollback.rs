//! `Rollback`: target side. Roll back generations down to and including
//! `to` (default: the newest), with progress frames while it runs; over
//! changes made since the apply only with `force`.

use std::io::Write;

use crate::agent::session::{Session, with_progress};
use crate::error::Result;
use crate::inventory::Counters;
use crate::protocol::Response;

pub fn rollback(
    session: &mut Session,
    output: &mut dyn Write,
    venv: &str,
    to: Option<&str>,
    force: bool,
) -> Result<Response> {
    let counters = Counters::default();
    let state = session.state(venv)?;
    with_progress(output, &counters, || state.rollback(to, force, &counters))?
        .map(Response::RolledBack)
}
