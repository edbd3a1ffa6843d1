//! The preflight's own checks on the venv as it stands: requirements
//! ([`crate::preflight::requirements`]), CUDA majors
//! ([`crate::preflight::cuda`]), the host's driver and GPUs
//! ([`crate::preflight::gpu`]) and loading every shared object (the
//! target-side ELF check with `whole` set, through the same load model:
//! optional plugins' problems are left out). Two kinds of ELF findings are
//! notes: a module the load model says needs another package imported
//! first, and an optional backend without its system library
//! ([`optional_backends`]).

use std::collections::{BTreeMap, HashSet};

use crate::error::Result;
use crate::model::{
    Dist, DoctorRequest, ElfFinding, Finding, FindingKind, NoteKind, PreflightRequest, Problem,
    ScanReport,
};
use crate::preflight::{self, cuda, gpu, requirements};

/// The findings, and how many shared objects the ELF check loaded.
pub fn preflight_checks(
    req: &DoctorRequest,
    scan: &ScanReport,
    dists: &[&Dist],
) -> Result<(Vec<Finding>, u64)> {
    let as_finding = |kind, p: Problem| Finding::problem(kind, p.dist, p.file, p.reason);
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
            machine: Some(scan.machine.clone()),
        },
        None,
    )?;
    // Optional plugins (objects no extension module loads) are left out,
    // as `plan` leaves them out without -v: their unmet needs are the
    // host's (no RDMA, no MPI), not the venv's damage.
    let elf: Vec<ElfFinding> = report
        .problems
        .into_iter()
        .filter(|f| !f.optional)
        .collect();
    let backends = optional_backends(&elf, dists);
    for f in elf {
        let dist = preflight::owner(dists, &f.file).map(|d| d.name.clone());
        let note = if !f.imported_first.is_empty() {
            Some(NoteKind::ImportedFirst)
        } else if backends.contains(&f.file) {
            Some(NoteKind::OptionalBackend)
        } else {
            None
        };
        let found = Finding::problem(FindingKind::Elf, dist, Some(f.file), f.reason);
        out.push(match note {
            Some(n) => Finding {
                imported_first: f.imported_first,
                ..found.into_note(n)
            },
            None => found,
        });
    }
    out.extend(
        cuda::check(dists, &req.cuda_family, &report.cudart)
            .into_iter()
            .map(|p| as_finding(FindingKind::Cuda, p)),
    );
    // The driver and the GPUs (optional plugins' kernels left out, as
    // their loading problems are).
    out.extend(
        gpu::driver_problems(dists, &report.cudart, &scan.machine, "this host", None)
            .into_iter()
            .map(|p| as_finding(FindingKind::Gpu, p)),
    );
    for f in report.gpu.into_iter().filter(|f| !f.optional) {
        let dist = preflight::owner(dists, &f.file).map(|d| d.name.clone());
        out.push(Finding::problem(
            FindingKind::Gpu,
            dist,
            Some(f.file),
            f.reason,
        ));
    }
    Ok((out, report.checked))
}

/// The extension modules whose ELF findings make them optional backends
/// without their system library: every finding of the module is a library
/// not found (`needs X, which is not found`, for the module or an object it
/// loads), no installed distribution ships a file of any of those names
/// (so it is the system's, and the system lacks it), and its distribution
/// has another extension module with no ELF finding (the package imports
/// without it, and falls back: cupy without cuTENSOR, numba without TBB).
pub fn optional_backends(elf: &[ElfFinding], dists: &[&Dist]) -> HashSet<String> {
    let shipped: HashSet<&str> = dists
        .iter()
        .flat_map(|d| d.files.iter())
        .map(|f| f.rsplit('/').next().unwrap_or(f))
        .collect();
    let failing: HashSet<&str> = elf.iter().map(|f| f.file.as_str()).collect();
    let mut by_root: BTreeMap<&str, Vec<&ElfFinding>> = BTreeMap::new();
    for f in elf {
        by_root.entry(f.file.as_str()).or_default().push(f);
    }
    by_root
        .into_iter()
        .filter(|(_, found)| {
            found.iter().all(|f| {
                f.missing_library
                    .as_deref()
                    .is_some_and(|lib| !shipped.contains(lib))
            })
        })
        .filter(|(root, _)| {
            preflight::owner(dists, root).is_some_and(|d| {
                d.files
                    .iter()
                    .any(|f| f != *root && is_extension_name(f) && !failing.contains(f.as_str()))
            })
        })
        .map(|(root, _)| root.to_string())
        .collect()
}

/// Does this path end like a CPython extension module of this platform
/// (`.cpython-311-x86_64-linux-gnu.so`, `.abi3.so`)?
fn is_extension_name(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".so") && (name.contains(".cpython-") || name.ends_with(".abi3.so"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_found(file: &str, lib: &str) -> ElfFinding {
        ElfFinding {
            file: file.into(),
            reason: format!("needs {lib}, which is not found (searched: ld.so cache)"),
            cause: format!("needs {lib}, which is not found"),
            missing_library: Some(lib.into()),
            ..ElfFinding::default()
        }
    }

    /// A system library no distribution ships, for one of several
    /// extension modules: an optional backend. Not when a distribution
    /// ships the library (the venv's own is missing), nor for the only
    /// extension module of its distribution, nor with another problem.
    #[test]
    fn optional_backends_need_a_system_library_and_a_sibling_that_loads() {
        let so = ".cpython-311-x86_64-linux-gnu.so";
        let mut numba = Dist::for_test("numba", "0.61");
        numba.files = vec![
            format!("numba/np/ufunc/tbbpool{so}"),
            format!("numba/np/ufunc/omppool{so}"),
            format!("numba/np/ufunc/shipped{so}"),
            format!("numba/np/ufunc/other{so}"),
        ];
        let mut pg = Dist::for_test("psycopg2", "2.9");
        pg.files = vec![format!("psycopg2/_psycopg{so}")];
        let mut tbb = Dist::for_test("tbb-libs", "1");
        tbb.files = vec!["tbb_libs/libshipped.so.1".into()];
        let mut other = not_found(&format!("numba/np/ufunc/other{so}"), "libtbb.so.12");
        other.missing_library = None;
        other.reason = "undefined symbol: x".into();
        let elf = vec![
            not_found(&format!("numba/np/ufunc/tbbpool{so}"), "libtbb.so.12"),
            not_found(&format!("numba/np/ufunc/shipped{so}"), "libshipped.so.1"),
            other,
            not_found(&format!("psycopg2/_psycopg{so}"), "libpq.so.5"),
        ];
        let found = optional_backends(&elf, &[&numba, &pg, &tbb]);
        assert_eq!(
            found,
            HashSet::from([format!("numba/np/ufunc/tbbpool{so}")])
        );
    }
}
