//! `Rollback`: target side. Roll back generations down to and including
//! `to` (default: the newest), with progress frames while it runs; over
//! changes made since the apply only with `force`; while processes run
//! from the venv only with `allow_running` (refused before anything is
//! written, and named in the report when allowed).

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
    allow_running: bool,
) -> Result<Response> {
    let counters = Counters::default();
    let root = crate::inventory::Venv::open(venv)?.root;
    let running = super::check(&root, "the rollback", allow_running)?;
    let state = session.state(venv)?;
    let mut report = with_progress(output, &counters, || state.rollback(to, force, &counters))??;
    if !report.generations.is_empty() || report.recovered.is_some() {
        report.running = crate::running::still_running(&running);
    }
    Ok(Response::RolledBack(report))
}
