//! What is installed in a venv, read on the host that has it: the
//! interpreter version, site-packages, every distribution with the files its
//! `*.dist-info/RECORD` lists, files matching globs, and per-path stat and
//! blake3 (hashed on all cores). This runs inside the agent; only the results
//! cross the network.
//!
//! Every path that comes from a RECORD, a glob or a request is checked
//! lexically to stay inside the venv before it is touched, and [`stat`]
//! (with its hashing) reaches it from the venv root's fd without following
//! a symlinked parent directory ([`Walker`]): what lies behind one is
//! reported as [`Kind::ThroughSymlink`](crate::model::Kind::ThroughSymlink),
//! never read.
//!
//! A set's `from` folder is read the same way, as a site-packages with no
//! interpreter ([`Venv::open_source`]).
//!
//! This file finds the venv ([`Venv`]) and holds the progress [`Counters`].
//! The rest, by job: `scan` (distributions, METADATA and RECORD parsing,
//! glob matches), `walk` ([`Walker`]: parent directories opened without
//! following symlinks), `stat` (per-path stat, hashing and bytecode) and
//! `hash` (content hashes, shebang rewriting, file stamps); and `machine`,
//! the host's NVIDIA driver and GPUs that the scan reports beside the venv.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

use crate::err;
use crate::error::{Result, io_cause};
use crate::model::venv_relative;

mod hash;
mod machine;
mod scan;
mod stat;
mod walk;

pub use hash::{
    ContentHasher, Hashed, content_hex, hash_file, hash_open, rewrite_shebang, stamp_of,
};
pub use machine::{machine, module_version, parse_gpus};
pub use scan::{
    Header, glob_matcher, host_facts, parse_metadata, parse_record, record_rows, scan,
    scan_without_machine,
};
pub use stat::stat;
pub use walk::{Blocked, Walker};

/// A located venv: its root and its site-packages directory.
#[derive(Debug, Clone)]
pub struct Venv {
    pub root: PathBuf,
    /// Relative to `root`, e.g. `lib/python3.11/site-packages`.
    pub site_rel: String,
    pub python: String,
}

