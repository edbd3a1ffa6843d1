//! Deciding a plan: [`compute`] takes what the two agents reported (scans
//! and per-path entries) and returns each set's changes and the warnings.
//! The steps, in order: check the sets' members ([`check_members`]), then
//! per set ([`Planner::set_plan`]) decide each source path
//! ([`Planner::source_path`]) and each path only the target set has
//! ([`Planner::target_only_path`]). A changed `.py` takes its bytecode
//! with it: the source's `__pycache__` files of it are carried (added, or
//! replacing the target's of the same name), the target's others are
//! deleted as stale ([`Planner::record`]; the controller stats both sides'
//! bytecode first, [`bytecode_to_stat`]). Where the venvs' paths differ,
//! a RECORD that lists a `bin/` script the plan places (its shebang
//! rewritten for the target) is replaced even when both sides have it
//! alike, so that the target can rewrite the script's row as pip would
//! ([`Planner::records_of_placed_scripts`]). The per-path rules are in
//! [`super::paths`].

use std::collections::BTreeSet;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::err;
use crate::error::Result;
use crate::model::{Action, Dist, Entry, Kind, ScanReport, Set};
use crate::plan::members::{Members, members_of, sorted_difference};
use crate::plan::paths::{
    not_carried, not_deleted, not_written, special_bits_warning, without_special_bits,
};
use crate::plan::side::{Entries, Side};
use crate::plan::versions::transitions;
use crate::plan::{Change, SetPlan, Warning};

/// What [`compute`] decided.
#[derive(Debug)]
pub struct Computed {
    /// Each set's plan, in the order of the sets given.
    pub sets: Vec<SetPlan>,
    pub warnings: Vec<Warning>,
}

/// The paths whose content decides the plan: regular files on both sides
/// with the same size, and `bin/` scripts (their shebang may be rewritten,
/// which changes their size on the source).
/// Yields each such path with its source entry and its target entry, if any.
pub fn needs_hash<'a>(
    src: &'a Entries,
    dst: &'a Entries,
) -> impl Iterator<Item = (&'a str, &'a Entry, Option<&'a Entry>)> {
    src.iter().filter_map(|(p, s)| {
        let d = dst.get(p);
        let needed = match (&s.kind, d.map(|e| &e.kind)) {
            (Kind::File { .. }, _) if p.starts_with("../../../bin/") => true,
            (Kind::File { size: a, .. }, Some(Kind::File { size: b, .. })) => a == b,
            _ => false,
        };
        needed.then_some((p.as_str(), s, d))
    })
}

/// The bytecode a plan stats after the hash phase, so that [`compute`]
/// can carry it with the `.py` files that change.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BytecodeToStat {
    /// The source's `__pycache__` files of each source `.py` that may
    /// change (sorted, site-packages-relative).
    pub source: Vec<String>,
    /// The target's files of the same names (those a carried file would
    /// replace).
    pub target: Vec<String>,
}

/// What [`BytecodeToStat`] asks of each side, from the stat and hash
/// phases' entries (stat'ed with their bytecode listed). A `.py` may change
/// unless both sides have it as a file of the same size, mode and hash.
pub fn bytecode_to_stat(src: &Entries, dst: &Entries) -> BytecodeToStat {
    let mut out = BytecodeToStat::default();
    for (p, s) in src {
        if !p.ends_with(".py") || s.pyc.is_empty() {
            continue;
        }
        let d = dst.get(p);
        let may_change = match (&s.kind, d.map(|d| &d.kind)) {
            (
                Kind::File {
                    size: a,
                    mode: ma,
                    blake3: ha,
                    ..
                },
                Some(Kind::File {
                    size: b,
                    mode: mb,
                    blake3: hb,
                    ..
                }),
            ) => a != b || ma != mb || ha.is_none() || ha != hb,
            (Kind::File { .. }, _) => true,
            _ => false,
        };
        if !may_change {
            continue;
        }
        out.source.extend(s.pyc.iter().cloned());
        if let Some(d) = d {
            out.target
                .extend(d.pyc.iter().filter(|t| s.pyc.contains(t)).cloned());
        }
    }
    out.source.sort();
    out.target.sort();
    out
}

