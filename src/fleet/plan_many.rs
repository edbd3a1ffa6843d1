//! Plan many targets against one source (`overlay plan SRC T1 T2 ...`, or
//! a `[groups.NAME]`): the source is connected, scanned, stated and hashed
//! once for all of them, each target is scanned and stated by its own agent
//! at the same time, and each target gets its own [`Plan`], exactly the one
//! `overlay plan SRC T` would make for it alone ([`plan_many`]).
//!
//! What is done once for all targets:
//! - the source's scan and the stat of its members (once per distinct
//!   target venv path: the source's `bin/` scripts are hashed as they would
//!   read with the target's venv in their shebang);
//! - hashing on the source: the union of the paths any target needs
//!   hashed, each read once;
//! - the ELF facts of the shared objects any target's plan places.
//!
//! Saved by [`save_many`]: each target's plan as an ordinary plan file
//! (`overlay apply FILE` carries out one), in a folder beside `--out`
//! (`.overlay/plan.json` → `.overlay/plan.d/TARGET.json`), and at `--out` a
//! [`FleetPlan`] that lists them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use crate::client::Client;
use crate::err;
use crate::error::Result;
use crate::manifest::{Host, Manifest};
use crate::model::{ElfInfo, HashMode, Kind, ScanReport, ShebangRewrite};
use crate::plan::{self, FleetPlan, FleetTarget, HostInfo, PLAN_FORMAT, Plan, Side};
use crate::transport::ConnectOptions;

use crate::ops::plan::{
    Closing, Scanned, SourceGroup, StatSide, both, connect_scan, folder_error, folder_host,
    globs_of, host_info, index, manifest_stamp, mark_from_folder, members_and_order, merge_plans,
    now, preflight, select_sets, shared_files, source_as_for, source_groups,
};
use crate::ops::{Clock, Meter, Observer, Silent, Step};

/// What `overlay plan SRC TARGET...` is asked.
#[derive(Debug, Clone)]
pub struct PlanManyOptions {
    pub manifest: PathBuf,
    /// The source host's manifest name.
    pub source: String,
    /// The targets as named: hosts and `[groups.NAME]`s.
    pub targets: Vec<String>,
    /// The sets to plan (`--set`); empty for all.
    pub sets: Vec<String>,
    /// Refuse to apply a plan that predicts problems, whatever the manifest says.
    pub strict: bool,
    pub connect: ConnectOptions,
}

/// The plans made, one per target in the order named, with the hosts'
/// agents still saying goodbye.
pub struct PlannedMany {
    pub plans: Vec<Plan>,
    /// How many files the source hashed for all the plans together.
    pub source_hashed: usize,
    pub closing: Closing,
}

/// The targets `names` stand for (hosts and groups), each once.
pub fn targets(manifest: &Path, names: &[String]) -> Result<Vec<String>> {
    let m = Manifest::load(manifest)?;
    Ok(m.expand_hosts(names)?
        .into_iter()
        .map(|h| h.name.clone())
        .collect())
}

/// Whether `names` is one host (not a group) of the manifest at `manifest`:
/// `overlay plan` then makes one plan, as it always did.
pub fn is_single_host(manifest: &Path, names: &[String]) -> bool {
    match names {
        [one] => Manifest::load(manifest).is_ok_and(|m| !m.is_group(one)),
        _ => false,
    }
}

/// Whether `name` is a `[groups.NAME]` of the manifest at `manifest` (not
/// when the manifest cannot be read: the one-host commands then work from
/// the plan, and say what is wrong).
pub fn is_group(manifest: &Path, name: &str) -> bool {
    Manifest::load(manifest).is_ok_and(|m| m.is_group(name))
}

