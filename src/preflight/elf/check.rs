//! The ELF check proper: [`check_object`] simulates loading one root (dlopen
//! by the interpreter, `RTLD_NOW`) on top of the global scope and turns what
//! resolution and the symbol analysis find into [`ElfProblem`]s, which
//! [`ElfProblem::to_problem`] turns into preflight [`Problem`]s.

use std::path::{Path, PathBuf};

use super::config::LoaderConfig;
use super::search::Session;
use super::symbols::{check_undefined_symbols, check_version_needs};
use super::view::{LoaderView, normalize};
use crate::model::{Check, Problem, Symbol};

/// One predicted load failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfProblem {
    /// The object that cannot be loaded (the one with the unmet need).
    pub file: PathBuf,
    pub reason: String,
    /// What is unmet, as data (the reason words it).
    pub unmet: Unmet,
}

/// What an [`ElfProblem`] lacks: what the load model's later rules (a
/// library no distribution ships, symbols another package defines) look at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Unmet {
    /// A `DT_NEEDED` name that is not found.
    Library(String),
    /// A needed symbol version.
    Version,
    /// Undefined symbols (one, or for "… and N more" the rest of them).
    Symbols(Vec<Symbol>),
    /// The object itself is missing or not a 64-bit little-endian ELF file.
    Unreadable,
}

impl ElfProblem {
    /// As a preflight [`Problem`] of the ELF check, the file relative to
    /// `site_packages` when it lies under it.
    pub fn to_problem(&self, site_packages: &Path, dist: Option<String>) -> Problem {
        let file = self.file.strip_prefix(site_packages).unwrap_or(&self.file);
        Problem {
            check: Check::Elf,
            dist,
            file: Some(file.to_string_lossy().into_owned()),
            reason: self.reason.clone(),
            cause: Some(cause_of(&self.reason)),
            ..Problem::default()
        }
    }
}

/// The grouping key of an ELF problem's reason: the missing soname or
/// version (`needs libX.so.1, which is not found`, without the directories
/// searched), the undefined symbol.
pub fn cause_of(reason: &str) -> String {
    if reason.starts_with("needs ") {
        reason.split(" (").next().unwrap_or(reason).to_owned()
    } else {
        reason.to_owned()
    }
}

/// Simulate loading `root` (dlopen by the interpreter, `RTLD_NOW`) and
/// report every problem: unresolvable `DT_NEEDED`, unmet version needs and
/// non-weak undefined symbols defined nowhere in scope.
pub fn check_object(root: &Path, view: &mut dyn LoaderView, cfg: &LoaderConfig) -> Vec<ElfProblem> {
    let mut problems = Vec::new();
    let mut s = Session::new(view, cfg);
    s.load_global();

    // The root, loaded by path, and its closure.
    let root = normalize(root);
    let Some(info) = s.view.elf(&root) else {
        return vec![ElfProblem {
            file: root,
            reason: "is missing or is not a 64-bit little-endian ELF object".to_owned(),
            unmet: Unmet::Unreadable,
        }];
    };
    let r = s.add(root, info, None, true);
    s.closure(r, true, Some(&mut problems));

    let missing_versions = check_version_needs(&s, &mut problems);
    check_undefined_symbols(&s, &missing_versions, &mut problems);
    problems
}

/// What loading one root brings into the process (see [`closure_of`]).
#[derive(Debug, Default)]
pub struct Closure {
    /// The objects loaded for the root (the root first, breadth-first), and
    /// the objects already loaded (global scope, [`LoaderConfig::loaded`])
    /// that one of them needs.
    pub objects: Vec<PathBuf>,
    /// Each name an object loaded for the root answers to (soname, names it
    /// was requested as), with its path: what later `DT_NEEDED`s match.
    pub names: Vec<(String, PathBuf)>,
    /// Every `DT_NEEDED` name of the objects loaded for the root, found or not.
    pub needed: Vec<String>,
}