/// Decide the plan. `sets` are the manifest's sets to carry out, in order.
pub fn compute(sets: &[Set], src: &Side, dst: &Side) -> Result<Computed> {
    compute_with(
        sets,
        src,
        dst,
        members_of(sets, src.scan, src.globs),
        members_of(sets, dst.scan, dst.globs),
    )
}

/// [`compute`] with each set's [`members`](fn@super::members) on both sides
/// already known (the controller needed them to ask for the stats), in
/// `sets` order.
pub fn compute_with<'a>(
    sets: &[Set],
    src: &Side<'a>,
    dst: &Side<'a>,
    src_members: Vec<Members<'a>>,
    dst_members: Vec<Members<'a>>,
) -> Result<Computed> {
    check_members(sets, src, dst, &src_members, &dst_members)?;
    let mut planner = Planner {
        src,
        dst,
        owners: owners(dst.scan),
        all_source: carried_anywhere(src, &src_members),
        claimed: Default::default(),
        warnings: Vec::new(),
    };
    let mut unchanged_records = Vec::new();
    let mut plans: Vec<SetPlan> = sets
        .iter()
        .zip(&src_members)
        .zip(&dst_members)
        .enumerate()
        .map(|(i, ((set, sm), dm))| {
            let (plan, records) = planner.set_plan(set, sm, dm);
            unchanged_records.extend(records.into_iter().map(|p| (i, p)));
            plan
        })
        .collect();
    if src.scan.venv != dst.scan.venv {
        planner.records_of_placed_scripts(&mut plans, &unchanged_records);
    }
    Ok(Computed {
        sets: plans,
        warnings: planner.warnings,
    })
}

/// A distribution's RECORD (`NAME.dist-info/RECORD`, relative to
/// site-packages).
fn is_record(path: &str) -> bool {
    path.split_once('/')
        .is_some_and(|(dir, file)| dir.ends_with(".dist-info") && file == "RECORD")
}

/// A script in the venv's `bin/` (relative to site-packages, as RECORD
/// names it): its shebang is rewritten where the venvs' paths differ.
fn is_script(path: &str) -> bool {
    path.starts_with("../../../bin/")
}

