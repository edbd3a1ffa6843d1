//! Apply: carry out a saved plan on its target, streaming the new files
//! from its source (through this controller, or `--direct`), then
//! switching them in through the target's journal; optionally run the
//! `[verify]` check and roll back when it fails.
//!
//! [`apply`] runs the steps in order, each its own function: the manifest
//! check (an explicit `--manifest` must be the one the plan recorded), the
//! line naming the plan and its target ([`announcement`]), the resume check
//! ([`resume`]), the strict check, prepare (which hands the target the
//! plan's versions to record), stream (`transfer`; with both hosts on this
//! machine, the target's agent copies the files itself instead, `copy_here`:
//! the local route), switch and commit
//! (keeping the backup unless `--no-backup`; the target says its size),
//! verify with rollback on failure.
//!
//! When some sets come from a folder ([`crate::plan::SetPlan::from`]), the
//! files are relayed source by source, each source's stream in turn, into
//! one stage of the target (`stream_parts`): one generation as ever.
//!
//! If an agent or its connection dies on either host, the apply stops at
//! once (a thread watches the target while this one waits on the source)
//! and the error says where the target stands and what to run next.
//!
//! Ctrl-C (or SIGTERM) stops it cleanly ([`crate::interrupt`]): the flag is
//! read between the steps, at every event of the stream and at every
//! progress frame of the switch. Before the switch the target discards its
//! staging; during it, the target stops and undoes it (`Abort`, see
//! [`Client::switch_unless`]); after the commit the new files stay. The
//! error (kind `Interrupted`, exit 130) names the target's state and the
//! command that undoes or repeats it ([`Left`]).

use std::path::PathBuf;

use indicatif::HumanBytes;
use serde::Serialize;

use crate::client::{Client, DirectTo, SendRequest};
use crate::err;
use crate::error::{Error, ErrorKind, Result};
use crate::interrupt;
use crate::model::{
    Action, Compression, GenChange, LevelWindow, PrepareRequest, RouteSetting, SendFile,
    ShebangRewrite, SourceHash, VerifyRequest,
};
use crate::plan::{HostInfo, Plan};
use crate::transport::ConnectOptions;

use super::{Clock, Observer, Step, endpoint, load_plan, relay};

/// What `overlay apply` is asked.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// The saved plan.
    pub plan: PathBuf,
    /// `--manifest`: checked against the one the plan was made from when
    /// `manifest_explicit`; `[verify]` is read from it when the plan's own is gone.
    pub manifest: PathBuf,
    /// `--manifest` (or OVERLAY_MANIFEST) was given, not defaulted.
    pub manifest_explicit: bool,
    pub connect: ConnectOptions,
    /// Only complete an interrupted generation.
    pub resume: bool,
    /// Apply a strict plan that predicts problems.
    pub force: bool,
    /// `--direct`: stream from the source straight to the target, whatever
    /// the plan's route (no fallback to the relay).
    pub direct: bool,
    /// `--relay`: stream through this machine, whatever the plan's route.
    pub relay: bool,
    /// Keep a backup, to roll back to (the default; off with `--no-backup`).
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
    /// Place the bytecode the plan carries with its `.py` files (off with
    /// `--no-compile`).
    pub compile: bool,
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
    /// Copied by the target's agent from the source venv on this machine
    /// (both hosts local: the local route).
    Local,
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
    /// The plan's route was direct but the source could not reach the
    /// target, so the files went through this machine: ssh's reason.
    pub fell_back_from_direct: Option<String>,
    pub seconds: f64,
    pub backup: bool,
    /// Bytes the backup holds on the target (0 without one).
    pub backup_bytes: u64,
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
    let mut ready = match begin(opts, obs)? {
        Began::Ready(r) => r,
        Began::Done(report) => return Ok(report),
    };
    clock.mark("connect and prepare");
    let send = SendFile::of_changes(&ready.changes);
    let sent = transfer(
        &mut ready.dst,
        &ready.plan,
        opts,
        &ready.generation,
        &ready.chosen,
        send,
        obs,
    )?;
    finish(ready, sent, &clock, obs)
}

