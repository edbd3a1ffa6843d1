//! Library resolution, as glibc's `_dl_map_object_deps` does it: the
//! [`Session`] of objects loaded so far (the global scope, then a root and
//! its breadth-first `DT_NEEDED` closure), the library search order of
//! `man ld.so` (a name already loaded first, the config's `loaded` objects
//! included; then inherited `DT_RPATH`, `LD_LIBRARY_PATH`, own `DT_RUNPATH`,
//! ld.so cache, default directories) and the expansion of `$ORIGIN`, `$LIB`
//! and `$PLATFORM`. A need that nothing satisfies becomes a "not found"
//! [`ElfProblem`] listing what was searched.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::ElfInfo;
use super::check::ElfProblem;
use super::config::LoaderConfig;
use super::view::{LoaderView, normalize};

/// One object in the session.
pub(super) struct Loaded {
    pub path: PathBuf,
    pub info: Arc<ElfInfo>,
    /// `$ORIGIN` of this object.
    pub origin: PathBuf,
    /// The object whose `DT_NEEDED` loaded this one (`l_loader`).
    pub loader: Option<usize>,
    /// Loaded for this root (checked), as opposed to already in the global scope.
    pub new: bool,
    /// Each `DT_NEEDED` of this object, in order, and what it resolved to.
    pub deps: Vec<Dep>,
}

/// One `DT_NEEDED` entry of a loaded object.
pub(super) struct Dep {
    /// The name as needed.
    pub name: String,
    /// The object it resolved to, `None` if not found.
    pub object: Option<usize>,
}

/// The objects loaded for one check, in load order.
pub(super) struct Session<'a> {
    pub view: &'a mut dyn LoaderView,
    pub cfg: &'a LoaderConfig,
    pub objs: Vec<Loaded>,
    /// Names an object answers to: soname, names it was requested as, path.
    pub by_name: HashMap<String, usize>,
    /// The main program (`cfg.global[0]`).
    main: Option<usize>,
}

impl<'a> Session<'a> {
    pub fn new(view: &'a mut dyn LoaderView, cfg: &'a LoaderConfig) -> Self {
        Session {
            view,
            cfg,
            objs: Vec::new(),
            by_name: HashMap::new(),
            main: None,
        }
    }
}