/// Refuse a set that names nothing on the source, and any set with a
/// damaged distribution on either side.
fn check_members(
    sets: &[Set],
    src: &Side,
    dst: &Side,
    src_members: &[Members],
    dst_members: &[Members],
) -> Result<()> {
    for ((set, sm), dm) in sets.iter().zip(src_members).zip(dst_members) {
        if sm.paths.is_empty() {
            return Err(err!(
                kind = Usage,
                hint = "check the set's `dists` and `files` against `pip list` on the source; names are compared PEP 503-normalized",
                "Set {} matches nothing on the source host {} ({})",
                set.name,
                src.host,
                src.scan.venv
            ));
        }
        for (side, m) in [(src, sm), (dst, dm)] {
            for d in &m.dists {
                if let Some(p) = &d.problem {
                    return Err(err!(
                        hint = "reinstall that distribution on that host (pip install --force-reinstall --no-deps), or leave it out of the set",
                        "Distribution {} {} on {} is damaged: {p} (in {}/{})",
                        d.name,
                        d.version,
                        side.host,
                        side.scan.venv,
                        side.scan.site_packages
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A distribution with two or more dist-infos in a set, on either side: a
/// broken install (an older transplant that left the old dist-info, a
/// failed uninstall) where pip and `importlib.metadata` see only one of
/// them. On the target the overlay deletes the files of them all and the
/// source's arrive; on the source every one of them would be carried.
fn duplicate_dist_infos(
    set: &Set,
    (src_host, sm): (&str, &Members),
    (dst_host, dm): (&str, &Members),
) -> Vec<Warning> {
    let groups = |m: &Members| {
        let mut by: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for d in &m.dists {
            by.entry(d.normalized.clone())
                .or_default()
                .push(d.dist_info.clone());
        }
        by.retain(|_, v| v.len() > 1);
        by
    };
    let arriving: BTreeSet<&str> = sm.dists.iter().map(|d| d.normalized.as_str()).collect();
    let mut out = Vec::new();
    for (name, infos) in groups(dm) {
        let after = if arriving.contains(name.as_str()) {
            format!(
                "the overlay removes every file their RECORDs list and brings {src_host}'s {name} in their place"
            )
        } else {
            "the overlay removes every file their RECORDs list".to_string()
        };
        out.push(Warning {
            set: Some(set.name.clone()),
            path: None,
            message: format!(
                "{dst_host} has {} dist-infos of {name} ({}): pip sees only one of them; {after}",
                infos.len(),
                infos.join(", "),
            ),
        });
    }
    for (name, infos) in groups(sm) {
        out.push(Warning {
            set: Some(set.name.clone()),
            path: None,
            message: format!(
                "{src_host} has {} dist-infos of {name} ({}): all would be carried, and pip on the target would see only one; remove the stale one on {src_host} (`overlay doctor` names it)",
                infos.len(),
                infos.join(", "),
            ),
        });
    }
    out
}

/// Who owns each path on the target.
fn owners(scan: &ScanReport) -> FxHashMap<&str, Vec<&Dist>> {
    let mut owners: FxHashMap<&str, Vec<&Dist>> = Default::default();
    for d in &scan.dists {
        for f in &d.files {
            owners.entry(f.as_str()).or_default().push(d);
        }
    }
    owners
}

/// Every path some set carries from the source: never deleted by another set.
fn carried_anywhere<'a>(src: &Side, src_members: &[Members<'a>]) -> FxHashSet<&'a str> {
    let mut all_source: FxHashSet<&str> = Default::default();
    for m in src_members {
        for &p in &m.paths {
            if src.entries.get(p).is_some_and(|e| e.kind.exists()) {
                all_source.insert(p);
            }
        }
    }
    all_source
}

/// The state shared by all sets while a plan is decided.
struct Planner<'a, 's> {
    src: &'s Side<'a>,
    dst: &'s Side<'a>,
    /// Who owns each path on the target.
    owners: FxHashMap<&'a str, Vec<&'a Dist>>,
    /// Every path some set carries from the source.
    all_source: FxHashSet<&'a str>,
    /// The set that carries or deletes each path: the first to name it.
    claimed: FxHashMap<&'a str, &'s str>,
    warnings: Vec<Warning>,
}

/// One set's plan while it is decided.
struct SetWork<'a> {
    plan: SetPlan,
    /// Bytecode on the target of the `.py` files that change.
    stale: BTreeSet<String>,
    /// Files whose setuid, setgid or sticky bits are dropped.
    special: Vec<&'a str>,
    /// The target's distributions in this set, matched once (not per path).
    in_set: BTreeSet<&'a str>,
    /// The RECORDs this set counted unchanged (the same on both sides).
    unchanged_records: Vec<&'a str>,
}

impl<'a, 's> Planner<'a, 's> {
    /// Decide one set: its source paths, then the paths only the target
    /// has. Also returns the RECORDs it counted unchanged.
    fn set_plan(
        &mut self,
        set: &'s Set,
        sm: &Members<'a>,
        dm: &Members<'a>,
    ) -> (SetPlan, Vec<&'a str>) {
        let mut work = SetWork {
            plan: SetPlan {
                name: set.name.clone(),
                versions: transitions(&sm.dists, &dm.dists),
                changes: Vec::new(),
                unchanged: 0,
                unchanged_bytes: 0,
                stale_bytecode: Vec::new(),
                from: None,
            },
            stale: BTreeSet::new(),
            special: Vec::new(),
            in_set: dm.dists.iter().map(|d| d.normalized.as_str()).collect(),
            unchanged_records: Vec::new(),
        };
        self.warnings.extend(duplicate_dist_infos(
            set,
            (self.src.host, sm),
            (self.dst.host, dm),
        ));
        for &path in &sm.paths {
            self.source_path(&mut work, set, sm, path);
        }
        let host = self.src.host;
        self.warnings
            .extend(special_bits_warning(&set.name, host, &work.special));
        for path in sorted_difference(&dm.paths, &sm.paths) {
            self.target_only_path(&mut work, set, path);
        }
        let mut plan = work.plan;
        plan.changes.sort_by(|a, b| a.path.cmp(&b.path));
        plan.stale_bytecode = work.stale.into_iter().collect();
        (plan, work.unchanged_records)
    }

    /// Make each RECORD that lists a script the plan places, and that the
    /// plan would leave unchanged, a change of the set that counted it: the
    /// placed script's shebang names the target's venv, so the row the
    /// RECORD has for it (the source's script) no longer describes it. The
    /// target rewrites the row as pip would (`journal::records`, the rule
    /// for every staged RECORD): only where the script, with its shebang
    /// put back to the source's venv, matches the row. Called only where
    /// the venvs' paths differ; `unchanged`: (set index, RECORD) as
    /// [`Self::set_plan`] counted them.
    fn records_of_placed_scripts(&self, plans: &mut [SetPlan], unchanged: &[(usize, &str)]) {
        if unchanged.is_empty() {
            return;
        }
        let placed: FxHashSet<&str> = plans
            .iter()
            .flat_map(|p| &p.changes)
            .filter(|c| {
                c.action != Action::Delete
                    && is_script(&c.path)
                    && matches!(c.source, Some(Kind::File { .. }))
            })
            .map(|c| c.path.as_str())
            .collect();
        if placed.is_empty() {
            return;
        }
        let records: FxHashSet<String> = self
            .src
            .scan
            .dists
            .iter()
            .filter(|d| {
                d.files
                    .iter()
                    .any(|f| is_script(f) && placed.contains(f.as_str()))
            })
            .map(|d| format!("{}/RECORD", d.dist_info))
            .collect();
        let mut touched = BTreeSet::new();
        for &(i, path) in unchanged {
            if !records.contains(path) {
                continue;
            }
            let (Some(s), Some(t)) = (self.src.entries.get(path), self.dst.entries.get(path))
            else {
                continue;
            };
            let skind = without_special_bits(&s.kind).unwrap_or_else(|| s.kind.clone());
            let plan = &mut plans[i];
            plan.unchanged = plan.unchanged.saturating_sub(1);
            plan.unchanged_bytes = plan.unchanged_bytes.saturating_sub(skind.size());
            plan.changes.push(Change {
                path: path.to_string(),
                action: Action::Replace,
                size: skind.size(),
                source: Some(skind),
                target: Some(t.kind.clone()),
            });
            touched.insert(i);
        }
        for i in touched {
            plans[i].changes.sort_by(|a, b| a.path.cmp(&b.path));
        }
    }

    /// Decide a path the source set has: add it, replace the target's,
    /// count it unchanged, or leave it out with a warning.
    fn source_path(
        &mut self,
        work: &mut SetWork<'a>,
        set: &'s Set,
        sm: &Members<'a>,
        path: &'a str,
    ) {
        let (src, dst) = (self.src, self.dst);
        let Some(s) = src.entries.get(path) else {
            return;
        };
        if let Some(message) = not_carried(src, dst, path, &s.kind) {
            return self.warn(set, path, message);
        }
        let masked = without_special_bits(&s.kind);
        let skind = masked.as_ref().unwrap_or(&s.kind);
        if let Some(first) = self.claimed.get(path) {
            let message = format!(
                "{path} is in sets {first} and {}; set {first} carries it",
                set.name
            );
            return self.warn(set, path, message);
        }
        self.claimed.insert(path, &set.name);
        let t = dst
            .entries
            .get(path)
            .map(|e| &e.kind)
            .filter(|k| k.exists());
        if let Some(message) = not_written(dst, path, t) {
            return self.warn(set, path, message);
        }
        let action = match t {
            None => Action::Add,
            Some(t) if skind.same_as(t) => {
                work.plan.unchanged += 1;
                work.plan.unchanged_bytes += skind.size();
                if is_record(path) {
                    work.unchanged_records.push(path);
                }
                return;
            }
            Some(_) => Action::Replace,
        };
        if masked.is_some() {
            work.special.push(path);
        }
        if sm.dist_paths.binary_search(&path).is_ok() {
            let foreign = self.foreign_owners(work, path);
            if !foreign.is_empty() && t.is_some() {
                let message = format!(
                    "{path} also belongs to {} on {}, outside the set; it is overwritten",
                    foreign.join(", "),
                    dst.host
                );
                self.warn(set, path, message);
            }
        }
        self.record(work, path, action, skind.size(), Some(skind), t);
    }

    /// Decide a path only the target set has: delete it, or keep it with a
    /// warning (another set carries it, it is not a file or symlink, or a
    /// distribution outside the set owns it).
    fn target_only_path(&mut self, work: &mut SetWork<'a>, set: &'s Set, path: &'a str) {
        let dst = self.dst;
        let Some(t) = dst
            .entries
            .get(path)
            .map(|e| &e.kind)
            .filter(|k| k.exists())
        else {
            return;
        };
        if self.all_source.contains(path) {
            return; // another set carries this path from the source
        }
        if let Some(message) = not_deleted(dst, path, t) {
            return self.warn(set, path, message);
        }
        let foreign = self.foreign_owners(work, path);
        if !foreign.is_empty() {
            let message = format!(
                "{path} would be deleted, but {} on {} also owns it; it is kept",
                foreign.join(", "),
                dst.host
            );
            return self.warn(set, path, message);
        }
        if self.claimed.contains_key(path) {
            return;
        }
        self.claimed.insert(path, &set.name);
        self.record(work, path, Action::Delete, t.size(), None, Some(t));
    }

    /// Target distributions outside the set that own `path`, as "name version".
    fn foreign_owners(&self, work: &SetWork, path: &str) -> Vec<String> {
        self.owners
            .get(path)
            .into_iter()
            .flatten()
            .filter(|d| !work.in_set.contains(d.normalized.as_str()))
            .map(|d| format!("{} {}", d.name, d.version))
            .collect()
    }

    /// Add a change to the set. A changed `.py` takes its bytecode with
    /// it: a `.py` the source provides carries the source's bytecode of it
    /// (as stat'ed, [`bytecode_to_stat`]: valid on the target, since the
    /// `.py` keeps its mtime and the interpreters match), adding it or
    /// replacing the target's file of the same name; the target's other
    /// bytecode of the `.py` is deleted as stale.
    fn record(
        &self,
        work: &mut SetWork,
        path: &str,
        action: Action,
        size: u64,
        source: Option<&Kind>,
        target: Option<&Kind>,
    ) {
        if path.ends_with(".py") {
            let carried: Vec<(&str, &Kind)> = match (source, self.src.entries.get(path)) {
                (Some(_), Some(e)) => e
                    .pyc
                    .iter()
                    .filter_map(|p| {
                        let s = &self.src.entries.get(p.as_str())?.kind;
                        let t = self.dst.entries.get(p.as_str()).map(|e| &e.kind);
                        let fits = matches!(s, Kind::File { .. })
                            && matches!(t, None | Some(Kind::File { .. } | Kind::Missing));
                        fits.then_some((p.as_str(), s))
                    })
                    .collect(),
                _ => Vec::new(),
            };
            if let Some(e) = self.dst.entries.get(path) {
                work.stale.extend(
                    e.pyc
                        .iter()
                        .filter(|p| !carried.iter().any(|(c, _)| c == p))
                        .cloned(),
                );
            }
            for (p, s) in carried {
                let t = self
                    .dst
                    .entries
                    .get(p)
                    .map(|e| &e.kind)
                    .filter(|k| k.exists());
                work.plan.changes.push(Change {
                    path: p.to_string(),
                    action: if t.is_some() {
                        Action::Replace
                    } else {
                        Action::Add
                    },
                    size: s.size(),
                    source: Some(without_special_bits(s).unwrap_or_else(|| s.clone())),
                    target: t.cloned(),
                });
            }
        }
        work.plan.changes.push(Change {
            path: path.to_string(),
            action,
            size,
            source: source.cloned(),
            target: target.cloned(),
        });
    }

    fn warn(&mut self, set: &Set, path: &str, message: String) {
        self.warnings.push(Warning {
            set: Some(set.name.clone()),
            path: Some(path.to_string()),
            message,
        });
    }
}

#[cfg(test)]
mod tests;
