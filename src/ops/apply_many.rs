//! Apply a plan of many targets (saved by `overlay plan SRC T1 T2 ...`,
//! see [`super::plan_many`]) with a rollout policy ([`Rollout`]): each
//! target's own plan is carried out by [`super::apply::apply`], exactly as
//! `overlay apply .overlay/plan.d/T.json` would (its own connection to the
//! source and the target, backup, journal, `--verify`,
//! `--rollback-on-failure`), several at once, canaries first, stopping
//! after too many failures or at Ctrl-C (each running apply stops cleanly,
//! as alone). Targets not started are untouched.
//!
//! The source is read once per target here (each apply streams its own
//! plan's files); one read fanned out to every target is not done yet.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::error::{ErrorKind, Result};
use crate::model::VerifyReport;

use super::apply::{ApplyOptions, ApplyReport, apply};
use super::{Meter, Observer, Step};

/// How a plan of many targets rolls out (`overlay apply --parallel N
/// --canary K --max-fail K`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rollout {
    /// Targets applied at once (at least 1).
    pub parallel: usize,
    /// The first `canary` targets are applied (and verified, with
    /// `--verify`) first; the rest start only if every canary succeeded.
    pub canary: usize,
    /// Start no new target once this many have failed (`None`: go on
    /// through every target, as Ansible does without
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
    /// Bytes of files the source read for the whole rollout: today each
    /// target's stream reads its own (the sum of the targets' `bytes`).
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
    let results: Mutex<Vec<Option<TargetResult>>> = Mutex::new(vec![None; n]);
    let failures = AtomicUsize::new(0);
    let canary = policy.canary.min(n);
    let run_wave = |wave: std::ops::Range<usize>, is_canary: bool| {
        let next = AtomicUsize::new(wave.start);
        std::thread::scope(|s| {
            for _ in 0..policy.parallel.max(1).min(wave.len().max(1)) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= wave.end {
                            return;
                        }
                        let (name, file) = &plans[i];
                        let stop = policy
                            .max_fail
                            .filter(|&k| failures.load(Ordering::SeqCst) >= k);
                        let r = match stop {
                            _ if crate::interrupt::requested() => {
                                skipped(name, is_canary, "not started: interrupted".into())
                            }
                            Some(k) => skipped(
                                name,
                                is_canary,
                                format!(
                                    "not started: {k} target{} failed (--max-fail {k})",
                                    if k == 1 { "" } else { "s" }
                                ),
                            ),
                            None => {
                                let r = one(name, file, base, is_canary, obs);
                                if !r.ok() {
                                    failures.fetch_add(1, Ordering::SeqCst);
                                }
                                r
                            }
                        };
                        results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
                    }
                });
            }
        });
    };
    run_wave(0..canary, true);
    let canaries_ok = results.lock().unwrap_or_else(|p| p.into_inner())[..canary]
        .iter()
        .all(|r| r.as_ref().is_some_and(TargetResult::ok));
    if canaries_ok {
        run_wave(canary..n, false);
    }
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    let targets = results
        .into_iter()
        .zip(plans)
        .map(|(r, (name, _))| {
            r.unwrap_or_else(|| skipped(name, false, "not started: a canary failed".into()))
        })
        .collect::<Vec<TargetResult>>();
    let source_bytes_read = targets.iter().map(|t| t.bytes).sum();
    Ok(Rolled {
        targets,
        source_bytes_read,
    })
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

/// Apply one target's plan and say how it went.
fn one(
    name: &str,
    file: &Path,
    base: &ApplyOptions,
    canary: bool,
    obs: &dyn Observer,
) -> TargetResult {
    let opts = ApplyOptions {
        plan: file.to_path_buf(),
        ..base.clone()
    };
    let started = Instant::now();
    let tagged = Tagged {
        inner: obs,
        target: name,
    };
    let mut r = skipped(name, canary, String::new());
    r.error = None;
    match apply(&opts, &tagged) {
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
