//! `Doctor` and `RecordCheck`: a venv checked as it stands
//! ([`crate::doctor::run`]), or some of its distributions against their own
//! RECORD ([`crate::doctor::record_check`]), with progress while it hashes.

use std::io::Write;

use crate::agent::session::{Session, with_progress};
use crate::error::Result;
use crate::inventory::Counters;
use crate::model::{DoctorRequest, RecordCheckRequest};
use crate::protocol::Response;

pub fn doctor(output: &mut dyn Write, req: &DoctorRequest) -> Result<Response> {
    let counters = Counters::default();
    with_progress(output, &counters, || crate::doctor::run(req, &counters))?.map(Response::Doctor)
}

pub fn record_check(
    session: &mut Session,
    output: &mut dyn Write,
    req: &RecordCheckRequest,
) -> Result<Response> {
    if let Some(b) = session.bundle_source(&req.venv)? {
        return b
            .record_check(req)
            .map(|findings| Response::RecordChecked { findings });
    }
    let counters = Counters::default();
    with_progress(output, &counters, || {
        crate::doctor::record_check(req, &counters)
    })?
    .map(|findings| Response::RecordChecked { findings })
}
