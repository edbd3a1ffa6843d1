//! Crash states from recorded file-system operations (issue 46): every
//! state a power cut may leave during an apply, a rollback, the recovery
//! after a crash (itself cut again) and a prune recovers to the old venv,
//! the new one, or a complete generation that `rollback` restores byte
//! for byte; no torn or empty file is ever left where a whole one was.
//!
//! How (docs/design.md, "Crash states from recorded operations"): the real
//! `overlay` binary runs on the local route (both venvs on this machine,
//! no sshd) under `strace` (`crash_states/trace.rs`); its calls become ops
//! on a model of the target venv (`model.rs`); the persistence model picks
//! the states a crash may leave (`states.rs`); each distinct state is put
//! in place at the venv's own path and the next overlay command a
//! restarted host would run recovers it, then the checker judges the
//! result (`check.rs`).
//!
//! Which command comes first is each recovery an operator may choose,
//! picked per state by a coin of the seed and the state's label: of the
//! apply's, the rollback's and the recovery's states, half are recovered
//! with `apply --resume` (which completes an interrupted switch instead
//! of undoing it), a quarter with `rollback`, the rest by the agent's
//! start (`history`); a prune's by the agent's start. Each run prints how
//! many states each recovery checked.
//!
//! `OVERLAY_CRASH_SEED=N` replays the random states of one run (the seed
//! is printed), and with it the recovery of each state;
//! `OVERLAY_CRASH_ONLY=TEXT` checks only the states whose label holds
//! TEXT (`random state 17`, `prefix 120/`); `OVERLAY_CRASH_RANDOM=N` sets
//! the random states per run; `OVERLAY_CRASH_RESUME=S` and
//! `OVERLAY_CRASH_ROLLBACK=S` set the shares (0 to 1) recovered first
//! with `apply --resume` and with `rollback` (both 0: the agent's start
//! alone; `OVERLAY_CRASH_RESUME=1`: every state resumed).
//! `OVERLAY_CRASH_BUDGET=N` checks at most N states per recorded run,
//! picked evenly from those generated (the run stays bounded).
//!
//! A larger pair (`benches/crash-states`, docs/benchmarks.md): with
//! `OVERLAY_CRASH_SRC=DIR`, `OVERLAY_CRASH_DST=DIR` and
//! `OVERLAY_CRASH_SETS=FILE` (all three) the runs carry the venv at DIR
//! (the source) onto the venv at the other DIR (the target, which the
//! test puts states in and leaves in whatever state it ends: give it a
//! copy, on the file system of the test's scratch, `target/`, since the
//! states are hard links) with FILE's `[sets.*]` tables, instead of the
//! testbed's scenario; both are local hosts (no ssh) at their own paths.

#[path = "crash_states/check.rs"]
mod check;
mod common;
#[path = "crash_states/model.rs"]
mod model;
#[path = "crash_states/states.rs"]
mod states;
#[path = "crash_states/trace.rs"]
mod trace;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use check::{Expect, Recovery, Snap};
use common::{Testbed, ok};

/// The share of each run's states recovered first with `apply --resume`
/// (`OVERLAY_CRASH_RESUME`), and with `rollback` (`OVERLAY_CRASH_ROLLBACK`);
/// the rest with the agent's start.
const RESUME: f64 = 0.5;
const ROLLBACK: f64 = 0.25;

/// One run of the test: the testbed, the seed and the tallies.
struct Bench {
    tb: Testbed,
    venv: PathBuf,
    /// Where states are put: the venv itself, or on FUSE the folder bindfs
    /// serves (a hard link into the farm cannot cross the mount).
    real: PathBuf,
    /// Whether a `syncfs` of the venv's file system makes it durable.
    syncfs_counts: bool,
    scratch: PathBuf,
    seed: u64,
    random: usize,
    /// At most this many states per run, picked evenly (the FUSE runs:
    /// each state costs a third of a second there).
    budget: usize,
    /// The shares of states recovered first with `apply --resume` and
    /// with `rollback` (the rest with the agent's start).
    resume: f64,
    rollback: f64,
    only: Option<String>,
    generated: usize,
    checked: usize,
    outcomes: BTreeMap<String, usize>,
    /// States checked per recovery.
    recoveries: BTreeMap<Recovery, usize>,
    violations: Vec<String>,
}

