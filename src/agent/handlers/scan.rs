//! `Scan`: the venv's interpreter, site-packages, distributions and the
//! files matching the globs (of a bundle read in place: from its index).
//! The serve loop keeps the answer for a `StatMembers` that follows.

use crate::agent::session::Session;
use crate::error::Result;
use crate::inventory;
use crate::protocol::Response;

pub fn scan(session: &mut Session, venv: &str, file_globs: &[String]) -> Result<Response> {
    match session.bundle_source(venv)? {
        Some(b) => b.scan(file_globs),
        None => inventory::scan(venv, file_globs),
    }
    .map(Response::Scan)
}