/// Make a plan for every target against one read of the source.
pub fn plan_many(opts: &PlanManyOptions, obs: &dyn Observer) -> Result<PlannedMany> {
    let manifest = Manifest::load(&opts.manifest)?;
    let src_host = manifest.host(&opts.source)?;
    let dst_hosts = manifest.expand_hosts(&opts.targets)?;
    if dst_hosts.iter().any(|h| h.name == src_host.name) {
        return Err(err!(
            hint = "leave the source out of the targets (a group may hold it)",
            "The source {} is also among the targets",
            src_host.name
        ));
    }
    let sets = select_sets(&manifest, &opts.sets)?;
    let stamp = manifest_stamp(&opts.manifest)?;
    let mut planned = plan_by_source(&manifest, &sets, src_host, &dst_hosts, &opts.connect, obs)?;
    for p in &mut planned.plans {
        p.strict |= opts.strict;
        p.manifest = stamp.path.display().to_string();
        p.manifest_sha256 = Some(stamp.sha256.clone());
    }
    Ok(planned)
}

/// Plan the sets source by source, as `ops::plan` does for one target:
/// those without `from` from the source host, each `from` folder's from an
/// agent over the folder, each group against every target with one read of
/// its source; then one plan per target of them all, each set recording
/// the source it comes from. Without any `from` this is [`make_plans`].
fn plan_by_source(
    manifest: &Manifest,
    sets: &[crate::model::Set],
    src_host: &Host,
    dst_hosts: &[&Host],
    connect: &ConnectOptions,
    obs: &dyn Observer,
) -> Result<PlannedMany> {
    let groups = source_groups(manifest, sets);
    if let [SourceGroup { from: None, .. }] = groups.as_slice() {
        return make_plans(manifest, sets, src_host, dst_hosts, connect, obs);
    }
    let mut per_target: Vec<Vec<Plan>> = dst_hosts.iter().map(|_| Vec::new()).collect();
    let mut closings = Vec::new();
    let mut source_hashed = 0;
    let mut planned_groups = || -> Result<()> {
        for group in &groups {
            let planned = match group.from {
                None => make_plans(manifest, &group.sets, src_host, dst_hosts, connect, obs)?,
                Some(f) => {
                    let folder = folder_host(manifest, f)?;
                    let mut p = make_plans(manifest, &group.sets, &folder, dst_hosts, connect, obs)
                        .map_err(|e| folder_error(e, &folder, f))?;
                    closings.extend(std::mem::take(&mut p.closing.0));
                    for plan in &mut p.plans {
                        mark_from_folder(f, plan)?;
                    }
                    p
                }
            };
            closings.extend(planned.closing.0);
            source_hashed += planned.source_hashed;
            for (i, plan) in planned.plans.into_iter().enumerate() {
                per_target[i].push(plan);
            }
        }
        Ok(())
    };
    let made = planned_groups().and_then(|()| {
        per_target
            .into_iter()
            .map(|plans| merge_plans(plans, sets))
            .collect::<Result<Vec<Plan>>>()
    });
    let closing = Closing(closings);
    match made {
        Ok(plans) => Ok(PlannedMany {
            plans,
            source_hashed,
            closing,
        }),
        Err(e) => {
            closing.wait();
            Err(e)
        }
    }
}

/// A target connected and scanned, and what its stat and hashing found.
struct Target<'h> {
    host: &'h Host,
    client: Client,
    scan: ScanReport,
    entries: plan::Entries,
}