/// The pair of venvs and the sets to carry instead of the testbed's
/// scenario (`OVERLAY_CRASH_SRC`, `OVERLAY_CRASH_DST`, `OVERLAY_CRASH_SETS`).
struct External {
    src: PathBuf,
    dst: PathBuf,
    /// The `[sets.*]` tables (and any other table but `[hosts.*]`).
    sets: String,
}

impl External {
    /// None when none of the three is set; all three, or a panic that
    /// names what is missing.
    fn from_env() -> Option<External> {
        let keys = [
            "OVERLAY_CRASH_SRC",
            "OVERLAY_CRASH_DST",
            "OVERLAY_CRASH_SETS",
        ];
        let vals: Vec<Option<String>> = keys
            .iter()
            .map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
            .collect();
        if vals.iter().all(Option::is_none) {
            return None;
        }
        let get = |i: usize| {
            let v = vals[i]
                .clone()
                .unwrap_or_else(|| panic!("{} is not set: set all of {keys:?}, or none", keys[i]));
            std::fs::canonicalize(&v).unwrap_or_else(|e| panic!("{}={v}: {e}", keys[i]))
        };
        let (src, dst, sets) = (get(0), get(1), get(2));
        for (k, d) in [(keys[0], &src), (keys[1], &dst)] {
            assert!(
                d.join("pyvenv.cfg").is_file(),
                "{k}={}: not a venv (no pyvenv.cfg)",
                d.display()
            );
        }
        let sets = std::fs::read_to_string(&sets)
            .unwrap_or_else(|e| panic!("OVERLAY_CRASH_SETS={}: {e}", sets.display()));
        assert!(
            !sets.lines().any(|l| l.trim_start().starts_with("[hosts.")),
            "OVERLAY_CRASH_SETS: the test writes the [hosts.*] tables; give only the sets"
        );
        Some(External { src, dst, sets })
    }
}

/// What one recorded run left: its farm (the tree after it), the
/// venv before and after, the generation it worked on, and its model.
struct Recorded {
    farm: PathBuf,
    after: Snap,
    generation: Option<String>,
    model: model::Model,
}

