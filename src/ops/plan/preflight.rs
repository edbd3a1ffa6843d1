//! The preflight of a plan ([`preflight`]): what would fail after the
//! overlay (requirements, ELF loading, CUDA majors), with the RECORD checks
//! of both sides folded into the plan ([`Preflighted::settle`]).

use std::collections::{HashMap, HashSet};

use crate::client::Client;
use crate::error::Result;
use crate::manifest::Manifest;
use crate::model::{Action, Check, Dist, ElfInfo, PreflightRequest, Problem, ScanReport, Set};
use crate::ops::{Clock, Observer};
use crate::plan::SetPlan;
use crate::preflight::{cuda, gpu, requirements};

use super::connect::both;

/// The paths the plan deletes, and those it places (adds or replaces).
pub fn deleted_and_placed(set_plans: &[SetPlan]) -> (HashSet<&str>, Vec<&str>) {
    let mut deleted: HashSet<&str> = HashSet::new();
    let mut placed: Vec<&str> = Vec::new();
    for s in set_plans {
        for c in &s.changes {
            match c.action {
                Action::Delete => {
                    deleted.insert(c.path.as_str());
                }
                _ => placed.push(c.path.as_str()),
            }
        }
    }
    (deleted, placed)
}

/// Requirements, for the target's interpreter and platform. Problems the
/// target already has are marked as such.
pub(super) fn requirement_problems(dst_scan: &ScanReport, after: &[&Dist]) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Some(env) = requirements::environment(&dst_scan.facts, &dst_scan.python) {
        let before: Vec<&Dist> = dst_scan.dists.iter().collect();
        let already: HashSet<String> = requirements::check(&before, &env)
            .into_iter()
            .map(|p| p.reason)
            .collect();
        for mut p in requirements::check(after, &env) {
            if already.contains(&p.reason) {
                p.reason.push_str(" (already so before the overlay)");
                p.preexisting = true;
            }
            problems.push(p);
        }
    }
    problems
}

