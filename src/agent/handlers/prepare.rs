//! `Prepare`: target side. Check the plan, refuse while processes run from
//! the venv (unless allowed), take the venv's lock, recover an
//! unfinished generation, check the plan's preconditions and free space,
//! and open a new generation (held in the session for `Stage`, `Switch`,
//! `Commit` or `Abort`).

use std::io::Write;

use crate::agent::session::{Session, with_progress};
use crate::error::Result;
use crate::inventory::{self, Counters};
use crate::model::PrepareRequest;
use crate::protocol::Response;

pub fn prepare(
    session: &mut Session,
    output: &mut dyn Write,
    req: &PrepareRequest,
) -> Result<Response> {
    let counters = Counters::default();
    // The plan is checked before anything is recovered, locked or written.
    let venv = inventory::Venv::open(&req.venv)?;
    crate::validate::check_prepare(req, &venv.site_rel)?;
    // Before anything is written, the recovery of an unfinished
    // generation included.
    let running = super::check(&venv.root, "the apply", req.allow_running)?;
    let state = session.state(&req.venv)?;
    let recovered = state.recover(req.resume, &counters)?.map(|(_, msg)| msg);
    let g = with_progress(output, &counters, || state.prepare(req, &counters))??;
    let generation = g.meta.id.clone();
    let warnings = g.warnings.clone();
    let durability = g.meta.durability.clone();
    session.generation = Some(g);
    session.running = running.clone();
    Ok(Response::Prepared {
        generation,
        recovered,
        warnings,
        durability,
        running,
    })
}
