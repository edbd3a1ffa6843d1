//! Distributions installed twice: two or more `*.dist-info` directories of
//! one (normalized) name. pip and `importlib.metadata` then see only one of
//! them, in directory order, and the other's files may be what is imported.

use std::collections::BTreeMap;

use crate::model::{Dist, Finding, FindingKind};

/// One finding per dist-info of every distribution installed more than once.
pub fn duplicates(dists: &[&Dist]) -> Vec<Finding> {
    let mut by_name: BTreeMap<&str, Vec<&Dist>> = BTreeMap::new();
    for d in dists {
        by_name.entry(d.normalized.as_str()).or_default().push(d);
    }
    let mut out = Vec::new();
    for same in by_name.values().filter(|v| v.len() > 1) {
        let mut infos: Vec<&str> = same.iter().map(|d| d.dist_info.as_str()).collect();
        infos.sort();
        for d in same {
            let others: Vec<&str> = infos
                .iter()
                .copied()
                .filter(|i| *i != d.dist_info)
                .collect();
            out.push(Finding::problem(
                FindingKind::DuplicateDistInfo,
                Some(d.name.clone()),
                Some(d.dist_info.clone()),
                format!(
                    "{} {} is installed {} times (also {}): pip sees only one of them",
                    d.name,
                    d.version,
                    same.len(),
                    others.join(", ")
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_dist_infos_are_named() {
        let a = Dist::for_test("Mini_Torch", "2.9.1");
        let b = Dist::for_test("mini-torch", "9.9");
        let c = Dist::for_test("other", "1.0");
        let found = duplicates(&[&a, &b, &c]);
        let paths: Vec<&str> = found.iter().map(|f| f.path.as_deref().unwrap()).collect();
        assert_eq!(
            paths,
            ["Mini_Torch-2.9.1.dist-info", "mini-torch-9.9.dist-info"]
        );
        assert!(found[0].reason.contains("also mini-torch-9.9.dist-info"));
    }
}