impl Venv {
    /// Find the venv at `root`: it must exist, not be a conda environment
    /// (`conda-meta/` and no `pyvenv.cfg`: conda's own packages are not
    /// described by dist-infos alone), and have one
    /// `lib/pythonX.Y/site-packages` (with several, `pyvenv.cfg`'s version
    /// picks one).
    pub fn open(root: &str) -> Result<Venv> {
        if let Some(file) = crate::model::bundle_of(root) {
            return Err(err!(
                kind = Usage,
                hint = "a bundle is a source: apply it to a venv with `overlay apply --bundle FILE --venv PATH`",
                "{file} is a bundle, not a venv"
            ));
        }
        let rootp = PathBuf::from(root);
        match std::fs::metadata(&rootp) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(err!(
                    kind = Usage,
                    hint = "check `venv` in the manifest",
                    "venv {root} is not a directory"
                ));
            }
            Err(e) => {
                return Err(err!(
                    kind = Usage,
                    hint = "check `venv` in the manifest, or create it with `python3 -m venv`",
                    "venv {root} cannot be read: {}",
                    io_cause(&e)
                ));
            }
        }
        if rootp.join("conda-meta").is_dir() && !rootp.join("pyvenv.cfg").exists() {
            return Err(err!(
                kind = Usage,
                hint = "overlay works on venvs (python -m venv, virtualenv, uv venv); \
                        conda environments are not supported yet: see docs/manifest.md#conda-environments",
                "venv {root} is a conda environment (it has conda-meta/ and no pyvenv.cfg)"
            ));
        }
        let cfg = std::fs::read_to_string(rootp.join("pyvenv.cfg")).unwrap_or_default();
        let cfg_version = cfg.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            let k = k.trim();
            (k == "version" || k == "version_info").then(|| v.trim().to_string())
        });
        let mut candidates = Vec::new();
        if let Ok(rd) = std::fs::read_dir(rootp.join("lib")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(ver) = name.strip_prefix("python")
                    && ver.split('.').count() == 2
                    && e.path().join("site-packages").is_dir()
                {
                    candidates.push(ver.to_string());
                }
            }
        }
        candidates.sort();
        let python = match (candidates.len(), &cfg_version) {
            (0, _) => {
                return Err(err!(
                    kind = Usage,
                    hint = "is this a virtualenv? overlay expects lib/pythonX.Y/site-packages inside it",
                    "venv {root} has no lib/python3.*/site-packages"
                ));
            }
            (1, _) => candidates.remove(0),
            (_, Some(v)) => {
                let minor: String = v.split('.').take(2).collect::<Vec<_>>().join(".");
                if candidates.contains(&minor) {
                    minor
                } else {
                    return Err(err!(
                        "venv {root} has several site-packages ({}) and pyvenv.cfg names none of them",
                        candidates.join(", ")
                    ));
                }
            }
            (_, None) => {
                return Err(err!(
                    "venv {root} has several site-packages ({}) and no pyvenv.cfg version",
                    candidates.join(", ")
                ));
            }
        };
        Ok(Venv {
            site_rel: format!("lib/python{python}/site-packages"),
            root: rootp,
            python,
        })
    }

    /// Open a source to read from: a venv ([`Venv::open`]), or a folder
    /// laid out like site-packages named by [`crate::model::folder_venv`]
    /// (a set's `from`). The folder is its own site-packages (`site_rel`
    /// is empty, so a RECORD row such as `../../../bin/x` leaves it and is
    /// refused) and has no interpreter (`python` is empty). Paths in it are
    /// reached as in a venv: from its fd, never through a symlink.
    pub fn open_source(root: &str) -> Result<Venv> {
        if let Some(file) = crate::model::bundle_of(root) {
            // Served by `crate::bundle::BundleSource`, never as a directory.
            return Err(err!(
                kind = Usage,
                hint = "a bundle is streamed through this machine: apply without --direct",
                "the bundle {file} is read only by its own agent's scan, stat and send, not as a directory"
            ));
        }
        let Some(folder) = crate::model::folder_of(root) else {
            return Venv::open(root);
        };
        if !folder.starts_with('/') {
            return Err(err!(
                kind = Usage,
                hint = "a set's `from` names a folder; check it in the manifest",
                "folder {folder:?} is not an absolute path"
            ));
        }
        match std::fs::metadata(folder) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(err!(
                    kind = Usage,
                    hint = "a set's `from` must name a folder laid out like site-packages; check it in the manifest",
                    "{folder} is not a directory"
                ));
            }
            Err(e) => {
                return Err(err!(
                    kind = Usage,
                    hint = "a set's `from` must name a folder laid out like site-packages; check it in the manifest",
                    "folder {folder} cannot be read: {}",
                    io_cause(&e)
                ));
            }
        }
        Ok(Venv {
            root: PathBuf::from(folder),
            site_rel: String::new(),
            python: String::new(),
        })
    }

    /// The venv root, opened for fd-relative, no-follow access ([`crate::beneath`]).
    pub fn beneath(&self) -> Result<crate::beneath::Beneath> {
        crate::beneath::Beneath::open(&self.root).map_err(|e| {
            err!(
                "venv {} cannot be opened: {}",
                self.root.display(),
                io_cause(&e)
            )
        })
    }

    pub fn site(&self) -> PathBuf {
        self.root.join(&self.site_rel)
    }

    /// Resolve a site-packages-relative path (RECORD style, may start with
    /// `../../../bin`) to an absolute path, refusing anything that leaves the
    /// venv. Returns the path relative to the venv root as well.
    pub fn resolve(&self, path: &str) -> Result<(PathBuf, String)> {
        let rel = venv_relative(&self.site_rel, path).ok_or_else(|| {
            err!(
                hint = "a RECORD or glob may only name files inside the venv",
                "path {path:?} escapes the venv {}",
                self.root.display()
            )
        })?;
        Ok((self.root.join(&rel), rel))
    }
}

