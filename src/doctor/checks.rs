//! The preflight's own checks on the venv as it stands: requirements
//! ([`crate::preflight::requirements`]), CUDA majors
//! ([`crate::preflight::cuda`]) and loading every shared object (the
//! target-side ELF check with `whole` set, through the same load model:
//! optional plugins' problems are left out).

use crate::error::Result;
use crate::model::{
    Dist, DoctorRequest, Finding, FindingKind, PreflightRequest, Problem, ScanReport,
};
use crate::preflight::{self, cuda, requirements};

/// The findings, and how many shared objects the ELF check loaded.
pub fn preflight_checks(
    req: &DoctorRequest,
    scan: &ScanReport,
    dists: &[&Dist],
) -> Result<(Vec<Finding>, u64)> {
    let as_finding = |kind, p: Problem| Finding {
        kind,
        dist: p.dist,
        path: p.file,
        reason: p.reason,
    };
    let mut out = Vec::new();
    let site = format!("{}/{}", req.venv.trim_end_matches('/'), scan.site_packages);
    if let Some(env) = requirements::environment(&scan.facts, &scan.python) {
        out.extend(
            requirements::check(dists, &env)
                .into_iter()
                .map(|p| as_finding(FindingKind::Requirement, p)),
        );
    }
    let report = preflight::run_on_target(
        &PreflightRequest {
            venv: req.venv.clone(),
            placed: vec![],
            deleted: vec![],
            ld_library_path: req
                .ld_library_path
                .iter()
                .map(|d| {
                    d.replace("{site_packages}", &site)
                        .replace("{venv}", &req.venv)
                })
                .collect(),
            torch_users: preflight::torch_users(dists),
            imported_first: preflight::imported_first(dists),
            whole: true,
        },
        None,
    )?;
    // Optional plugins (objects no extension module loads) are left out,
    // as `plan` leaves them out without -v: their unmet needs are the
    // host's (no RDMA, no MPI), not the venv's damage.
    for f in report.problems.into_iter().filter(|f| !f.optional) {
        out.push(Finding {
            kind: FindingKind::Elf,
            dist: preflight::owner(dists, &f.file).map(|d| d.name.clone()),
            path: Some(f.file),
            reason: f.reason,
        });
    }
    out.extend(
        cuda::check(dists, &req.cuda_family, &report.cudart)
            .into_iter()
            .map(|p| as_finding(FindingKind::Cuda, p)),
    );
    Ok((out, report.checked))
}