impl Bench {
    fn new() -> Bench {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let mut tb = Testbed::local(2);
        if let Some(x) = External::from_env() {
            // The hosts' venvs are the pair's, at their own paths.
            for (h, dir) in tb.hosts.iter_mut().zip([x.src, x.dst]) {
                h.venv = dir.to_str().expect("a UTF-8 venv path").to_string();
                h.venv_dir = dir;
            }
            tb.write_manifest(&x.sets);
            eprintln!(
                "crash states: the pair {} -> {}",
                tb.hosts[0].venv, tb.hosts[1].venv
            );
        } else {
            tb.write_manifest(common::SCENARIO_SETS);
            // pip and setuptools, which no set touches, are a thousand files
            // that every state would put back in place: the target venv
            // without them is the venv the sets are about.
            let site = tb.site_packages(1);
            for e in std::fs::read_dir(&site).unwrap().flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if ["pip", "setuptools", "pkg_resources", "_distutils_hack"]
                    .iter()
                    .any(|p| n == *p || n.starts_with(&format!("{p}-")))
                {
                    std::fs::remove_dir_all(e.path()).unwrap();
                }
            }
        }
        let venv = tb.host_venv_dir(1).to_path_buf();
        let scratch = tb.dir().join("crash");
        std::fs::create_dir_all(&scratch).unwrap();
        let seed = env("OVERLAY_CRASH_SEED")
            .map(|s| trace::parse_int(&s).expect("OVERLAY_CRASH_SEED: a number") as u64)
            .unwrap_or_else(|| {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap();
                t.as_nanos() as u64 ^ u64::from(std::process::id())
            });
        let random =
            env("OVERLAY_CRASH_RANDOM").map_or(200, |s| s.parse().expect("OVERLAY_CRASH_RANDOM"));
        eprintln!("crash states: seed {seed:#x} (replay with OVERLAY_CRASH_SEED={seed:#x})");
        Bench {
            tb,
            real: venv.clone(),
            syncfs_counts: true,
            venv,
            scratch,
            seed,
            random,
            budget: env("OVERLAY_CRASH_BUDGET").map_or(usize::MAX, |s| {
                s.parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .expect("OVERLAY_CRASH_BUDGET: a count of states, 1 or more")
            }),
            resume: 0.0,
            rollback: 0.0,
            only: env("OVERLAY_CRASH_ONLY"),
            generated: 0,
            checked: 0,
            outcomes: BTreeMap::new(),
            recoveries: BTreeMap::new(),
            violations: Vec::new(),
        }
    }

    fn root_mode(&self) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(&self.venv).unwrap().permissions().mode() & 0o7777
    }

    /// The newest generation `history` lists.
    fn newest_generation(&self) -> Option<String> {
        let out = ok(
            self.tb
                .overlay(&["history", "dst", "--json"])
                .output()
                .unwrap(),
            "history",
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array().and_then(|g| {
            g.iter()
                .filter_map(|g| g["id"].as_str())
                .max()
                .map(String::from)
        })
    }

    /// Put `farm`'s tree in place at the venv's path.
    fn put(&self, farm: &Path) {
        check::materialise(&self.real, self.root_mode(), &check::farm_tree(farm));
    }

    /// Put `farm`'s tree in place, run `overlay ARGS` under strace there,
    /// and model what it did.
    /// (`in_place`: it stands there already, as the plan saw it.)
    fn record(&mut self, name: &str, farm: &Path, args: &[&str], in_place: bool) -> Recorded {
        if !in_place {
            self.put(farm);
        }
        let allowed = vec![self.tb.client.clone(), self.tb.work.clone()];
        let builder =
            model::Builder::new(&self.venv, farm, allowed, &self.tb.work, self.syncfs_counts);
        let log = self.scratch.join(format!("{name}.trace"));
        let (status, err) = trace::record(&self.tb.overlay(args), &log);
        assert!(
            status.success(),
            "overlay {args:?} under strace failed: {err}"
        );
        let after = check::snapshot(&self.venv);
        let generation = self.newest_generation();
        let calls = trace::parse(&log);
        eprintln!(
            "crash states: recorded {name}: {} calls, a log of {:.1} MiB",
            calls.len(),
            std::fs::metadata(&log).map_or(0, |m| m.len()) as f64 / 1048576.0
        );
        let mut model = builder.build(&calls);
        let farm = check::farm(&self.real, &self.scratch.join(format!("farm-{name}")));
        model.after = Some(farm.clone());
        Recorded {
            farm,
            after,
            generation,
            model,
        }
    }

    /// Check every crash state of `rec` against `expect`.
    fn check_states(&mut self, name: &str, rec: &Recorded, expect: &Expect) {
        let t0 = Instant::now();
        let cover = states::cover(&rec.model);
        let seed = self.seed
            ^ name
                .bytes()
                .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        let mut choices = states::choices(&rec.model, &cover, self.random, seed);
        let all = choices.len();
        if choices.len() > self.budget {
            let step = choices.len() as f64 / self.budget as f64;
            choices = (0..self.budget)
                .map(|i| choices[(i as f64 * step) as usize].clone())
                .collect();
        }
        let (mut seen, mut checked, generated) = (HashSet::new(), 0, choices.len());
        let picked = match all > generated {
            true => format!(" (of {all}, by the budget)"),
            false => String::new(),
        };
        let mut kinds: BTreeMap<Recovery, usize> = BTreeMap::new();
        let violations = self.violations.len();
        let mode = self.root_mode();
        let tb = &self.tb;
        let overlay = |a: &[&str]| tb.overlay(a);
        for c in &choices {
            if self
                .only
                .as_ref()
                .is_some_and(|o| !c.label.contains(o.as_str()))
            {
                continue;
            }
            let tree = states::realise(&rec.model, c);
            if !seen.insert(tree.hash) {
                continue;
            }
            checked += 1;
            check::materialise(&self.real, mode, &tree);
            let how = self.recovery(seed, &c.label);
            *kinds.entry(how).or_default() += 1;
            match check::check(&overlay, &self.venv, expect, how) {
                Ok(outcome) => {
                    let key = format!("{name}, {}: {outcome}", how.name());
                    *self.outcomes.entry(key).or_default() += 1
                }
                Err(why) => {
                    let lost = states::lost(&rec.model, c, 12).join("\n    ");
                    let last: Vec<String> = (c.k.saturating_sub(4)..c.k)
                        .map(|i| format!("#{i} {}", rec.model.what[i]))
                        .collect();
                    let last = last.join("\n    ");
                    let v = format!(
                        "{name}, {}, recovered by {}:\n  {why}\n  the last ops:\n    {last}\n  lost or torn:\n    {lost}",
                        c.label,
                        how.name()
                    );
                    if self.violations.len() == violations {
                        eprintln!("crash states: first violation of {name}:\n{v}");
                    }
                    self.violations.push(v);
                }
            }
            if self.violations.len() >= violations + 10 {
                break;
            }
        }
        eprintln!(
            "crash states of {name}: {} ops ({} barriers), {generated} states generated{picked}, {checked} distinct checked ({}), {} violations, in {:.1}s",
            rec.model.ops.len(),
            rec.model
                .ops
                .iter()
                .filter(|o| matches!(o, model::Op::Sync { .. } | model::Op::SyncFs))
                .count(),
            per_recovery(&kinds),
            self.violations.len() - violations,
            t0.elapsed().as_secs_f64()
        );
        self.generated += generated;
        self.checked += checked;
        for (k, n) in kinds {
            *self.recoveries.entry(k).or_default() += n;
        }
    }
}

