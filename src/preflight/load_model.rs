//! The ELF check on the target through the **load model**
//! ([`run_on_target`]): the roots are the extension modules (what `import`
//! loads), each on top of what the imports of the distributions it
//! requires have loaded ([`Preloads`]: their `_C` modules by name, their
//! global deps); shared objects no extension module reaches are optional
//! plugins, whose problems are marked `optional`; a staying root's problem
//! that the venv as it is has already is marked `preexisting`; a root whose
//! only problems are undefined symbols that another package's shared
//! objects define is imported after that package, and gets one finding
//! marked `imported_first` instead ([`imported_first_note`]), which `plan`
//! does not predict and `doctor` notes. See docs/preflight.md.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::elf::{self, LoaderConfig, LoaderView, OverlayView};
use super::object::{Found, Object, lexical};
use super::preloads::{Preloads, imported_first_note, imported_first_of};
use super::{SharedObjects, cuda, facts, gpu, looks_shared};
use crate::error::Result;
use crate::inventory::Venv;
use crate::model::{ElfFinding, ElfInfo, PreflightReport, PreflightRequest};

/// Libraries that come with the GPU driver, not with any wheel: a host
/// without a GPU has none, and that is not the overlay's doing.
const DRIVER_LIBS: &[&str] = &[
    "libcuda.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ptxjitcompiler.so.1",
];

fn cudart_majors(info: &ElfInfo) -> BTreeSet<u32> {
    info.needed
        .iter()
        .chain(info.version_needs.iter().map(|(f, _)| f))
        .filter_map(|f| cuda::cudart_major(f))
        .collect()
}

/// Target side: simulate the loader over the venv as it will be.
///
/// The load model: what an import loads is an extension module (an object
/// that defines `PyInit_<its stem>`, [`ElfInfo::is_extension`]) and its
/// `DT_NEEDED` closure, on top of what the imports before it loaded (see
/// [`Preloads`]). Every other shared object is an optional plugin: checked,
/// its problems marked `optional`. Checked roots are the extension modules
/// and plugins the overlay affects (placed, or whose closure holds a placed
/// object or needs one it replaces or deletes), or all with `req.whole`.
/// The problems of a root that stays are then looked for on the venv as it
/// is: the same problem there is `preexisting`. A root whose problems are
/// all symbols other packages define gets one "needs X imported first"
/// finding instead (`imported_first_note`).
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
    let (view, listed, cache) = facts::target_view(&venv, listed);
    let mut overlaid = overlay(req, &venv, view)?;
    let mut report = PreflightReport::default();
    let after = objects_after(req, &listed, &mut overlaid);
    for o in &after {
        let majors = cudart_majors(&o.info);
        if !majors.is_empty() {
            report.cudart.insert(o.rel.clone(), majors);
        }
    }

    let mut cfg = LoaderConfig::system();
    cfg.ld_library_path = req.ld_library_path.iter().map(PathBuf::from).collect();
    let imported_first = imported_first_of(req);
    let interpreter = std::fs::canonicalize(venv.root.join("bin/python")).ok();
    let preloads = Preloads::of(
        &site,
        &after,
        &imported_first,
        interpreter.clone(),
        &cfg,
        &mut overlaid.view,
    );
    let roots = classify_roots(&after, &preloads, &cfg, &mut overlaid);
    let checked: Vec<&Root> = roots.iter().filter(|r| r.affected || req.whole).collect();
    report.checked = checked.len() as u64;
    let site_str = site.to_string_lossy().into_owned();
    let found_in = check_roots(&after, &checked, &preloads, &cfg, &overlaid.view, &site_str);

    // Pre-existing: the same problem on the venv as it is, for roots that stay.
    let mut before: Option<(OverlayView, Preloads)> = None;
    for (root, found) in found_in {
        let o = &after[root.index];
        let was: HashSet<Found> = if o.placed || req.whole {
            HashSet::new()
        } else {
            let (view, pre) = before.get_or_insert_with(|| {
                let mut view = OverlayView::with_cache(cache.clone());
                let objects: Vec<Object> = listed
                    .iter()
                    .filter_map(|(rel, path)| {
                        let info = view.elf(path)?;
                        Some(Object::new(rel, path, info, false))
                    })
                    .collect();
                let pre = Preloads::of(
                    &site,
                    &objects,
                    &imported_first,
                    interpreter.clone(),
                    &cfg,
                    &mut view,
                );
                (view, pre)
            });
            let c = pre.config_for(&cfg, &o.rel, &o.path);
            root_problems(&o.rel, &o.path, view, &c, &site_str)
                .into_iter()
                .collect()
        };
        if let Some(first) = imported_first_note(&o.rel, &found, &after) {
            report.problems.push(ElfFinding {
                file: o.rel.clone(),
                optional: root.optional,
                preexisting: found.iter().all(|f| was.contains(f)),
                ..first
            });
            continue;
        }
        for f in found {
            let preexisting = was.contains(&f);
            report.problems.push(ElfFinding {
                file: o.rel.clone(),
                reason: f.reason,
                cause: f.cause,
                optional: root.optional,
                preexisting,
                imported_first: Vec::new(),
                missing_library: match f.unmet {
                    elf::Unmet::Library(name) => Some(name),
                    _ => None,
                },
            });
        }
    }
    report.problems.sort();
    report.problems.dedup();
    if let Some(machine) = &req.machine {
        report.gpu = gpu_findings(machine, &after, &roots, &listed, &cache);
    }
    cache.save();
    Ok(report)
}

