//! Apply a plan of many targets (saved by `overlay plan SRC T1 T2 ...`,
//! see [`super::plan_many`]) with a rollout policy ([`Rollout`]): each
//! target's own plan is carried out exactly as `overlay apply
//! .overlay/plan.d/T.json` would (backup, journal, `--verify`,
//! `--rollback-on-failure`), in slots of `--parallel` targets, the next
//! starting as a slot frees, canaries first, none starting after too many
//! failures or at Ctrl-C (each running apply stops cleanly, as alone).
//! Targets not started are untouched.
//!
//! Among each `--parallel` consecutive targets, those that can share a
//! stream read the source once for all of them ([`super::fanout`]) and hold
//! their slots until the last of them is done; a target that cannot
//! (`--direct`, the local route, sets from a folder, a different venv path)
//! is applied on its own (`crate::ops::apply::apply`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::error::{ErrorKind, Result};
use crate::model::VerifyReport;
use crate::plan::Plan;

use crate::ops::apply::{ApplyOptions, ApplyReport, apply};
use crate::ops::{Meter, Observer, Step, load_plan};

use super::fanout;

/// How a plan of many targets rolls out (`overlay apply --parallel N
/// --canary K --max-fail K`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rollout {
    /// Targets applied at once, a batch sharing one read of the source
    /// (at least 1).
    pub parallel: usize,
    /// The first `canary` targets are applied (and verified, with
    /// `--verify`) first; the rest start only if every canary succeeded.
    pub canary: usize,
    /// Start no new batch once this many targets have failed (`None`: go
    /// on through every target, as Ansible does without
    /// `max_fail_percentage`).
    pub max_fail: Option<usize>,
}

/// What happened on one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// A generation was applied (and verified, with `--verify`).
    Applied,
    /// Its plan had nothing to change.
    Unchanged,
    /// The `[verify]` check failed (rolled back with `--rollback-on-failure`).
    VerifyFailed,
    /// The apply failed: see the error.
    Failed,
    /// Not started: a canary failed, or `--max-fail` was reached. Untouched.
    Skipped,
}

/// One row of the final table (also in `apply --json`).
#[derive(Debug, Clone, Serialize)]
pub struct TargetResult {
    pub target: String,
    pub result: Outcome,
    /// Changes in the generation (0 when none was applied).
    pub changes: u64,
    /// Bytes of the files sent to it, before compression (what the source
    /// read for it).
    pub bytes: u64,
    /// Bytes on the wire.
    pub sent_bytes: u64,
    pub seconds: f64,
    pub generation: Option<String>,
    /// With `--verify`: whether the check passed.
    pub verified: Option<bool>,
    /// The generation was rolled back (`--rollback-on-failure`).
    pub rolled_back: bool,
    /// Whether a canary (`--canary`).
    pub canary: bool,
    /// Why it failed or was skipped.
    pub error: Option<String>,
    /// The exit code `overlay apply` of this target alone would have given.
    pub exit_code: u8,
}

impl TargetResult {
    /// Whether this target ended as asked.
    pub fn ok(&self) -> bool {
        matches!(self.result, Outcome::Applied | Outcome::Unchanged)
    }
}

/// Every target's result, in the plan's order.
#[derive(Debug, Clone, Serialize)]
pub struct Rolled {
    pub targets: Vec<TargetResult>,
    /// Bytes of files the source read for the whole rollout: once for the
    /// targets of a batch that shared a stream, plus each lone target's.
    pub source_bytes_read: u64,
}

impl Rolled {
    /// The targets that did not end as asked (failed or skipped).
    pub fn failed(&self) -> Vec<&TargetResult> {
        self.targets.iter().filter(|t| !t.ok()).collect()
    }
}

/// Carry out each of `plans` (one target each) by `policy`. `base` is the
/// apply's options; its `plan` is replaced by each target's.
///
/// The targets run in slots: at most `policy.parallel` at once, and the
/// next one starts as soon as a slot frees (a slow target holds only its
/// own slot). Targets that can share one read of the source are grouped
/// among each `parallel` consecutive targets ([`units`]) and take as many
/// slots as they are targets. Canaries run first, alone as a wave; the
/// rest start only if every canary succeeded. Once `max_fail` targets have
/// failed (or at Ctrl-C), no target starts.
pub fn apply_many(
    plans: &[(String, PathBuf)],
    base: &ApplyOptions,
    policy: Rollout,
    obs: &dyn Observer,
) -> Result<Rolled> {
    let n = plans.len();
    let opts: Vec<ApplyOptions> = plans
        .iter()
        .map(|(_, file)| ApplyOptions {
            plan: file.clone(),
            ..base.clone()
        })
        .collect();
    let mut run = Run {
        plans,
        opts: &opts,
        policy,
        obs,
        results: vec![None; n],
        failures: 0,
        source_bytes_read: 0,
    };
    let canary = policy.canary.min(n);
    for (wave, is_canary) in [(0..canary, true), (canary..n, false)] {
        // The rest start only if every canary succeeded.
        if !is_canary
            && !run.results[..canary]
                .iter()
                .all(|r| r.as_ref().is_some_and(TargetResult::ok))
        {
            break;
        }
        let units = units(plans, &opts, base, wave, policy.parallel.max(1));
        run.wave(units, is_canary);
    }
    let targets = run
        .results
        .into_iter()
        .zip(plans)
        .map(|(r, (name, _))| {
            r.unwrap_or_else(|| skipped(name, false, "not started: a canary failed".into()))
        })
        .collect::<Vec<TargetResult>>();
    Ok(Rolled {
        targets,
        source_bytes_read: run.source_bytes_read,
    })
}