impl Bench {
    /// How the state labelled `label` is recovered first: a coin of the
    /// run's seed and the label (so that `OVERLAY_CRASH_ONLY` replays a
    /// state the same way), `apply --resume` or `rollback` by their
    /// shares, else the agent's start.
    fn recovery(&self, seed: u64, label: &str) -> Recovery {
        let h = label
            .bytes()
            .fold(seed, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        let coin = (states::Rng(h).next() >> 11) as f64 / (1u64 << 53) as f64;
        if coin < self.resume {
            Recovery::Resume
        } else if coin < self.resume + self.rollback {
            Recovery::Rollback
        } else {
            Recovery::AgentStart
        }
    }
}

/// `3 agent start, 5 apply --resume, 2 rollback`.
fn per_recovery(kinds: &BTreeMap<Recovery, usize>) -> String {
    let all = [Recovery::AgentStart, Recovery::Resume, Recovery::Rollback];
    all.iter()
        .map(|k| format!("{} {}", kinds.get(k).copied().unwrap_or(0), k.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A share from the environment variable `key` (0 to 1), else `default`.
fn share(key: &str, default: f64) -> f64 {
    let v = std::env::var(key)
        .ok()
        .filter(|v| !v.is_empty())
        .map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{key}: a share, 0 to 1, not {v:?}"))
        });
    assert!((0.0..=1.0).contains(&v), "{key}: a share, 0 to 1, not {v}");
    v
}

/// The state in the middle of `rec`'s switch with nothing lost: what a
/// process killed there leaves (the start of the recovery's own run). The
/// switch's moves are its `renameat2` calls (state files are renamed into
/// place with a plain `renameat`).
fn mid_switch(rec: &Recorded) -> states::Choice {
    let moves: Vec<usize> = (0..rec.model.ops.len())
        .filter(|&i| rec.model.what[i].starts_with("renameat2 "))
        .collect();
    assert!(
        moves.len() > 10,
        "the apply's switch moves files: {moves:?}"
    );
    let k = moves[moves.len() / 2];
    states::Choice {
        label: format!("apply killed at op {k}"),
        k,
        fates: Default::default(),
    }
}

/// The venv before and after the apply, and what the apply left.
struct Applied {
    old: Snap,
    new: Snap,
    start: PathBuf,
    apply: Recorded,
}

impl Applied {
    /// What recovery must leave for a run that applies or rolls back.
    fn expect(&self) -> Expect {
        Expect {
            generation: self
                .apply
                .generation
                .clone()
                .expect("the apply's generation"),
            allowed: vec![
                (
                    "old".into(),
                    self.old.clone(),
                    vec!["absent", "rolled-back"],
                ),
                ("new".into(), self.new.clone(), vec!["complete"]),
            ],
            rolls_back_to: self.old.clone(),
        }
    }
}

/// Plan, record the apply and check its crash states, then the rollback's.
fn apply_and_rollback(b: &mut Bench) -> Applied {
    let start = check::farm(&b.real, &b.scratch.join("farm-start"));
    let old = check::snapshot(&b.venv);
    // The plan sees the venv as every state will have it (a hard link
    // changes an inode's ctime, which the drift check compares).
    b.put(&start);
    ok(
        b.tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    let apply = b.record("apply", &start, &["apply"], true);
    let new = apply.after.clone();
    assert_ne!(old, new, "the apply changed the venv");
    let a = Applied {
        old,
        new,
        start,
        apply,
    };
    // Each state is recovered first by the agent's start, `apply
    // --resume` or `rollback`, by a seeded coin (`OVERLAY_CRASH_RESUME`
    // and `OVERLAY_CRASH_ROLLBACK` set the shares).
    b.resume = share("OVERLAY_CRASH_RESUME", RESUME);
    b.rollback = share("OVERLAY_CRASH_ROLLBACK", ROLLBACK).min(1.0 - b.resume);
    b.check_states("apply", &a.apply, &a.expect());
    let rollback = b.record("rollback", &a.apply.farm, &["rollback", "dst"], false);
    assert_eq!(rollback.after, a.old, "the rollback restored the venv");
    b.check_states("rollback", &rollback, &a.expect());
    a
}

/// The tallies, and the test's verdict.
fn finish(b: &Bench, a: &Applied, t0: Instant) {
    // Nothing wrote into an inode of the tree from before the run.
    assert_eq!(
        check::snapshot(&a.start),
        a.old,
        "the farm's files changed: overlay wrote into an existing inode"
    );
    assert_eq!(
        check::snapshot(&a.apply.farm),
        a.new,
        "the files the apply left changed: overlay wrote into an existing inode"
    );
    eprintln!(
        "crash states: {} generated, {} distinct states checked ({}), {} violations, in {:.1}s; outcomes: {:?}",
        b.generated,
        b.checked,
        per_recovery(&b.recoveries),
        b.violations.len(),
        t0.elapsed().as_secs_f64(),
        b.outcomes
    );
    assert!(
        b.violations.is_empty(),
        "{} violations (seed {:#x}):\n{}",
        b.violations.len(),
        b.seed,
        b.violations.join("\n\n")
    );
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: hard links into the test's farm, strace"
)]
fn every_crash_state_recovers_to_old_or_new() {
    assert!(
        Path::new("/usr/bin/strace").exists(),
        "needs strace (run scripts/setup)"
    );
    let t0 = Instant::now();
    let mut b = Bench::new();
    let a = apply_and_rollback(&mut b);

    // Recovery after a crash in the middle of the switch, crashed again.
    let killed = states::realise(&a.apply.model, &mid_switch(&a.apply));
    check::materialise(&b.real, b.root_mode(), &killed);
    let crashed = check::farm(&b.real, &b.scratch.join("farm-crashed"));
    let recovery = b.record("recovery", &crashed, &["history", "dst"], false);
    b.check_states("recovery", &recovery, &a.expect());

    // Prune of the complete generation: the venv stays new throughout.
    let prune = b.record(
        "prune",
        &a.apply.farm,
        &["prune", "dst", "--keep", "0"],
        false,
    );
    assert_eq!(prune.after, a.new);
    let prune_expect = Expect {
        allowed: vec![("new".into(), a.new.clone(), vec!["absent", "complete"])],
        ..a.expect()
    };
    // A prune's states: the agent's start only (a `rollback` would take
    // the venv back to old, which these expectations do not allow).
    (b.resume, b.rollback) = (0.0, 0.0);
    b.check_states("prune", &prune, &prune_expect);
    finish(&b, &a, t0);
}

/// On FUSE (bindfs over the target venv, in a mount namespace of this
/// test's thread) the barrier is an fsync per file and per directory, and
/// a `syncfs` makes nothing durable: the same apply and rollback, every
/// directory fsync now load-bearing.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: FUSE mounts in a mount namespace, strace"
)]
fn on_fuse_every_crash_state_recovers_to_old_or_new() {
    assert!(
        Path::new("/usr/bin/strace").exists(),
        "needs strace (run scripts/setup)"
    );
    assert!(
        Path::new("/usr/bin/bindfs").exists() && Path::new("/dev/fuse").exists(),
        "needs bindfs"
    );
    let t0 = Instant::now();
    let mut b = Bench::new();
    fuse::private_mount_namespace();
    b.real = b.venv.with_extension("real");
    std::fs::rename(&b.venv, &b.real).unwrap();
    std::fs::create_dir(&b.venv).unwrap();
    let _mount = fuse::Bindfs::mount(&b.real, &b.venv);
    b.syncfs_counts = false;
    b.random = b.random.min(60);
    b.budget = std::env::var("OVERLAY_CRASH_FUSE_BUDGET").map_or(100, |v| v.parse().unwrap());
    let a = apply_and_rollback(&mut b);
    finish(&b, &a, t0);
}

#[path = "crash_states/fuse.rs"]
mod fuse;
