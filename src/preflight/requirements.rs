//! Requirements: every `Requires-Dist` of every distribution present after
//! the overlay is satisfied. Markers are evaluated for the target's
//! interpreter and platform, extras are followed (a requirement on `x[fast]`
//! activates x's `extra == "fast"` requirements), and versions are matched
//! with PEP 440 (pep440_rs/pep508_rs), which ignores a local label such as
//! `+cu130` when the specifier has none: that mix is the CUDA check's job.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::str::FromStr;

use crate::model::{Check, Dist, Facts, Problem, normalize_name};
use pep508_rs::pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::{
    ExtraName, MarkerEnvironment, MarkerEnvironmentBuilder, Requirement, VersionOrUrl,
};

/// The PEP 508 marker environment of a Linux CPython described by `facts`.
pub fn environment(facts: &Facts, python: &str) -> Option<MarkerEnvironment> {
    let full = if facts.python_full.is_empty() {
        format!("{python}.0")
    } else {
        facts.python_full.clone()
    };
    MarkerEnvironment::try_from(MarkerEnvironmentBuilder {
        implementation_name: "cpython",
        implementation_version: &full,
        os_name: "posix",
        platform_machine: if facts.machine.is_empty() {
            "x86_64"
        } else {
            &facts.machine
        },
        platform_python_implementation: "CPython",
        platform_release: &facts.release,
        platform_system: "Linux",
        platform_version: &facts.kernel_version,
        python_full_version: &full,
        python_version: python,
        sys_platform: "linux",
    })
    .ok()
}

/// Check the requirements of `dists` (the distributions installed after the
/// overlay). Problems are sorted; each names the requiring distribution.
pub fn check(dists: &[&Dist], env: &MarkerEnvironment) -> Vec<Problem> {
    let by_name: BTreeMap<&str, &Dist> =
        dists.iter().map(|d| (d.normalized.as_str(), *d)).collect();
    let mut problems = BTreeSet::new();
    // Start with every installed dist, no extras.
    let mut queue: VecDeque<Asked> = dists
        .iter()
        .map(|d| Asked {
            dist: d,
            extras: Vec::new(),
            via: String::new(),
        })
        .collect();
    let mut seen: BTreeSet<(String, Vec<String>)> = BTreeSet::new();
    while let Some(asked) = queue.pop_front() {
        let key = (
            asked.dist.normalized.clone(),
            asked
                .extras
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>(),
        );
        if !seen.insert(key) {
            continue;
        }
        for line in &asked.dist.requires_dist {
            if let Some(next) = check_line(&asked, line, &by_name, env, &mut problems) {
                queue.push_back(next);
            }
        }
    }
    problems.into_iter().collect()
}

/// A distribution whose requirements are to be checked, with the extras
/// requested of it.
struct Asked<'a> {
    dist: &'a Dist,
    extras: Vec<ExtraName>,
    /// Who asked, worded for messages: " (required by …)", or empty.
    via: String,
}

/// Check one `Requires-Dist` `line` of `asked.dist` into `problems`. A
/// requirement with extras returns its target, to be checked with them.
fn check_line<'a>(
    asked: &Asked<'_>,
    line: &str,
    by_name: &BTreeMap<&str, &'a Dist>,
    env: &MarkerEnvironment,
    problems: &mut BTreeSet<Problem>,
) -> Option<Asked<'a>> {
    let dist = asked.dist;
    let req = match Requirement::<pep508_rs::VerbatimUrl>::from_str(line) {
        Ok(r) => r,
        Err(e) => {
            problems.insert(problem(
                &dist.name,
                Some(format!("{}/METADATA", dist.dist_info)),
                format!("cannot parse Requires-Dist {line:?}: {e}"),
            ));
            return None;
        }
    };
    if !req.evaluate_markers(env, &asked.extras) {
        return None;
    }
    let who = if asked.extras.is_empty() {
        format!("{} {}", dist.name, dist.version)
    } else {
        let ex: Vec<String> = asked.extras.iter().map(|e| e.to_string()).collect();
        format!(
            "{}[{}] {}{}",
            dist.name,
            ex.join(","),
            dist.version,
            asked.via
        )
    };
    let name = req.name.to_string();
    let Some(target) = by_name.get(name.as_str()).copied() else {
        problems.insert(problem(
            &dist.name,
            None,
            format!("{who} requires {line}, but {name} is not installed"),
        ));
        return None;
    };
    if let Some(VersionOrUrl::VersionSpecifier(spec)) = &req.version_or_url {
        check_version(
            spec,
            target,
            dist,
            &format!("{who} requires {line}"),
            problems,
        );
    }
    if req.extras.is_empty() {
        return None;
    }
    let declared: BTreeSet<String> = target
        .provides_extra
        .iter()
        .map(|e| normalize_name(e))
        .collect();
    for e in &req.extras {
        if !declared.contains(&e.to_string()) {
            problems.insert(problem(
                &dist.name,
                None,
                format!(
                    "{who} requires {line}, but {} {} has no extra {e:?}",
                    target.name, target.version
                ),
            ));
        }
    }
    Some(Asked {
        dist: target,
        extras: req.extras.clone(),
        via: format!(" (required by {who})"),
    })
}

