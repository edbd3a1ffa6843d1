//! `StagedDirect`: target side, after a direct stream. Another agent filled
//! the staging folder; check it against what both ends reported and mark
//! the generation staged (or discard it).

use crate::agent::session::Session;
use crate::error::Result;
use crate::model::{SourceHash, StageCount, Written};
use crate::protocol::Response;
use crate::stream;

pub fn staged_direct(
    session: &mut Session,
    hashes: &[SourceHash],
    written: &[Written],
) -> Result<Response> {
    let (_, g) = session.opened()?;
    let r = stream::check_staged(g, written).and_then(|count| {
        g.staged(written, hashes)?;
        Ok(count)
    });
    match r {
        Ok(StageCount { files, bytes }) => Ok(Response::Staged {
            files,
            bytes,
            waits: Default::default(),
        }),
        Err(e) => {
            session.discard_open();
            Err(e)
        }
    }
}
