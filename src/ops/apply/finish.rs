//! Everything after the stream ([`finish`]): switch and commit, the line
//! that says what was applied, the `[verify]` check with its rollback.

use indicatif::HumanBytes;

use super::begin::Ready;
use super::outcome::{Left, Phase, fate, interrupted};
use super::transfer::Transferred;
use super::{Applied, ApplyOptions, ApplyReport, Route};
use crate::client::Client;
use crate::error::Result;
use crate::interrupt;
use crate::model::{SendFile, VerifyRequest};
use crate::ops::{Clock, Observer, Step};
use crate::plan::Plan;

/// Everything after the stream: switch and commit, say so, run the check
/// (rolling back when it fails and that was asked), and close.
pub fn finish(
    ready: Box<Ready>,
    sent: Transferred,
    clock: &Clock,
    obs: &dyn Observer,
) -> Result<ApplyReport> {
    let Ready {
        opts,
        plan,
        mut dst,
        changes,
        generation,
        recovered,
        check,
        _cleanly,
        ..
    } = *ready;
    let opts = &opts;
    let tname = plan.target.name.clone();
    let stopped = |left: Left<'_>| interrupted(left, &tname, &opts.plan);
    let files = SendFile::of_changes(&changes).len();
    let moved = sent.moved;
    clock.mark(&format!("stream and stage ({})", HumanBytes(moved.sent)));
    let switching = obs.step(Step::Switch, &tname);
    let committed = switch_and_commit(&mut dst, opts, &tname, &generation, clock)?;
    let backup_bytes = committed.backup_bytes;
    switching.finish();
    if interrupt::requested() {
        let _ = dst.close();
        return Err(stopped(Left::Applied(&generation)));
    }
    obs.status(&format!(
        "Applied generation {generation} on {tname}: {} changes, {files} files {}, {} on the wire for {} of files, in {:.1}s",
        changes.len(),
        match (&sent.direct, files == 0) {
            (_, true) => "sent".to_string(),
            _ if moved.local => format!("copied on this machine from {}", plan.source.name),
            _ if sent.shared > 1 => format!(
                "sent from {} through this machine, in one stream with {} other target{}",
                plan.source.name,
                sent.shared - 1,
                if sent.shared == 2 { "" } else { "s" }
            ),
            (Some(d), false) => format!("sent directly from {} to {d:?}", plan.source.name),
            (None, false) if sent.fell_back_from_direct.is_some() => format!(
                "sent from {} through this machine ({} could not reach {} directly)",
                plan.source.name, plan.source.name, plan.target.name
            ),
            (None, false) => format!("sent from {} through this machine", sources_named(&plan)),
        },
        HumanBytes(moved.sent),
        HumanBytes(moved.raw),
        clock.seconds(),
    ));
    if let Some(line) = still_running_line(&tname, &committed.running) {
        obs.warn(&line);
    }
    let checked = match check {
        Some(req) => verify_and_roll_back(&mut dst, &plan, opts, req, &generation, obs)?,
        None => Checked::default(),
    };
    if interrupt::requested() && !checked.rolled_back {
        let _ = dst.close();
        return Err(stopped(Left::Applied(&generation)));
    }
    dst.close()
        .map_err(|e| fate(e, true, Phase::Applied, &tname, &generation))?;
    Ok(ApplyReport::Applied(Applied {
        target: tname,
        generation,
        recovered,
        files: files as u64,
        changes: changes.len() as u64,
        raw_bytes: moved.raw,
        sent_bytes: moved.sent,
        waits: moved.waits.map(Box::new),
        route: match (&sent.direct, files == 0) {
            (_, true) => None,
            _ if moved.local => Some(Route::Local),
            (Some(_), false) => Some(Route::Direct),
            (None, false) => Some(Route::Relay),
        },
        fell_back_from_direct: sent.fell_back_from_direct,
        seconds: clock.seconds(),
        backup: opts.backup,
        backup_bytes,
        verified: checked.verified,
        rolled_back: checked.rolled_back,
        still_running: committed.running,
    }))
}

