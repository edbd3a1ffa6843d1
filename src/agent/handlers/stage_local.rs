//! `StageLocal`: target side, the local route. The source venv is on this
//! machine: the files of the generation `Prepare` opened are copied from it
//! into staging by this agent itself with the kernel's copy
//! ([`stream::copy_local`]), checked against the plan as a stream is, and
//! the generation is marked staged (or discarded). Progress frames go out
//! meanwhile; an `Abort` from the controller (Ctrl-C), or the controller
//! going away, stops the copy, and the generation is discarded.

use std::io::Write;
use std::sync::atomic::Ordering;

use crate::agent::session::{Session, with_progress};
use crate::error::Result;
use crate::inventory::Counters;
use crate::model::ShebangRewrite;
use crate::protocol::Response;
use crate::stream;

pub fn stage_local(
    session: &mut Session,
    output: &mut dyn Write,
    source_venv: &str,
    shebang: Option<&ShebangRewrite>,
) -> Result<Response> {
    let counters = Counters::default();
    let pending = session.pending;
    let stop = || counters.cancel.load(Ordering::Relaxed) || pending.is_some_and(|p| p());
    let staged = {
        let (state, g) = session.opened()?;
        let host_dir = state.venv.root.clone();
        let copied = with_progress(output, &counters, || {
            stream::copy_local(g, &host_dir, source_venv, shebang, &counters, &stop)
        });
        // Files the plan had not hashed: what was staged is what was read.
        copied.and_then(|r| r).and_then(|c| {
            g.staged(&c.written, &c.hashes)?;
            Ok(c)
        })
    };
    match staged {
        Ok(c) => Ok(Response::CopiedLocal {
            files: c.count.files,
            bytes: c.count.bytes,
            copies: c.copies,
        }),
        Err(e) => {
            session.discard_open();
            Err(e)
        }
    }
}