/// What [`begin`] left: a target ready for its files, or the whole report.
pub enum Began {
    Ready(Box<Ready>),
    /// `--resume`, or a plan with nothing to change.
    Done(ApplyReport),
}

/// A target ready for its files: connected, checked, its generation open.
pub struct Ready {
    pub opts: ApplyOptions,
    pub plan: Plan,
    pub dst: Client,
    pub changes: Vec<GenChange>,
    pub generation: String,
    pub recovered: Option<String>,
    pub chosen: ChosenRoute,
    check: Option<VerifyRequest>,
    /// Ctrl-C stops cleanly while this lives.
    _cleanly: interrupt::Cleanly,
}

/// Everything before the stream: load and check the plan, connect the
/// target, choose the route, read the check, and open the generation.
pub fn begin(opts: &ApplyOptions, obs: &dyn Observer) -> Result<Began> {
    let mut plan = load_plan(&opts.plan)?;
    if !opts.compile {
        plan.without_carried_bytecode();
    }
    same_manifest(&plan, opts)?;
    if !opts.resume {
        super::bundle_cache::check_cache(&plan, &opts.plan)?;
    }
    let tname = plan.target.name.clone();
    if !opts.resume && plan.has_changes() {
        obs.status(&announcement(&plan, &opts.plan));
    }
    let connecting = obs.step(Step::Connect, &tname);
    let mut dst = Client::connect(
        &tname,
        &endpoint(&plan.target),
        plan.target.sudo.as_deref(),
        &opts.connect,
    )?;
    connecting.finish();
    if opts.resume {
        return resume(dst, &plan).map(Began::Done);
    }
    // From here on, Ctrl-C stops cleanly.
    let cleanly = interrupt::Cleanly::new(interrupt::Note {
        cleaning: format!("{tname} discards what this apply staged, or undoes its switch"),
        forced: format!("{tname} in an unknown state"),
        hint: format!(
            "run `overlay history {tname}` to see where it stands (that rolls back an unfinished switch), or `overlay apply --resume {}` to complete it",
            opts.plan.display()
        ),
    });
    strict_check(&plan, opts.force)?;
    let chosen = choose_route(&plan, opts, obs)?;
    // Read the check before touching anything, so a missing [verify] fails early.
    let check = opts
        .verify
        .then(|| check_request(&plan, opts, obs))
        .transpose()?;
    let changes = gen_changes(&plan);
    if changes.is_empty() {
        dst.close()?;
        return Ok(Began::Done(ApplyReport::NothingToApply { target: tname }));
    }
    if interrupt::requested() {
        let _ = dst.close();
        return Err(interrupted(Left::Untouched, &tname, &opts.plan));
    }
    let prepared = prepare(&mut dst, &plan, opts, changes.clone())?;
    if let Some(r) = &prepared.recovered {
        obs.status(&format!("{tname}: {r}"));
    }
    Ok(Began::Ready(Box::new(Ready {
        opts: opts.clone(),
        plan,
        dst,
        changes,
        generation: prepared.generation,
        recovered: prepared.recovered,
        chosen,
        check,
        _cleanly: cleanly,
    })))
}

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
    let backup_bytes = switch_and_commit(&mut dst, opts, &tname, &generation, clock)?;
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

/// The route chosen before anything is sent ([`choose_route`]).
#[derive(Debug, Clone, Default)]
pub struct ChosenRoute {
    /// The direct route: the target's ssh destination as the source knows
    /// it. `None`: the relay.
    pub direct: Option<String>,
    /// The direct route comes from the plan (the manifest's `route`), not
    /// from `--direct`: if the source cannot reach the target, the files go
    /// through this machine instead.
    pub may_fall_back: bool,
}