/// Counters shared with the progress reporter.
#[derive(Default)]
pub struct Counters {
    pub files: AtomicU64,
    pub bytes: AtomicU64,
    pub total_files: AtomicU64,
    pub total_bytes: AtomicU64,
    /// Set by the progress reporter when the controller is gone: work that
    /// only matters to it (a stream) stops.
    pub cancel: std::sync::atomic::AtomicBool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = "lib/python3.11/site-packages";

    #[test]
    fn a_folder_is_read_as_site_packages_with_no_interpreter() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("pkg-1.0.dist-info")).unwrap();
        std::fs::create_dir_all(root.join("pkg")).unwrap();
        std::fs::create_dir_all(root.join("bad-1.0.dist-info")).unwrap();
        std::fs::write(root.join("pkg/a.py"), "x = 1\n").unwrap();
        std::fs::write(root.join("loose.py"), "y = 2\n").unwrap();
        std::fs::write(
            root.join("pkg-1.0.dist-info/METADATA"),
            "Name: pkg\nVersion: 1.0\n",
        )
        .unwrap();
        std::fs::write(root.join("pkg-1.0.dist-info/RECORD"), "pkg/a.py,,\n").unwrap();
        std::fs::write(
            root.join("bad-1.0.dist-info/METADATA"),
            "Name: bad\nVersion: 1.0\n",
        )
        .unwrap();
        std::fs::write(root.join("bad-1.0.dist-info/RECORD"), "../../../bin/x,,\n").unwrap();
        let venv = crate::model::folder_venv(root.to_str().unwrap());
        let scan = scan(&venv, &["*.py".to_string()]).unwrap();
        assert_eq!(scan.python, "");
        assert_eq!(scan.site_packages, "");
        assert_eq!(scan.globs, [["loose.py"]]);
        let pkg = scan.dists.iter().find(|d| d.name == "pkg").unwrap();
        assert!(pkg.files.contains(&"pkg/a.py".to_string()), "{pkg:?}");
        let bad = scan.dists.iter().find(|d| d.name == "bad").unwrap();
        assert!(
            bad.problem.as_deref().unwrap().contains("escapes"),
            "a RECORD row that leaves the folder: {bad:?}"
        );
        let e = Venv::open_source(&crate::model::folder_venv(
            root.join("loose.py").to_str().unwrap(),
        ))
        .unwrap_err();
        assert!(e.message.contains("is not a directory"), "{}", e.message);
        let e = Venv::open_source(&crate::model::folder_venv("rel/x")).unwrap_err();
        assert!(e.message.contains("not an absolute path"), "{}", e.message);
        // A target's own requests never read a folder.
        assert!(Venv::open(&venv).is_err());
    }

    #[test]
    fn relative_paths_stay_in_the_venv() {
        assert_eq!(
            venv_relative(SITE, "torch/__init__.py").unwrap(),
            "lib/python3.11/site-packages/torch/__init__.py"
        );
        assert_eq!(
            venv_relative(SITE, "../../../bin/torchrun").unwrap(),
            "bin/torchrun"
        );
        assert_eq!(venv_relative(SITE, "../../../../etc/passwd"), None);
        assert_eq!(venv_relative(SITE, "/etc/passwd"), None);
        assert_eq!(venv_relative(SITE, "a/../../../../../x"), None);
        assert_eq!(venv_relative(SITE, ""), None);
    }

    #[test]
    fn a_conda_environment_is_refused_and_a_venv_beside_conda_meta_is_not() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join(SITE)).unwrap();
        std::fs::create_dir(t.path().join("conda-meta")).unwrap();
        let root = t.path().to_str().unwrap();
        let e = Venv::open(root).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::Usage);
        assert!(e.message.contains("conda environment") && e.message.contains(root));
        assert!(e.hint.unwrap().contains("docs/manifest.md"));
        // A venv made with conda's python has pyvenv.cfg: it is a venv.
        std::fs::write(t.path().join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
        assert_eq!(Venv::open(root).unwrap().python, "3.11");
    }
}
