//! The plan as data, and the set semantics that decide it. Nothing here
//! touches a host: [`compute`] takes what the agents reported (scans and
//! per-path entries) and returns a [`Plan`] that `overlay apply` carries out.
//!
//! A set mirrors the source onto the target, file by file. A path the source
//! set has is added or replaced; a path only the target set has is deleted
//! unless a target distribution outside the set owns it (then it is kept and
//! a warning names the owner). `__pycache__` is never part of a set; the
//! bytecode of every `.py` file that changes is deleted with it.
//!
//! Only files and symlinks are carried. Left out, each with a warning
//! (docs/plan.md, "What is left out"): paths into overlay's state folder
//! `.overlay/`, paths not spelled plainly, directories named by a RECORD row
//! (on either side: a directory goes only when the deletes leave it empty),
//! paths behind a symlinked parent directory, devices and fifos. Modes are
//! carried without setuid, setgid and sticky bits. The target's agent checks
//! the result again (`validate::check_prepare`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::err;
use crate::error::Result;
use crate::manifest::matches_any;
use crate::model::{Action, Dist, Entry, Kind, Problem, ScanReport, Set};
use crate::validate::{MODE_MASK, canonical, state_path};

/// Version of the saved plan format.
pub const PLAN_FORMAT: u32 = 2;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub format: u32,
    /// Seconds since the epoch when the plan was made.
    pub created: u64,
    pub manifest: String,
    pub source: HostInfo,
    pub target: HostInfo,
    pub sets: Vec<SetPlan>,
    pub warnings: Vec<Warning>,
    /// Predicted breakage after the overlay (see `preflight`).
    #[serde(default)]
    pub problems: Vec<Problem>,
    /// `--strict` or `[preflight] strict`: problems are errors, and apply refuses the plan without `--force`.
    #[serde(default)]
    pub strict: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostInfo {
    pub name: String,
    /// The manifest's `ssh` value; absent for the local machine.
    pub ssh: Option<String>,
    /// The manifest's `direct_ssh` value (see `apply --direct`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_ssh: Option<String>,
    pub venv: String,
    /// Relative to the venv.
    pub site_packages: String,
    pub python: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SetPlan {
    pub name: String,
    pub versions: Vec<Transition>,
    pub changes: Vec<Change>,
    pub unchanged: u64,
    pub unchanged_bytes: u64,
    /// Compiled bytecode on the target deleted because its `.py` changes.
    pub stale_bytecode: Vec<String>,
}

/// A distribution's version before and after (`None`: absent).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Transition {
    pub name: String,
    pub from: Option<String>,
    pub to: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Change {
    /// Relative to the target's site-packages, as RECORD writes it.
    pub path: String,
    pub action: Action,
    /// Bytes: the source file's for add and replace, the target's for delete.
    pub size: u64,
    /// What the source has (add, replace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Kind>,
    /// What the target has now (replace, delete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Kind>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Warning {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub message: String,
}

/// What one host reported.
pub struct Side<'a> {
    pub host: &'a str,
    pub scan: &'a ScanReport,
    /// The file globs sent with the scan, in the same order as `scan.globs`.
    pub globs: &'a [String],
    pub entries: &'a Entries,
}

/// A host's stat entries by path. (Fx-hashed: the plan looks paths up
/// ~200,000 times, and SipHash's DoS resistance buys nothing against the
/// controller's own input.)
pub type Entries = HashMap<String, Entry, rustc_hash::FxBuildHasher>;

/// The distributions and paths of one set on one host. The path lists are
/// sorted and without repeats (sorted vectors: a torch stack's 35,000
/// paths sort in a few ms, where inserting them into ordered sets one by
/// one took ~15 ms per list on both the controller and the agents).
pub struct Members<'a> {
    pub dists: Vec<&'a Dist>,
    /// Paths owned by the set's distributions.
    pub dist_paths: Vec<&'a str>,
    /// All paths: distribution files plus glob matches.
    pub paths: Vec<&'a str>,
}

/// Sort and drop repeats.
fn sorted_unique(mut v: Vec<&str>) -> Vec<&str> {
    v.sort_unstable();
    v.dedup();
    v
}

/// The set's members on a host (from its scan; entries not needed).
pub fn members<'a>(set: &Set, scan: &'a ScanReport, globs: &[String]) -> Members<'a> {
    let dists: Vec<&Dist> = scan
        .dists
        .iter()
        .filter(|d| matches_any(&set.dists, &d.normalized))
        .collect();
    let dist_paths = sorted_unique(
        dists
            .iter()
            .flat_map(|d| d.files.iter().map(String::as_str))
            .collect(),
    );
    let mut globbed: Vec<&str> = Vec::new();
    for g in &set.files {
        if let Some(i) = globs.iter().position(|x| x == g) {
            globbed.extend(scan.globs.get(i).into_iter().flatten().map(String::as_str));
        }
    }
    let paths = if globbed.is_empty() {
        dist_paths.clone()
    } else {
        merge_sorted(&dist_paths, &sorted_unique(globbed))
    };
    Members {
        dists,
        dist_paths,
        paths,
    }
}