/// How the files go: `--relay` or `--direct` if given, else the plan's
/// route (the manifest's `route` for the target). A direct route from the
/// plan that cannot work (a target behind `sudo`, or this machine) is the
/// relay, with a note at `-v`; one that can may fall back to the relay.
pub fn choose_route(plan: &Plan, opts: &ApplyOptions, obs: &dyn Observer) -> Result<ChosenRoute> {
    if opts.relay && opts.direct {
        return Err(err!(
            kind = Usage,
            hint = "pass one of them",
            "--relay and --direct ask for two routes; {} is unchanged",
            plan.target.name
        ));
    }
    if opts.relay || (!opts.direct && plan.target.route == RouteSetting::Relay) {
        return Ok(ChosenRoute::default());
    }
    if opts.direct && from_folders(plan) {
        return Err(err!(
            kind = Usage,
            hint = "apply without --direct: sets with `from` go through this machine",
            "--direct cannot send the sets whose files come from a folder (`from` in the manifest); {} is unchanged",
            plan.target.name
        ));
    }
    if opts.direct {
        return Ok(ChosenRoute {
            direct: direct_destination(plan, true)?,
            may_fall_back: false,
        });
    }
    if let Some(why) = direct_obstacle(plan) {
        obs.note(&format!(
            "{why}: the manifest's route = \"direct\" is not taken, the files go through this machine"
        ));
        return Ok(ChosenRoute::default());
    }
    Ok(ChosenRoute {
        direct: direct_destination(plan, true)?,
        may_fall_back: true,
    })
}

/// Why the direct route cannot be taken to the plan's target at all, if
/// it cannot: its agent runs through `sudo`, or it is this machine.
pub fn direct_obstacle(plan: &Plan) -> Option<String> {
    let tname = &plan.target.name;
    if let Some(user) = &plan.target.sudo {
        return Some(format!(
            "{tname} runs its agent through sudo (as {user}), which the source's ssh cannot do"
        ));
    }
    if plan.target.direct_ssh.is_none() && plan.target.ssh.is_none() {
        return Some(format!("{tname} is this machine"));
    }
    if from_folders(plan) {
        return Some("some sets come from a folder (`from`)".to_string());
    }
    None
}

/// For `overlay plan`: the route `apply` takes without `--relay` or
/// `--direct`, when the manifest asks for the direct route (the relay,
/// the default, goes unsaid).
pub fn route_note(plan: &Plan) -> Option<String> {
    if plan.target.route != RouteSetting::Direct {
        return None;
    }
    let (src, dst) = (&plan.source.name, &plan.target.name);
    Some(match direct_obstacle(plan) {
        Some(why) => format!(
            "Route: through this machine ({why}, so the manifest's route = \"direct\" is not taken)"
        ),
        None => format!(
            "Route: {src} sends the files straight to {dst} with its own ssh (the manifest's route = \"direct\"), or through this machine if it cannot reach {dst}; `overlay apply --relay` always goes through this machine"
        ),
    })
}

