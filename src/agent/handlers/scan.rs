//! `Scan`: the venv's interpreter, site-packages, distributions and the
//! files matching the globs. The serve loop keeps the answer for a
//! `StatMembers` that follows.

use crate::error::Result;
use crate::inventory;
use crate::protocol::Response;

pub fn scan(venv: &str, file_globs: &[String]) -> Result<Response> {
    inventory::scan(venv, file_globs).map(Response::Scan)
}
