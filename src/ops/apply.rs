//! Apply: carry out a saved plan on its target, streaming the new files
//! from its source (through this controller, or `--direct`), then
//! switching them in through the target's journal; optionally run the
//! `[verify]` check and roll back when it fails.
//!
//! [`apply`] runs the steps in order, each its own function: the resume
//! check ([`resume`]), the strict check, prepare, stream (`transfer`),
//! switch and commit, verify with rollback on failure.
//!
//! If an agent or its connection dies on either host, the apply stops at
//! once (a thread watches the target while this one waits on the source)
//! and the error says where the target stands and what to run next.

use std::path::PathBuf;

use indicatif::HumanBytes;
use serde::Serialize;

use crate::client::{Client, DirectTo, SendRequest, StreamEvent};
use crate::err;
use crate::error::{Error, Result};
use crate::model::{
    Action, Compression, GenChange, LevelWindow, PrepareRequest, SendFile, ShebangRewrite,
    VerifyRequest,
};
use crate::plan::Plan;
use crate::transport::ConnectOptions;

use super::{Clock, Observer, endpoint, load_plan};

/// What `overlay apply` is asked.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// The saved plan.
    pub plan: PathBuf,
    /// The manifest to read `[verify]` from when the plan's own is gone.
    pub manifest: PathBuf,
    pub connect: ConnectOptions,
    /// Only complete an interrupted generation.
    pub resume: bool,
    /// Apply a strict plan that predicts problems.
    pub force: bool,
    /// Stream from the source straight to the target.
    pub direct: bool,
    /// Keep a backup, to roll back to.
    pub backup: bool,
    /// Generations to keep after the commit.
    pub keep: Option<usize>,
    /// Keep the source's owners on the target.
    pub same_owner: bool,
    pub compression: Compression,
    /// Run the `[verify]` check after the switch.
    pub verify: bool,
    /// Roll back when that check fails.
    pub rollback_on_failure: bool,
}

/// What an apply did.
#[derive(Debug, Clone)]
pub enum ApplyReport {
    /// `--resume`: what was done to an interrupted generation, if there was one.
    Resumed {
        target: String,
        outcome: Option<String>,
    },
    /// The plan has no changes.
    NothingToApply { target: String },
    /// A generation was applied.
    Applied(Applied),
}

/// How the files travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Route {
    /// Through this machine.
    Relay,
    /// From the source to the target (`--direct`).
    Direct,
}

/// A generation applied (also `apply --json`'s document).
#[derive(Debug, Clone, Serialize)]
pub struct Applied {
    /// The target's manifest name.
    #[serde(skip)]
    pub target: String,
    pub generation: String,
    /// What was done first to an interrupted generation, if there was one.
    pub recovered: Option<String>,
    /// Files sent.
    pub files: u64,
    /// Changes in the generation (with stale bytecode deleted).
    pub changes: u64,
    pub raw_bytes: u64,
    pub sent_bytes: u64,
    /// How the files travelled; `None` when none were sent.
    pub route: Option<Route>,
    pub seconds: f64,
    pub backup: bool,
    /// With `verify`: whether the check passed.
    pub verified: Option<bool>,
    /// With `rollback_on_failure`: the generation was rolled back.
    pub rolled_back: bool,
}

/// The generation's change list: the plan's changes plus stale bytecode.
pub fn gen_changes(plan: &Plan) -> Vec<GenChange> {
    let mut out = Vec::new();
    for set in &plan.sets {
        for c in &set.changes {
            out.push(GenChange {
                path: c.path.clone(),
                action: c.action,
                source: c.source.clone(),
                target: c.target.clone(),
                bytecode: false,
                staged: None,
            });
        }
        for p in &set.stale_bytecode {
            out.push(GenChange {
                path: p.clone(),
                action: Action::Delete,
                source: None,
                target: None,
                bytecode: true,
                staged: None,
            });
        }
    }
    out
}

