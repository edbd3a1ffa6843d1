//! Prediction of breakage before apply: what would fail to import on the
//! target after the overlay. Three checks, each in its own module:
//! [`requirements`] (every `Requires-Dist` satisfied, markers and extras
//! evaluated for the target), [`cuda`] (packages that link together agree on
//! the CUDA major) and [`elf`] (every shared object the overlay brings or
//! disturbs can be loaded: DT_NEEDED, version needs, undefined symbols).
//!
//! The checks read facts, they never run the loader or the interpreter.
//! The ELF facts are read by [`facts`]: on the agents, on all cores, ahead
//! of the requests that need them, and through a cache keyed by file stamp.

pub mod cuda;
pub mod elf;
pub mod facts;
pub mod requirements;

pub use facts::{SharedObjects, elf_infos, shared_objects};

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::inventory::Venv;
use crate::model::{Dist, ElfInfo, PreflightReport, PreflightRequest, Set, normalize_name};
use elf::{LoaderConfig, LoaderView, OverlayView};

/// Libraries that come with the GPU driver, not with any wheel: a host
/// without a GPU has none, and that is not the overlay's doing.
const DRIVER_LIBS: &[&str] = &[
    "libcuda.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
];

/// The ELF facts cache's kind (its folder under `~/.cache/overlay`): a new
/// name whenever [`ElfInfo`] gains a fact or changes form (`elf3`: defined
/// symbols as hashes), so that no entry written by an older overlay is
/// misread.
pub const ELF_CACHE: &str = "elf3";

/// Does this file name look like a shared object?
pub fn looks_shared(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".so") || name.contains(".so.")
}

fn cudart_majors(info: &ElfInfo) -> BTreeSet<u32> {
    info.needed
        .iter()
        .chain(info.version_needs.iter().map(|(f, _)| f))
        .filter_map(|f| cuda::cudart_major(f))
        .collect()
}

/// Target side: simulate the loader over the venv as it will be.
///
/// `listed`: the venv's shared objects and their facts as
/// [`facts::prefetch_target`] read them ahead of the request, if it did;
/// otherwise they are listed now and read as the check needs them.
pub fn run_on_target(
    req: &PreflightRequest,
    listed: Option<facts::Prefetched>,
) -> Result<PreflightReport> {
    let venv = Venv::open(&req.venv)?;
    let site = venv.site();
    let (view, staying, cache) = facts::target_view(&venv, listed);
    let mut overlaid = overlay(req, &venv, view)?;
    let mut report = PreflightReport::default();
    let mut roots = std::mem::take(&mut overlaid.placed_objects);
    roots.extend(staying_roots(req, staying, &mut overlaid, &mut report));
    for (rel, info) in &req.placed {
        if let Some(info) = info {
            let majors = cudart_majors(info);
            if !majors.is_empty() {
                report.cudart.insert(rel.clone(), majors);
            }
        }
    }

    let mut cfg = LoaderConfig::system();
    cfg.ld_library_path = req.ld_library_path.iter().map(PathBuf::from).collect();
    let preloaded = Preloaded::of(&venv, &site, &mut overlaid.view);
    let site_str = site.to_string_lossy().into_owned();
    for (rel, path) in &roots {
        let c = preloaded.config_for(&cfg, rel, &req.torch_users);
        report.checked += 1;
        for reason in root_problems(rel, path, &mut overlaid.view, &c, &site_str) {
            report.problems.push((rel.clone(), reason));
        }
    }
    report.problems.sort();
    report.problems.dedup();
    cache.save();
    Ok(report)
}

/// The venv as it will be after the overlay, and what the overlay disturbs.
struct Overlaid {
    /// The disk with the placed and deleted files laid over it.
    view: OverlayView,
    /// Sonames and file names of shared objects the overlay replaces or
    /// deletes: staying objects that need one of them are checked.
    disturbed: HashSet<String>,
    /// The placed files that are ELF objects.
    placed_objects: SharedObjects,
}

/// Lay the request's placed and deleted files over `view`, noting what each
/// placed or deleted shared object was before (read through the cache): its
/// soname and file name are what staying objects may need.
fn overlay(req: &PreflightRequest, venv: &Venv, mut view: OverlayView) -> Result<Overlaid> {
    let abs = |rel: &str| -> Result<PathBuf> { Ok(venv.resolve(rel)?.0) };
    let mut disturbed: HashSet<String> = HashSet::new();
    let mut placed_objects = Vec::new();
    let mut was = |p: &Path, rel: &str, view: &mut OverlayView| {
        if looks_shared(rel)
            && let Some(old) = view.elf(p)
        {
            disturbed.extend(old.soname.clone());
            disturbed.extend(p.file_name().map(|n| n.to_string_lossy().into_owned()));
        }
    };
    for (rel, info) in &req.placed {
        let p = abs(rel)?;
        was(&p, rel, &mut view);
        if info.is_some() {
            placed_objects.push((rel.clone(), p.clone()));
        }
        view.set(p, info.clone());
    }
    for rel in &req.deleted {
        let p = abs(rel)?;
        was(&p, rel, &mut view);
        view.set(p, None);
    }
    Ok(Overlaid {
        view,
        disturbed,
        placed_objects,
    })
}

