//! `Scan`: the venv's interpreter, site-packages, distributions and the
//! files matching the globs (of a bundle read in place: from its index).
//! The serve loop keeps the answer for a `StatMembers` that follows. With
//! `machine_later`, the machine facts are read on a thread of their own
//! and answered by the `Machine` that follows (off the plan's path).

use crate::agent::session::Session;
use crate::error::Result;
use crate::inventory;
use crate::protocol::Response;

pub fn scan(
    session: &mut Session,
    venv: &str,
    file_globs: &[String],
    machine_later: bool,
) -> Result<Response> {
    match session.bundle_source(venv)? {
        Some(b) => b.scan(file_globs),
        None if machine_later => {
            session.machine = Some(std::thread::spawn(inventory::machine));
            inventory::scan_without_machine(venv, file_globs)
        }
        None => inventory::scan(venv, file_globs),
    }
    .map(Response::Scan)
}

/// `Machine`: the facts read since the `Scan` (none without one, as for a
/// bundle, whose scan has none either).
pub fn machine(session: &mut Session) -> Result<Response> {
    Ok(Response::Machine(
        session
            .machine
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default(),
    ))
}
