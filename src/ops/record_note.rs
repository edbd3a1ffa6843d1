//! `plan`'s note on the source's carried files that differ from their own
//! RECORD: a hand-patched `.py` is expected, and named as such in one status
//! line per distribution; a shared object that differs (or is cut short) is
//! a [`Warning`] in the plan. Cheap: only the files the plan places (adds or
//! replaces) are checked, on the source's agent, by size, ELF headers, and
//! the sha256 of files up to [`MAX_HASH_BYTES`] (remembered by the source's
//! sha256 cache, so a warm plan reads none of them again). The source's
//! agent answers [`record_request`] while the target runs its loader check
//! (see `plan::preflight`), so the note costs a warm plan nothing extra.
//!
//! The target's side of the same question ([`target_record_request`],
//! [`target_record_note`]): the files the plan replaces or deletes that
//! differ from the target's own RECORD were changed after pip installed
//! them (a hand edit, a site's CA bundle, an earlier transplant). The
//! overlay's backup of them will be their only copy, and the plan says so.

use std::collections::BTreeMap;

use crate::error::Result;
use crate::model::{Action, Finding, FindingKind, RecordCheckRequest, ScanReport};
use crate::plan::{SetPlan, Warning};

use super::Observer;

/// Larger carried files get only the size and ELF checks here (`overlay
/// doctor` hashes everything).
pub const MAX_HASH_BYTES: u64 = 1 << 20;

/// How many paths a note names before "and N more".
const NAMED: usize = 5;

/// What to ask the source's agent (`venv`, its `scan`): the RECORD rows of
/// the files the plan places, in the dist-infos that list them; `None` when
/// the plan places no file a RECORD lists.
pub fn record_request(
    venv: &str,
    scan: &ScanReport,
    set_plans: &[SetPlan],
) -> Option<RecordCheckRequest> {
    let placed = placed_sets(set_plans);
    check_of(venv, scan, placed.keys().copied())
}

/// The RECORD check of `paths` in the dist-infos of `scan` that list them;
/// `None` when no RECORD lists any.
fn check_of<'p>(
    venv: &str,
    scan: &ScanReport,
    paths: impl Iterator<Item = &'p str>,
) -> Option<RecordCheckRequest> {
    let paths: std::collections::BTreeSet<&str> = paths.collect();
    let dist_infos: Vec<String> = scan
        .dists
        .iter()
        .filter(|d| d.files.iter().any(|f| paths.contains(f.as_str())))
        .map(|d| d.dist_info.clone())
        .collect();
    if dist_infos.is_empty() {
        return None;
    }
    Some(RecordCheckRequest {
        venv: venv.to_string(),
        dist_infos,
        paths: paths.iter().map(|p| p.to_string()).collect(),
        max_hash_bytes: Some(MAX_HASH_BYTES),
    })
}

/// Which carried `.py` files may take the source's bytecode with them
/// (`plan::SetPlan::keep_carried_bytecode`): those a source RECORD lists
/// and the source's check against RECORD (`answer`) found as pip installed
/// them. pip compiled those; a `.py` changed since (a hand patch) may have
/// a `.pyc` whose header still matches (same size and mtime) but whose code
/// is the old one, so its bytecode stays behind and the target's is
/// deleted as stale, for Python to compile on import. A failed check
/// vouches for nothing.
pub fn bytecode_vouched<'a>(
    answer: Option<&Result<Vec<Finding>>>,
    scan: &'a ScanReport,
) -> impl Fn(&str) -> bool + 'a {
    let changed: std::collections::HashSet<String> = match answer {
        Some(Ok(findings)) => findings.iter().filter_map(|f| f.path.clone()).collect(),
        _ => std::collections::HashSet::new(),
    };
    let checked = matches!(answer, Some(Ok(_)));
    let listed: std::collections::HashSet<&'a str> = scan
        .dists
        .iter()
        .flat_map(|d| d.files.iter().map(String::as_str))
        .filter(|f| f.ends_with(".py"))
        .collect();
    move |py: &str| checked && listed.contains(py) && !changed.contains(py)
}

/// What to ask the target's agent (`venv`, its `scan`): the RECORD rows of
/// the files the plan replaces or deletes, bytecode aside (Python rewrites
/// it, so a `.pyc` that differs from RECORD is no edit); `None` when no
/// such file is listed in a RECORD.
pub fn target_record_request(
    venv: &str,
    scan: &ScanReport,
    set_plans: &[SetPlan],
) -> Option<RecordCheckRequest> {
    let gone = set_plans
        .iter()
        .flat_map(|s| s.changes.iter())
        .filter(|c| c.action != Action::Add)
        .map(|c| c.path.as_str())
        .filter(|p| !p.ends_with(".pyc") && !p.contains("__pycache__/"));
    check_of(venv, scan, gone)
}