/// Carry out the saved plan `opts.plan`.
pub fn apply(opts: &ApplyOptions, obs: &dyn Observer) -> Result<ApplyReport> {
    let clock = Clock::start(obs);
    let plan = load_plan(&opts.plan)?;
    let tname = plan.target.name.clone();
    let mut dst = Client::connect(&tname, &endpoint(&plan.target), &opts.connect)?;
    if opts.resume {
        return resume(dst, &plan);
    }
    strict_check(&plan, opts.force)?;
    let direct = direct_destination(&plan, opts.direct)?;
    // Read the check before touching anything, so a missing [verify] fails early.
    let check = opts
        .verify
        .then(|| check_request(&plan, opts))
        .transpose()?;
    let changes = gen_changes(&plan);
    if changes.is_empty() {
        dst.close()?;
        return Ok(ApplyReport::NothingToApply { target: tname });
    }
    let prepared = prepare(&mut dst, &plan, opts, changes.clone())?;
    if let Some(r) = &prepared.recovered {
        obs.status(&format!("{tname}: {r}"));
    }
    clock.mark("connect and prepare");
    let generation = prepared.generation;
    let send = files_to_send(&changes);
    let files = send.len();
    let moved = transfer(
        &mut dst,
        &plan,
        opts,
        &generation,
        direct.as_deref(),
        send,
        obs,
    )?;
    clock.mark(&format!("stream and stage ({})", HumanBytes(moved.sent)));
    switch_and_commit(&mut dst, opts, &tname, &generation, &clock)?;
    obs.status(&format!(
        "Applied generation {generation} on {tname}: {} changes, {files} files sent{}, {} on the wire for {} of files, in {:.1}s",
        changes.len(),
        match (&direct, files == 0) {
            (_, true) => String::new(),
            (Some(d), false) => format!(" directly from {} to {d:?}", plan.source.name),
            (None, false) => format!(" from {} through this machine", plan.source.name),
        },
        HumanBytes(moved.sent),
        HumanBytes(moved.raw),
        clock.seconds(),
    ));
    let checked = match check {
        Some(req) => verify_and_roll_back(&mut dst, &plan, opts, req, &generation, obs)?,
        None => Checked::default(),
    };
    dst.close()
        .map_err(|e| fate(e, true, Phase::Applied, &tname, &generation))?;
    Ok(ApplyReport::Applied(Applied {
        target: tname,
        generation,
        recovered: prepared.recovered,
        files: files as u64,
        changes: changes.len() as u64,
        raw_bytes: moved.raw,
        sent_bytes: moved.sent,
        route: match (&direct, files == 0) {
            (_, true) => None,
            (Some(_), false) => Some(Route::Direct),
            (None, false) => Some(Route::Relay),
        },
        seconds: clock.seconds(),
        backup: opts.backup,
        verified: checked.verified,
        rolled_back: checked.rolled_back,
    }))
}

/// `--resume`: complete an interrupted generation on the target, and nothing else.
pub fn resume(mut dst: Client, plan: &Plan) -> Result<ApplyReport> {
    let outcome = dst.recover(&plan.target.venv, true)?;
    dst.close()?;
    Ok(ApplyReport::Resumed {
        target: plan.target.name.clone(),
        outcome,
    })
}

/// A plan made with `--strict` (or a strict manifest) that predicts
/// problems is refused unless forced.
fn strict_check(plan: &Plan, force: bool) -> Result<()> {
    if plan.strict && plan.new_problems() > 0 && !force {
        return Err(err!(
            kind = Refused,
            hint = "fix what `overlay plan` predicts, or pass --force to apply anyway",
            "The plan predicts {} problem{} after the overlay and was made with --strict; {} is unchanged",
            plan.new_problems(),
            if plan.new_problems() == 1 { "" } else { "s" },
            plan.target.name
        ));
    }
    Ok(())
}