/// The GPU check's kernel findings ([`gpu::kernel_findings`]) of every
/// object after the overlay that has GPU code, on `machine`: marked
/// optional as its root is (a plugin no extension module loads), and
/// pre-existing when the object stays, or when the one it replaces had the
/// same finding.
fn gpu_findings(
    machine: &crate::model::Machine,
    after: &[Object],
    roots: &[Root],
    listed: &SharedObjects,
    cache: &Arc<facts::FactsCache>,
) -> Vec<ElfFinding> {
    let optional: HashSet<usize> = roots
        .iter()
        .filter(|r| r.optional)
        .map(|r| r.index)
        .collect();
    let mut before: Option<OverlayView> = None;
    let mut out = Vec::new();
    for (i, o) in after.iter().enumerate() {
        let Some(code) = &o.info.gpu else { continue };
        let found = gpu::kernel_findings(&o.rel, code, machine);
        if found.is_empty() {
            continue;
        }
        let was: HashSet<String> = if !o.placed {
            found.iter().map(|f| f.cause.clone()).collect()
        } else {
            let view = before.get_or_insert_with(|| OverlayView::with_cache(cache.clone()));
            listed
                .iter()
                .find(|(rel, _)| *rel == o.rel)
                .and_then(|(_, path)| view.elf(path))
                .and_then(|info| info.gpu.clone())
                .map(|code| gpu::kernel_findings(&o.rel, &code, machine))
                .unwrap_or_default()
                .into_iter()
                .map(|f| f.cause)
                .collect()
        };
        for f in found {
            out.push(ElfFinding {
                file: o.rel.clone(),
                preexisting: was.contains(&f.cause),
                reason: f.reason,
                cause: f.cause,
                optional: optional.contains(&i),
                ..Default::default()
            });
        }
    }
    out
}

/// The shared objects after the overlay, in path order: those that stay,
/// and those placed.
fn objects_after(
    req: &PreflightRequest,
    listed: &SharedObjects,
    overlaid: &mut Overlaid,
) -> Vec<Object> {
    let placed_set: HashSet<&str> = req.placed.iter().map(|(r, _)| r.as_str()).collect();
    let deleted_set: HashSet<&str> = req.deleted.iter().map(String::as_str).collect();
    let mut after: Vec<Object> = Vec::new();
    for (rel, path) in listed {
        if placed_set.contains(rel.as_str()) || deleted_set.contains(rel.as_str()) {
            continue;
        }
        if let Some(info) = overlaid.view.elf(path) {
            after.push(Object::new(rel, path, info, false));
        }
    }
    for (rel, path) in &overlaid.placed_objects {
        if let Some(info) = overlaid.view.elf(path) {
            after.push(Object::new(rel, path, info, true));
        }
    }
    after.sort_by(|a, b| a.rel.cmp(&b.rel));
    after
}