impl Session<'_> {
    pub fn add(
        &mut self,
        path: PathBuf,
        info: Arc<ElfInfo>,
        loader: Option<usize>,
        new: bool,
    ) -> usize {
        let index = self.objs.len();
        let origin = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        self.by_name
            .entry(path.to_string_lossy().into_owned())
            .or_insert(index);
        if let Some(soname) = &info.soname {
            self.by_name.entry(soname.clone()).or_insert(index);
        }
        self.objs.push(Loaded {
            path,
            info,
            origin,
            loader,
            new,
            deps: Vec::new(),
        });
        index
    }

    /// Load the global scope: each object of `cfg.global` and its own
    /// closure, silently (problems there are not the root's).
    pub fn load_global(&mut self) {
        let cfg = self.cfg;
        for (n, g) in cfg.global.iter().enumerate() {
            let g = normalize(g);
            if self.by_name.contains_key(g.to_string_lossy().as_ref()) {
                continue;
            }
            let Some(info) = self.view.elf(&g) else {
                continue;
            };
            let i = self.add(g.clone(), info, None, false);
            if n == 0 {
                // The executable's $ORIGIN is that of its real path (/proc/self/exe).
                if let Some(dir) = fs::canonicalize(&g)
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf))
                {
                    self.objs[i].origin = dir;
                }
                self.main = Some(i);
            }
            self.closure(i, false, None);
        }
    }

    /// The search path of `man ld.so` for a need of object `o`, with
    /// `None` marking the place of the ld.so cache.
    fn search_dirs(&self, o: usize) -> Vec<Option<PathBuf>> {
        let mut dirs = Vec::new();
        let obj = &self.objs[o];
        if obj.info.runpath.is_empty() {
            self.push_inherited_rpaths(o, &mut dirs);
        }
        dirs.extend(self.cfg.ld_library_path.iter().map(|d| Some(normalize(d))));
        push_path_entries(&obj.info.runpath, &obj.origin, &mut dirs);
        dirs.push(None);
        dirs.extend(self.cfg.default_dirs.iter().map(|d| Some(d.clone())));
        let mut seen = HashSet::new();
        dirs.retain(|d| seen.insert(d.clone()));
        dirs
    }

    /// `DT_RPATH` of `o`, then of each loader up the chain (a `DT_RUNPATH` on
    /// an object voids its own `DT_RPATH`), then of the main program.
    fn push_inherited_rpaths(&self, o: usize, dirs: &mut Vec<Option<PathBuf>>) {
        let mut did_main = false;
        let mut l = Some(o);
        while let Some(i) = l {
            let lo = &self.objs[i];
            if lo.info.runpath.is_empty() {
                push_path_entries(&lo.info.rpath, &lo.origin, dirs);
                did_main |= Some(i) == self.main;
            }
            l = lo.loader;
        }
        if let (false, Some(m)) = (did_main, self.main) {
            let mo = &self.objs[m];
            if mo.info.runpath.is_empty() {
                push_path_entries(&mo.info.rpath, &mo.origin, dirs);
            }
        }
    }

    /// Find (loading it if need be) the object `o` asks for as `name`.
    /// `Err` lists what was searched.
    fn resolve(&mut self, o: usize, name: &str, new: bool) -> Result<usize, Vec<String>> {
        if name.contains('/') {
            let p = PathBuf::from(expand_dst(name, &self.objs[o].origin));
            if !p.is_absolute() {
                return Err(vec![format!(
                    "{} (relative to the working directory)",
                    p.display()
                )]);
            }
            let p = normalize(&p);
            return self
                .open(o, name, &p, new)
                .ok_or_else(|| vec![p.display().to_string()]);
        }
        if let Some(&i) = self.by_name.get(name) {
            return Ok(i);
        }
        if let Some(p) = self.cfg.loaded.get(name) {
            // Loaded earlier (RTLD_LOCAL): matched by name, already there
            // with its own closure, not this root's to check.
            let p = normalize(p);
            if let Some(info) = self.view.elf(&p) {
                let i = match self.by_name.get(p.to_string_lossy().as_ref()) {
                    Some(&i) => i,
                    None => {
                        let i = self.add(p, info, None, false);
                        self.closure(i, false, None);
                        i
                    }
                };
                self.by_name.entry(name.to_owned()).or_insert(i);
                return Ok(i);
            }
        }
        let mut searched = Vec::new();
        for dir in self.search_dirs(o) {
            let candidate = match dir {
                Some(dir) => {
                    searched.push(dir.display().to_string());
                    dir.join(name)
                }
                None => {
                    searched.push("ld.so cache".to_owned());
                    match self.cfg.ld_cache.get(name) {
                        Some(p) => p.clone(),
                        None => continue,
                    }
                }
            };
            if let Some(i) = self.open(o, name, &candidate, new) {
                return Ok(i);
            }
        }
        Err(searched)
    }

    fn open(&mut self, o: usize, name: &str, path: &Path, new: bool) -> Option<usize> {
        let key = path.to_string_lossy();
        let index = match self.by_name.get(key.as_ref()) {
            Some(&i) => i,
            None => {
                let info = self.view.elf(path)?;
                self.add(path.to_path_buf(), info, Some(o), new)
            }
        };
        self.by_name.entry(name.to_owned()).or_insert(index);
        Some(index)
    }

    /// Breadth-first closure from `start`; not-found problems go to `problems`
    /// when given.
    pub fn closure(&mut self, start: usize, new: bool, mut problems: Option<&mut Vec<ElfProblem>>) {
        let mut queue = VecDeque::from([start]);
        let mut queued: HashSet<usize> = HashSet::from([start]);
        while let Some(o) = queue.pop_front() {
            let info = self.objs[o].info.clone();
            for name in &info.needed {
                let dep = match self.resolve(o, name, new) {
                    Ok(i) => Some(i),
                    Err(searched) => {
                        if let Some(p) = problems.as_deref_mut() {
                            p.push(ElfProblem {
                                file: self.objs[o].path.clone(),
                                reason: format!(
                                    "needs {name}, which is not found (searched: {})",
                                    searched.join(", ")
                                ),
                                unmet: super::check::Unmet::Library(name.clone()),
                            });
                        }
                        None
                    }
                };
                self.objs[o].deps.push(Dep {
                    name: name.clone(),
                    object: dep,
                });
                if let Some(i) = dep
                    && self.objs[i].new == new
                    && queued.insert(i)
                {
                    queue.push_back(i);
                }
            }
        }
    }
}

/// Push the absolute directories of `DT_RPATH`/`DT_RUNPATH` `entries` of an
/// object at `origin`, expanded and normalized.
fn push_path_entries(entries: &[String], origin: &Path, dirs: &mut Vec<Option<PathBuf>>) {
    for e in entries {
        let d = PathBuf::from(expand_dst(e, origin));
        if d.is_absolute() {
            dirs.push(Some(normalize(&d)));
        }
    }
}