/// With `--direct`: the target's ssh destination as the source knows it.
fn direct_destination(plan: &Plan, direct: bool) -> Result<Option<String>> {
    if !direct {
        return Ok(None);
    }
    match plan.target.direct_ssh.clone().or(plan.target.ssh.clone()) {
        Some(d) => Ok(Some(d)),
        None => {
            let tname = &plan.target.name;
            Err(err!(
                hint = "give the target an `ssh` or `direct_ssh` in the manifest, or apply without --direct",
                "--direct needs an ssh destination for {tname}, which is this machine in the plan; {tname} is unchanged"
            ))
        }
    }
}

/// With `--direct`: the jump hosts the source's `ssh` goes through (`-J`):
/// the target's `proxy_jump` when the source uses the target's `ssh` value;
/// none when the manifest gives a `direct_ssh` (the source's own
/// ~/.ssh/config then says how it gets there).
fn direct_jump(plan: &Plan) -> Option<String> {
    match plan.target.direct_ssh {
        Some(_) => None,
        None => plan.target.proxy_jump.clone(),
    }
}

/// The `[verify]` check of the manifest the plan was made from, if it is
/// still there, else of `opts.manifest`.
fn check_request(plan: &Plan, opts: &ApplyOptions) -> Result<VerifyRequest> {
    let m = std::path::Path::new(&plan.manifest);
    let manifest = if m.exists() {
        m
    } else {
        opts.manifest.as_path()
    };
    super::verify::request(manifest, &plan.target.venv, None, None)
}

/// Open the generation on the target.
fn prepare(
    dst: &mut Client,
    plan: &Plan,
    opts: &ApplyOptions,
    changes: Vec<GenChange>,
) -> Result<crate::client::Prepared> {
    let tname = &plan.target.name;
    let req = PrepareRequest {
        venv: plan.target.venv.clone(),
        source: plan.source.name.clone(),
        target: tname.clone(),
        plan_created: plan.created,
        changes,
        backup: opts.backup,
        resume: false,
        same_owner: opts.same_owner,
    };
    let prepared = dst.prepare(req);
    prepared.map_err(|e| fate(e, dst.lost(), Phase::Prepare, tname, ""))
}

/// The added and replaced files, to stream from the source.
fn files_to_send(changes: &[GenChange]) -> Vec<SendFile> {
    changes
        .iter()
        .enumerate()
        .filter(|(_, c)| c.action != Action::Delete)
        .filter_map(|(index, c)| {
            Some(SendFile {
                index,
                path: c.path.clone(),
                kind: c.source.clone()?,
            })
        })
        .collect()
}

/// Bytes a stream carried.
#[derive(Debug, Clone, Copy, Default)]
struct Moved {
    /// Bytes of files.
    raw: u64,
    /// Bytes on the wire.
    sent: u64,
}

/// Stream the added and replaced files from the source into the target's
/// staging. If the source fails, the target discards the generation.
fn transfer(
    dst: &mut Client,
    plan: &Plan,
    opts: &ApplyOptions,
    generation: &str,
    direct: Option<&str>,
    send: Vec<SendFile>,
    obs: &dyn Observer,
) -> Result<Moved> {
    if send.is_empty() {
        return Ok(Moved::default());
    }
    let tname = &plan.target.name;
    let route = match direct {
        None => Way::Relay,
        Some(dest) => Way::Direct {
            dest,
            generation,
            timeout: opts.connect.timeout.as_secs(),
        },
    };
    let failure = match stream(plan, &opts.connect, dst, send, opts.compression, route, obs) {
        Ok(moved) => return Ok(moved),
        Err(f) => f,
    };
    let e = failure.error;
    if dst.lost() {
        return Err(fate(e, dst.lost(), Phase::Stream, tname, generation));
    }
    // The target is still there: it discards the generation now.
    let aborted = dst.abort();
    if !failure.died {
        return Err(e);
    }
    Err(match aborted {
        Ok(()) => fate(e, dst.lost(), Phase::Aborted, tname, generation),
        Err(_) => fate(e, dst.lost(), Phase::Stream, tname, generation),
    })
}