/// Plan `sets` from `src_host` for every target of `dst_hosts` (in that
/// order): connect and scan every host at once, stat and hash the source
/// once per target venv path, decide each target's plan, then preflight it
/// with the ELF facts the source read once for all.
fn make_plans(
    manifest: &Manifest,
    sets: &[crate::model::Set],
    src_host: &Host,
    dst_hosts: &[&Host],
    opts: &ConnectOptions,
    obs: &dyn Observer,
) -> Result<PlannedMany> {
    let clock = Clock::start(obs);
    let globs = globs_of(sets);
    let Connected {
        mut src,
        mut targets,
        meters,
    } = connect_all(src_host, dst_hosts, &globs, opts, obs)?;
    let source = host_info(src_host, &src.scan);
    let folder = crate::model::folder_of(&src_host.venv).is_some();
    let source_for = |target: &HostInfo| source_as_for(&source, folder, target);
    for t in &targets {
        let target = host_info(t.host, &t.scan);
        plan::check_python(&source_for(&target), &target)?;
    }
    clock.mark("connect and scan");

    let SourceEntries {
        by_venv: venvs,
        hashed: source_hashed,
    } = stat_and_hash(sets, &globs, src_host, &mut src, &mut targets, obs)?;
    src.scanning.finish();
    for m in meters {
        m.finish();
    }
    clock.mark(&format!(
        "stat and hash ({} targets; the source hashed {source_hashed} files for all)",
        targets.len()
    ));

    // Decide each target's plan, then preflight it; the source reads the
    // ELF facts of what any plan places once.
    let computed = decide(sets, &globs, src_host, &src.scan, &targets, &venvs)?;
    clock.mark("decide");
    let gpus = all_capabilities(targets.iter().map(|t| &t.scan));
    let known = placed_elf_facts(&mut src.client, &src_host.venv, &computed, gpus)?;
    let mut plans = Vec::with_capacity(targets.len());
    // The source's notes are about the source: each is shown once.
    let once = Once {
        inner: obs,
        seen: Default::default(),
    };
    for (t, c) in targets.iter_mut().zip(computed) {
        let plan::Computed {
            sets: set_plans,
            mut warnings,
        } = c;
        let mut set_plans = set_plans;
        let preflighted = preflight(
            manifest,
            sets,
            (&mut src.client, &src.scan, &src_host.venv),
            (&mut t.client, &t.scan, &t.host.venv),
            &t.host.name,
            &set_plans,
            Some(&known),
            &clock,
        )?;
        let running = preflighted.running.clone();
        let problems = preflighted.settle(
            (&src_host.name, &src.scan),
            (&t.host.name, &t.scan),
            &mut set_plans,
            &mut warnings,
            &once,
        );
        plans.push(Plan {
            format: PLAN_FORMAT,
            created: now(),
            manifest: manifest.path.display().to_string(),
            manifest_sha256: None,
            source: source_for(&host_info(t.host, &t.scan)),
            target: host_info(t.host, &t.scan),
            sets: set_plans,
            warnings,
            problems,
            strict: manifest.preflight.strict,
            bundle: None,
            provenance: None,
            running: Some(running),
        });
    }
    clock.mark("preflight of every target");
    let clients: Vec<Client> = std::iter::once(src.client)
        .chain(targets.into_iter().map(|t| t.client))
        .collect();
    Ok(PlannedMany {
        plans,
        source_hashed,
        closing: close_all(clients),
    })
}

/// Every host connected and scanned: the source, and the targets in the
/// order of `dst_hosts`.
struct Connected<'h> {
    src: Scanned,
    targets: Vec<Target<'h>>,
    /// The targets' scan steps, finished once their members are stated too.
    meters: Vec<Box<dyn Meter>>,
}

/// Connect to and scan the source and every target, all at once.
fn connect_all<'h>(
    src_host: &Host,
    dst_hosts: &[&'h Host],
    globs: &[String],
    opts: &ConnectOptions,
    obs: &dyn Observer,
) -> Result<Connected<'h>> {
    let (src, dsts) = both(
        || connect_scan(src_host, globs, opts, obs),
        || {
            std::thread::scope(|s| {
                let handles: Vec<_> = dst_hosts
                    .iter()
                    .map(|h| s.spawn(|| connect_scan(h, globs, opts, obs)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("worker thread panicked"))
                    .collect::<Vec<_>>()
            })
        },
    );
    let src = src?;
    let mut targets = Vec::with_capacity(dsts.len());
    let mut meters = Vec::with_capacity(dsts.len());
    for (host, d) in dst_hosts.iter().zip(dsts) {
        let d = d?;
        meters.push(d.scanning);
        targets.push(Target {
            host,
            client: d.client,
            scan: d.scan,
            entries: Default::default(),
        });
    }
    Ok(Connected {
        src,
        targets,
        meters,
    })
}

/// The source's entries for each distinct target venv path, and how many
/// files the source hashed for them all.
struct SourceEntries<'v> {
    by_venv: BTreeMap<&'v str, plan::Entries>,
    hashed: usize,
}