/// The `[verify]` check's `LD_LIBRARY_PATH` on the target, as the loader
/// simulation should see it.
pub(super) fn ld_library_path(
    manifest: &Manifest,
    dst_scan: &ScanReport,
    dst_venv: &str,
) -> Vec<String> {
    manifest
        .verify
        .as_ref()
        .and_then(|v| v.env.get("LD_LIBRARY_PATH"))
        .map(|v| {
            let site = format!(
                "{}/{}",
                dst_venv.trim_end_matches('/'),
                dst_scan.site_packages
            );
            v.replace("{site_packages}", &site)
                .replace("{venv}", dst_venv)
                .split(':')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// The predicted problems, and the source's answer to the RECORD check
/// that ran beside the target's loader check.
pub struct Preflighted {
    pub problems: Vec<Problem>,
    pub record: Option<Result<Vec<crate::model::Finding>>>,
    /// The target's answer to its RECORD check of the files the plan
    /// replaces or deletes ([`crate::ops::record_note::target_record_request`]).
    pub target_record: Option<Result<Vec<crate::model::Finding>>>,
    /// The processes that run from the target's venv.
    pub running: crate::model::Running,
}

impl Preflighted {
    /// The plan's problems, after the RECORD answers of both sides have
    /// been folded into `set_plans` (which carried bytecode the source
    /// vouches for) and into `warnings` (the source's notes, the target's
    /// edited files).
    pub fn settle(
        self,
        (src_host, src_scan): (&str, &ScanReport),
        (dst_host, dst_scan): (&str, &ScanReport),
        set_plans: &mut [SetPlan],
        warnings: &mut Vec<crate::plan::Warning>,
        obs: &dyn Observer,
    ) -> Vec<Problem> {
        let vouched = crate::ops::record_note::bytecode_vouched(self.record.as_ref(), src_scan);
        for s in set_plans.iter_mut() {
            s.keep_carried_bytecode(&vouched);
        }
        if let Some(answer) = self.record {
            warnings.extend(crate::ops::record_note::record_note(
                answer,
                (src_host, src_scan),
                set_plans,
                obs,
            ));
        }
        if let Some(answer) = self.target_record {
            warnings.extend(crate::ops::record_note::target_record_note(
                answer,
                (dst_host, dst_scan),
                set_plans,
                obs,
            ));
        }
        warnings.extend(self.running.warnings(dst_host).into_iter().map(|message| {
            crate::plan::Warning {
                set: None,
                path: None,
                message,
            }
        }));
        self.problems
    }
}

/// Predict what would fail after the overlay: requirements, CUDA majors, ELF
/// loading; and list the processes that run from the target's venv
/// ([`crate::running`]). While the target simulates its loader, the source checks the
/// files the plan carries against their RECORD
/// ([`crate::ops::record_note::record_request`]). `known`: ELF facts of the
/// source's shared objects already read (a plan of many targets reads
/// them once for all); those it lacks are asked of the source.
pub fn preflight(
    manifest: &Manifest,
    sets: &[Set],
    (src, src_scan, src_venv): (&mut Client, &ScanReport, &str),
    (dst, dst_scan, dst_venv): (&mut Client, &ScanReport, &str),
    dst_name: &str,
    set_plans: &[SetPlan],
    known: Option<&HashMap<String, Option<ElfInfo>>>,
    clock: &Clock,
) -> Result<Preflighted> {
    let (deleted, placed) = deleted_and_placed(set_plans);
    let after = crate::preflight::dists_after(&dst_scan.dists, &src_scan.dists, sets, &deleted);
    // 1. Requirements.
    let mut problems = requirement_problems(dst_scan, &after);

    // 2. ELF: facts of the shared objects the overlay brings, then the target simulates its loader.
    let shared: Vec<String> = placed
        .iter()
        .filter(|p| crate::preflight::looks_shared(p))
        .map(|p| p.to_string())
        .collect();
    // Read by the source's agent ahead (see `make_plan`): only compact
    // facts (symbol hashes, not names) travel and are kept here.
    let infos = match known {
        _ if shared.is_empty() => Vec::new(),
        Some(known) if shared.iter().all(|p| known.contains_key(p)) => {
            shared.iter().map(|p| known[p].clone()).collect()
        }
        _ => src.elf_info(
            src_venv,
            shared.clone(),
            Some(dst_scan.machine.capabilities()),
        )?,
    };
    clock.mark(&format!(
        "preflight: requirements, and ELF facts of {} shared objects",
        shared.len()
    ));
    let mut infos: HashMap<String, Option<ElfInfo>> = shared.into_iter().zip(infos).collect();
    let req = PreflightRequest {
        venv: dst_venv.to_string(),
        // Only what concerns the loader: the shared objects placed or deleted.
        placed: placed
            .iter()
            .filter(|p| crate::preflight::looks_shared(p))
            .map(|p| (p.to_string(), infos.remove(*p).flatten()))
            .collect(),
        deleted: deleted
            .iter()
            .filter(|p| crate::preflight::looks_shared(p))
            .map(|p| p.to_string())
            .collect(),
        ld_library_path: ld_library_path(manifest, dst_scan, dst_venv),
        torch_users: crate::preflight::torch_users(&after),
        imported_first: crate::preflight::imported_first(&after),
        whole: false,
        machine: Some(dst_scan.machine.clone()),
    };
    let record = crate::ops::record_note::record_request(src_venv, src_scan, set_plans);
    let target_record =
        crate::ops::record_note::target_record_request(dst_venv, dst_scan, set_plans);
    let (record, report) = both(
        || record.map(|r| src.record_check(r)),
        || {
            let report = dst.preflight(req)?;
            let target_record = target_record.map(|r| dst.record_check(r));
            Ok((report, target_record, dst.running(dst_venv)?))
        },
    );
    let (report, target_record, running) = report?;
    problems.extend(elf_problems(report.problems, &after));

    // 3. CUDA majors of the packages that link together.
    problems.extend(cuda::check(
        &after,
        &manifest.preflight.cuda_family,
        &report.cudart,
    ));

    // 4. The target's driver and GPUs.
    problems.extend(gpu_problems(
        dst_name,
        dst_scan,
        &after,
        &report.cudart,
        &report.gpu,
    ));
    problems.sort();
    problems.dedup();
    Ok(Preflighted {
        problems,
        record,
        target_record,
        running,
    })
}

/// The ELF check's findings as the plan's problems. A module that needs
/// another package imported first (the load model's last rule,
/// docs/preflight.md) is no predicted failure.
fn elf_problems(findings: Vec<crate::model::ElfFinding>, after: &[&Dist]) -> Vec<Problem> {
    findings
        .into_iter()
        .filter(|f| f.imported_first.is_empty())
        .map(|f| Problem {
            check: Check::Elf,
            dist: crate::preflight::owner(after, &f.file).map(|d| d.name.clone()),
            file: Some(f.file),
            reason: f.reason,
            preexisting: f.preexisting,
            optional: f.optional,
            cause: Some(f.cause),
        })
        .collect()
}

/// The GPU check's problems on the target `host`: each distribution after
/// the overlay whose CUDA runtime needs a newer driver than the host has
/// (pre-existing when that distribution loads that major already), and
/// each shared object without code for one of its GPU kinds (as the
/// target found them).
pub(super) fn gpu_problems(
    host: &str,
    dst_scan: &ScanReport,
    after: &[&Dist],
    cudart: &std::collections::BTreeMap<String, std::collections::BTreeSet<u32>>,
    kernels: &[crate::model::ElfFinding],
) -> Vec<Problem> {
    let before: Vec<&Dist> = dst_scan.dists.iter().collect();
    let had: std::collections::BTreeMap<String, std::collections::BTreeSet<u32>> =
        gpu::runtime_majors(&before, &Default::default())
            .into_iter()
            .map(|(name, (_, majors))| (name.to_string(), majors))
            .collect();
    let mut problems = gpu::driver_problems(after, cudart, &dst_scan.machine, host, Some(&had));
    for f in kernels {
        problems.push(Problem {
            check: Check::Gpu,
            dist: crate::preflight::owner(after, &f.file).map(|d| d.name.clone()),
            file: Some(f.file.clone()),
            reason: format!(
                "{host}'s {}{}",
                f.reason,
                if f.preexisting {
                    " (already so before the overlay)"
                } else {
                    ""
                }
            ),
            preexisting: f.preexisting,
            optional: f.optional,
            cause: Some(f.cause.clone()),
        });
    }
    problems
}