/// Switch the staged generation in and commit it.
fn switch_and_commit(
    dst: &mut Client,
    opts: &ApplyOptions,
    tname: &str,
    generation: &str,
    clock: &Clock,
) -> Result<()> {
    let switched = dst.switch();
    switched.map_err(|e| fate(e, dst.lost(), Phase::Switch, tname, generation))?;
    clock.mark("switch and check");
    let committed = dst.commit(opts.backup, opts.keep);
    committed.map_err(|e| fate(e, dst.lost(), Phase::Switch, tname, generation))?;
    clock.mark("commit");
    Ok(())
}

/// The `[verify]` check after an apply.
#[derive(Debug, Clone, Copy, Default)]
struct Checked {
    /// Whether the check passed (`None`: not run).
    verified: Option<bool>,
    rolled_back: bool,
}

/// Run the check on the new generation; with `rollback_on_failure`, roll
/// the generation back when it fails.
fn verify_and_roll_back(
    dst: &mut Client,
    plan: &Plan,
    opts: &ApplyOptions,
    mut req: VerifyRequest,
    generation: &str,
    obs: &dyn Observer,
) -> Result<Checked> {
    req.generation = Some(generation.to_string());
    let failure = match super::verify::check(dst, req, obs) {
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
        let r = dst.rollback(&plan.target.venv, Some(generation.to_string()))?;
        checked.rolled_back = true;
        obs.status(&format!(
            "verify failed ({why}): rolled back generation {generation} on {} ({} files restored, {} removed, {} paths verified)",
            plan.target.name, r.restored, r.removed, r.verified
        ));
    }
    Ok(checked)
}

/// How the stream gets from the source to the target's staging.
enum Way<'a> {
    /// Through this machine: the source's data frames are relayed to the target.
    Relay,
    /// `--direct`: the source streams straight to the target (see
    /// `crate::transport::openssh`); this machine only follows the progress.
    Direct {
        dest: &'a str,
        generation: &'a str,
        /// The source's connect timeout to the target, in seconds.
        timeout: u64,
    },
}

/// Where the apply stood when a host died: what the target is left with,
/// and what to run next.
#[derive(Clone, Copy)]
enum Phase {
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
fn fate(e: Error, lost: bool, phase: Phase, tname: &str, generation: &str) -> Error {
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

/// How often the target is looked at while this thread waits on the source.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// A stream that failed, and whether an agent (or its connection) died:
/// the source's (then named in the error) or the target's (then `dst.lost()`).
struct StreamFailure {
    error: Error,
    died: bool,
}

impl StreamFailure {
    fn new(error: Error, died: bool) -> Self {
        StreamFailure { error, died }
    }
}

/// Have the source stream `files` into the target's staging by `route`.
///
/// While this thread waits on the source, another looks at the target (over
/// `--direct` the controller reads nothing from it until the source is
/// done): if it dies, the source's connection is cut, which ends the wait
/// and tells the source agent to stop. A source that dies ends the wait by
/// itself (its channel ends); the caller then tells the target to abort.
fn stream(
    plan: &Plan,
    opts: &ConnectOptions,
    dst: &mut Client,
    files: Vec<SendFile>,
    compression: Compression,
    route: Way<'_>,
    obs: &dyn Observer,
) -> std::result::Result<Moved, StreamFailure> {
    let sname = plan.source.name.clone();
    let mut src = Client::connect(&sname, &endpoint(&plan.source), opts)
        .map_err(|e| StreamFailure::new(e, false))?;
    let (Some(src_watch), Some(dst_watch)) = (src.watch(), dst.watch()) else {
        let e = err!(
            kind = Connection,
            "The agent on {} is gone",
            plan.target.name
        );
        return Err(StreamFailure::new(e, dst.lost()));
    };
    let dst_died = std::sync::atomic::AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        // Dropped when the stream ends, which ends the watch at once.
        let (done, stop) = std::sync::mpsc::channel::<()>();
        let (dst_watch, src_watch, dst_died) = (&dst_watch, &src_watch, &dst_died);
        scope.spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                stop.recv_timeout(WATCH_EVERY)
            {
                if dst_watch.gone().is_some() {
                    dst_died.store(true, std::sync::atomic::Ordering::Relaxed);
                    src_watch.cut();
                    break;
                }
            }
        });
        let r = relay(plan, dst, &mut src, files, compression, route, obs);
        drop(done);
        r
    });
    if dst_died.into_inner() || dst.lost() {
        // The target died: say how (it is gone, so this does not wait);
        // the source, whose connection is cut, is left to stop by itself.
        let e = match result {
            Err(e) if dst.lost() => e,
            _ => dst.dead(),
        };
        src_watch.cut();
        return Err(StreamFailure::new(e, true));
    }
    match result {
        // Everything was sent and staged: a source that fails its goodbye
        // still fails the apply, which the target then aborts.
        Ok(r) => src
            .close()
            .map(|()| r)
            .map_err(|e| StreamFailure::new(e, true)),
        Err(e) => {
            let died = src.lost();
            Err(StreamFailure::new(e, died))
        }
    }
}

