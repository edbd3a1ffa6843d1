//! `Running`: target side. The processes that run from the venv
//! ([`crate::running`]), for the plan to name: looked for in the
//! background from the plan's `PrefetchPreflight` on
//! ([`prefetch_running`]), while the controller hashes. And [`check`],
//! which `Prepare` and `Rollback` run before they write anything.

use crate::agent::session::Session;
use crate::error::Result;
use crate::inventory;
use crate::model::VenvProcess;
use crate::protocol::Response;

pub fn running(session: &mut Session, venv: &str) -> Result<Response> {
    if let Some((v, found)) = session.running_prefetch.take()
        && v == venv
        && let Ok(found) = found.join()
    {
        return found.map(Response::Running);
    }
    let venv = inventory::Venv::open(venv)?;
    crate::running::find(&venv.root).map(Response::Running)
}

/// Start looking for the processes that run from `venv` in the
/// background, for the `Running` that follows (the plan's target sends
/// `PrefetchPreflight` first, and the walk of the venv then overlaps the
/// hashing).
pub fn prefetch_running(session: &mut Session, venv: &str) {
    let v = venv.to_string();
    let found = std::thread::spawn(move || {
        let venv = inventory::Venv::open(&v)?;
        crate::running::find(&venv.root)
    });
    session.running_prefetch = Some((venv.to_string(), found));
}

/// The processes that run from the venv at `root`, refused (kind
/// `Refused`, naming them) unless `allow`: `what` is the operation, for
/// the message. Processes that could not be inspected do not refuse.
pub fn check(root: &std::path::Path, what: &str, allow: bool) -> Result<Vec<VenvProcess>> {
    let found = crate::running::find(root)?.processes;
    if !found.is_empty() && !allow {
        return Err(crate::running::refusal(
            &root.display().to_string(),
            what,
            &found,
        ));
    }
    Ok(found)
}