/// What needrestart says after an upgrade: the processes that still run
/// the old files, and to restart them (`None` for none).
pub fn still_running_line(host: &str, running: &[crate::model::VenvProcess]) -> Option<String> {
    let n = running.len();
    (n > 0).then(|| {
        format!(
            "{n} process{} on {host} still run{} the old files: {}: restart {}",
            if n == 1 { "" } else { "es" },
            if n == 1 { "s" } else { "" },
            crate::running::list(running),
            if n == 1 { "it" } else { "them" }
        )
    })
}

/// The plan's sources for messages: the source host's name, then each
/// `from` folder's, e.g. `src and ./snapshots/ddtree`.
pub(super) fn sources_named(plan: &Plan) -> String {
    let mut names: Vec<&str> = Vec::new();
    if plan.sets.iter().any(|s| s.from.is_none()) {
        names.push(&plan.source.name);
    }
    for s in &plan.sets {
        if let Some(f) = &s.from
            && !names.contains(&f.name.as_str())
        {
            names.push(&f.name);
        }
    }
    names.join(" and ")
}

/// Switch the staged generation in and commit it; returns what the
/// target said (the bytes its backup holds, the processes that still run
/// the old files). On Ctrl-C, before the commit, the target undoes the
/// switch.
pub(super) fn switch_and_commit(
    dst: &mut Client,
    opts: &ApplyOptions,
    tname: &str,
    generation: &str,
    clock: &Clock,
) -> Result<crate::client::Committed> {
    let stopped = |left: Left<'_>| interrupted(left, tname, &opts.plan);
    if interrupt::requested() {
        let aborted = dst.abort();
        aborted.map_err(|e| fate(e, dst.lost(), Phase::Stream, tname, generation))?;
        return Err(stopped(Left::Discarded));
    }
    let switched = dst.switch_unless(&interrupt::requested);
    let switched = switched.map_err(|e| fate(e, dst.lost(), Phase::Switch, tname, generation))?;
    if switched.is_none() {
        return Err(stopped(Left::Undone));
    }
    clock.mark("switch and check");
    if interrupt::requested() {
        let aborted = dst.abort();
        aborted.map_err(|e| fate(e, dst.lost(), Phase::Switch, tname, generation))?;
        return Err(stopped(Left::Undone));
    }
    let committed = dst.commit(opts.backup, opts.keep);
    let committed = committed.map_err(|e| fate(e, dst.lost(), Phase::Switch, tname, generation))?;
    clock.mark("commit");
    Ok(committed)
}

/// The `[verify]` check after an apply.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Checked {
    /// Whether the check passed (`None`: not run).
    pub(super) verified: Option<bool>,
    pub(super) rolled_back: bool,
}

/// Run the check on the new generation; with `rollback_on_failure`, roll
/// the generation back when it fails.
pub(super) fn verify_and_roll_back(
    dst: &mut Client,
    plan: &Plan,
    opts: &ApplyOptions,
    mut req: VerifyRequest,
    generation: &str,
    obs: &dyn Observer,
) -> Result<Checked> {
    req.generation = Some(generation.to_string());
    let failure = match crate::ops::verify::check(dst, req, obs) {
        Ok(report) if report.ok => None,
        Ok(report) => Some(report.summary()),
        Err(e) => Some(format!("the check could not run: {}", e.message)),
    };
    let Some(why) = failure else {
        return Ok(Checked {
            verified: Some(true),
            rolled_back: false,
        });
    };
    let mut checked = Checked {
        verified: Some(false),
        rolled_back: false,
    };
    if opts.rollback_on_failure {
        // Right after the switch: what the check itself changed is undone
        // too, whatever runs from the venv (asked for with the apply).
        let r = dst.rollback(&plan.target.venv, Some(generation.to_string()), true, true)?;
        checked.rolled_back = true;
        obs.status(&format!(
            "verify failed ({why}): rolled back generation {generation} on {} ({} files restored, {} removed, {} paths verified)",
            plan.target.name, r.restored, r.removed, r.verified
        ));
    }
    Ok(checked)
}
