//! `Verify`: run the `[verify]` check in the venv ([`crate::verify::run`]).

use crate::error::Result;
use crate::model::VerifyRequest;
use crate::protocol::Response;

pub fn verify(req: &VerifyRequest) -> Result<Response> {
    crate::verify::run(req).map(Response::Verified)
}