/// Every root of the load model: the extension modules, then the objects
/// none of them reaches (optional plugins), each marked affected when the
/// overlay places it, or its closure holds a placed object or needs a name
/// the overlay replaces or deletes.
fn classify_roots(
    after: &[Object],
    preloads: &Preloads,
    cfg: &LoaderConfig,
    overlaid: &mut Overlaid,
) -> Vec<Root> {
    let placed_paths: HashSet<PathBuf> = overlaid
        .placed_objects
        .iter()
        .map(|(_, p)| lexical(p))
        .collect();
    let disturbed = &overlaid.disturbed;
    let affects = |c: &elf::Closure| {
        c.objects.iter().any(|p| placed_paths.contains(&lexical(p)))
            || c.needed.iter().any(|n| disturbed.contains(n))
    };
    let view = &mut overlaid.view;
    let mut reached: HashSet<PathBuf> = preloads.all_objects().into_iter().collect();
    let mut reached_real: HashSet<PathBuf> = HashSet::new();
    let mut roots: Vec<Root> = Vec::new();
    for (i, o) in after.iter().enumerate().filter(|(_, o)| o.extension) {
        let c = preloads.config_for(cfg, &o.rel, &o.path);
        let closure = elf::closure_of(&o.path, view, &c);
        let affected = o.placed || affects(&closure);
        for p in &closure.objects {
            // A library needed through a symlink (libcudart.so.13 ->
            // libcudart.so.13.0.96): the walk lists the file it points to.
            if reached.insert(lexical(p))
                && std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
                && let Ok(real) = std::fs::canonicalize(p)
            {
                reached_real.insert(real);
            }
        }
        roots.push(Root {
            index: i,
            optional: false,
            affected,
        });
    }
    for (i, o) in after.iter().enumerate() {
        if o.extension
            || reached.contains(&lexical(&o.path))
            || !reached_real.is_empty()
                && std::fs::canonicalize(&o.path).is_ok_and(|r| reached_real.contains(&r))
        {
            continue;
        }
        let affected = o.placed || {
            let c = preloads.config_for(cfg, &o.rel, &o.path);
            affects(&elf::closure_of(&o.path, view, &c))
        };
        roots.push(Root {
            index: i,
            optional: true,
            affected,
        });
    }
    roots
}