/// With `--direct`: the target's ssh destination as the source knows it.
fn direct_destination(plan: &Plan, direct: bool) -> Result<Option<String>> {
    if !direct {
        return Ok(None);
    }
    if let Some(user) = &plan.target.sudo {
        let tname = &plan.target.name;
        return Err(err!(
            hint = "apply without --direct (the stream then passes through this machine)",
            "--direct cannot start {tname}'s agent through sudo (as {user}): the source's ssh would run it as the login user; {tname} is unchanged"
        ));
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

/// The line `apply` starts with: which plan, from where to where, and
/// how many files it adds, replaces and deletes.
pub fn announcement(plan: &Plan, file: &std::path::Path) -> String {
    let count = |a: Action| -> usize {
        plan.sets
            .iter()
            .map(|s| s.changes.iter().filter(|c| c.action == a).count())
            .sum()
    };
    let adds = count(Action::Add);
    format!(
        "Applying {}: {} -> {} ({}), {adds} file{} to add, {} to replace, {} to delete",
        file.display(),
        plan.source.name,
        plan.target.name,
        plan.target.venv,
        if adds == 1 { "" } else { "s" },
        count(Action::Replace),
        count(Action::Delete)
    )
}

/// An explicit `--manifest` must be the manifest the plan was made from,
/// byte for byte (a copy elsewhere is the same manifest). Plans made
/// before overlay recorded the manifest's hash are not checked.
fn same_manifest(plan: &Plan, opts: &ApplyOptions) -> Result<()> {
    let Some(recorded) = &plan.manifest_sha256 else {
        return Ok(());
    };
    if !opts.manifest_explicit {
        return Ok(());
    }
    let given = super::plan::manifest_stamp(&opts.manifest)?;
    if given.sha256 == *recorded {
        return Ok(());
    }
    let planfile = opts.plan.display();
    let what = if given.path == std::path::Path::new(&plan.manifest) {
        format!(
            "{} has changed since the plan {planfile} was made from it",
            plan.manifest
        )
    } else {
        format!(
            "The plan {planfile} was made from {}, not from {}",
            plan.manifest,
            given.path.display()
        )
    };
    Err(err!(
        kind = Usage,
        hint = format!(
            "re-run `overlay plan -m {} {} {}` to plan with it, or drop --manifest (and OVERLAY_MANIFEST) to apply {planfile} as it was planned",
            crate::text::shell_quote(&opts.manifest.to_string_lossy()),
            crate::text::shell_quote(&plan.source.name),
            crate::text::shell_quote(&plan.target.name)
        ),
        "{what}; nothing was applied to {}",
        plan.target.name
    ))
}

/// The `[verify]` check of the manifest the plan was made from: `--manifest`
/// when it was given (it matches, see [`same_manifest`]), else the
/// plan's recorded path, which must still be there. Plans made before
/// overlay recorded the manifest's hash fall back to `--manifest`.
fn check_request(plan: &Plan, opts: &ApplyOptions, obs: &dyn Observer) -> Result<VerifyRequest> {
    let recorded = std::path::Path::new(&plan.manifest);
    let manifest = if opts.manifest_explicit {
        opts.manifest.as_path()
    } else if recorded.exists() {
        let edited = match &plan.manifest_sha256 {
            Some(sha) => super::plan::manifest_stamp(recorded)?.sha256 != *sha,
            None => false,
        };
        obs.status(&format!(
            "The check is the [verify] of {}, the manifest the plan was made from{}",
            plan.manifest,
            if edited {
                " (edited since: its check as it is now)"
            } else {
                ""
            }
        ));
        recorded
    } else if plan.manifest_sha256.is_some() {
        return Err(err!(
            kind = Usage,
            hint =
                "pass --manifest with that manifest (or a copy of it), or apply without --verify",
            "The plan {} was made from {}, which is gone: its [verify] check cannot be read; nothing was applied to {}",
            opts.plan.display(),
            plan.manifest,
            plan.target.name
        ));
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
        versions: versions(plan),
        // The target rewrites the RECORD rows of the scripts whose shebang
        // the source rewrote, as pip records the script it wrote; they
        // describe them as the source venv had them: a bundle's, as the
        // venv it was packed from.
        shebang: Some(ShebangRewrite {
            from: plan
                .bundle
                .as_ref()
                .and_then(|b| b.source_venv.clone())
                .unwrap_or_else(|| plan.source.venv.clone()),
            to: plan.target.venv.clone(),
        }),
    };
    let prepared = dst.prepare(req);
    prepared.map_err(|e| fate(e, dst.lost(), Phase::Prepare, tname, ""))
}

/// The plan's distribution versions, each name once (the first set that
/// names it), for the generation to record.
fn versions(plan: &Plan) -> Vec<crate::model::Transition> {
    let mut seen = std::collections::HashSet::new();
    plan.sets
        .iter()
        .flat_map(|s| &s.versions)
        .filter(|t| seen.insert(t.name.clone()))
        .cloned()
        .collect()
}

/// What [`transfer`] did: the bytes, and the route they took.
#[derive(Debug, Clone, Default)]
pub struct Transferred {
    pub moved: Moved,
    /// The direct route's destination, if the files took it.
    pub direct: Option<String>,
    /// The direct route fell back to the relay: ssh's reason.
    pub fell_back_from_direct: Option<String>,
    /// Targets that took the same stream of the source (one read fanned
    /// out to them, see `crate::fleet::fanout`); 0 or 1: this target alone.
    pub shared: usize,
}

/// Bytes a stream carried.
#[derive(Debug, Clone, Copy, Default)]
pub struct Moved {
    /// Bytes of files.
    pub raw: u64,
    /// Bytes on the wire.
    pub sent: u64,
    /// The target copied the files itself (the local route): none went
    /// on a wire.
    pub local: bool,
}

/// Stream the added and replaced files from the source into the target's
/// staging. If the source fails, the target discards the generation. A
/// direct route that may fall back ([`ChosenRoute`]) and whose source could
/// not reach the target (nothing was sent) is followed by the relay, with a
/// warning.
fn transfer(
    dst: &mut Client,
    plan: &Plan,
    opts: &ApplyOptions,
    generation: &str,
    chosen: &ChosenRoute,
    send: Vec<SendFile>,
    obs: &dyn Observer,
) -> Result<Transferred> {
    let tname = &plan.target.name;
    if interrupt::requested() {
        return Err(match dst.abort() {
            Ok(()) => interrupted(Left::Discarded, tname, &opts.plan),
            Err(_) => interrupted(Left::Pending(generation), tname, &opts.plan),
        });
    }
    if send.is_empty() {
        return Ok(Transferred::default());
    }
    if local_copy(plan, chosen.direct.as_deref()) {
        let moved = copy_here(dst, plan, opts, generation, obs)?;
        return Ok(Transferred {
            moved,
            ..Transferred::default()
        });
    }
    let route = match chosen.direct.as_deref() {
        None => Way::Relay,
        Some(dest) => Way::Direct {
            dest,
            generation,
            timeout: opts.connect.timeout.as_secs(),
        },
    };
    let compression = route_compression(opts.compression, plan);
    let again = chosen.may_fall_back.then(|| send.clone());
    let mut result = match by_source(plan, &send) {
        Some(parts) => stream_parts(plan, &opts.connect, dst, parts, compression, obs),
        None => stream(
            (plan, Part::whole(&plan.source, &Default::default())),
            &opts.connect,
            dst,
            send,
            compression,
            route,
            obs,
        ),
    };
    let mut fell_back = None;
    if let (Err(failure), Some(send), Some(dest)) = (&result, again, &chosen.direct)
        && let Some(why) = fallback_reason(&failure.error, dst)
    {
        obs.warn(&fallback_warning(plan, dest, &why));
        fell_back = Some(why);
        result = stream(
            (plan, Part::whole(&plan.source, &Default::default())),
            &opts.connect,
            dst,
            send,
            compression,
            Way::Relay,
            obs,
        );
    }
    let failure = match result {
        Ok(moved) => {
            return Ok(Transferred {
                moved,
                direct: chosen.direct.clone().filter(|_| fell_back.is_none()),
                fell_back_from_direct: fell_back,
                shared: 0,
            });
        }
        Err(f) => f,
    };
    Err(stream_failed(dst, failure, tname, &opts.plan, generation))
}

/// The error of a stream that failed, once the target has discarded what
/// it staged if it still can (Ctrl-C, or the source failed or died); told
/// with where the target stands when an agent died.
pub fn stream_failed(
    dst: &mut Client,
    failure: StreamFailure,
    tname: &str,
    plan_file: &std::path::Path,
    generation: &str,
) -> Error {
    let e = failure.error;
    if e.kind == ErrorKind::Interrupted && !dst.lost() {
        // Ctrl-C: the source was cut off; the target discards the staging.
        return match dst.abort() {
            Ok(()) => interrupted(Left::Discarded, tname, plan_file),
            Err(_) => interrupted(Left::Pending(generation), tname, plan_file),
        };
    }
    if dst.lost() {
        return fate(e, dst.lost(), Phase::Stream, tname, generation);
    }
    // The target is still there: it discards the generation now.
    let aborted = dst.abort();
    if !failure.died {
        return e;
    }
    match aborted {
        Ok(()) => fate(e, dst.lost(), Phase::Aborted, tname, generation),
        Err(_) => fate(e, dst.lost(), Phase::Stream, tname, generation),
    }
}

/// Why the direct route may give way to the relay: the source's ssh could
/// not reach the target, so nothing was sent, and the target is still there
/// with the generation open. Not after Ctrl-C.
fn fallback_reason(e: &Error, dst: &Client) -> Option<String> {
    let why = e.unreached.as_ref()?;
    if dst.lost() || e.kind == ErrorKind::Interrupted || interrupt::requested() {
        return None;
    }
    Some(why.clone())
}

/// The warning of a direct route that fell back to the relay: who could not
/// reach whom, ssh's reason, and how to make either route stick.
fn fallback_warning(plan: &Plan, dest: &str, why: &str) -> String {
    let (src, dst) = (&plan.source.name, &plan.target.name);
    format!(
        "{src} could not reach {dst} directly (its ssh to {dest:?}: {why}); sending through this machine instead. \
         To relay without trying, apply with --relay or drop route = \"direct\" from the manifest; \
         to go direct, fix {src}'s ~/.ssh until `ssh -o BatchMode=yes {dest} true` works there"
    )
}

/// The local route: both hosts on this machine's local transport (no `ssh`
/// for either), not `--direct`, and the target's agent reads the source
/// venv as the source's agent would (the same `sudo`, or the target's
/// agent runs as root). The target's agent then copies the files itself.
pub fn local_copy(plan: &Plan, direct: Option<&str>) -> bool {
    let local = plan.source.ssh.is_none() && plan.target.ssh.is_none();
    let reads_alike = plan.source.sudo == plan.target.sudo
        || plan.target.sudo.as_deref() == Some("root")
        || (plan.target.sudo.is_none() && rustix::process::geteuid().is_root());
    direct.is_none() && local && reads_alike && !from_folders(plan)
}

/// The plan's sources for messages: the source host's name, then each
/// `from` folder's, e.g. `src and ./snapshots/ddtree`.
fn sources_named(plan: &Plan) -> String {
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

/// Some sets come from a folder (the manifest's `from`): their files are
/// relayed through this machine, each source's stream in turn.
fn from_folders(plan: &Plan) -> bool {
    plan.sets.iter().any(|s| s.from.is_some())
}

/// The local route: the target's agent copies the files from the source
/// venv with the kernel's copy (no source agent, no stream). On a failure
/// the target has discarded the generation; on Ctrl-C it stops and
/// discards it.
fn copy_here(
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
        "local copy of {} files ({}): {} reflinked, {} written past the page cache, {} by copy_file_range, {} read and written, {} scripts rewritten",
        c.files,
        HumanBytes(c.bytes),
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
    })
}

/// `--compress auto` between two venvs of this machine (both hosts on the
/// local transport) sends the files as they are: the stream then runs
/// through pipes, where compressing costs CPU and saves nothing. A fixed
/// `--compress LEVEL` is kept.
pub fn route_compression(asked: Compression, plan: &Plan) -> Compression {
    let local = plan.source.ssh.is_none() && plan.target.ssh.is_none();
    match asked {
        Compression::Auto if local => Compression::None,
        other => other,
    }
}

/// Switch the staged generation in and commit it; returns the bytes its
/// backup holds on the target. On Ctrl-C, before the commit, the target
/// undoes the switch.
fn switch_and_commit(
    dst: &mut Client,
    opts: &ApplyOptions,
    tname: &str,
    generation: &str,
    clock: &Clock,
) -> Result<u64> {
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
    Ok(committed.backup_bytes)
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
        // Right after the switch: what the check itself changed is undone too.
        let r = dst.rollback(&plan.target.venv, Some(generation.to_string()), true)?;
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

/// Where a Ctrl-C left the target.
#[derive(Clone, Copy)]
enum Left<'a> {
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
fn interrupted(left: Left<'_>, tname: &str, plan: &std::path::Path) -> Error {
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

/// A test hook: with `OVERLAY_TEST_PAUSE_AT=stream`, the stream waits at
/// its first event until Ctrl-C (at most two minutes), having created the
/// file `OVERLAY_TEST_PAUSE_MARK` to say it waits (tests/interrupt.rs).
pub fn pause_hook(point: &str) {
    if std::env::var("OVERLAY_TEST_PAUSE_AT").ok().as_deref() != Some(point) {
        return;
    }
    if let Some(mark) = std::env::var_os("OVERLAY_TEST_PAUSE_MARK") {
        let _ = std::fs::write(mark, b"paused\n");
    }
    let t = std::time::Instant::now();
    while !interrupt::requested() && t.elapsed() < std::time::Duration::from_secs(120) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// How often the target is looked at while this thread waits on the source.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// A stream that failed, and whether an agent (or its connection) died:
/// the source's (then named in the error) or the target's (then `dst.lost()`).
pub struct StreamFailure {
    error: Error,
    died: bool,
}

impl StreamFailure {
    pub fn new(error: Error, died: bool) -> Self {
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
    (plan, part): (&Plan, Part<'_>),
    opts: &ConnectOptions,
    dst: &mut Client,
    files: Vec<SendFile>,
    compression: Compression,
    route: Way<'_>,
    obs: &dyn Observer,
) -> std::result::Result<Moved, StreamFailure> {
    let source = part.source;
    let sname = source.name.clone();
    let connecting = obs.step(Step::Connect, &sname);
    let mut src = Client::connect(&sname, &endpoint(source), source.sudo.as_deref(), opts)
        .map_err(|e| StreamFailure::new(e, false))?;
    connecting.finish();
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
        let r = relay((plan, part), dst, &mut src, files, compression, route, obs);
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
    if matches!(&result, Err(e) if e.kind == ErrorKind::Interrupted) {
        // Ctrl-C: the source stops at its next write (or, over --direct,
        // its next progress report), and tells its receiver to abort.
        src_watch.cut();
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
/// everything ([`relay::follow`], which passes data frames on to the target
/// from a second thread), and have the target confirm what it staged.
fn relay(
    (plan, part): (&Plan, Part<'_>),
    dst: &mut Client,
    src: &mut Client,
    files: Vec<SendFile>,
    compression: Compression,
    route: Way<'_>,
    obs: &dyn Observer,
) -> Result<Moved> {
    let send = SendRequest {
        venv: part.source.venv.clone(),
        files,
        shebang: Some(ShebangRewrite {
            from: part.source.venv.clone(),
            to: plan.target.venv.clone(),
        }),
        compression,
    };
    let relayed = matches!(route, Way::Relay);
    match route {
        Way::Relay => {
            src.start_send(send)?;
            if part.first {
                dst.start_stage(None)?;
            }
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
    let (from, to) = (&part.source.name, &plan.target.name);
    let meter = obs.step(
        Step::Stream,
        &if relayed {
            format!("{from} -> {to}")
        } else {
            format!("{from} -> {to} (direct)")
        },
    );
    let relay::Ended { sent, written } = relay::follow(
        src,
        relayed.then_some(&mut *dst),
        relay::Listener {
            first: &mut || pause_hook("stream"),
            progress: &mut |p| meter.update(p),
        },
    )?;
    show_windows(obs, &sent.windows);
    meter.finish();
    if interrupt::requested() {
        return Err(err!(kind = Interrupted, "interrupted"));
    }
    // The relay's end of stream, or the direct route's report of what it staged.
    if relayed {
        let mut hashes = part.hashes.take();
        hashes.extend(sent.hashes);
        if part.last {
            dst.end_stage(hashes)?;
        } else {
            part.hashes.set(hashes);
        }
    } else {
        dst.staged_direct(sent.hashes, written)?;
    }
    Ok(Moved {
        raw: sent.raw_bytes,
        sent: sent.packed_bytes,
        local: false,
    })
}

/// One source's stream in a stage that several sources share (sets with
/// `from`): the target takes the streams one after another as one stage,
/// opened by the first and closed by the last with every source's hashes.
#[derive(Clone, Copy)]
struct Part<'a> {
    source: &'a HostInfo,
    first: bool,
    last: bool,
    /// The hashes of the streams before this one, for the last to hand over.
    hashes: &'a std::cell::Cell<Vec<SourceHash>>,
}

impl<'a> Part<'a> {
    /// The one stream of a stage.
    fn whole(source: &'a HostInfo, hashes: &'a std::cell::Cell<Vec<SourceHash>>) -> Self {
        Part {
            source,
            first: true,
            last: true,
            hashes,
        }
    }
}

/// The files to send, source by source, when some sets come from a folder
/// ([`crate::plan::SetPlan::from`]); `None` when all come from the plan's source.
fn by_source<'p>(plan: &'p Plan, send: &[SendFile]) -> Option<Vec<(&'p HostInfo, Vec<SendFile>)>> {
    if plan.sets.iter().all(|s| s.from.is_none()) {
        return None;
    }
    // The source of each change index, in `gen_changes`' order.
    let mut source_of: Vec<&HostInfo> = Vec::new();
    for set in &plan.sets {
        let src = set.from.as_ref().unwrap_or(&plan.source);
        source_of.extend(std::iter::repeat_n(
            src,
            set.changes.len() + set.stale_bytecode.len(),
        ));
    }
    let mut parts: Vec<(&HostInfo, Vec<SendFile>)> = Vec::new();
    for f in send {
        let src = source_of.get(f.index).copied().unwrap_or(&plan.source);
        match parts.iter_mut().find(|(s, _)| *s == src) {
            Some((_, files)) => files.push(f.clone()),
            None => parts.push((src, vec![f.clone()])),
        }
    }
    Some(parts)
}

/// Relay each source's files in turn into one stage of the target.
fn stream_parts(
    plan: &Plan,
    opts: &ConnectOptions,
    dst: &mut Client,
    parts: Vec<(&HostInfo, Vec<SendFile>)>,
    compression: Compression,
    obs: &dyn Observer,
) -> std::result::Result<Moved, StreamFailure> {
    let hashes = std::cell::Cell::new(Vec::new());
    let n = parts.len();
    let mut total = Moved::default();
    for (i, (source, files)) in parts.into_iter().enumerate() {
        let part = Part {
            source,
            first: i == 0,
            last: i + 1 == n,
            hashes: &hashes,
        };
        let m = stream((plan, part), opts, dst, files, compression, Way::Relay, obs)?;
        total.raw += m.raw;
        total.sent += m.sent;
    }
    Ok(total)
}

/// For `-vv`: the levels `--compress auto` measured, window by window.
pub fn show_windows(obs: &dyn Observer, windows: &[LevelWindow]) {
    if !windows.is_empty() {
        let w: Vec<String> = windows
            .iter()
            .map(|w| {
                format!(
                    "{}:{:.0}:{:.0}%:{:.2}",
                    w.level,
                    w.bytes_per_sec / 1e6,
                    w.blocked * 100.0,
                    w.ratio
                )
            })
            .collect();
        obs.detail(&format!(
            "compression windows (level:MB/s of files:blocked on the link:ratio): {}",
            w.join(" ")
        ));
    }
}
