//! Extra files: files under a distribution's top-level package directories
//! that no RECORD lists (a stray copy, a leftover of a hand-patch). The
//! walk also collects the `__pycache__` files it passes, for
//! [`super::pycache`]; those are never extras themselves.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use rayon::prelude::*;

use crate::model::{Dist, Finding, FindingKind, in_pycache};

/// What the walk of the package directories found.
#[derive(Debug, Default)]
pub struct Walked {
    pub extras: Vec<Finding>,
    /// Files inside `__pycache__` directories, relative to site-packages.
    pub pycache: Vec<String>,
}

/// The top-level directories the distributions' files live in, each with
/// the (first, by name) distribution that has files there.
pub fn package_dirs<'d>(site: &Path, dists: &[&'d Dist]) -> BTreeMap<String, &'d Dist> {
    let mut out: BTreeMap<String, &Dist> = BTreeMap::new();
    for d in dists {
        for f in &d.files {
            let Some((top, _)) = f.split_once('/') else {
                continue;
            };
            if top == ".." || top.ends_with(".dist-info") || out.contains_key(top) {
                continue;
            }
            let is_dir = std::fs::symlink_metadata(site.join(top)).is_ok_and(|m| m.is_dir());
            if is_dir {
                out.insert(top.to_string(), d);
            }
        }
    }
    out
}

/// Walk the package directories of `dists` (in parallel, one per directory).
pub fn walk(site: &Path, dists: &[&Dist]) -> Walked {
    let listed: HashSet<&str> = dists
        .iter()
        .flat_map(|d| d.files.iter().map(String::as_str))
        .collect();
    let tops = package_dirs(site, dists);
    let per_top: Vec<Walked> = tops
        .par_iter()
        .map(|(top, owner)| {
            let mut w = Walked::default();
            for e in walkdir::WalkDir::new(site.join(top))
                .follow_links(false)
                .into_iter()
                .flatten()
            {
                if e.file_type().is_dir() {
                    continue;
                }
                let Some(rel) = e
                    .path()
                    .strip_prefix(site)
                    .ok()
                    .and_then(|r| r.to_str())
                    .map(str::to_string)
                else {
                    continue;
                };
                if in_pycache(&rel) {
                    w.pycache.push(rel);
                } else if !listed.contains(rel.as_str()) {
                    w.extras.push(Finding::problem(
                        FindingKind::Extra,
                        Some(owner.name.clone()),
                        Some(rel),
                        format!("in {top}/, listed in no RECORD"),
                    ));
                }
            }
            w
        })
        .collect();
    let mut out = Walked::default();
    for w in per_top {
        out.extras.extend(w.extras);
        out.pycache.extend(w.pycache);
    }
    out
}
