//! `overlay doctor`: a venv checked as it stands, on its own host, without a
//! source. Run inside the agent ([`run`]); only the findings cross the
//! network. By job:
//!
//! - `record`: every distribution's files against its RECORD (missing,
//!   changed size or sha256), hashed on all cores through the sha256
//!   [`StampCache`](crate::hashcache::StampCache);
//! - `elf`: shared objects cut short (a segment past the end of the file);
//! - `extra`: files in the distributions' package directories that no
//!   RECORD lists;
//! - `pycache`: bytecode whose header does not match its source;
//! - `shebang`: `bin/` scripts whose interpreter is missing or another venv's;
//! - `dists`: a distribution with two dist-infos;
//! - `checks`: the preflight's requirement, CUDA, ELF and GPU checks on the
//!   venv as it is (the GPU check against this host's driver and GPUs,
//!   which the report carries).
//!
//! Each finding is a problem or a note
//! ([`FindingClass`](crate::model::FindingClass)): what a healthy
//! venv shows too (regenerable bytecode and edited data files, from
//! `record`; modules that need another package imported first and optional
//! backends without their system library, from `checks`) is a note, and
//! only problems make `doctor` fail.
//!
//! [`record_check`] is the RECORD part alone, for some distributions: the
//! note `overlay plan` makes on the source's carried files.

mod checks;
mod dists;
mod elf;
mod extra;
mod pycache;
mod record;
mod shebang;

use std::collections::HashMap;

use crate::error::Result;
use crate::hashcache::StampCache;
use crate::inventory::{Counters, Venv};
use crate::model::{Dist, DoctorReport, DoctorRequest, Finding, FindingKind, RecordCheckRequest};

pub use elf::damage;
pub use record::{Row, SHA256_CACHE, parse_rows, sha256_file};

/// Check the venv of `req` as it stands.
pub fn run(req: &DoctorRequest, counters: &Counters) -> Result<DoctorReport> {
    let scan = crate::inventory::scan(&req.venv, &[])?;
    // GPU code is read for this host's GPUs (docs/preflight.md#gpu).
    crate::preflight::elf::fatbin::read_for(Some(scan.machine.capabilities()));
    let venv = Venv::open(&req.venv)?;
    let site = venv.site();
    let dists: Vec<&Dist> = scan.dists.iter().collect();
    let cache = StampCache::<String>::open_kind(&venv.root, SHA256_CACHE);
    let checked = record::check(
        &venv,
        &dists,
        &record::Hashing {
            cache: &cache,
            max_bytes: None,
            only: None,
        },
        counters,
    )?;
    cache.save();
    let mut findings = checked.findings;
    for d in &dists {
        if let Some(p) = &d.problem
            && !p.contains("/RECORD")
        {
            findings.push(Finding::problem(
                FindingKind::Changed,
                Some(d.name.clone()),
                Some(d.dist_info.clone()),
                p.clone(),
            ));
        }
    }
    let owners: HashMap<&str, &str> = dists
        .iter()
        .flat_map(|d| d.files.iter().map(|f| (f.as_str(), d.name.as_str())))
        .collect();
    let owner = |p: &str| owners.get(p).map(|s| s.to_string());
    let walked = extra::walk(&site, &dists);
    findings.extend(walked.extras);
    findings.extend(pycache::check(&site, &venv.python, &walked.pycache, &owner));
    let record_prefix = format!("{}bin/", "../".repeat(venv.site_rel.split('/').count()));
    findings.extend(shebang::check(&venv.root, &record_prefix, &owner));
    findings.extend(dists::duplicates(&dists));
    let (found, elf_checked) = checks::preflight_checks(req, &scan, &dists)?;
    findings.extend(found);
    findings.sort();
    findings.dedup();
    Ok(DoctorReport {
        venv: req.venv.clone(),
        dists: dists.len() as u64,
        files: checked.files,
        hashed: checked.hashed,
        cached: checked.cached,
        elf_checked,
        findings,
        machine: scan.machine.clone(),
    })
}

/// The files of the distributions `req` names against their own RECORD:
/// what differs (changed, missing, damaged), sorted. Only their RECORDs are
/// read (no scan of the venv); each finding's `dist` is the dist-info
/// directory's name, for the caller to map to the distribution.
pub fn record_check(req: &RecordCheckRequest, counters: &Counters) -> Result<Vec<Finding>> {
    let venv = Venv::open_source(&req.venv)?;
    let named: Vec<Dist> = req
        .dist_infos
        .iter()
        .map(|d| {
            if d.ends_with(".dist-info") && !d.contains('/') && !d.starts_with('.') {
                Ok(Dist {
                    name: d.clone(),
                    normalized: String::new(),
                    version: String::new(),
                    build: None,
                    dist_info: d.clone(),
                    files: Vec::new(),
                    problem: None,
                    requires_dist: Vec::new(),
                    provides_extra: Vec::new(),
                    cuda: None,
                })
            } else {
                Err(crate::err!(
                    kind = Protocol,
                    "a RECORD check names {d:?}, which is not a dist-info directory"
                ))
            }
        })
        .collect::<Result<_>>()?;
    let dists: Vec<&Dist> = named.iter().collect();
    let cache = StampCache::<String>::open_kind(&venv.root, SHA256_CACHE);
    let only: std::collections::HashSet<&str> = req.paths.iter().map(String::as_str).collect();
    let checked = record::check(
        &venv,
        &dists,
        &record::Hashing {
            cache: &cache,
            max_bytes: req.max_hash_bytes,
            only: (!only.is_empty()).then_some(&only),
        },
        counters,
    )?;
    cache.save();
    let mut out = checked.findings;
    out.sort();
    out.dedup();
    Ok(out)
}
