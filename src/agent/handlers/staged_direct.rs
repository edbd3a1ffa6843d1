//! `StagedDirect`: target side, after a direct stream. Another agent filled
//! the staging folder; check it against what both ends reported and mark
//! the generation staged (or discard it).

use crate::agent::serve::Session;
use crate::apply;
use crate::error::Result;
use crate::journal::Record;
use crate::model::Written;
use crate::protocol::Response;

pub fn staged_direct(
    session: &mut Session,
    hashes: &[(usize, String)],
    written: &[Written],
) -> Result<Response> {
    let (_, g) = session.opened()?;
    let r = apply::check_staged(g, written).and_then(|(files, bytes)| {
        g.record_hashes(written, hashes)?;
        g.append(Record::Staged)?;
        Ok((files, bytes))
    });
    match r {
        Ok((files, bytes)) => Ok(Response::Staged { files, bytes }),
        Err(e) => {
            session.discard_open();
            Err(e)
        }
    }
}
