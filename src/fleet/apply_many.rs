//! Apply a plan of many targets (saved by `overlay plan SRC T1 T2 ...`,
//! see [`super::plan_many`]) with a rollout policy ([`Rollout`]): each
//! target's own plan is carried out exactly as `overlay apply
//! .overlay/plan.d/T.json` would (backup, journal, `--verify`,
//! `--rollback-on-failure`), in batches of `--parallel` targets, canaries
//! first, starting no batch after too many failures or at Ctrl-C (each
//! running apply stops cleanly, as alone). Targets not started are
//! untouched.
//!
//! In a batch, the targets that can share a stream read the source once
//! for all of them ([`super::fanout`]); a target that cannot (`--direct`,
//! the local route, sets from a folder, a different venv path) is applied
//! on its own ([`super::apply::apply`]) beside them.

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
pub fn apply_many(
    plans: &[(String, PathBuf)],
    base: &ApplyOptions,
    policy: Rollout,
    obs: &dyn Observer,
) -> Result<Rolled> {
    let n = plans.len();
    let mut results: Vec<Option<TargetResult>> = vec![None; n];
    let mut failures = 0;
    let mut source_bytes_read = 0;
    let canary = policy.canary.min(n);
    let batch = policy.parallel.max(1);
    for (wave, is_canary) in [(0..canary, true), (canary..n, false)] {
        // The rest start only if every canary succeeded.
        if !is_canary
            && !results[..canary]
                .iter()
                .all(|r| r.as_ref().is_some_and(TargetResult::ok))
        {
            break;
        }
        for start in wave.clone().step_by(batch) {
            let end = (start + batch).min(wave.end);
            let stop = match policy.max_fail {
                _ if crate::interrupt::requested() => Some("not started: interrupted".to_string()),
                Some(k) if failures >= k => Some(format!(
                    "not started: {k} target{} failed (--max-fail {k})",
                    if k == 1 { "" } else { "s" }
                )),
                _ => None,
            };
            if let Some(why) = stop {
                for (i, (name, _)) in plans.iter().enumerate().take(end).skip(start) {
                    results[i] = Some(skipped(name, is_canary, why.clone()));
                }
                continue;
            }
            let ran = run_batch(&plans[start..end], base, is_canary, obs);
            source_bytes_read += ran.source_bytes_read;
            for (k, r) in ran.rows.into_iter().enumerate() {
                if !r.ok() {
                    failures += 1;
                }
                results[start + k] = Some(r);
            }
        }
    }
    let targets = results
        .into_iter()
        .zip(plans)
        .map(|(r, (name, _))| {
            r.unwrap_or_else(|| skipped(name, false, "not started: a canary failed".into()))
        })
        .collect::<Vec<TargetResult>>();
    Ok(Rolled {
        targets,
        source_bytes_read,
    })
}

/// A batch's rows, in its order, and the bytes of files the source read
/// for it.
struct Batch {
    rows: Vec<TargetResult>,
    source_bytes_read: u64,
}

/// Apply a batch of targets at once: those that can share a stream of the
/// source ([`fanout::share_groups`]) together, with one read of it; the
/// others each on its own.
fn run_batch(
    plans: &[(String, PathBuf)],
    base: &ApplyOptions,
    canary: bool,
    obs: &dyn Observer,
) -> Batch {
    let opts: Vec<ApplyOptions> = plans
        .iter()
        .map(|(_, file)| ApplyOptions {
            plan: file.clone(),
            ..base.clone()
        })
        .collect();
    // Plans that cannot be read are applied alone, which says why.
    let loaded: Vec<(usize, Plan)> = plans
        .iter()
        .enumerate()
        .filter_map(|(i, (_, file))| {
            let mut plan = load_plan(file).ok()?;
            if !base.compile {
                plan.without_carried_bytecode();
            }
            Some((i, plan))
        })
        .filter(|(i, plan)| !base.resume && fanout::shareable(plan, &opts[*i]))
        .collect();
    let refs: Vec<&Plan> = loaded.iter().map(|(_, p)| p).collect();
    let mut units: Vec<Vec<usize>> = fanout::share_groups(&refs)
        .into_iter()
        .map(|g| g.into_iter().map(|k| loaded[k].0).collect::<Vec<usize>>())
        .collect();
    for i in 0..plans.len() {
        if !units.iter().any(|u| u.contains(&i)) {
            units.push(vec![i]);
        }
    }
    let mut rows: Vec<Option<TargetResult>> = vec![None; plans.len()];
    let mut source_bytes_read = 0;
    let ran: Vec<(Vec<(usize, TargetResult)>, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = units
            .iter()
            .map(|unit| {
                let opts = &opts;
                s.spawn(move || {
                    if let [i] = unit[..] {
                        let r = one(&plans[i].0, &opts[i], canary, obs);
                        let read = r.bytes;
                        return (vec![(i, r)], read);
                    }
                    together(unit, plans, opts, canary, obs)
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    for (unit_rows, read) in ran {
        source_bytes_read += read;
        for (i, r) in unit_rows {
            rows[i] = Some(r);
        }
    }
    Batch {
        rows: rows
            .into_iter()
            .zip(plans)
            .map(|(r, (name, _))| {
                r.unwrap_or_else(|| {
                    let mut r = skipped(name, canary, "its apply thread failed".into());
                    r.result = Outcome::Failed;
                    r.exit_code = ErrorKind::Internal.exit_code();
                    r
                })
            })
            .collect(),
        source_bytes_read,
    }
}

/// Apply the targets `unit` (indexes into `plans`) with one stream of the
/// source ([`fanout::apply_shared`]).
fn together(
    unit: &[usize],
    plans: &[(String, PathBuf)],
    opts: &[ApplyOptions],
    canary: bool,
    obs: &dyn Observer,
) -> (Vec<(usize, TargetResult)>, u64) {
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
    (rows, shared.source_bytes_read)
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
