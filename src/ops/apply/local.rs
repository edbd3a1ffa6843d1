//! The local route: the target's agent copies the files from the source
//! venv on this machine itself (no source agent, no stream).

use indicatif::HumanBytes;

use super::ApplyOptions;
use super::outcome::{Left, Phase, fate, interrupted};
use super::stream::pause_hook;
use super::transfer::Moved;
use crate::client::Client;
use crate::error::{ErrorKind, Result};
use crate::interrupt;
use crate::model::ShebangRewrite;
use crate::ops::{Observer, Step};
use crate::plan::Plan;

/// The local route: the target's agent copies the files from the source
/// venv with the kernel's copy (no source agent, no stream). On a failure
/// the target has discarded the generation; on Ctrl-C it stops and
/// discards it.
pub(super) fn copy_here(
    dst: &mut Client,
    plan: &Plan,
    opts: &ApplyOptions,
    generation: &str,
    obs: &dyn Observer,
) -> Result<Moved> {
    let tname = &plan.target.name;
    let meter = obs.step(
        Step::Stream,
        &format!("copying {} -> {tname} (local)", plan.source.name),
    );
    let shebang = ShebangRewrite {
        from: plan.source.venv.clone(),
        to: plan.target.venv.clone(),
    };
    pause_hook("stream");
    if interrupt::requested() {
        return Err(match dst.abort() {
            Ok(()) => interrupted(Left::Discarded, tname, &opts.plan),
            Err(_) => interrupted(Left::Pending(generation), tname, &opts.plan),
        });
    }
    let started = std::time::Instant::now();
    let copied = dst.stage_local(
        &plan.source.venv,
        Some(shebang),
        &mut |p| meter.update(&p),
        &interrupt::requested,
    );
    let copied = copied.map_err(|e| match e.kind {
        ErrorKind::Interrupted if !dst.lost() => interrupted(Left::Discarded, tname, &opts.plan),
        _ => fate(e, dst.lost(), Phase::Stream, tname, generation),
    })?;
    let Some(c) = copied else {
        return Err(interrupted(Left::Discarded, tname, &opts.plan));
    };
    meter.finish();
    let k = c.copies;
    obs.detail(&format!(
        "local copy of {} files ({}) in {} lane{}, {:.2} s: {} reflinked, {} written past the page cache, {} by copy_file_range, {} read and written, {} scripts rewritten",
        c.files,
        HumanBytes(c.bytes),
        k.lanes,
        if k.lanes == 1 { "" } else { "s" },
        started.elapsed().as_secs_f64(),
        k.reflink,
        k.direct,
        k.copy_range,
        k.read_write,
        k.rewritten
    ));
    Ok(Moved {
        raw: c.bytes,
        sent: 0,
        local: true,
        waits: None,
    })
}