/// The stream itself, on this thread: start it on the source (and, relayed,
/// on the target), then follow the source's events until it has sent
/// everything, and have the target confirm what it staged.
fn relay(
    plan: &Plan,
    dst: &mut Client,
    src: &mut Client,
    files: Vec<SendFile>,
    compression: Compression,
    route: Way<'_>,
    obs: &dyn Observer,
) -> Result<Moved> {
    let send = SendRequest {
        venv: plan.source.venv.clone(),
        files,
        shebang: Some(ShebangRewrite {
            from: plan.source.venv.clone(),
            to: plan.target.venv.clone(),
        }),
        compression,
    };
    let relayed = matches!(route, Way::Relay);
    match route {
        Way::Relay => {
            src.start_send(send)?;
            dst.start_stage()?;
        }
        Way::Direct {
            dest,
            generation,
            timeout,
        } => {
            let to = DirectTo {
                ssh: dest.to_string(),
                proxy_jump: direct_jump(plan),
                agent: dst.agent_exe().to_string(),
                target_venv: plan.target.venv.clone(),
                generation: generation.to_string(),
                connect_timeout_secs: timeout,
            };
            src.start_send_direct(send, to)?;
        }
    }
    let meter = obs.meter(if relayed {
        "transfer"
    } else {
        "transfer (direct)"
    });
    let sent = loop {
        match src.stream_event()? {
            StreamEvent::Data(d) if relayed => dst.write_data(&d)?,
            StreamEvent::Data(_) => {
                return Err(err!(
                    kind = Protocol,
                    "unexpected stream data from {} on the direct route",
                    plan.source.name
                ));
            }
            StreamEvent::Progress(p) => meter.update(&p),
            StreamEvent::Sent { sent, written } => break (sent, written),
        }
    };
    let (sent, written) = sent;
    show_windows(obs, &sent.windows);
    meter.finish();
    // The relay's end of stream, or the direct route's report of what it staged.
    if relayed {
        dst.end_stage(sent.hashes)?;
    } else {
        dst.staged_direct(sent.hashes, written)?;
    }
    Ok(Moved {
        raw: sent.raw_bytes,
        sent: sent.packed_bytes,
    })
}

/// For `-vv`: the levels `--compress auto` measured, window by window.
fn show_windows(obs: &dyn Observer, windows: &[LevelWindow]) {
    if !windows.is_empty() {
        let w: Vec<String> = windows
            .iter()
            .map(|w| format!("{}:{:.0}", w.level, w.bytes_per_sec / 1e6))
            .collect();
        obs.detail(&format!(
            "compression windows (level:MB/s of files): {}",
            w.join(" ")
        ));
    }
}
