//! Which paths a set names on one host ([`members`]), and the sorted-list
//! arithmetic the controller and the agents share to agree on what a stat
//! answers for ([`stat_order`], [`order_check`], [`sorted_difference`]).

use crate::manifest::matches_any;
use crate::model::{Dist, ScanReport, Set};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