/// Stat and hash the source once per distinct target venv path (its `bin/`
/// scripts read with that venv in their shebang, see the module doc) and
/// every target with it ([`plan_for_venv`]); fills each target's entries.
fn stat_and_hash<'h>(
    sets: &[crate::model::Set],
    globs: &[String],
    src_host: &Host,
    src: &mut Scanned,
    targets: &mut [Target<'h>],
    obs: &dyn Observer,
) -> Result<SourceEntries<'h>> {
    let mut venvs: BTreeMap<&str, plan::Entries> = BTreeMap::new();
    for venv in targets.iter().map(|t| t.host.venv.as_str()) {
        venvs.entry(venv).or_default();
    }
    let mut source_hashed = 0usize;
    let mut first = true;
    for (venv, src_entries) in venvs.iter_mut() {
        let src_side = StatSide {
            host: &src_host.name,
            venv: &src_host.venv,
            shebang: Some(ShebangRewrite {
                from: src_host.venv.clone(),
                to: venv.to_string(),
            }),
            pycache: true,
        };
        let mine: Vec<&mut Target> = targets
            .iter_mut()
            .filter(|t| t.host.venv == *venv)
            .collect();
        source_hashed += plan_for_venv(
            sets,
            globs,
            (&src_side, &mut src.client, &src.scan),
            mine,
            src_entries,
            first,
            obs,
        )?;
        first = false;
    }
    Ok(SourceEntries {
        by_venv: venvs,
        hashed: source_hashed,
    })
}

/// Decide each target's plan (in `targets` order) against the source's
/// entries for the target's venv path.
fn decide(
    sets: &[crate::model::Set],
    globs: &[String],
    src_host: &Host,
    src_scan: &ScanReport,
    targets: &[Target],
    venvs: &BTreeMap<&str, plan::Entries>,
) -> Result<Vec<plan::Computed>> {
    let mut computed = Vec::with_capacity(targets.len());
    for t in targets {
        let src_entries = &venvs[t.host.venv.as_str()];
        let c = plan::compute_with(
            sets,
            &Side {
                host: &src_host.name,
                scan: src_scan,
                globs,
                entries: src_entries,
            },
            &Side {
                host: &t.host.name,
                scan: &t.scan,
                globs,
                entries: &t.entries,
            },
            plan::members_of(sets, src_scan, globs),
            plan::members_of(sets, &t.scan, globs),
        )?;
        computed.push(c);
    }
    Ok(computed)
}

/// The ELF facts of the shared objects any of the `computed` plans places,
/// read on the source (`src`, its venv `venv`) once.
fn placed_elf_facts(
    src: &mut Client,
    venv: &str,
    computed: &[plan::Computed],
    gpus: Vec<(u32, u32)>,
) -> Result<HashMap<String, Option<ElfInfo>>> {
    let mut shared: BTreeSet<String> = BTreeSet::new();
    for c in computed {
        let (_, placed) = crate::ops::plan::deleted_and_placed(&c.sets);
        shared.extend(
            placed
                .into_iter()
                .filter(|p| crate::preflight::looks_shared(p))
                .map(String::from),
        );
    }
    let shared: Vec<String> = shared.into_iter().collect();
    let infos = if shared.is_empty() {
        Vec::new()
    } else {
        src.elf_info(venv, shared.clone(), Some(gpus))?
    };
    Ok(shared.into_iter().zip(infos).collect())
}

/// The compute capabilities of every target's GPUs, each once: what the
/// source reads GPU code for.
fn all_capabilities<'a>(scans: impl Iterator<Item = &'a ScanReport>) -> Vec<(u32, u32)> {
    let mut ccs: Vec<(u32, u32)> = scans.flat_map(|s| s.machine.capabilities()).collect();
    ccs.sort_unstable();
    ccs.dedup();
    ccs
}

/// Say goodbye to every client, all at once, on a thread of their own.
fn close_all(clients: Vec<Client>) -> Closing {
    let closing = std::thread::spawn(move || {
        std::thread::scope(|s| {
            for c in clients {
                s.spawn(move || {
                    let _ = c.close();
                });
            }
        });
    });
    Closing(vec![closing])
}

