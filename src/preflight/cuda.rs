//! CUDA build consistency: packages that link together (torch, torchvision,
//! torchaudio, triton, sgl_kernel, flashinfer, ...) must agree on the CUDA
//! major they were built for. PEP 440 cannot see this (`==2.11.0` matches
//! `2.11.0+cu128` and `2.11.0+cu130` alike), so each package's major is read
//! from three kinds of evidence:
//! - `<pkg>/version.py` (`cuda = '13.0'`),
//! - the local version label (`+cu130`),
//! - the ELF needs of its shared objects (`libcudart.so.13`, or a symbol
//!   version such as `cudaGetDevice@libcudart.so.13`).

use std::collections::{BTreeMap, BTreeSet};

use crate::manifest::matches_any;
use crate::model::{Check, Dist, Problem, normalize_name};

/// Distributions that link against torch's CUDA runtime (PEP 503 names).
pub const DEFAULT_FAMILY: &[&str] = &[
    "torch",
    "torchvision",
    "torchaudio",
    "triton",
    "sgl-kernel",
    "flashinfer",
    "flashinfer-python",
    "flashinfer-cubin",
    "flashinfer-jit-cache",
    "xformers",
    "vllm",
    "torch-memory-saver",
    "deep-ep",
    "deep-gemm",
];

/// One piece of evidence for a CUDA major.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Evidence {
    pub major: u32,
    pub what: String,
}

/// The CUDA major in a local version label: `+cu130` → 13, `+cu128` → 12, `+cu92` → 9.
pub fn label_major(version: &str) -> Option<u32> {
    let local = version.split_once('+')?.1;
    local.split(['.', '_', '-']).find_map(|part| {
        let rest = part.strip_prefix("cu")?;
        // `cu130`, and `cu124torch2.6` as some projects write it.
        let digits: &str = &rest[..rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len())];
        if digits.len() < 2 {
            return None;
        }
        let n = if digits.len() <= 2 {
            &digits[..1]
        } else {
            &digits[..digits.len() - 1]
        };
        n.parse().ok()
    })
}