/// Expand `$ORIGIN`, `$LIB` and `$PLATFORM` (braced or not) as glibc does.
fn expand_dst(s: &str, origin: &Path) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        let (name, after) = match rest.strip_prefix('{') {
            Some(r) => match r.find('}') {
                Some(j) => (&r[..j], &r[j + 1..]),
                None => ("", rest),
            },
            None => {
                let j = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                (&rest[..j], &rest[j..])
            }
        };
        match name {
            "ORIGIN" => out.push_str(&origin.to_string_lossy()),
            "LIB" => out.push_str("lib"),
            "PLATFORM" => out.push_str("x86_64"),
            _ => {
                out.push('$');
                continue;
            }
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ElfInfo;
    use crate::preflight::elf::testutil::{BaseAndUser, base_and_user, cc, reasons};
    use crate::preflight::elf::{OverlayView, check_object, read_elf};

    #[test]
    fn deleted_needed_is_not_found() {
        let t = tempfile::tempdir().unwrap();
        let BaseAndUser { base, user } = base_and_user(t.path());
        let mut view = OverlayView::new();
        view.set(base, None);
        let problems = check_object(&user, &mut view, &LoaderConfig::system());
        assert_eq!(problems.len(), 1, "{:#?}", reasons(&problems));
        assert_eq!(problems[0].file, user);
        assert!(
            problems[0]
                .reason
                .starts_with("needs libbase.so.1, which is not found (searched: ")
        );
        assert!(
            problems[0]
                .reason
                .contains(&t.path().join("deps").display().to_string())
        );
    }

    /// root (RPATH or RUNPATH $ORIGIN/deps) -> deps/libB.so.1 (no path) -> deps/libC.so.1
    fn chain(dir: &Path, dtags: &str) -> PathBuf {
        cc(
            dir,
            "deps/libC.so.1",
            "int c(void) { return 3; }\n",
            false,
            &["-Wl,-soname,libC.so.1"],
        );
        cc(
            dir,
            "deps/libB.so.1",
            "extern int c(void);\nint b(void) { return c(); }\n",
            false,
            &["-Wl,-soname,libB.so.1", "deps/libC.so.1"],
        );
        cc(
            dir,
            "root.so",
            "extern int b(void);\nint r(void) { return b(); }\n",
            false,
            &[
                "deps/libB.so.1",
                dtags,
                "-Wl,-rpath,$ORIGIN/deps",
                "-Wl,-rpath-link,deps",
            ],
        )
    }

    #[test]
    fn rpath_is_inherited() {
        let t = tempfile::tempdir().unwrap();
        let root = chain(t.path(), "-Wl,--disable-new-dtags");
        assert_eq!(
            read_elf(&root).unwrap().unwrap().rpath,
            vec!["$ORIGIN/deps".to_owned()]
        );
        let problems = check_object(&root, &mut OverlayView::new(), &LoaderConfig::system());
        assert!(problems.is_empty(), "{:#?}", reasons(&problems));
    }

    #[test]
    fn runpath_is_not_inherited() {
        let t = tempfile::tempdir().unwrap();
        let root = chain(t.path(), "-Wl,--enable-new-dtags");
        assert_eq!(
            read_elf(&root).unwrap().unwrap().runpath,
            vec!["$ORIGIN/deps".to_owned()]
        );
        let problems = check_object(&root, &mut OverlayView::new(), &LoaderConfig::system());
        assert_eq!(problems.len(), 1, "{:#?}", reasons(&problems));
        assert_eq!(problems[0].file, t.path().join("deps/libB.so.1"));
        assert!(
            problems[0]
                .reason
                .starts_with("needs libC.so.1, which is not found")
        );
        // LD_LIBRARY_PATH does reach it.
        let mut cfg = LoaderConfig::system();
        cfg.ld_library_path = vec![t.path().join("deps")];
        assert!(check_object(&root, &mut OverlayView::new(), &cfg).is_empty());
    }

    #[test]
    fn origin_parent_in_runpath() {
        let t = tempfile::tempdir().unwrap();
        let BaseAndUser { base, .. } = base_and_user(t.path());
        let ext = cc(
            t.path(),
            "pkg/sub/ext.so",
            "extern int base(int);\nint e(void) { return base(1); }\n",
            false,
            &[
                base.to_str().unwrap(),
                "-Wl,--enable-new-dtags",
                "-Wl,-rpath,${ORIGIN}/../../deps",
            ],
        );
        let cfg = LoaderConfig::system();
        let problems = check_object(&ext, &mut OverlayView::new(), &cfg);
        assert!(problems.is_empty(), "{:#?}", reasons(&problems));
        // A replacement added by the overlay next to the old one is what counts.
        let mut view = OverlayView::new();
        view.set(
            t.path().join("pkg/sub/../../deps/libbase.so.1"),
            Some(ElfInfo::default()),
        );
        let problems = check_object(&ext, &mut view, &cfg);
        assert_eq!(
            reasons(&problems),
            vec![format!("{}: undefined symbol: base", ext.display())]
        );
    }

    #[test]
    fn expand_dst_substitutes_known_names() {
        let o = Path::new("/a/b");
        assert_eq!(expand_dst("$ORIGIN/../lib", o), "/a/b/../lib");
        assert_eq!(expand_dst("${ORIGIN}/x:$LIB", o), "/a/b/x:lib");
        assert_eq!(expand_dst("/opt/$UNKNOWN/x", o), "/opt/$UNKNOWN/x");
    }
}