/// Each set's [`members`] on a host, in `sets` order.
pub fn members_of<'a>(sets: &[Set], scan: &'a ScanReport, globs: &[String]) -> Vec<Members<'a>> {
    sets.iter().map(|s| members(s, scan, globs)).collect()
}

/// The paths a stat of `members` and `extra` answers for, in its order:
/// sorted, each once. The controller and the agent both compute it (see
/// `Request::StatMembers`).
pub fn stat_order<'a>(members: &[Members<'a>], extra: &[&'a str]) -> Vec<&'a str> {
    let mut order: Vec<&str> = Vec::new();
    for m in members {
        order = merge_sorted(&order, &m.paths);
    }
    merge_sorted(&order, &sorted_unique(extra.to_vec()))
}

/// The union of two sorted lists without repeats, sorted.
fn merge_sorted<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(b[j]) {
            std::cmp::Ordering::Less => {
                out.push(a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(b[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                out.push(a[i]);
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
    out
}

/// The items of sorted `a` that sorted `b` lacks, in order.
pub fn sorted_difference<'a>(a: &[&'a str], b: &[&str]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut j = 0;
    for &x in a {
        while j < b.len() && b[j] < x {
            j += 1;
        }
        if b.get(j) != Some(&x) {
            out.push(x);
        }
    }
    out
}

/// A checksum of a [`stat_order`], to tell that two computations agree.
pub fn order_check(order: &[&str]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = rustc_hash::FxHasher::default();
    order.hash(&mut h);
    h.finish()
}

fn version_of(d: &Dist) -> String {
    d.build.clone().unwrap_or_else(|| d.version.clone())
}

/// Check the interpreters agree; compiled extensions are built per minor version.
pub fn check_python(src: &HostInfo, dst: &HostInfo) -> Result<()> {
    if src.python != dst.python {
        return Err(err!(
            "Python {} on {} but {} on {}: compiled extensions (cpython-{}) built for one will not load in the other",
            src.python,
            src.name,
            dst.python,
            dst.name,
            src.python.replace('.', "")
        )
        .hint(format!(
            "overlay between venvs of the same Python minor version, or rebuild the venv on {} with Python {}",
            dst.name, src.python
        )));
    }
    Ok(())
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

/// Why the site-relative `path` is never carried, if it is not: it points
/// into overlay's state folder, or it is not spelled the one plain way
/// (`validate::canonical`), which the target would refuse.
fn left_out(site_rel: &str, path: &str) -> Option<&'static str> {
    if state_path(site_rel, path) {
        Some("points into overlay's state folder")
    } else if crate::beneath::normalize(path).is_none() && canonical(site_rel, path).is_none() {
        Some("is not spelled as a plain path (empty, `.` or needless `..` parts)")
    } else {
        None
    }
}

/// The names of `paths` for a message: all of them when few, else the first few and a count.
fn some_of(paths: &[&str]) -> String {
    const SHOWN: usize = 5;
    let mut s = paths
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > SHOWN {
        s.push_str(&format!(" and {} more", paths.len() - SHOWN));
    }
    s
}

/// Decide the plan. `sets` are the manifest's sets to carry out, in order.
pub fn compute(sets: &[Set], src: &Side, dst: &Side) -> Result<(Vec<SetPlan>, Vec<Warning>)> {
    compute_with(
        sets,
        src,
        dst,
        members_of(sets, src.scan, src.globs),
        members_of(sets, dst.scan, dst.globs),
    )
}

/// [`compute`] with each set's [`members`] on both sides already known (the
/// controller needed them to ask for the stats), in `sets` order.
pub fn compute_with<'a>(
    sets: &[Set],
    src: &Side<'a>,
    dst: &Side<'a>,
    src_members: Vec<Members<'a>>,
    dst_members: Vec<Members<'a>>,
) -> Result<(Vec<SetPlan>, Vec<Warning>)> {
    let mut warnings = Vec::new();
    let warn = |w: &mut Vec<Warning>, set: &str, path: Option<&str>, message: String| {
        w.push(Warning {
            set: Some(set.to_string()),
            path: path.map(str::to_string),
            message,
        })
    };

    // Who owns each path on the target.
    let mut owners: rustc_hash::FxHashMap<&str, Vec<&Dist>> = Default::default();
    for d in &dst.scan.dists {
        for f in &d.files {
            owners.entry(f.as_str()).or_default().push(d);
        }
    }

    for (set, m) in sets.iter().zip(&src_members) {
        if m.paths.is_empty() {
            return Err(err!(
                kind = Usage,
                hint = "check the set's `dists` and `files` against `pip list` on the source; names are compared PEP 503-normalized",
                "Set {} matches nothing on the source host {} ({})",
                set.name,
                src.host,
                src.scan.venv
            ));
        }
        for (side, host, m) in [
            (src, src.host, m),
            (
                dst,
                dst.host,
                &dst_members[sets.iter().position(|s| s == set).unwrap()],
            ),
        ] {
            for d in &m.dists {
                if let Some(p) = &d.problem {
                    return Err(err!(
                        hint = "reinstall that distribution on that host (pip install --force-reinstall --no-deps), or leave it out of the set",
                        "Distribution {} {} on {} is damaged: {p} (in {}/{})",
                        d.name,
                        d.version,
                        host,
                        side.scan.venv,
                        side.scan.site_packages
                    ));
                }
            }
        }
    }

    // Every path some set carries from the source: never deleted by another set.
    let mut all_source: rustc_hash::FxHashSet<&str> = Default::default();
    for m in &src_members {
        for &p in &m.paths {
            if src.entries.get(p).is_some_and(|e| e.kind.exists()) {
                all_source.insert(p);
            }
        }
    }

    let mut claimed: rustc_hash::FxHashMap<&str, &str> = Default::default();
    let mut out = Vec::new();
    for ((set, sm), dm) in sets.iter().zip(&src_members).zip(&dst_members) {
        let mut plan = SetPlan {
            name: set.name.clone(),
            versions: transitions(&sm.dists, &dm.dists),
            changes: Vec::new(),
            unchanged: 0,
            unchanged_bytes: 0,
            stale_bytecode: Vec::new(),
        };
        let mut stale = BTreeSet::new();
        // Files whose setuid, setgid or sticky bits are dropped.
        let mut special: Vec<&str> = Vec::new();
        // The target's distributions in this set, matched once (not per path).
        let in_set: BTreeSet<&str> = dm.dists.iter().map(|d| d.normalized.as_str()).collect();
        // Target distributions outside this set that own `path`, as "name version".
        let foreign_owners = |path: &str| -> Vec<String> {
            owners
                .get(path)
                .into_iter()
                .flatten()
                .filter(|d| !in_set.contains(d.normalized.as_str()))
                .map(|d| format!("{} {}", d.name, d.version))
                .collect()
        };
        let mut record = |plan: &mut SetPlan,
                          path: &str,
                          action: Action,
                          size: u64,
                          s: Option<&Kind>,
                          t: Option<&Kind>| {
            if path.ends_with(".py")
                && let Some(e) = dst.entries.get(path)
            {
                stale.extend(e.pyc.iter().cloned());
            }
            plan.changes.push(Change {
                path: path.to_string(),
                action,
                size,
                source: s.cloned(),
                target: t.cloned(),
            });
        };

        for &path in &sm.paths {
            let Some(s) = src.entries.get(path) else {
                continue;
            };
            if state_path(&src.scan.site_packages, path)
                || state_path(&dst.scan.site_packages, path)
            {
                warn(
                    &mut warnings,
                    &set.name,
                    Some(path),
                    format!("{path} points into overlay's state folder; it is left out"),
                );
                continue;
            }
            match &s.kind {
                Kind::Missing => {
                    warn(
                        &mut warnings,
                        &set.name,
                        Some(path),
                        format!(
                            "{path} is listed in a RECORD on {} but missing there; it is left out",
                            src.host
                        ),
                    );
                    continue;
                }
                Kind::Dir { .. } => {
                    warn(
                        &mut warnings,
                        &set.name,
                        Some(path),
                        format!(
                            "{path} is a directory on {}; overlay carries files and symlinks, never a directory named by a RECORD row or glob; it is left out",
                            src.host
                        ),
                    );
                    continue;
                }
                Kind::ThroughSymlink { link } => {
                    warn(
                        &mut warnings,
                        &set.name,
                        Some(path),
                        format!(
                            "{path}: its parent {link} is a symlink on {}; overlay never reads through one; it is left out",
                            src.host
                        ),
                    );
                    continue;
                }
                Kind::Other => {
                    warn(
                        &mut warnings,
                        &set.name,
                        Some(path),
                        format!(
                            "{path} on {} is not a regular file or symlink; it is left out",
                            src.host
                        ),
                    );
                    continue;
                }
                Kind::File { .. } | Kind::Symlink { .. } => {}
            }
            if let Some(why) =
                left_out(&src.scan.site_packages, path).or(left_out(&dst.scan.site_packages, path))
            {
                warn(
                    &mut warnings,
                    &set.name,
                    Some(path),
                    format!("{path} {why}; it is left out"),
                );
                continue;
            }
            // setuid, setgid and sticky bits never travel.
            let masked;
            let skind = match &s.kind {
                Kind::File {
                    size,
                    mode,
                    blake3,
                    stamp,
                } if mode & !MODE_MASK != 0 => {
                    masked = Kind::File {
                        size: *size,
                        mode: mode & MODE_MASK,
                        blake3: blake3.clone(),
                        stamp: *stamp,
                    };
                    &masked
                }
                k => k,
            };
            if let Some(first) = claimed.get(path) {
                warn(
                    &mut warnings,
                    &set.name,
                    Some(path),
                    format!(
                        "{path} is in sets {first} and {}; set {first} carries it",
                        set.name
                    ),
                );
                continue;
            }
            claimed.insert(path, &set.name);
            let t = dst
                .entries
                .get(path)
                .map(|e| &e.kind)
                .filter(|k| k.exists());
            let refused = match t {
                Some(Kind::Dir { .. }) => Some(format!(
                    "{path} is a directory on {}; overlay never replaces a directory; it is left out",
                    dst.host
                )),
                Some(Kind::ThroughSymlink { link }) => Some(format!(
                    "{path}: its parent {link} is a symlink on {}; overlay never writes through one; it is left out",
                    dst.host
                )),
                Some(Kind::Other) => Some(format!(
                    "{path} on {} is not a regular file or symlink; it is left out",
                    dst.host
                )),
                _ => None,
            };
            if let Some(message) = refused {
                warn(&mut warnings, &set.name, Some(path), message);
                continue;
            }
            let action = match t {
                None => Action::Add,
                Some(t) if skind.same_as(t) => {
                    plan.unchanged += 1;
                    plan.unchanged_bytes += skind.size();
                    continue;
                }
                Some(_) => Action::Replace,
            };
            if !std::ptr::eq(skind, &s.kind) {
                special.push(path);
            }
            if sm.dist_paths.binary_search(&path).is_ok() {
                let foreign = foreign_owners(path);
                if !foreign.is_empty() && t.is_some() {
                    warn(
                        &mut warnings,
                        &set.name,
                        Some(path),
                        format!(
                            "{path} also belongs to {} on {}, outside the set; it is overwritten",
                            foreign.join(", "),
                            dst.host
                        ),
                    );
                }
            }
            record(&mut plan, path, action, skind.size(), Some(skind), t);
        }
        if !special.is_empty() {
            warnings.push(Warning {
                set: Some(set.name.clone()),
                path: (special.len() == 1).then(|| special[0].to_string()),
                message: format!(
                    "setuid, setgid or sticky bits of {} file{} on {} are dropped (overlay carries modes up to 0o777): {}",
                    special.len(),
                    if special.len() == 1 { "" } else { "s" },
                    src.host,
                    some_of(&special)
                ),
            });
        }

        for path in sorted_difference(&dm.paths, &sm.paths) {
            let Some(t) = dst
                .entries
                .get(path)
                .map(|e| &e.kind)
                .filter(|k| k.exists())
            else {
                continue;
            };
            if all_source.contains(path) {
                continue; // another set carries this path from the source
            }
            let refused = match t {
                _ if state_path(&dst.scan.site_packages, path) => Some(format!(
                    "{path} points into overlay's state folder; it is kept"
                )),
                Kind::Dir { .. } => Some(format!(
                    "{path} is a directory on {}; a RECORD row never deletes a directory (it goes when the deletes leave it empty); it is kept",
                    dst.host
                )),
                Kind::ThroughSymlink { link } => Some(format!(
                    "{path}: its parent {link} is a symlink on {}; overlay never deletes through one; it is kept",
                    dst.host
                )),
                Kind::File { .. } | Kind::Symlink { .. } => left_out(&dst.scan.site_packages, path)
                    .map(|why| format!("{path} {why}; it is kept")),
                _ => Some(format!(
                    "{path} on {} is not a regular file or symlink; it is kept",
                    dst.host
                )),
            };
            if let Some(message) = refused {
                warn(&mut warnings, &set.name, Some(path), message);
                continue;
            }
            let foreign = foreign_owners(path);
            if !foreign.is_empty() {
                warn(
                    &mut warnings,
                    &set.name,
                    Some(path),
                    format!(
                        "{path} would be deleted, but {} on {} also owns it; it is kept",
                        foreign.join(", "),
                        dst.host
                    ),
                );
                continue;
            }
            if claimed.contains_key(path) {
                continue;
            }
            claimed.insert(path, &set.name);
            record(&mut plan, path, Action::Delete, t.size(), None, Some(t));
        }
        plan.changes.sort_by(|a, b| a.path.cmp(&b.path));
        plan.stale_bytecode = stale.into_iter().collect();
        out.push(plan);
    }
    Ok((out, warnings))
}

/// Pair source and target distributions by normalized name.
fn transitions(src: &[&Dist], dst: &[&Dist]) -> Vec<Transition> {
    let mut by: BTreeMap<&str, (String, Option<String>, Option<String>)> = BTreeMap::new();
    for d in dst {
        let e = by
            .entry(&d.normalized)
            .or_insert((d.name.clone(), None, None));
        e.1 = Some(join_version(e.1.take(), version_of(d)));
    }
    for d in src {
        let e = by
            .entry(&d.normalized)
            .or_insert((d.name.clone(), None, None));
        e.0 = d.name.clone();
        e.2 = Some(join_version(e.2.take(), version_of(d)));
    }
    by.into_values()
        .map(|(name, from, to)| Transition { name, from, to })
        .collect()
}

/// Two dist-infos of one project (a broken install) show as `a, b`.
fn join_version(prev: Option<String>, v: String) -> String {
    match prev {
        Some(p) => format!("{p}, {v}"),
        None => v,
    }
}

/// Totals of a set's changes: (count, bytes) for add, replace, delete.
pub fn totals(set: &SetPlan) -> BTreeMap<Action, (u64, u64)> {
    let mut t = BTreeMap::new();
    for a in [Action::Add, Action::Replace, Action::Delete] {
        t.insert(a, (0, 0));
    }
    for c in &set.changes {
        let e = t.get_mut(&c.action).expect("all actions present");
        e.0 += 1;
        e.1 += c.size;
    }
    t
}

impl Plan {
    /// Predicted problems the overlay would cause (not those the target has already).
    pub fn new_problems(&self) -> usize {
        self.problems.iter().filter(|p| !p.preexisting).count()
    }

    pub fn has_changes(&self) -> bool {
        self.sets
            .iter()
            .any(|s| !s.changes.is_empty() || !s.stale_bytecode.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(sha: &str, size: u64) -> Kind {
        Kind::File {
            size,
            mode: 0o644,
            blake3: Some(sha.into()),
            stamp: None,
        }
    }

    fn dist(name: &str, version: &str, files: &[&str]) -> Dist {
        Dist {
            files: files.iter().map(|s| s.to_string()).collect(),
            ..Dist::for_test(name, version)
        }
    }

    fn scan(dists: Vec<Dist>, globs: Vec<Vec<&str>>) -> ScanReport {
        ScanReport {
            venv: "/v".into(),
            site_packages: "lib/python3.11/site-packages".into(),
            python: "3.11".into(),
            dists,
            globs: globs
                .into_iter()
                .map(|g| g.into_iter().map(String::from).collect())
                .collect(),
            facts: Default::default(),
        }
    }

    fn entries(list: &[(&str, Kind)]) -> Entries {
        list.iter()
            .map(|(p, k)| {
                (
                    p.to_string(),
                    Entry {
                        path: p.to_string(),
                        kind: k.clone(),
                        pyc: vec![],
                    },
                )
            })
            .collect()
    }

    fn set(name: &str, dists: &[&str], files: &[&str]) -> Set {
        Set {
            name: name.into(),
            dists: dists.iter().map(|s| s.to_string()).collect(),
            files: files.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn actions(p: &SetPlan) -> Vec<(String, Action)> {
        p.changes
            .iter()
            .map(|c| (c.path.clone(), c.action))
            .collect()
    }

    fn run(
        sets: &[Set],
        s: (&ScanReport, &Entries),
        d: (&ScanReport, &Entries),
        globs: &[String],
    ) -> Result<(Vec<SetPlan>, Vec<Warning>)> {
        compute(
            sets,
            &Side {
                host: "src",
                scan: s.0,
                globs,
                entries: s.1,
            },
            &Side {
                host: "dst",
                scan: d.0,
                globs,
                entries: d.1,
            },
        )
    }

    #[test]
    fn sorted_difference_keeps_order() {
        assert_eq!(
            sorted_difference(&["a", "b", "c", "e"], &["b", "d", "e"]),
            ["a", "c"]
        );
        assert_eq!(sorted_difference(&["a"], &[]), ["a"]);
    }

    #[test]
    fn merged_order_is_the_sorted_union() {
        let a = ["a/x.py", "b/y.so", "c/z.py"];
        let b = ["a/w.py", "b/y.so", "d/v.py"];
        let merged = merge_sorted(&a, &b);
        let mut want: Vec<&str> = a.iter().chain(&b).copied().collect();
        want.sort();
        want.dedup();
        assert_eq!(merged, want);
        assert_eq!(order_check(&merged), order_check(&want));
        assert_ne!(order_check(&merged), order_check(&a));
        assert_eq!(merge_sorted(&[], &b), b);
    }

    #[test]
    fn add_replace_delete_unchanged() {
        let s = scan(
            vec![dist(
                "torch",
                "2.11.0",
                &[
                    "torch/a.py",
                    "torch/b.py",
                    "torch/new.so",
                    "t-2.11.dist-info/RECORD",
                ],
            )],
            vec![],
        );
        let d = scan(
            vec![dist(
                "torch",
                "2.9.1",
                &[
                    "torch/a.py",
                    "torch/b.py",
                    "torch/old.so",
                    "t-2.9.1.dist-info/RECORD",
                ],
            )],
            vec![],
        );
        let se = entries(&[
            ("torch/a.py", file("aa", 1)),
            ("torch/b.py", file("b2", 2)),
            ("torch/new.so", file("n", 30)),
            ("t-2.11.dist-info/RECORD", file("r", 4)),
        ]);
        let de = entries(&[
            ("torch/a.py", file("aa", 1)),
            ("torch/b.py", file("b1", 5)),
            ("torch/old.so", file("o", 7)),
            ("t-2.9.1.dist-info/RECORD", file("r", 4)),
        ]);
        let (plans, warnings) =
            run(&[set("torch", &["torch"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let p = &plans[0];
        assert_eq!(
            actions(p),
            vec![
                ("t-2.11.dist-info/RECORD".into(), Action::Add),
                ("t-2.9.1.dist-info/RECORD".into(), Action::Delete),
                ("torch/b.py".into(), Action::Replace),
                ("torch/new.so".into(), Action::Add),
                ("torch/old.so".into(), Action::Delete),
            ]
        );
        assert_eq!(p.unchanged, 1);
        let sizes: Vec<u64> = p.changes.iter().map(|c| c.size).collect();
        assert_eq!(
            sizes,
            [4, 4, 2, 30, 7],
            "source size for add/replace, target size for delete"
        );
        assert_eq!(
            p.versions,
            vec![Transition {
                name: "torch".into(),
                from: Some("2.9.1".into()),
                to: Some("2.11.0".into())
            }]
        );
        let t = totals(p);
        assert_eq!(t[&Action::Add], (2, 34));
    }

    #[test]
    fn mode_type_and_link_target_count_as_replace() {
        let s = scan(vec![dist("x", "1", &["x/a", "x/b", "x/c", "x/d"])], vec![]);
        let d = scan(vec![dist("x", "1", &["x/a", "x/b", "x/c", "x/d"])], vec![]);
        let se = entries(&[
            (
                "x/a",
                Kind::File {
                    size: 1,
                    mode: 0o755,
                    blake3: Some("h".into()),
                    stamp: None,
                },
            ),
            ("x/b", Kind::Symlink { target: "a".into() }),
            ("x/c", Kind::Symlink { target: "a".into() }),
            ("x/d", Kind::Symlink { target: "a".into() }),
        ]);
        let de = entries(&[
            ("x/a", file("h", 1)),
            ("x/b", file("h", 1)),
            ("x/c", Kind::Symlink { target: "b".into() }),
            ("x/d", Kind::Symlink { target: "a".into() }),
        ]);
        let (plans, _) = run(&[set("x", &["x"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
        assert_eq!(
            actions(&plans[0]),
            vec![
                ("x/a".into(), Action::Replace),
                ("x/b".into(), Action::Replace),
                ("x/c".into(), Action::Replace)
            ]
        );
        assert_eq!(plans[0].unchanged, 1);
    }

    #[test]
    fn a_file_owned_outside_the_set_is_kept_with_a_warning() {
        // cu12 and cu13 wheels write some of the same paths; a dist outside the set keeps its files.
        let s = scan(
            vec![dist(
                "nvidia-cublas",
                "13.0",
                &["nvidia/cu13/lib/libcublas.so.13"],
            )],
            vec![],
        );
        let d = scan(
            vec![
                dist(
                    "nvidia-cublas-cu12",
                    "12.8",
                    &["nvidia/cublas/lib/libcublas.so.12", "nvidia/__init__.py"],
                ),
                dist("other", "1", &["nvidia/__init__.py"]),
            ],
            vec![],
        );
        let se = entries(&[("nvidia/cu13/lib/libcublas.so.13", file("c13", 10))]);
        let de = entries(&[
            ("nvidia/cublas/lib/libcublas.so.12", file("c12", 9)),
            ("nvidia/__init__.py", file("i", 0)),
        ]);
        let (plans, warnings) =
            run(&[set("nv", &["nvidia-*"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
        assert_eq!(
            actions(&plans[0]),
            vec![
                ("nvidia/cu13/lib/libcublas.so.13".into(), Action::Add),
                ("nvidia/cublas/lib/libcublas.so.12".into(), Action::Delete)
            ]
        );
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].path.as_deref(), Some("nvidia/__init__.py"));
        assert!(warnings[0].message.contains("other 1"), "{warnings:?}");
    }

    #[test]
    fn overwriting_a_file_of_another_distribution_warns() {
        let s = scan(vec![dist("a", "2", &["shared/x.so"])], vec![]);
        let d = scan(vec![dist("b", "1", &["shared/x.so"])], vec![]);
        let se = entries(&[("shared/x.so", file("new", 1))]);
        let de = entries(&[("shared/x.so", file("old", 1))]);
        let (plans, warnings) = run(&[set("a", &["a"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
        assert_eq!(
            actions(&plans[0]),
            vec![("shared/x.so".into(), Action::Replace)]
        );
        assert!(warnings[0].message.contains("b 1") && warnings[0].message.contains("overwritten"));
    }

    #[test]
    fn file_globs_and_bytecode() {
        let globs = vec!["sg/spec/*.py".to_string()];
        let s = scan(
            vec![dist("sg", "0.5", &["sg/spec/a.py", "sg/spec/b.py"])],
            vec![vec!["sg/spec/a.py", "sg/spec/b.py", "sg/spec/new.py"]],
        );
        let d = scan(
            vec![dist("sg", "0.5", &["sg/spec/a.py", "sg/spec/b.py"])],
            vec![vec!["sg/spec/a.py", "sg/spec/b.py", "sg/spec/local.py"]],
        );
        let se = entries(&[
            ("sg/spec/a.py", file("a2", 3)),
            ("sg/spec/b.py", file("b", 3)),
            ("sg/spec/new.py", file("n", 1)),
        ]);
        let mut de = entries(&[
            ("sg/spec/a.py", file("a1", 3)),
            ("sg/spec/b.py", file("b", 3)),
            ("sg/spec/local.py", file("l", 1)),
        ]);
        de.get_mut("sg/spec/a.py").unwrap().pyc =
            vec!["sg/spec/__pycache__/a.cpython-311.pyc".into()];
        de.get_mut("sg/spec/b.py").unwrap().pyc =
            vec!["sg/spec/__pycache__/b.cpython-311.pyc".into()];
        let (plans, warnings) = run(
            &[set("patches", &[], &["sg/spec/*.py"])],
            (&s, &se),
            (&d, &de),
            &globs,
        )
        .unwrap();
        // local.py matches the glob only on the target and no distribution owns it: the mirror deletes it.
        assert_eq!(
            actions(&plans[0]),
            vec![
                ("sg/spec/a.py".into(), Action::Replace),
                ("sg/spec/local.py".into(), Action::Delete),
                ("sg/spec/new.py".into(), Action::Add)
            ]
        );
        assert!(
            warnings.is_empty(),
            "patching files of a distribution is the point of a file set: {warnings:?}"
        );
        assert_eq!(
            plans[0].stale_bytecode,
            ["sg/spec/__pycache__/a.cpython-311.pyc"]
        );
    }

    #[test]
    fn target_only_glob_match_is_deleted_unless_a_dist_owns_it() {
        let globs = vec!["p/*.py".to_string()];
        let s = scan(vec![], vec![vec!["p/a.py"]]);
        let d = scan(
            vec![dist("p", "1", &["p/owned.py"])],
            vec![vec!["p/a.py", "p/owned.py", "p/stray.py"]],
        );
        let se = entries(&[("p/a.py", file("a", 1))]);
        let de = entries(&[
            ("p/a.py", file("a", 1)),
            ("p/owned.py", file("o", 1)),
            ("p/stray.py", file("s", 2)),
        ]);
        let (plans, warnings) =
            run(&[set("f", &[], &["p/*.py"])], (&s, &se), (&d, &de), &globs).unwrap();
        assert_eq!(
            actions(&plans[0]),
            vec![("p/stray.py".into(), Action::Delete)]
        );
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].message.contains("p 1"));
    }

    #[test]
    fn a_path_another_set_carries_is_not_deleted() {
        let s = scan(
            vec![dist("b", "2", &["shared.so"]), dist("a", "2", &["a.py"])],
            vec![],
        );
        let d = scan(vec![dist("a", "1", &["a.py", "shared.so"])], vec![]);
        let se = entries(&[("shared.so", file("n", 1)), ("a.py", file("a", 1))]);
        let de = entries(&[("shared.so", file("o", 1)), ("a.py", file("a", 1))]);
        let (plans, _) = run(
            &[set("a", &["a"], &[]), set("b", &["b"], &[])],
            (&s, &se),
            (&d, &de),
            &[],
        )
        .unwrap();
        assert!(plans[0].changes.is_empty(), "{:?}", plans[0].changes);
        assert_eq!(
            actions(&plans[1]),
            vec![("shared.so".into(), Action::Replace)]
        );
    }

    #[test]
    fn a_path_in_two_sets_goes_with_the_first() {
        let s = scan(
            vec![dist("a", "1", &["x.py"]), dist("b", "1", &["x.py"])],
            vec![],
        );
        let d = scan(vec![], vec![]);
        let se = entries(&[("x.py", file("x", 1))]);
        let de = entries(&[]);
        let (plans, warnings) = run(
            &[set("a", &["a"], &[]), set("b", &["b"], &[])],
            (&s, &se),
            (&d, &de),
            &[],
        )
        .unwrap();
        assert_eq!(actions(&plans[0]), vec![("x.py".into(), Action::Add)]);
        assert!(plans[1].changes.is_empty());
        assert!(warnings[0].message.contains("sets a and b"));
    }

    #[test]
    fn empty_set_and_damaged_dist_are_errors() {
        let s = scan(vec![dist("torch", "1", &["t.py"])], vec![]);
        let d = scan(vec![], vec![]);
        let se = entries(&[("t.py", file("t", 1))]);
        let de = entries(&[]);
        let e = run(
            &[set("tv", &["torchvision"], &[])],
            (&s, &se),
            (&d, &de),
            &[],
        )
        .unwrap_err();
        assert!(
            e.message
                .contains("Set tv matches nothing on the source host src"),
            "{}",
            e.message
        );
        let mut bad = dist("torch", "1", &["t.py"]);
        bad.problem =
            Some("RECORD line 3: path \"../../../../etc/passwd\" escapes the venv".into());
        let d = scan(vec![bad], vec![]);
        let e = run(&[set("t", &["torch"], &[])], (&s, &se), (&d, &de), &[]).unwrap_err();
        assert!(
            e.message.contains("on dst is damaged") && e.message.contains("escapes"),
            "{}",
            e.message
        );
    }

    #[test]
    fn missing_source_file_is_left_out_with_a_warning() {
        let s = scan(vec![dist("x", "1", &["x/a.py", "x/gone.py"])], vec![]);
        let d = scan(vec![], vec![]);
        let se = entries(&[("x/a.py", file("a", 1)), ("x/gone.py", Kind::Missing)]);
        let de = entries(&[]);
        let (plans, warnings) = run(&[set("x", &["x"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
        assert_eq!(actions(&plans[0]), vec![("x/a.py".into(), Action::Add)]);
        assert!(warnings[0].message.contains("missing there"));
    }

    #[test]
    fn state_folder_paths_directories_and_symlinked_parents_are_left_out() {
        let fake = "../../../.overlay/generations/20000101T000000Z-0000/journal";
        let s = scan(
            vec![dist(
                "x",
                "2",
                &[fake, "x/a.py", "srcdir", "evil/secret", "evil", "x//b.py"],
            )],
            vec![],
        );
        let d = scan(
            vec![
                dist(
                    "x",
                    "1",
                    &["../../../.overlay/mine", "shared/", "tdata/y", "x/a.py"],
                ),
                dist("other", "1", &["shared/other_module.py"]),
            ],
            vec![],
        );
        let se = entries(&[
            (fake, file("j", 1)),
            ("x/a.py", file("a", 1)),
            ("srcdir", Kind::Dir { mode: 0o755 }),
            (
                "evil/secret",
                Kind::ThroughSymlink {
                    link: "evil".into(),
                },
            ),
            (
                "evil",
                Kind::Symlink {
                    target: "/etc".into(),
                },
            ),
            ("x//b.py", file("b", 1)),
        ]);
        let de = entries(&[
            ("../../../.overlay/mine", file("m", 1)),
            ("shared/", Kind::Dir { mode: 0o755 }),
            (
                "tdata/y",
                Kind::ThroughSymlink {
                    link: "tdata".into(),
                },
            ),
            ("x/a.py", Kind::Dir { mode: 0o755 }),
        ]);
        let (plans, warnings) = run(&[set("x", &["x"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
        assert_eq!(actions(&plans[0]), vec![("evil".into(), Action::Add)]);
        let said = |path: &str, part: &str| {
            assert!(
                warnings
                    .iter()
                    .any(|w| w.path.as_deref() == Some(path) && w.message.contains(part)),
                "{path}: {part}: {warnings:#?}"
            )
        };
        said(fake, "points into overlay's state folder; it is left out");
        said(
            "../../../.overlay/mine",
            "points into overlay's state folder; it is kept",
        );
        said("srcdir", "is a directory on src");
        said("shared/", "never deletes a directory");
        said("x/a.py", "never replaces a directory");
        said(
            "evil/secret",
            "evil/secret: its parent evil is a symlink on src; overlay never reads through one",
        );
        said("tdata/y", "its parent tdata is a symlink on dst");
        said("x//b.py", "not spelled as a plain path");
    }

    #[test]
    fn setuid_setgid_and_sticky_bits_are_dropped_with_one_warning() {
        let paths: Vec<String> = (0..7).map(|i| format!("x/f{i}")).collect();
        let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
        let s = scan(vec![dist("x", "1", &refs)], vec![]);
        let d = scan(vec![], vec![]);
        let special = |m: u32| Kind::File {
            size: 1,
            mode: m,
            blake3: Some("h".into()),
            stamp: None,
        };
        let list: Vec<(&str, Kind)> = refs
            .iter()
            .enumerate()
            .map(|(i, p)| {
                (
                    *p,
                    special(if i == 0 {
                        0o755
                    } else {
                        0o4755 | (i as u32 * 0o1000 % 0o10000)
                    }),
                )
            })
            .collect();
        let se = entries(&list);
        let mut de = entries(&[]);
        // Unchanged once the bits are dropped: not carried, not warned about.
        de.insert(
            "x/f6".into(),
            Entry {
                path: "x/f6".into(),
                kind: special(0o755),
                pyc: vec![],
            },
        );
        let (plans, warnings) = run(&[set("x", &["x"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
        assert_eq!(plans[0].changes.len(), 6);
        assert_eq!(plans[0].unchanged, 1);
        for c in &plans[0].changes {
            let Some(Kind::File { mode, .. }) = &c.source else {
                panic!("{c:?}")
            };
            assert_eq!(*mode, 0o755, "{}", c.path);
        }
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        let m = &warnings[0].message;
        assert!(
            m.contains("of 5 files on src") && m.contains("x/f1, x/f2") && !m.contains("x/f0"),
            "{m}"
        );
    }

    #[test]
    fn versions_show_the_true_build() {
        let mut a = dist("torch", "2.11.0", &["t.py"]);
        a.build = Some("2.11.0+cu130".into());
        let b = dist("torch", "2.9.1", &["t.py"]);
        let v = transitions(&[&a], &[&b]);
        assert_eq!(v[0].from.as_deref(), Some("2.9.1"));
        assert_eq!(v[0].to.as_deref(), Some("2.11.0+cu130"));
        let v = transitions(&[&a], &[]);
        assert_eq!(v[0].from, None);
    }

    #[test]
    fn python_minor_must_match() {
        let h = |n: &str, py: &str| HostInfo {
            name: n.into(),
            ssh: None,
            direct_ssh: None,
            venv: "/v".into(),
            site_packages: String::new(),
            python: py.into(),
        };
        assert!(check_python(&h("a", "3.11"), &h("b", "3.11")).is_ok());
        let e = check_python(&h("a", "3.11"), &h("b", "3.12")).unwrap_err();
        assert!(e.message.contains("will not load"), "{}", e.message);
    }
}