/// The target's answer to [`target_record_request`] (`host`, its `scan`)
/// as warnings, one per distribution: its files that differ from their
/// RECORD, which the overlay replaces or deletes, so that the new
/// generation's backup holds their only copy. A check that failed is a
/// note to `obs`: it never fails the plan.
pub fn target_record_note(
    answer: Result<Vec<Finding>>,
    (host, scan): (&str, &ScanReport),
    set_plans: &[SetPlan],
    obs: &dyn Observer,
) -> Vec<Warning> {
    let findings = match answer {
        Ok(f) => f,
        Err(e) => {
            obs.status(&format!(
                "note: the files the plan replaces on {host} were not checked against their RECORD: {e}"
            ));
            return Vec::new();
        }
    };
    let sets: BTreeMap<&str, (&str, Action)> = set_plans
        .iter()
        .flat_map(|s| {
            s.changes
                .iter()
                .map(|c| (c.path.as_str(), (s.name.as_str(), c.action)))
        })
        .collect();
    let names: BTreeMap<&str, &str> = scan
        .dists
        .iter()
        .map(|d| (d.dist_info.as_str(), d.name.as_str()))
        .collect();
    let mut by_dist: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for f in findings {
        if f.kind == FindingKind::Missing {
            continue;
        }
        let Some(path) = f.path else { continue };
        let dist = f.dist.unwrap_or_default();
        let dist = names
            .get(dist.as_str())
            .map_or(dist.clone(), |n| n.to_string());
        by_dist.entry(dist).or_default().push((path, f.reason));
    }
    by_dist
        .into_iter()
        .map(|(dist, mut files)| {
            files.sort();
            files.dedup_by(|a, b| a.0 == b.0);
            let n = files.len();
            let first = files[0].0.clone();
            let named = if n == 1 {
                format!("{first} ({})", files[0].1)
            } else {
                let mut named = files[..n.min(NAMED)]
                    .iter()
                    .map(|f| f.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", ");
                if n > NAMED {
                    named.push_str(&format!(", and {} more", n - NAMED));
                }
                named
            };
            let actions: std::collections::BTreeSet<Action> = files
                .iter()
                .filter_map(|f| sets.get(f.0.as_str()).map(|s| s.1))
                .collect();
            let verb = match actions.iter().collect::<Vec<_>>()[..] {
                [Action::Delete] => "deletes",
                [Action::Replace] => "replaces",
                _ => "replaces or deletes",
            };
            Warning {
                set: sets.get(first.as_str()).map(|s| s.0.to_string()),
                message: format!(
                    "{n} file{s} of {dist} on {host} differ{v} from {its} RECORD, changed since pip installed {them}: {named}; \
                     the overlay {verb} {them}, so the new generation's backup will hold the only copy \
                     (`overlay rollback {host}` brings {them} back; keep that generation until the change is saved elsewhere)",
                    s = if n == 1 { "" } else { "s" },
                    v = if n == 1 { "s" } else { "" },
                    its = if n == 1 { "its" } else { "their" },
                    them = if n == 1 { "it" } else { "them" },
                ),
                path: (n == 1).then_some(first),
            }
        })
        .collect()
}

/// Each placed path, with the set that places it.
fn placed_sets(set_plans: &[SetPlan]) -> BTreeMap<&str, &str> {
    set_plans
        .iter()
        .flat_map(|s| {
            s.changes
                .iter()
                .filter(|c| c.action != Action::Delete)
                .map(|c| (c.path.as_str(), s.name.as_str()))
        })
        .collect()
}

/// The source's answer to [`record_request`] (`host`, its `scan`) as notes
/// to `obs` and the returned warnings. A check that failed is a note too:
/// it never fails the plan.
pub fn record_note(
    answer: Result<Vec<Finding>>,
    (host, scan): (&str, &ScanReport),
    set_plans: &[SetPlan],
    obs: &dyn Observer,
) -> Vec<Warning> {
    let placed = placed_sets(set_plans);
    // The agent names each finding's distribution by its dist-info.
    let names: BTreeMap<&str, &str> = scan
        .dists
        .iter()
        .map(|d| (d.dist_info.as_str(), d.name.as_str()))
        .collect();
    let findings = match answer {
        Ok(f) => f,
        Err(e) => {
            obs.status(&format!(
                "note: the carried files on {host} were not checked against their RECORD: {e}"
            ));
            return Vec::new();
        }
    };
    // Missing files are the plan's own warning already ("listed in a RECORD
    // on HOST but missing there").
    let mut objects: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut patched: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in findings {
        let dist = f.dist.unwrap_or_default();
        let dist = names
            .get(dist.as_str())
            .map_or(dist.clone(), |n| n.to_string());
        let Some(path) = f.path else {
            continue;
        };
        // A file whose content differs is a hand patch, unless it is a
        // shared object; anything else (damage, a file that cannot be read)
        // is a warning.
        let content = f.reason.starts_with("size ") || f.reason.starts_with("sha256 ");
        match f.kind {
            FindingKind::Missing => {}
            FindingKind::Changed if content && !crate::preflight::looks_shared(&path) => {
                patched.entry(dist).or_default().push(path)
            }
            _ => objects.entry((path, dist)).or_default().push(f.reason),
        }
    }
    for (dist, mut paths) in patched {
        paths.sort();
        paths.dedup();
        let n = paths.len();
        let mut named = paths[..n.min(NAMED)].join(", ");
        if n > NAMED {
            named.push_str(&format!(", and {} more", n - NAMED));
        }
        obs.status(&format!(
            "note: {n} file{} of {dist} on {host} differ{} from {} RECORD (hand-patched): {named}",
            if n == 1 { "" } else { "s" },
            if n == 1 { "s" } else { "" },
            if n == 1 { "its" } else { "their" },
        ));
    }
    objects
        .into_iter()
        .map(|((path, dist), reasons)| Warning {
            set: placed.get(path.as_str()).map(|s| s.to_string()),
            message: format!(
                "{path} of {dist} on {host} differs from its RECORD: {}",
                reasons.join("; ")
            ),
            path: Some(path),
        })
        .collect()
}
