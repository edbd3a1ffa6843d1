//! `Switch`: target side. Switch the staged files into place through the
//! journal, then re-hash what changed; a mismatch rolls the generation back.

use std::io::Write;

use crate::agent::serve::{Session, with_progress};
use crate::err;
use crate::error::Result;
use crate::inventory::Counters;
use crate::protocol::Response;

pub fn switch(session: &mut Session, output: &mut dyn Write) -> Result<Response> {
    let counters = Counters::default();
    let (state, g) = session.opened()?;
    let changed = state.switch(g)?;
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
