//! `Running`: target side. The processes that run from the venv
//! ([`crate::running`]), for the plan to name; and [`check`], which
//! `Prepare` and `Rollback` run before they write anything.

use crate::error::Result;
use crate::inventory;
use crate::model::VenvProcess;
use crate::protocol::Response;

pub fn running(venv: &str) -> Result<Response> {
    let venv = inventory::Venv::open(venv)?;
    crate::running::find(&venv.root).map(Response::Running)
}

/// The processes that run from the venv at `root`, refused (kind
/// `Refused`, naming them) unless `allow`: `what` is the operation, for
/// the message. Processes that could not be inspected do not refuse.
pub fn check(root: &std::path::Path, what: &str, allow: bool) -> Result<Vec<VenvProcess>> {
    let found = crate::running::find(root)?.processes;
    if !found.is_empty() && !allow {
        return Err(crate::running::refusal(&root.display().to_string(), what, &found));
    }
    Ok(found)
}
