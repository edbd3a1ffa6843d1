//! `Switch`: target side. Switch the staged files into place through the
//! journal, then re-hash what changed; a mismatch rolls the generation back.
//! Progress frames go out meanwhile; if the controller sends `Abort` (its
//! user pressed Ctrl-C) or goes away, the switch stops after the step it is
//! taking and is undone, so the venv is as before the apply.

use std::io::Write;
use std::sync::atomic::Ordering;

use crate::agent::session::{Session, with_progress};
use crate::err;
use crate::error::Result;
use crate::inventory::Counters;
use crate::protocol::Response;

pub fn switch(session: &mut Session, output: &mut dyn Write) -> Result<Response> {
    let counters = Counters::default();
    let pending = session.pending;
    let stop = || counters.cancel.load(Ordering::Relaxed) || pending.is_some_and(|p| p());
    let (state, g) = session.opened()?;
    let switched = with_progress(output, &counters, || state.switch_unless(g, &stop));
    let changed = match switched {
        Ok(Ok(Some(changed))) => changed,
        Ok(Ok(None)) => {
            let undone = state.undo(g)?;
            let n = with_progress(output, &counters, || {
                state.finish_undo(g, &undone, &counters)
            })??;
            return Err(err!(
                kind = Interrupted,
                hint = "the generation was undone; run `overlay apply` to apply the plan again",
                "the switch was stopped on request and undone ({n} paths match the listing from before the apply)"
            ));
        }
        Ok(Err(e)) => return Err(e),
        Err(gone) => {
            // The controller went away: undo what was switched, if it can
            // be (else the next command rolls it back from the journal).
            if let Ok(undone) = state.undo(g) {
                let _ = state.finish_undo(g, &undone, &counters);
            }
            return Err(gone);
        }
    };
    if let Err(e) = with_progress(output, &counters, || state.check(g, &counters))? {
        let undone = state.undo(g)?;
        let n = state.finish_undo(g, &undone, &counters)?;
        return Err(err!(
            hint = "the generation was rolled back; run `overlay plan` and `overlay apply` again",
            "{}; rolled back ({n} paths match the listing from before the apply)",
            e.message
        )
        .kind(e.kind));
    }
    Ok(Response::Switched { changed })
}