/// The problems of each root in `checked`, on all cores: each worker loads
/// its roots in its own copy of the view (what the closures already read is
/// in it; anything else comes through the shared facts cache).
fn check_roots<'r>(
    after: &[Object],
    checked: &[&'r Root],
    preloads: &Preloads,
    cfg: &LoaderConfig,
    view: &OverlayView,
    site_str: &str,
) -> Vec<(&'r Root, Vec<Found>)> {
    use rayon::prelude::*;
    checked
        .par_iter()
        .map_init(
            || view.clone(),
            |view, root| {
                let o = &after[root.index];
                let c = preloads.config_for(cfg, &o.rel, &o.path);
                (*root, root_problems(&o.rel, &o.path, view, &c, site_str))
            },
        )
        .filter(|(_, found)| !found.is_empty())
        .collect()
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
    // Only shared objects (by name or by content) concern the loader: a
    // plan's thousands of .py files are not even resolved.
    for (rel, info) in &req.placed {
        if info.is_none() && !looks_shared(rel) {
            continue;
        }
        let p = abs(rel)?;
        was(&p, rel, &mut view);
        if info.is_some() {
            placed_objects.push((rel.clone(), p.clone()));
        }
        view.set(p, info.clone());
    }
    for rel in req.deleted.iter().filter(|r| looks_shared(r)) {
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

/// A root of the ELF check: an extension module, or an optional plugin.
struct Root {
    /// Its index in the objects after the overlay.
    index: usize,
    /// A plugin (no extension module reaches it).
    optional: bool,
    /// The overlay affects it: it is checked (all are with `whole`).
    affected: bool,
}

/// The problems of the root at `rel` (`path`), each worded for the report,
/// with its grouping key. An object it loads is named
/// relative to site-packages (`site_str`). Missing GPU driver libraries are
/// not problems.
fn root_problems(
    rel: &str,
    path: &Path,
    view: &mut OverlayView,
    cfg: &LoaderConfig,
    site_str: &str,
) -> Vec<Found> {
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
        let cause = elf::cause_of(&p.reason);
        let reason = if shown == *rel {
            p.reason
        } else {
            format!("{shown} (loaded by {rel}): {}", p.reason)
        };
        out.push(Found {
            reason,
            cause,
            unmet: p.unmet,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::elf::testutil::cc;
    use std::collections::BTreeMap;

    /// A venv at `dir` with an extension module (`pkg/_ext...so`, needing
    /// `libreal.so.1`, a symlink to `libreal.so.1.0`, which needs
    /// `libgone.so`) and a plugin nothing loads (`pkg/plugins/libplug.so`,
    /// needing `libgone.so` too); `libgone.so` is not in the venv.
    fn venv(dir: &Path) -> PathBuf {
        let site = dir.join("venv/lib/python3.11/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::write(dir.join("venv/pyvenv.cfg"), "version = 3.11.4\n").unwrap();
        let b = dir.join("build");
        std::fs::create_dir_all(&b).unwrap();
        cc(
            &b,
            "libgone.so",
            "int gone(void) { return 1; }\n",
            false,
            &["-Wl,-soname,libgone.so"],
        );
        cc(
            &site,
            "pkg/lib/libreal.so.1.0",
            "extern int gone(void);\nint real(void) { return gone(); }\n",
            false,
            &[
                "-Wl,-soname,libreal.so.1",
                b.join("libgone.so").to_str().unwrap(),
            ],
        );
        std::os::unix::fs::symlink("libreal.so.1.0", site.join("pkg/lib/libreal.so.1")).unwrap();
        cc(
            &site,
            "pkg/_ext.cpython-311-x86_64-linux-gnu.so",
            "extern int real(void);\nint PyInit__ext(void) { return real(); }\n",
            false,
            &[
                "pkg/lib/libreal.so.1",
                "-Wl,--enable-new-dtags",
                "-Wl,-rpath,$ORIGIN/lib",
            ],
        );
        cc(
            &site,
            "pkg/plugins/libplug.so",
            "extern int gone(void);\nint plug(void) { return gone(); }\n",
            false,
            &[b.join("libgone.so").to_str().unwrap()],
        );
        dir.join("venv")
    }

    fn request(venv: &Path) -> PreflightRequest {
        PreflightRequest {
            venv: venv.to_string_lossy().into_owned(),
            placed: Vec::new(),
            deleted: Vec::new(),
            ld_library_path: Vec::new(),
            torch_users: Vec::new(),
            imported_first: BTreeMap::new(),
            whole: true,
            machine: None,
        }
    }

    /// The whole venv: the extension's problem is its library's (reached
    /// through a symlink, so no plugin), the unreached plugin's is optional.
    #[test]
    fn extensions_reach_libraries_and_the_rest_are_plugins() {
        let t = tempfile::tempdir().unwrap();
        let report = run_on_target(&request(&venv(t.path())), None).unwrap();
        let got: Vec<(&str, &str, bool)> = report
            .problems
            .iter()
            .map(|f| (f.file.as_str(), f.cause.as_str(), f.optional))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "pkg/_ext.cpython-311-x86_64-linux-gnu.so",
                    "needs libgone.so, which is not found",
                    false
                ),
                (
                    "pkg/plugins/libplug.so",
                    "needs libgone.so, which is not found",
                    true
                ),
            ],
            "{:#?}",
            report.problems
        );
        assert!(
            report.problems[0]
                .reason
                .starts_with("pkg/lib/libreal.so.1 (loaded by ")
        );
        assert!(report.problems.iter().all(|f| !f.preexisting));
    }

    /// Without `whole` and with nothing placed, nothing is affected.
    #[test]
    fn an_empty_overlay_checks_nothing() {
        let t = tempfile::tempdir().unwrap();
        let mut req = request(&venv(t.path()));
        req.whole = false;
        let report = run_on_target(&req, None).unwrap();
        assert_eq!(report.checked, 0);
        assert!(report.problems.is_empty(), "{:#?}", report.problems);
    }

    /// A staying extension whose library the overlay replaces keeps the
    /// problem it had: pre-existing. The plugin, untouched, is not checked.
    #[test]
    fn a_problem_the_venv_has_already_is_preexisting() {
        let t = tempfile::tempdir().unwrap();
        let venv = venv(t.path());
        let mut req = request(&venv);
        req.whole = false;
        let lib = venv.join("lib/python3.11/site-packages/pkg/lib/libreal.so.1.0");
        let info = elf::read_elf(&lib).unwrap();
        req.placed = vec![("pkg/lib/libreal.so.1.0".into(), info)];
        let report = run_on_target(&req, None).unwrap();
        assert_eq!(report.problems.len(), 1, "{:#?}", report.problems);
        let f = &report.problems[0];
        assert_eq!(f.file, "pkg/_ext.cpython-311-x86_64-linux-gnu.so");
        assert!(f.preexisting && !f.optional, "{f:#?}");
    }

    /// The load model's last rule: an extension module whose undefined
    /// symbols are all defined by another package's library needs that
    /// package imported first (one finding, marked so); one symbol defined
    /// nowhere, or a symbol only its own package's unloaded library
    /// defines, leaves real problems.
    #[test]
    fn symbols_another_package_defines_need_it_imported_first() {
        let t = tempfile::tempdir().unwrap();
        let venv = t.path().join("venv");
        let site = venv.join("lib/python3.11/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::write(venv.join("pyvenv.cfg"), "version = 3.11.4\n").unwrap();
        let so = ".cpython-311-x86_64-linux-gnu.so";
        cc(
            &site,
            "prov/lib/libprov.so",
            "int prov_a(void) { return 1; }\nint prov_b(void) { return 2; }\n",
            false,
            &[],
        );
        cc(
            &site,
            &format!("user/_bridge{so}"),
            "extern int prov_a(void);\nextern int prov_b(void);\n\
             int PyInit__bridge(void) { return prov_a() + prov_b(); }\n",
            false,
            &[],
        );
        cc(
            &site,
            &format!("user/_gone{so}"),
            "extern int prov_a(void);\nextern int gone_api(void);\n\
             int PyInit__gone(void) { return prov_a() + gone_api(); }\n",
            false,
            &[],
        );
        cc(
            &site,
            "user/lib/libown.so",
            "int own_api(void) { return 1; }\n",
            false,
            &[],
        );
        cc(
            &site,
            &format!("user/_own{so}"),
            "extern int own_api(void);\nint PyInit__own(void) { return own_api(); }\n",
            false,
            &[],
        );
        let report = run_on_target(&request(&venv), None).unwrap();
        let got: Vec<(&str, &str, &[String])> = report
            .problems
            .iter()
            .filter(|f| !f.optional)
            .map(|f| {
                (
                    f.file.as_str(),
                    f.cause.as_str(),
                    f.imported_first.as_slice(),
                )
            })
            .collect();
        let first = ["prov".to_string()];
        assert_eq!(
            got,
            vec![
                (
                    format!("user/_bridge{so}").as_str(),
                    "needs prov imported first",
                    &first[..]
                ),
                (
                    format!("user/_gone{so}").as_str(),
                    "undefined symbol: gone_api",
                    &[][..]
                ),
                (
                    format!("user/_gone{so}").as_str(),
                    "undefined symbol: prov_a",
                    &[][..]
                ),
                (
                    format!("user/_own{so}").as_str(),
                    "undefined symbol: own_api",
                    &[][..]
                ),
            ],
            "{:#?}",
            report.problems
        );
        assert_eq!(
            report.problems[0].reason,
            "needs prov imported first: its 2 undefined symbols (prov_a, prov_b) are defined by prov/lib/libprov.so"
        );
    }
}
