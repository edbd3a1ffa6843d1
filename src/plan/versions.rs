//! The version column of a plan: each distribution of a set, paired by
//! normalized name, with its version on the target before and on the source
//! (what the target will have after).

use std::collections::BTreeMap;

use crate::model::Dist;
use crate::plan::Transition;

/// The version to show: the true build (`2.11.0+cu130`) when the
/// distribution's `version.py` refines its dist-info version.
fn version_of(d: &Dist) -> String {
    d.build.clone().unwrap_or_else(|| d.version.clone())
}

/// Pair source and target distributions by normalized name.
pub(super) fn transitions(src: &[&Dist], dst: &[&Dist]) -> Vec<Transition> {
    let mut by: BTreeMap<&str, Transition> = BTreeMap::new();
    let blank = |d: &Dist| Transition {
        name: d.name.clone(),
        from: None,
        to: None,
    };
    for d in dst {
        let t = by.entry(&d.normalized).or_insert_with(|| blank(d));
        t.from = Some(join_version(t.from.take(), version_of(d)));
    }
    for d in src {
        let t = by.entry(&d.normalized).or_insert_with(|| blank(d));
        t.name = d.name.clone();
        t.to = Some(join_version(t.to.take(), version_of(d)));
    }
    by.into_values().collect()
}

/// Two dist-infos of one project (a broken install) show as `a, b`.
fn join_version(prev: Option<String>, v: String) -> String {
    match prev {
        Some(p) => format!("{p}, {v}"),
        None => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(name: &str, version: &str, files: &[&str]) -> Dist {
        Dist {
            files: files.iter().map(|s| s.to_string()).collect(),
            ..Dist::for_test(name, version)
        }
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
}