/// The CUDA major a library file name implies: `libcudart.so.13` → 13.
pub fn cudart_major(file: &str) -> Option<u32> {
    file.strip_prefix("libcudart.so.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Evidence for one distribution. `elf` maps its files (site-packages
/// relative) to the cudart majors their shared objects need.
pub fn evidence(d: &Dist, elf: &BTreeMap<String, BTreeSet<u32>>) -> Vec<Evidence> {
    let mut out = Vec::new();
    if let Some(c) = &d.cuda
        && let Some(major) = c.split('.').next().and_then(|m| m.parse().ok())
    {
        out.push(Evidence {
            major,
            what: format!("version.py says cuda = '{c}'"),
        });
    }
    let version = d.build.as_deref().unwrap_or(&d.version);
    if let Some(major) = label_major(version) {
        out.push(Evidence {
            major,
            what: format!("version {version}"),
        });
    }
    for f in &d.files {
        for &major in elf.get(f).into_iter().flatten() {
            out.push(Evidence {
                major,
                what: format!("{f} needs libcudart.so.{major}"),
            });
        }
    }
    out
}

/// Check that the family (built-in list plus `extra_family` globs, plus any
/// distribution with CUDA evidence that requires a family member) agrees.
pub fn check(
    dists: &[&Dist],
    extra_family: &[String],
    elf: &BTreeMap<String, BTreeSet<u32>>,
) -> Vec<Problem> {
    let mut globs: Vec<String> = DEFAULT_FAMILY.iter().map(|s| s.to_string()).collect();
    globs.extend(extra_family.iter().cloned());
    let core: BTreeSet<&str> = dists
        .iter()
        .filter(|d| matches_any(&globs, &d.normalized))
        .map(|d| d.normalized.as_str())
        .collect();
    let requires_core = |d: &Dist| {
        d.requires_dist.iter().any(|r| {
            let name: String = r
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                .collect();
            core.contains(normalize_name(&name).as_str())
        })
    };
    let mut members: Vec<(&Dist, Vec<Evidence>)> = Vec::new();
    for d in dists {
        let ev = evidence(d, elf);
        if !ev.is_empty() && (core.contains(d.normalized.as_str()) || requires_core(d)) {
            members.push((d, ev));
        }
    }
    let mut problems = Vec::new();
    // A package that contradicts itself.
    for (d, ev) in &members {
        let majors: BTreeSet<u32> = ev.iter().map(|e| e.major).collect();
        if majors.len() > 1 {
            problems.push(Problem {
                check: Check::Cuda,
                dist: Some(d.name.clone()),
                file: None,
                reason: format!(
                    "{} {} mixes CUDA majors: {}",
                    d.name,
                    version(d),
                    describe(ev)
                ),
                ..Problem::default()
            });
        }
    }
    // The reference: torch's major if torch is there, else the most common one.
    let major_of = |ev: &[Evidence]| -> u32 {
        let mut count: BTreeMap<u32, usize> = BTreeMap::new();
        for e in ev {
            *count.entry(e.major).or_default() += 1;
        }
        count
            .into_iter()
            .max_by_key(|(m, n)| (*n, *m))
            .map_or(0, |(m, _)| m)
    };
    let reference = members
        .iter()
        .find(|(d, _)| d.normalized == "torch")
        .map(|(d, ev)| (*d, major_of(ev)))
        .or_else(|| {
            let mut votes: BTreeMap<u32, Vec<&Dist>> = BTreeMap::new();
            for (d, ev) in &members {
                votes.entry(major_of(ev)).or_default().push(d);
            }
            votes
                .into_iter()
                .max_by_key(|(m, ds)| (ds.len(), *m))
                .map(|(m, ds)| (ds[0], m))
        });
    let Some((ref_dist, ref_major)) = reference else {
        return problems;
    };
    for (d, ev) in &members {
        let m = major_of(ev);
        if m != ref_major {
            problems.push(Problem {
                check: Check::Cuda,
                dist: Some(d.name.clone()),
                file: ev.iter().find_map(|e| e.what.split_once(" needs ").map(|(f, _)| f.to_string())),
                reason: format!(
                    "{} {} is built for CUDA {m} ({}), but {} {} is built for CUDA {ref_major}: they will not load together",
                    d.name,
                    version(d),
                    describe(ev),
                    ref_dist.name,
                    version(ref_dist)
                ),
                ..Problem::default()
            });
        }
    }
    problems
}

fn version(d: &Dist) -> &str {
    d.build.as_deref().unwrap_or(&d.version)
}

fn describe(ev: &[Evidence]) -> String {
    let mut parts: Vec<&str> = ev.iter().map(|e| e.what.as_str()).collect();
    parts.dedup();
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(
        name: &str,
        version: &str,
        cuda: Option<&str>,
        files: &[&str],
        requires: &[&str],
    ) -> Dist {
        Dist {
            dist_info: String::new(),
            files: files.iter().map(|s| s.to_string()).collect(),
            requires_dist: requires.iter().map(|s| s.to_string()).collect(),
            cuda: cuda.map(String::from),
            ..Dist::for_test(name, version)
        }
    }

    #[test]
    fn labels_and_sonames() {
        assert_eq!(label_major("2.11.0+cu130"), Some(13));
        assert_eq!(label_major("2.9.1+cu128"), Some(12));
        assert_eq!(label_major("1.0+cu92"), Some(9));
        assert_eq!(label_major("1.0+cpu"), None);
        assert_eq!(label_major("0.2.5+cu124torch2.6"), Some(12));
        assert_eq!(label_major("1.0"), None);
        assert_eq!(cudart_major("libcudart.so.13"), Some(13));
        assert_eq!(cudart_major("libcudart.so.12.8.90"), Some(12));
        assert_eq!(cudart_major("libcublas.so.13"), None);
    }

    #[test]
    fn a_consistent_stack_is_quiet_and_a_mix_is_named() {
        let mut torch = dist("torch", "2.11.0", Some("13.0"), &["torch/_C.so"], &[]);
        torch.build = Some("2.11.0+cu130".into());
        let vision12 = dist(
            "torchvision",
            "0.24.1+cu128",
            None,
            &["torchvision/_C.so"],
            &["torch==2.9.1"],
        );
        let vision13 = dist(
            "torchvision",
            "0.26.0+cu130",
            None,
            &["torchvision/_C.so"],
            &["torch==2.11.0"],
        );
        let mut elf = BTreeMap::new();
        elf.insert("torch/_C.so".to_string(), BTreeSet::from([13]));
        assert!(check(&[&torch, &vision13], &[], &elf).is_empty());
        elf.insert("torchvision/_C.so".to_string(), BTreeSet::from([12]));
        let p = check(&[&torch, &vision12], &[], &elf);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].dist.as_deref(), Some("torchvision"));
        assert!(
            p[0].reason.contains("CUDA 12")
                && p[0]
                    .reason
                    .contains("torch 2.11.0+cu130 is built for CUDA 13"),
            "{}",
            p[0].reason
        );
        assert!(
            p[0].reason
                .contains("torchvision/_C.so needs libcudart.so.12"),
            "{}",
            p[0].reason
        );
    }

    #[test]
    fn members_beyond_the_list_come_from_the_manifest_or_a_torch_requirement() {
        let torch = dist("torch", "2.11.0+cu130", None, &[], &[]);
        let ext = dist("my-ext", "1.0+cu128", None, &[], &["torch"]);
        let other = dist("unrelated", "1.0+cu118", None, &[], &[]);
        let p = check(&[&torch, &ext, &other], &[], &BTreeMap::new());
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].dist.as_deref(), Some("my-ext"));
        let p = check(
            &[&torch, &ext, &other],
            &["unrelated".into()],
            &BTreeMap::new(),
        );
        assert_eq!(p.len(), 2, "{p:?}");
    }
}