/// A rollout in progress: each target's result once it has one, and what
/// the policy counts.
struct Run<'a> {
    plans: &'a [(String, PathBuf)],
    opts: &'a [ApplyOptions],
    policy: Rollout,
    obs: &'a dyn Observer,
    results: Vec<Option<TargetResult>>,
    failures: usize,
    source_bytes_read: u64,
}

/// What one unit's apply gave: each of its targets' rows (by index into
/// the plans), and the bytes of files the source read for it.
struct UnitDone {
    rows: Vec<(usize, TargetResult)>,
    source_bytes_read: u64,
}

impl Run<'_> {
    /// Why no target may start now, if so: Ctrl-C, or `--max-fail` reached.
    fn stop(&self) -> Option<String> {
        match self.policy.max_fail {
            _ if crate::interrupt::requested() => Some("not started: interrupted".to_string()),
            Some(k) if self.failures >= k => Some(format!(
                "not started: {k} target{} failed (--max-fail {k})",
                if k == 1 { "" } else { "s" }
            )),
            _ => None,
        }
    }

    /// Run the `units` of one wave in slots of `parallel` targets, each
    /// starting in order as soon as there is room for it; those that may
    /// not start (see [`Run::stop`]) are skipped, untouched.
    fn wave(&mut self, units: Vec<Vec<usize>>, canary: bool) {
        let slots = self.policy.parallel.max(1);
        let mut queue: std::collections::VecDeque<Vec<usize>> = units.into();
        let (plans, opts, obs) = (self.plans, self.opts, self.obs);
        let (done_tx, done_rx) = std::sync::mpsc::channel::<(usize, UnitDone)>();
        std::thread::scope(|scope| {
            let mut free = slots;
            let mut running = 0;
            loop {
                while let Some(unit) = queue.front() {
                    if let Some(why) = self.stop() {
                        for i in queue.drain(..).flatten() {
                            self.results[i] = Some(skipped(&plans[i].0, canary, why.clone()));
                        }
                        break;
                    }
                    // A unit wider than the free slots waits for them (one
                    // wider than all slots starts alone).
                    if unit.len() > free && running > 0 {
                        break;
                    }
                    let unit = queue.pop_front().expect("a unit is there");
                    free = free.saturating_sub(unit.len());
                    running += 1;
                    let tx = done_tx.clone();
                    scope.spawn(move || {
                        let width = unit.len();
                        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            run_unit(&unit, plans, opts, canary, obs)
                        }))
                        .unwrap_or_else(|_| UnitDone {
                            rows: unit
                                .iter()
                                .map(|&i| (i, thread_failed(&plans[i].0, canary)))
                                .collect(),
                            source_bytes_read: 0,
                        });
                        let _ = tx.send((width, done));
                    });
                }
                if running == 0 {
                    break;
                }
                let Ok((width, done)) = done_rx.recv() else {
                    break;
                };
                running -= 1;
                free = (free + width).min(slots);
                self.source_bytes_read += done.source_bytes_read;
                for (i, r) in done.rows {
                    if !r.ok() {
                        self.failures += 1;
                    }
                    self.results[i] = Some(r);
                }
            }
        });
    }
}

/// Apply one unit: a target alone, or targets sharing one stream.
fn run_unit(
    unit: &[usize],
    plans: &[(String, PathBuf)],
    opts: &[ApplyOptions],
    canary: bool,
    obs: &dyn Observer,
) -> UnitDone {
    if let [i] = unit[..] {
        let r = one(&plans[i].0, &opts[i], canary, obs);
        let read = r.bytes;
        return UnitDone {
            rows: vec![(i, r)],
            source_bytes_read: read,
        };
    }
    together(unit, plans, opts, canary, obs)
}

/// The row of a target whose apply thread panicked.
fn thread_failed(name: &str, canary: bool) -> TargetResult {
    let mut row = skipped(name, canary, "its apply thread failed".into());
    row.result = Outcome::Failed;
    row.exit_code = ErrorKind::Internal.exit_code();
    row
}

