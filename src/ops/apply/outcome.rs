//! Where a failed or interrupted apply left the target, and what to run
//! next: [`fate`] for an agent that died, [`interrupted`] for Ctrl-C.

use crate::err;
use crate::error::Error;

/// Where the apply stood when a host died: what the target is left with,
/// and what to run next.
#[derive(Clone, Copy)]
pub(super) enum Phase {
    /// Before the generation was opened.
    Prepare,
    /// While the files were streaming (the target did not abort).
    Stream,
    /// While the files were streaming; the target then discarded the generation.
    Aborted,
    /// Switch or commit asked for, not answered.
    Switch,
    /// Committed; the goodbye failed.
    Applied,
}

/// An error of the apply, told with where it left the target when it says
/// an agent or its connection died (`lost`: the target's, or [`Phase::Aborted`]
/// for a source that died). Other errors are returned as they are.
pub(super) fn fate(e: Error, lost: bool, phase: Phase, tname: &str, generation: &str) -> Error {
    if !lost && !matches!(phase, Phase::Aborted) {
        return e;
    }
    let (state, hint) = match phase {
        Phase::Prepare => (
            format!("nothing on {tname} was changed"),
            "run `overlay apply` again (a generation it may have opened is discarded first)"
                .to_string(),
        ),
        Phase::Stream => (
            format!(
                "the files were still streaming, so nothing on {tname} was changed; the next overlay command there discards generation {generation}"
            ),
            "run `overlay apply` again".to_string(),
        ),
        Phase::Aborted => (
            format!(
                "the files were still streaming, so nothing on {tname} was changed; it discarded generation {generation}"
            ),
            "run `overlay apply` again".to_string(),
        ),
        Phase::Switch => (
            format!(
                "the switch of generation {generation} on {tname} was interrupted; the next overlay command there rolls it back from its journal"
            ),
            format!(
                "run `overlay history {tname}` to roll it back and see where it stands, or `overlay apply --resume` to complete it"
            ),
        ),
        Phase::Applied => (
            format!("generation {generation} was applied on {tname}"),
            format!("roll it back with `overlay rollback {tname}` if it should not stay"),
        ),
    };
    Error {
        message: format!("{}; {state}", e.message),
        hint: Some(hint),
        ..e
    }
}

/// Where a Ctrl-C left the target.
#[derive(Clone, Copy)]
pub(super) enum Left<'a> {
    /// Nothing was opened there yet.
    Untouched,
    /// It discarded what this apply staged.
    Discarded,
    /// It could not be told: its next overlay command discards this generation.
    Pending(&'a str),
    /// It undid the switch.
    Undone,
    /// This generation was applied (committed).
    Applied(&'a str),
}

/// The error of an apply stopped by Ctrl-C (kind `Interrupted`, exit 130):
/// where it left the target and what to run next.
pub(super) fn interrupted(left: Left<'_>, tname: &str, plan: &std::path::Path) -> Error {
    let again = format!("run `overlay apply {}` to start it again", plan.display());
    let (state, hint) = match left {
        Left::Untouched => (format!("nothing changed on {tname}"), again),
        Left::Discarded => (
            format!("nothing changed on {tname} (staging discarded)"),
            again,
        ),
        Left::Pending(g) => (
            format!(
                "nothing changed on {tname}; the next overlay command there discards the staging of generation {g}"
            ),
            again,
        ),
        Left::Undone => (
            format!("{tname} is back to its state before this apply (the switch was undone)"),
            again,
        ),
        Left::Applied(g) => (
            format!("{tname} has the new files (generation {g} was applied)"),
            format!("`overlay rollback {tname}` undoes it"),
        ),
    };
    err!(kind = Interrupted, hint = hint, "interrupted: {state}")
}