/// The `DT_NEEDED` closure of `root` loaded on top of `cfg` (search only:
/// no version or symbol check, so only needed, soname and path facts are
/// used). A need not found is left out.
pub fn closure_of(root: &Path, view: &mut dyn LoaderView, cfg: &LoaderConfig) -> Closure {
    let mut s = Session::new(view, cfg);
    s.load_global();
    let root = normalize(root);
    let Some(info) = s.view.elf(&root) else {
        return Closure::default();
    };
    let first = s.objs.len();
    let r = s.add(root, info, None, true);
    s.closure(r, true, None);
    let mut seen = std::collections::HashSet::new();
    let mut objects = Vec::new();
    let mut needed = Vec::new();
    for (i, o) in s.objs.iter().enumerate().skip(first).filter(|(_, o)| o.new) {
        needed.extend(o.info.needed.iter().cloned());
        if seen.insert(i) {
            objects.push(o.path.clone());
        }
        for d in o.deps.iter().filter_map(|d| d.object) {
            if !s.objs[d].new && seen.insert(d) {
                objects.push(s.objs[d].path.clone());
            }
        }
    }
    let names = s
        .by_name
        .iter()
        .filter(|(n, i)| !n.contains('/') && s.objs[**i].new)
        .map(|(n, &i)| (n.clone(), s.objs[i].path.clone()))
        .collect();
    Closure {
        objects,
        names,
        needed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::elf::OverlayView;
    use crate::preflight::elf::testutil::{BaseAndUser, base_and_user, cc, reasons};

    #[test]
    fn consistent_object_has_no_problem() {
        let t = tempfile::tempdir().unwrap();
        let BaseAndUser { user, .. } = base_and_user(t.path());
        let cfg = LoaderConfig::system();
        assert!(
            cfg.ld_cache.contains_key("libc.so.6"),
            "ld cache: {:?}",
            cfg.ld_cache.len()
        );
        let problems = check_object(&user, &mut OverlayView::new(), &cfg);
        assert!(problems.is_empty(), "{:#?}", reasons(&problems));
    }

    #[test]
    fn global_scope_defines_interpreter_symbols() {
        let t = tempfile::tempdir().unwrap();
        let ext = cc(
            t.path(),
            "ext.so",
            "extern int PyFake_Create(int);\nint PyInit_ext(void) { return PyFake_Create(3); }\n",
            false,
            &[],
        );
        let interp = cc(
            t.path(),
            "libfakepython.so",
            "int PyFake_Create(int x) { return x; }\n",
            false,
            &[],
        );
        let mut cfg = LoaderConfig::system();
        let problems = check_object(&ext, &mut OverlayView::new(), &cfg);
        assert_eq!(
            reasons(&problems),
            vec![format!(
                "{}: undefined symbol: PyFake_Create",
                ext.display()
            )]
        );
        cfg.global = vec![interp];
        assert!(check_object(&ext, &mut OverlayView::new(), &cfg).is_empty());
    }
}

#[cfg(test)]
mod loaded_tests {
    use super::*;
    use crate::preflight::elf::OverlayView;
    use crate::preflight::elf::testutil::{cc, reasons};

    /// The torch/libtorch_python pattern: a library loaded earlier
    /// (`RTLD_LOCAL`) satisfies a `DT_NEEDED` by its soname with no search
    /// path to it, and lends its symbols to the objects that need it, but
    /// not to the others.
    #[test]
    fn a_loaded_library_matches_by_name_and_lends_symbols_only_in_scope() {
        let t = tempfile::tempdir().unwrap();
        let lib = cc(
            t.path(),
            "torchlike/lib/libtp.so",
            "int tp_api(void) { return 1; }\n",
            false,
            &["-Wl,-soname,libtp.so"],
        );
        let user = cc(
            t.path(),
            "vision/image.so",
            "extern int tp_api(void);\nint image(void) { return tp_api(); }\n",
            false,
            &["torchlike/lib/libtp.so"],
        );
        let stray = cc(
            t.path(),
            "vision/stray.so",
            "extern int tp_api(void);\nint stray(void) { return tp_api(); }\n",
            false,
            &[],
        );
        let mut cfg = LoaderConfig::system();
        let alone = check_object(&user, &mut OverlayView::new(), &cfg);
        assert_eq!(alone.len(), 1, "{:#?}", reasons(&alone));
        assert!(
            alone[0]
                .reason
                .starts_with("needs libtp.so, which is not found")
        );
        cfg.loaded.insert("libtp.so".into(), lib.clone());
        let after_import = check_object(&user, &mut OverlayView::new(), &cfg);
        assert!(after_import.is_empty(), "{:#?}", reasons(&after_import));
        let c = closure_of(&user, &mut OverlayView::new(), &cfg);
        assert_eq!(c.objects, vec![user.clone(), lib.clone()]);
        // Loaded RTLD_LOCAL: its symbols are not the stray object's.
        assert_eq!(
            reasons(&check_object(&stray, &mut OverlayView::new(), &cfg)),
            vec![format!("{}: undefined symbol: tp_api", stray.display())]
        );
        // Loaded RTLD_GLOBAL: they are.
        cfg.global = vec![lib];
        assert!(check_object(&stray, &mut OverlayView::new(), &cfg).is_empty());
    }

    #[test]
    fn cause_of_drops_the_searched_directories() {
        assert_eq!(
            cause_of("needs libx.so.1, which is not found (searched: /a, ld.so cache)"),
            "needs libx.so.1, which is not found"
        );
        assert_eq!(
            cause_of("needs V_2 from libv.so (/p defines up to V_1)"),
            "needs V_2 from libv.so"
        );
        assert_eq!(
            cause_of("undefined symbol: ns::f(int) (_ZN2ns1fEi)"),
            "undefined symbol: ns::f(int) (_ZN2ns1fEi)"
        );
    }
}

#[cfg(test)]
mod system_tests {
    use super::*;
    use crate::preflight::elf::OverlayView;
    use std::path::PathBuf;
    use std::time::Instant;

    /// Every shared library of this host's system directories should load:
    /// a false-positive hunt (run with `--ignored`).
    #[test]
    #[ignore]
    fn system_libraries_load() {
        let dir =
            std::env::var("ELF_SCAN_DIR").unwrap_or_else(|_| "/usr/lib/x86_64-linux-gnu".into());
        let depth = std::env::var("ELF_SCAN_DEPTH")
            .ok()
            .and_then(|d| d.parse().ok())
            .unwrap_or(1);
        let mut cfg = LoaderConfig::system();
        if let Ok(g) = std::env::var("ELF_GLOBAL") {
            cfg.global = g.split(':').map(PathBuf::from).collect();
        }
        let mut view = OverlayView::new();
        let start = Instant::now();
        let mut n = 0;
        let mut bad = Vec::new();
        for e in walkdir::WalkDir::new(&dir).max_depth(depth) {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if !e.file_type().is_file() || !name.contains(".so") {
                continue;
            }
            if view.elf(e.path()).is_none() {
                continue;
            }
            n += 1;
            let p = check_object(e.path(), &mut view, &cfg);
            bad.extend(p);
        }
        eprintln!("{n} objects in {:?}", start.elapsed());
        for p in &bad {
            eprintln!("{}: {}", p.file.display(), p.reason);
        }
    }
}