/// The units of a wave, in the plan's order: among each `parallel`
/// consecutive targets, those that can share a stream of the source
/// ([`fanout::share_groups`]) form one unit; every other target is a unit
/// of its own.
fn units(
    plans: &[(String, PathBuf)],
    opts: &[ApplyOptions],
    base: &ApplyOptions,
    wave: std::ops::Range<usize>,
    parallel: usize,
) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    for start in wave.clone().step_by(parallel) {
        let end = (start + parallel).min(wave.end);
        // Plans that cannot be read are applied alone, which says why.
        let loaded: Vec<(usize, Plan)> = (start..end)
            .filter_map(|i| {
                let mut plan = load_plan(&plans[i].1).ok()?;
                if !base.compile {
                    plan.without_carried_bytecode();
                }
                Some((i, plan))
            })
            .filter(|(i, plan)| !base.resume && fanout::shareable(plan, &opts[*i]))
            .collect();
        let refs: Vec<&Plan> = loaded.iter().map(|(_, p)| p).collect();
        let mut chunk: Vec<Vec<usize>> = fanout::share_groups(&refs)
            .into_iter()
            .map(|g| g.into_iter().map(|k| loaded[k].0).collect::<Vec<usize>>())
            .filter(|g| g.len() > 1)
            .collect();
        for i in start..end {
            if !chunk.iter().any(|u| u.contains(&i)) {
                chunk.push(vec![i]);
            }
        }
        // In the plan's order of each unit's first target.
        chunk.sort_by_key(|u| u[0]);
        out.extend(chunk);
    }
    out
}

/// Apply the targets `unit` (indexes into `plans`) with one stream of the
/// source ([`fanout::apply_shared`]).
fn together(
    unit: &[usize],
    plans: &[(String, PathBuf)],
    opts: &[ApplyOptions],
    canary: bool,
    obs: &dyn Observer,
) -> UnitDone {
    let started = Instant::now();
    let tagged: Vec<Tagged> = unit
        .iter()
        .map(|&i| Tagged {
            inner: obs,
            target: &plans[i].0,
        })
        .collect();
    let members: Vec<fanout::Member> = unit
        .iter()
        .zip(&tagged)
        .map(|(&i, t)| fanout::Member {
            opts: opts[i].clone(),
            obs: t,
        })
        .collect();
    let shared = fanout::apply_shared(&members, obs);
    let rows = unit
        .iter()
        .zip(shared.reports)
        .map(|(&i, report)| (i, row(&plans[i].0, canary, report, started)))
        .collect();
    UnitDone {
        rows,
        source_bytes_read: shared.source_bytes_read,
    }
}

fn skipped(name: &str, canary: bool, why: String) -> TargetResult {
    TargetResult {
        target: name.to_string(),
        result: Outcome::Skipped,
        changes: 0,
        bytes: 0,
        sent_bytes: 0,
        seconds: 0.0,
        generation: None,
        verified: None,
        rolled_back: false,
        canary,
        error: Some(why),
        exit_code: 0,
    }
}

/// Apply one target's plan on its own and say how it went.
fn one(name: &str, opts: &ApplyOptions, canary: bool, obs: &dyn Observer) -> TargetResult {
    let started = Instant::now();
    let tagged = Tagged {
        inner: obs,
        target: name,
    };
    row(name, canary, apply(opts, &tagged), started)
}

/// A target's row from its apply's outcome.
fn row(name: &str, canary: bool, outcome: Result<ApplyReport>, started: Instant) -> TargetResult {
    let mut r = skipped(name, canary, String::new());
    r.error = None;
    match outcome {
        Ok(ApplyReport::Applied(a)) => {
            r.changes = a.changes;
            r.bytes = a.raw_bytes;
            r.sent_bytes = a.sent_bytes;
            r.seconds = a.seconds;
            r.generation = Some(a.generation);
            r.rolled_back = a.rolled_back;
            r.verified = a.verified;
            if a.verified == Some(false) {
                r.result = Outcome::VerifyFailed;
                r.exit_code = ErrorKind::VerifyFailed.exit_code();
                r.error = Some(if a.rolled_back {
                    "the [verify] check failed; rolled back".into()
                } else {
                    "the [verify] check failed".into()
                });
            } else {
                r.result = Outcome::Applied;
            }
        }
        Ok(ApplyReport::NothingToApply { .. }) | Ok(ApplyReport::Resumed { .. }) => {
            r.result = Outcome::Unchanged;
            r.seconds = started.elapsed().as_secs_f64();
        }
        Err(e) => {
            r.result = Outcome::Failed;
            r.exit_code = e.kind.exit_code();
            r.seconds = started.elapsed().as_secs_f64();
            r.error = Some(e.message);
        }
    }
    r
}

/// An observer that names the target in every line it passes on.
struct Tagged<'a> {
    inner: &'a dyn Observer,
    target: &'a str,
}

impl Observer for Tagged<'_> {
    fn status(&self, line: &str) {
        self.inner.status(&format!("{}: {line}", self.target));
    }
    fn detail(&self, line: &str) {
        self.inner.detail(&format!("{}: {line}", self.target));
    }
    fn note(&self, line: &str) {
        self.inner.note(&format!("{}: {line}", self.target));
    }
    fn warn(&self, line: &str) {
        self.inner.warn(&format!("{}: {line}", self.target));
    }
    fn step(&self, step: Step, on: &str) -> Box<dyn Meter> {
        self.inner.step(step, on)
    }
    fn checked(&self, host: &str, report: &VerifyReport, log: &Path) {
        self.inner.checked(host, report, log);
    }
}