/// Does the installed `target` satisfy `spec`, which `dist` asks for (`asks`:
/// "who requires what", for the message)?
fn check_version(
    spec: &VersionSpecifiers,
    target: &Dist,
    dist: &Dist,
    asks: &str,
    problems: &mut BTreeSet<Problem>,
) {
    match Version::from_str(&target.version) {
        Ok(v) if spec.contains(&v) => {}
        Ok(_) => {
            problems.insert(problem(
                &dist.name,
                None,
                format!(
                    "{asks}, but {} {} is installed",
                    target.name, target.version
                ),
            ));
        }
        Err(_) => {
            problems.insert(problem(
                &target.name,
                Some(format!("{}/METADATA", target.dist_info)),
                format!(
                    "{} has a version that is not PEP 440: {:?}",
                    target.name, target.version
                ),
            ));
        }
    }
}

/// A problem of the requirements check.
fn problem(dist: &str, file: Option<String>, reason: String) -> Problem {
    Problem {
        check: Check::Requirements,
        dist: Some(dist.to_owned()),
        file,
        cause: reason.split_once(" requires ").map(|(_, r)| r.to_owned()),
        reason,
        ..Problem::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(name: &str, version: &str, requires: &[&str], extras: &[&str]) -> Dist {
        Dist {
            requires_dist: requires.iter().map(|s| s.to_string()).collect(),
            provides_extra: extras.iter().map(|s| s.to_string()).collect(),
            ..Dist::for_test(name, version)
        }
    }

    fn env() -> MarkerEnvironment {
        environment(
            &Facts {
                python_full: "3.11.2".into(),
                machine: "x86_64".into(),
                release: "6.1".into(),
                kernel_version: "#1".into(),
            },
            "3.11",
        )
        .unwrap()
    }

    fn reasons(dists: &[Dist]) -> Vec<String> {
        let refs: Vec<&Dist> = dists.iter().collect();
        check(&refs, &env()).into_iter().map(|p| p.reason).collect()
    }

    #[test]
    fn a_pin_without_local_label_matches_a_local_build() {
        let d = [
            dist("torchvision", "0.26.0+cu130", &["torch==2.11.0"], &[]),
            dist("torch", "2.11.0+cu130", &[], &[]),
        ];
        assert!(reasons(&d).is_empty(), "{:?}", reasons(&d));
    }

    #[test]
    fn missing_and_wrong_versions_are_reported() {
        let d = [
            dist("sglang", "0.5.0", &["pybase64", "torch>=2.11"], &[]),
            dist("torch", "2.9.1+cu128", &[], &[]),
        ];
        let r = reasons(&d);
        assert_eq!(r.len(), 2, "{r:?}");
        assert!(
            r.iter().any(|x| x.contains("pybase64 is not installed")),
            "{r:?}"
        );
        assert!(
            r.iter()
                .any(|x| x.contains("torch 2.9.1+cu128 is installed")),
            "{r:?}"
        );
    }

    #[test]
    fn markers_exclude_and_extras_include() {
        let d = [
            dist(
                "app",
                "1",
                &[
                    "winonly; sys_platform == 'win32'",
                    "old; python_version < '3.8'",
                    "lib[fast]",
                ],
                &[],
            ),
            dist(
                "lib",
                "1",
                &["speedup; extra == 'fast'", "never; extra == 'slow'"],
                &["fast", "slow"],
            ),
        ];
        let r = reasons(&d);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].contains("speedup is not installed")
                && r[0].contains("lib[fast]")
                && r[0].contains("app 1"),
            "{r:?}"
        );
    }

    #[test]
    fn an_undeclared_extra_and_a_bad_line_are_reported() {
        let d = [
            dist("app", "1", &["lib[nope]", "not a requirement!!"], &[]),
            dist("lib", "1", &[], &[]),
        ];
        let r = reasons(&d);
        assert!(r.iter().any(|x| x.contains("no extra")), "{r:?}");
        assert!(r.iter().any(|x| x.contains("cannot parse")), "{r:?}");
    }
}