/// The shared objects that stay (neither placed nor deleted) and link to
/// something the overlay disturbs; the CUDA runtime majors of every staying
/// object go to `report`.
fn staying_roots(
    req: &PreflightRequest,
    listed: SharedObjects,
    overlaid: &mut Overlaid,
    report: &mut PreflightReport,
) -> SharedObjects {
    let placed_set: HashSet<&str> = req.placed.iter().map(|(r, _)| r.as_str()).collect();
    let deleted_set: HashSet<&str> = req.deleted.iter().map(String::as_str).collect();
    let staying = listed.into_iter().filter(|(rel, _)| {
        !placed_set.contains(rel.as_str()) && !deleted_set.contains(rel.as_str())
    });
    let mut roots = Vec::new();
    for (rel, path) in staying {
        let Some(info) = overlaid.view.elf(&path) else {
            continue;
        };
        let majors = cudart_majors(&info);
        if !majors.is_empty() {
            report.cudart.insert(rel.clone(), majors);
        }
        // A staying object is checked when it links to something the overlay disturbs.
        if info.needed.iter().any(|n| overlaid.disturbed.contains(n)) {
            roots.push((rel, path));
        }
    }
    roots
}

/// What is in the global scope before an extension of the venv is loaded.
struct Preloaded {
    /// The venv's interpreter (its real path), for every object.
    interpreter: Option<PathBuf>,
    /// What `import torch` loads first, for objects of torch users.
    torch: Vec<PathBuf>,
}

impl Preloaded {
    fn of(venv: &Venv, site: &Path, view: &mut OverlayView) -> Self {
        let interpreter = std::fs::canonicalize(venv.root.join("bin/python")).ok();
        let torch: Vec<PathBuf> = ["torch/lib/libtorch_global_deps.so"]
            .iter()
            .map(|r| site.join(r))
            .chain(
                std::fs::read_dir(site.join("torch"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.starts_with("_C.") && n.ends_with(".so"))
                    }),
            )
            .filter(|p| view.elf(p).is_some())
            .collect();
        Preloaded { interpreter, torch }
    }

    /// `cfg` with the global scope of the object at `rel`.
    fn config_for(&self, cfg: &LoaderConfig, rel: &str, torch_users: &[String]) -> LoaderConfig {
        let mut c = LoaderConfig {
            global: Vec::new(),
            ..cfg.clone()
        };
        c.global.extend(self.interpreter.clone());
        if torch_users
            .iter()
            .any(|t| rel.starts_with(&format!("{t}/")))
        {
            c.global.extend(self.torch.iter().cloned());
        }
        c
    }
}

/// The problems of the root at `rel` (`path`), each worded for the report:
/// an object it loads is named relative to site-packages (`site_str`).
/// Missing GPU driver libraries are not problems.
fn root_problems(
    rel: &str,
    path: &Path,
    view: &mut OverlayView,
    cfg: &LoaderConfig,
    site_str: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    for p in elf::check_object(path, view, cfg) {
        if DRIVER_LIBS
            .iter()
            .any(|d| p.reason.contains(&format!("needs {d},")))
        {
            continue;
        }
        let file = p.file.to_string_lossy();
        let shown = file
            .strip_prefix(&format!("{site_str}/"))
            .map(str::to_string)
            .unwrap_or_else(|| file.into_owned());
        let reason = if shown == *rel {
            p.reason
        } else {
            format!("{shown} (loaded by {rel}): {}", p.reason)
        };
        out.push(reason);
    }
    out
}

/// Distributions installed after the plan: those of the target that stay,
/// plus those the sets bring from the source.
pub fn dists_after<'a>(
    target: &'a [Dist],
    source: &'a [Dist],
    sets: &[Set],
    deleted: &HashSet<&str>,
) -> Vec<&'a Dist> {
    let arriving: Vec<&Dist> = source
        .iter()
        .filter(|d| {
            sets.iter()
                .any(|s| crate::manifest::matches_any(&s.dists, &d.normalized))
        })
        .collect();
    let arriving_infos: HashSet<&str> = arriving.iter().map(|d| d.dist_info.as_str()).collect();
    let mut out: Vec<&Dist> = target
        .iter()
        .filter(|d| {
            !deleted.contains(format!("{}/METADATA", d.dist_info).as_str())
                && !arriving_infos.contains(d.dist_info.as_str())
        })
        .collect();
    out.extend(arriving);
    out
}

/// The top-level directories owned by distributions that require torch.
pub fn torch_users(dists: &[&Dist]) -> Vec<String> {
    let mut out = BTreeSet::new();
    for d in dists {
        let needs_torch = d.requires_dist.iter().any(|r| {
            let name: String = r
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                .collect();
            normalize_name(&name) == "torch"
        });
        if needs_torch || d.normalized == "torch" {
            for f in &d.files {
                if let Some((top, _)) = f.split_once('/')
                    && !top.ends_with(".dist-info")
                    && !top.starts_with("..")
                {
                    out.insert(top.to_string());
                }
            }
        }
    }
    out.into_iter().collect()
}

/// Owner distribution of a path (after the overlay), for messages.
pub fn owner<'a>(dists: &[&'a Dist], path: &str) -> Option<&'a Dist> {
    dists
        .iter()
        .find(|d| d.files.iter().any(|f| f == path))
        .copied()
}