/// Stat the source once and every target of one venv path at the same
/// time, then hash what any of them needs: on the source the union, each
/// path once; on each target its own. Fills `src_entries` and each
/// target's entries; returns how many files the source hashed. The source's
/// ELF prefetch starts with the first venv's round, each target's preflight
/// prefetch with its own.
fn plan_for_venv(
    sets: &[crate::model::Set],
    globs: &[String],
    (src_side, src, src_scan): (&StatSide, &mut Client, &ScanReport),
    mut targets: Vec<&mut Target>,
    src_entries: &mut plan::Entries,
    prefetch_elf: bool,
    obs: &dyn Observer,
) -> Result<usize> {
    let (_, src_order) = members_and_order(sets, src_scan, globs);
    // Phase 1: stat, everyone at once.
    *src_entries = stat_everyone(sets, globs, (src_side, src), &src_order, &mut targets)?;
    if prefetch_elf {
        let gpus = all_capabilities(targets.iter().map(|t| &t.scan));
        src.prefetch_elf(src_side.venv, shared_files(src_entries), Some(gpus))?;
    }
    for t in targets.iter_mut() {
        let gpus = t.scan.machine.capabilities();
        t.client
            .prefetch_preflight(&t.host.venv, Some(gpus), None)?;
    }

    // Phase 2: hash what decides something (see `plan::needs_hash`).
    let unhashed = |e: Option<&crate::model::Entry>| {
        matches!(e.map(|e| &e.kind), Some(Kind::File { blake3: None, .. }))
    };
    let mut src_hash: BTreeSet<String> = BTreeSet::new();
    let mut dst_hash: Vec<Vec<String>> = Vec::with_capacity(targets.len());
    for t in &targets {
        let mut mine = Vec::new();
        for (p, s, d) in plan::needs_hash(src_entries, &t.entries) {
            if unhashed(Some(s)) {
                src_hash.insert(p.to_string());
            }
            if unhashed(d) {
                mine.push(p.to_string());
            }
        }
        dst_hash.push(mine);
    }
    let n_src = src_hash.len();
    let smeter = obs.step(Step::Hash, src_side.host);
    let (s, d) = both(
        || src_side.stat(src, src_hash.into_iter().collect(), HashMode::All, &*smeter),
        || stat_each_target(&mut targets, dst_hash, HashMode::All, obs),
    );
    src_entries.extend(index(s?));
    smeter.finish();
    for (t, e) in targets.iter_mut().zip(d) {
        t.entries.extend(index(e?));
    }

    // Phase 3: the bytecode of the `.py` files that may change (see
    // `plan::bytecode_to_stat`): on the source the union, on each target
    // its own.
    let mut src_pyc: BTreeSet<String> = BTreeSet::new();
    let mut dst_pyc: Vec<Vec<String>> = Vec::with_capacity(targets.len());
    for t in &targets {
        let plan::BytecodeToStat { source, target } =
            plan::bytecode_to_stat(src_entries, &t.entries);
        src_pyc.extend(source);
        dst_pyc.push(target);
    }
    let (s, d) = both(
        || src_side.stat(src, src_pyc.into_iter().collect(), HashMode::None, &Silent),
        || stat_each_target(&mut targets, dst_pyc, HashMode::None, &Silent),
    );
    src_entries.extend(index(s?));
    for (t, e) in targets.iter_mut().zip(d) {
        t.entries.extend(index(e?));
    }
    Ok(n_src)
}

