//! The distributions of a target after a plan, as the controller sees
//! them for the preflight: which stay and which arrive ([`dists_after`]),
//! which are imported before which ([`imported_first`], [`torch_users`]),
//! and who owns a file ([`owner`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use super::looks_shared;
use crate::model::{Dist, Set, normalize_name};

/// Distributions installed after the plan: those of the target that stay,
/// plus those the sets bring from the source.
pub fn dists_after<'a>(
    target: &'a [Dist],
    source: &'a [Dist],
    sets: &[Set],
    deleted: &HashSet<&str>,
) -> Vec<&'a Dist> {
    let arriving: Vec<&Dist> = source
        .iter()
        .filter(|d| {
            sets.iter()
                .any(|s| crate::manifest::matches_any(&s.dists, &d.normalized))
        })
        .collect();
    let arriving_infos: HashSet<&str> = arriving.iter().map(|d| d.dist_info.as_str()).collect();
    let mut out: Vec<&Dist> = target
        .iter()
        .filter(|d| {
            !deleted.contains(format!("{}/METADATA", d.dist_info).as_str())
                && !arriving_infos.contains(d.dist_info.as_str())
        })
        .collect();
    out.extend(arriving);
    out
}

/// The top-level directories owned by distributions that require torch.
pub fn torch_users(dists: &[&Dist]) -> Vec<String> {
    let mut out = BTreeSet::new();
    for d in dists {
        let needs_torch = d.requires_dist.iter().any(|r| {
            let name: String = r
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                .collect();
            normalize_name(&name) == "torch"
        });
        if needs_torch || d.normalized == "torch" {
            for f in &d.files {
                if let Some((top, _)) = f.split_once('/')
                    && !top.ends_with(".dist-info")
                    && !top.starts_with("..")
                {
                    out.insert(top.to_string());
                }
            }
        }
    }
    out.into_iter().collect()
}

/// For [`PreflightRequest::imported_first`]: each top-level directory of
/// a distribution -> the top-level directories of the distributions it
/// requires, directly or not (names of `Requires-Dist`, markers and extras
/// not evaluated), among `dists`. Its own are left out: a distribution's
/// `_C` module is checked as a root, never assumed loaded for its siblings.
pub fn imported_first(dists: &[&Dist]) -> BTreeMap<String, Vec<String>> {
    let by_name: HashMap<&str, &Dist> = dists.iter().map(|d| (d.normalized.as_str(), *d)).collect();
    let requires = |d: &Dist| -> Vec<String> {
        d.requires_dist
            .iter()
            .map(|r| {
                let name: String = r
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                    .collect();
                normalize_name(&name)
            })
            .collect()
    };
    let mut out = BTreeMap::new();
    for d in dists {
        let mut seen: BTreeSet<&str> = BTreeSet::from([d.normalized.as_str()]);
        let mut todo = requires(d);
        let mut provider_tops = BTreeSet::new();
        while let Some(name) = todo.pop() {
            let Some(r) = by_name.get(name.as_str()) else {
                continue;
            };
            if !seen.insert(r.normalized.as_str()) {
                continue;
            }
            provider_tops.extend(preloading_tops(r));
            todo.extend(requires(r));
        }
        let own = tops(d);
        let provider_tops: Vec<String> = provider_tops
            .into_iter()
            .filter(|t| !own.contains(t))
            .collect();
        if provider_tops.is_empty() {
            continue;
        }
        for t in own {
            out.insert(t, provider_tops.clone());
        }
    }
    out
}

/// The top-level directories of a distribution that have something an
/// import preloads: a `<top>/_C.*.so` or `<top>/lib/lib<top>_global_deps.so`.
fn preloading_tops(d: &Dist) -> BTreeSet<String> {
    d.files
        .iter()
        .filter_map(|f| f.split_once('/'))
        .filter(|(top, rest)| {
            (rest.starts_with("_C.") && looks_shared(rest) && !rest.contains('/'))
                || *rest == format!("lib/lib{top}_global_deps.so")
        })
        .map(|(top, _)| top.to_owned())
        .collect()
}

/// The top-level directories a distribution's files lie in.
fn tops(d: &Dist) -> BTreeSet<String> {
    d.files
        .iter()
        .filter_map(|f| f.split_once('/'))
        .map(|(top, _)| top)
        .filter(|top| !top.ends_with(".dist-info") && !top.starts_with(".."))
        .map(str::to_owned)
        .collect()
}

/// Owner distribution of a path (after the overlay), for messages.
pub fn owner<'a>(dists: &[&'a Dist], path: &str) -> Option<&'a Dist> {
    dists
        .iter()
        .find(|d| d.files.iter().any(|f| f == path))
        .copied()
}
