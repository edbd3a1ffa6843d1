//! `Stage`: target side. The controller's data frames follow, up to
//! `EndData` (or `Abort`); they are unpacked into the staging folder of the
//! generation `Prepare` opened (a stream several targets share names its
//! entries through the request's map, see [`StreamEntry`]), and the source's hashes of the files the
//! plan had not hashed are recorded with it. A stage that fails or is
//! abandoned discards the generation.

use std::io::Read;

use crate::agent::session::{Next, Session};
use crate::agent::stream_in::{StreamIn, drain, stream_in};
use crate::model::{StageCount, StreamEntry, Unpacked};
use crate::protocol::Response;
use crate::stream::Holds;

/// Receive the data frames of a stage. [`Next::Last`]: the input ended, or
/// a frame could not be read and nothing after it can be.
pub fn stage(session: &mut Session, input: &mut dyn Read, shared: Option<&[StreamEntry]>) -> Next {
    let (state, g) = match session.opened() {
        Ok(x) => x,
        Err(e) => {
            return match drain(input) {
                Ok(()) => Next::Answer(Response::Error(e)),
                Err(broken) => Next::Last(Some(Response::Error(broken))),
            };
        }
    };
    let host_dir = state.venv.root.clone();
    let StreamIn {
        result,
        source_hashes,
        ended,
        aborted,
        broken,
    } = stream_in(
        input,
        g,
        &host_dir,
        shared.map_or(Holds::All, Holds::Shared),
    );
    if ended || aborted {
        session.discard_open();
        if let Some(e) = broken {
            return Next::Last(Some(Response::Error(e)));
        }
        return if ended {
            Next::Last(None)
        } else {
            Next::Answer(Response::Aborted)
        };
    }
    // Files the plan had not hashed: what the target wrote must be what the source read.
    let result = result.and_then(|u| {
        let (_, g) = session.opened()?;
        g.staged(&u.written, &source_hashes)?;
        Ok(u)
    });
    match result {
        Ok(Unpacked {
            count: StageCount { files, bytes },
            waits,
            ..
        }) => Next::Answer(Response::Staged {
            files,
            bytes,
            waits,
        }),
        Err(e) => {
            session.discard_open();
            Next::Answer(Response::Error(e))
        }
    }
}