/// Phase 1 of [`plan_for_venv`], everyone at once: stat the source's
/// members in `src_order`, and each target's own members and the source's
/// others. Sets each target's entries; returns the source's.
fn stat_everyone(
    sets: &[crate::model::Set],
    globs: &[String],
    (src_side, src): (&StatSide, &mut Client),
    src_order: &[&str],
    targets: &mut [&mut Target],
) -> Result<plan::Entries> {
    let (s, d) = both(
        || {
            src_side
                .stat_members(src, sets, globs, &[], src_order)
                .map(index)
        },
        || {
            std::thread::scope(|sc| {
                let handles: Vec<_> = targets
                    .iter_mut()
                    .map(|t| {
                        sc.spawn(move || -> Result<plan::Entries> {
                            let Target {
                                host, client, scan, ..
                            } = &mut **t;
                            let (dst_members, dst_own) = members_and_order(sets, scan, globs);
                            let extra = plan::sorted_difference(src_order, &dst_own);
                            let order = plan::stat_order(&dst_members, &extra);
                            let side = StatSide {
                                host: &host.name,
                                venv: &host.venv,
                                shebang: None,
                                pycache: true,
                            };
                            side.stat_members(client, sets, globs, &extra, &order)
                                .map(index)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("worker thread panicked"))
                    .collect::<Vec<_>>()
            })
        },
    );
    let src_entries = s?;
    for (t, e) in targets.iter_mut().zip(d) {
        t.entries = e?;
    }
    Ok(src_entries)
}

/// Stat each target's own `paths` (in `targets` order) at the same time,
/// each with its progress meter on `obs`.
fn stat_each_target(
    targets: &mut [&mut Target],
    paths: Vec<Vec<String>>,
    mode: HashMode,
    obs: &dyn Observer,
) -> Vec<Result<Vec<crate::model::Entry>>> {
    std::thread::scope(|sc| {
        let handles: Vec<_> = targets
            .iter_mut()
            .zip(paths)
            .map(|(t, paths)| {
                sc.spawn(move || -> Result<Vec<crate::model::Entry>> {
                    let meter = obs.step(Step::Hash, &t.host.name);
                    let side = StatSide {
                        host: &t.host.name,
                        venv: &t.host.venv,
                        shebang: None,
                        pycache: true,
                    };
                    let r = side.stat(&mut t.client, paths, mode, &*meter);
                    if r.is_ok() {
                        meter.finish();
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread panicked"))
            .collect()
    })
}

/// The folder that holds the targets' plans of the fleet plan at `out`:
/// `.overlay/plan.json` → `.overlay/plan.d`.
pub fn plans_dir(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map_or_else(|| "plan".into(), |s| s.to_string_lossy().into_owned());
    out.with_file_name(format!("{stem}.d"))
}

/// Save each target's plan in [`plans_dir`], then the [`FleetPlan`] at
/// `out` (each file written atomically). Returns the targets' plan files.
pub fn save_many(plans: &[Plan], out: &Path) -> Result<Vec<PathBuf>> {
    let dir = plans_dir(out);
    let dir_name = dir
        .file_name()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let mut files = Vec::with_capacity(plans.len());
    let mut targets = Vec::with_capacity(plans.len());
    for p in plans {
        let file = dir.join(format!("{}.json", p.target.name));
        crate::ops::plan::save(p, &file)?;
        targets.push(FleetTarget {
            name: p.target.name.clone(),
            plan: format!("{dir_name}/{}.json", p.target.name),
        });
        files.push(file);
    }
    let fleet = FleetPlan {
        format: PLAN_FORMAT,
        source: plans
            .first()
            .map_or_else(String::new, |p| p.source.name.clone()),
        targets,
    };
    let text = serde_json::to_string_pretty(&fleet).expect("a fleet plan serializes") + "\n";
    crate::ops::plan::write_atomic(out, |w| w.write_all(text.as_bytes()))?;
    Ok(files)
}

/// An observer that passes each line on once, however often it is told.
struct Once<'a> {
    inner: &'a dyn Observer,
    seen: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Once<'_> {
    fn first(&self, line: &str) -> bool {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(line.to_string())
    }
}

impl Observer for Once<'_> {
    fn status(&self, line: &str) {
        if self.first(line) {
            self.inner.status(line);
        }
    }
    fn detail(&self, line: &str) {
        if self.first(line) {
            self.inner.detail(line);
        }
    }
    fn note(&self, line: &str) {
        if self.first(line) {
            self.inner.note(line);
        }
    }
    fn warn(&self, line: &str) {
        if self.first(line) {
            self.inner.warn(line);
        }
    }
    fn step(&self, step: Step, on: &str) -> Box<dyn Meter> {
        self.inner.step(step, on)
    }
    fn checked(&self, host: &str, report: &crate::model::VerifyReport, log: &Path) {
        self.inner.checked(host, report, log);
    }
}
