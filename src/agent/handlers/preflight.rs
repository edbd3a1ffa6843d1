//! `PrefetchPreflight` and `Preflight`: target side. The first starts
//! listing site-packages' shared objects and reading their ELF facts (in
//! parallel, through the facts cache) in the background, and is answered
//! at once; the `Preflight` that follows (for the same venv) starts from
//! what it read to predict what fails to load after the overlay.

use std::io::Write;

use crate::agent::serve::{Session, with_progress};
use crate::error::Result;
use crate::inventory::Counters;
use crate::model::PreflightRequest;
use crate::protocol::Response;

pub fn prefetch_preflight(session: &mut Session, venv: String) -> Result<Response> {
    let walk = venv.clone();
    session.prefetch = Some((
        venv,
        std::thread::spawn(move || crate::preflight::facts::prefetch_target(&walk).ok()),
    ));
    Ok(Response::Prefetching)
}

pub fn preflight(
    session: &mut Session,
    output: &mut dyn Write,
    req: &PreflightRequest,
) -> Result<Response> {
    let counters = Counters::default();
    let listed = match session.prefetch.take() {
        Some((venv, walk)) if venv == req.venv => walk.join().ok().flatten(),
        _ => None,
    };
    with_progress(output, &counters, || {
        crate::preflight::run_on_target(req, listed)
    })?
    .map(Response::Preflight)
}
