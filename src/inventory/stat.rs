//! [`stat`]: the entry of each requested path (kind, size, mode, stamp,
//! content hash when asked, and the `.pyc` files beside a `.py`), reached
//! beneath the venv root's fd and worked on all cores.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use rayon::prelude::*;

use crate::err;
use crate::error::{Result, io_cause};
use crate::hashcache::HashCache;
use crate::inventory::walk::{Probe, split_rel};
use crate::inventory::{Blocked, Counters, Venv, Walker, hash_open};
use crate::model::{Entry, FileStamp, HashMode, Kind, ShebangRewrite};

/// Stat (and optionally hash) paths relative to site-packages.
///
/// Every path is reached from the venv root's fd without following a
/// symlink in its parent chain ([`Walker`]): a path behind a symlinked
/// directory is reported as [`Kind::ThroughSymlink`], never read through.
/// A symlink at the path itself is reported as the symlink it is.
///
/// Answers come in the order of `paths`; the work is done in sorted order,
/// so that each walker's open directory chain serves the paths that follow
/// (a request in another order, such as the hashes a cold plan asks for,
/// would otherwise reopen every directory above every path).
pub fn stat(
    venv_root: &str,
    paths: &[String],
    hash: HashMode,
    shebang: Option<&ShebangRewrite>,
    pycache: bool,
    counters: &Counters,
) -> Result<Vec<Entry>> {
    if paths.is_sorted() {
        return stat_sorted(venv_root, paths, hash, shebang, pycache, counters);
    }
    let mut order: Vec<usize> = (0..paths.len()).collect();
    order.sort_unstable_by(|&a, &b| paths[a].cmp(&paths[b]));
    let sorted: Vec<String> = order.iter().map(|&i| paths[i].clone()).collect();
    let entries = stat_sorted(venv_root, &sorted, hash, shebang, pycache, counters)?;
    let mut out: Vec<Option<Entry>> = std::iter::repeat_with(|| None).take(paths.len()).collect();
    for (e, &i) in entries.into_iter().zip(&order) {
        out[i] = Some(e);
    }
    Ok(out.into_iter().flatten().collect())
}

/// [`stat`] of paths in sorted order.
fn stat_sorted(
    venv_root: &str,
    paths: &[String],
    hash: HashMode,
    shebang: Option<&ShebangRewrite>,
    pycache: bool,
    counters: &Counters,
) -> Result<Vec<Entry>> {
    let venv = Venv::open_source(venv_root)?;
    let root = venv.beneath()?;
    let root_fd = root.as_fd();
    let FirstPass { cache, probed } = probe_all(&venv, root_fd, paths, hash)?;
    let total: u64 = probed
        .iter()
        .map(|p| match p.probe {
            Ok(Probe::File { size, .. }) => size,
            _ => 0,
        })
        .sum();
    counters
        .total_files
        .store(paths.len() as u64, Ordering::Relaxed);
    counters.total_bytes.store(
        if hash == HashMode::All { total } else { 0 },
        Ordering::Relaxed,
    );
    let pyc_dirs = if pycache {
        list_pycache(root_fd, paths, &probed)
    } else {
        HashMap::new()
    };
    let work = Work {
        venv: &venv,
        cache: &cache,
        hash,
        shebang,
        counters,
        pyc_dirs: &pyc_dirs,
    };
    // Jobs of consecutive paths here too, so that a walker's open chain is
    // reused (one job per path reopened every directory above it: nine
    // opens per hashed file in a cold plan); small enough that big files
    // still spread over the cores.
    let entries: Vec<Result<Entry>> = paths
        .par_iter()
        .zip(probed.into_par_iter())
        .with_min_len(32)
        .map_init(
            || Walker::new(root_fd),
            |w, (p, probed)| work.entry(w, p, probed),
        )
        .collect();
    cache.save();
    entries.into_iter().collect()
}

/// One path after the first pass.
struct Probed {
    /// Absolute: the hash cache's key, and for messages.
    abs: PathBuf,
    /// Relative to the venv root.
    rel: String,
    /// The lstat, or the message for anything but absence.
    probe: std::result::Result<Probe, String>,
}

/// What the first pass found: every path's [`Probed`], in order, and the
/// hash cache (loaded meanwhile).
struct FirstPass {
    cache: HashCache,
    probed: Vec<Probed>,
}

/// The first pass: lstat everything, so progress knows the totals; the
/// hash cache loads meanwhile.
fn probe_all(
    venv: &Venv,
    root_fd: BorrowedFd<'_>,
    paths: &[String],
    hash: HashMode,
) -> Result<FirstPass> {
    std::thread::scope(|s| {
        let cache = s.spawn(|| match hash {
            HashMode::None => HashCache::disabled(),
            _ => HashCache::open(&venv.root),
        });
        // Jobs of at least 256 consecutive paths: each reuses its open
        // directory chain (a job that starts mid-directory reopens it).
        let probed: Result<Vec<Probed>> = paths
            .par_iter()
            .with_min_len(256)
            .map_init(
                || Walker::new(root_fd),
                |w, p| {
                    let (abs, rel) = venv.resolve(p)?;
                    let probe = Probe::at(w, &rel);
                    Ok(Probed { abs, rel, probe })
                },
            )
            .collect();
        let cache = cache.join().expect("the cache loader panicked");
        probed.map(|probed| FirstPass { cache, probed })
    })
}

/// The `__pycache__` directory (venv-relative) beside the venv-relative `rel`.
fn pycache_of(rel: &str) -> String {
    match split_rel(rel).0 {
        "" => "__pycache__".to_string(),
        d => format!("{d}/__pycache__"),
    }
}

/// Bytecode listing, one readdir per `__pycache__` directory beside a
/// `.py` of `paths`, by its venv-relative path.
fn list_pycache(
    root_fd: BorrowedFd<'_>,
    paths: &[String],
    probed: &[Probed],
) -> HashMap<String, Vec<String>> {
    let mut pyc_dirs: HashMap<String, Vec<String>> = HashMap::new();
    let mut w = Walker::new(root_fd);
    for (p, probed) in paths.iter().zip(probed) {
        if p.ends_with(".py")
            && let std::collections::hash_map::Entry::Vacant(v) =
                pyc_dirs.entry(pycache_of(&probed.rel))
        {
            let names = w.list(v.key());
            v.insert(names);
        }
    }
    pyc_dirs
}

/// What the second pass needs for every path.
struct Work<'w> {
    venv: &'w Venv,
    cache: &'w HashCache,
    hash: HashMode,
    shebang: Option<&'w ShebangRewrite>,
    counters: &'w Counters,
    pyc_dirs: &'w HashMap<String, Vec<String>>,
}

impl Work<'_> {
    /// The entry of the site-relative `p`, from its first-pass probe.
    fn entry(&self, w: &mut Walker<'_>, p: &str, probed: Probed) -> Result<Entry> {
        let Probed { abs, rel, probe } = probed;
        let kind = match probe.map_err(|e| err!("{}/{e}", self.venv.root.display()))? {
            Probe::Missing => Kind::Missing,
            Probe::Symlink(target) => Kind::Symlink { target },
            Probe::Through(link) => Kind::ThroughSymlink {
                link: crate::validate::site_spelling(&self.venv.site_rel, &link),
            },
            Probe::Dir { mode } => Kind::Dir { mode },
            Probe::Other => Kind::Other,
            Probe::File { size, mode, stamp } => {
                let Content { size, blake3 } = self.content(w, &abs, &rel, size, &stamp)?;
                Kind::File {
                    size,
                    mode,
                    blake3,
                    stamp: Some(stamp),
                }
            }
        };
        self.counters.files.fetch_add(1, Ordering::Relaxed);
        Ok(Entry {
            path: p.to_string(),
            kind,
            pyc: self.bytecode(p, &rel),
        })
    }

    /// The size and hash of the regular file `rel` (lstat `size` and
    /// `stamp`), as the hash mode asks: read and hashed, from the hash
    /// cache, or not at all. A `bin/` script is hashed with its shebang
    /// rewritten, and that hash is never cached.
    fn content(
        &self,
        w: &mut Walker<'_>,
        abs: &Path,
        rel: &str,
        size: u64,
        stamp: &FileStamp,
    ) -> Result<Content> {
        let rw = if rel.starts_with("bin/") {
            self.shebang
        } else {
            None
        };
        // A rewritten script's hash is never cached.
        let cached = || {
            if rw.is_none() {
                self.cache.get_at(abs, size, stamp)
            } else {
                None
            }
        };
        // A script whose shebang is rewritten is always hashed, even when
        // only cached hashes are asked for: it is small, and that spares a
        // second round trip.
        let read = self.hash == HashMode::All
            || (self.hash == HashMode::Cached && rw.is_some() && size < (1 << 20));
        if !read {
            let blake3 = (self.hash == HashMode::Cached).then(cached).flatten();
            return Ok(Content { size, blake3 });
        }
        if let Some(h) = cached() {
            self.counters.bytes.fetch_add(size, Ordering::Relaxed);
            return Ok(Content {
                size,
                blake3: Some(h),
            });
        }
        let failed = |m: String| err!("Failed to read {}: {m}", abs.display());
        let f = w.open(rel).map_err(|b| match b {
            Blocked::Error(m) => failed(m),
            _ => failed("it changed while it was read".into()),
        })?;
        let read = hash_open(f, rw, self.counters).map_err(|e| failed(io_cause(&e)))?;
        if rw.is_none() && read.size == size {
            self.cache.put_at(abs, size, stamp, &read.blake3);
        }
        Ok(Content {
            size: read.size,
            blake3: Some(read.blake3),
        })
    }

    /// The bytecode beside the site-relative `p` (venv-relative `rel`), if
    /// it is a `.py`: `__pycache__/STEM.TAG.pyc` files, sorted, as
    /// site-relative paths.
    fn bytecode(&self, p: &str, rel: &str) -> Vec<String> {
        let mut pyc = Vec::new();
        let Some(stem) = p
            .ends_with(".py")
            .then(|| p.rsplit('/').next().and_then(|f| f.strip_suffix(".py")))
            .flatten()
        else {
            return pyc;
        };
        let dir_rel = match p.rsplit_once('/') {
            Some((d, _)) => format!("{d}/__pycache__"),
            None => "__pycache__".to_string(),
        };
        if let Some(names) = self.pyc_dirs.get(&pycache_of(rel)) {
            let want = format!("{stem}.");
            for n in names {
                if n.starts_with(&want)
                    && n.ends_with(".pyc")
                    && n[want.len()..].find('.').is_some()
                {
                    pyc.push(format!("{dir_rel}/{n}"));
                }
            }
            pyc.sort();
        }
        pyc
    }
}

/// A regular file's size (as hashed) and content hash, if taken.
struct Content {
    size: u64,
    blake3: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = "lib/python3.11/site-packages";

    #[test]
    fn stat_never_goes_through_a_symlinked_parent() {
        let t = tempfile::tempdir().unwrap();
        let venv = t.path().join("v");
        let site = venv.join(SITE);
        let outside = t.path().join("outside");
        std::fs::create_dir_all(site.join("pkg/sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(venv.join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        std::fs::write(site.join("pkg/a.py"), "a").unwrap();
        std::fs::write(site.join("pkg/sub/b.py"), "bb").unwrap();
        std::os::unix::fs::symlink(&outside, site.join("evil_data")).unwrap();
        std::os::unix::fs::symlink(&outside, site.join("pkg/sub/deep")).unwrap();
        let paths: Vec<String> = [
            "evil_data",
            "evil_data/secret",
            "pkg/a.py",
            "pkg/a.py/x",
            "pkg/gone/x",
            "pkg/sub/b.py",
            "pkg/sub/deep/secret",
            "pkg/sub/deep/secret/more",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let entries = stat(
            venv.to_str().unwrap(),
            &paths,
            HashMode::All,
            None,
            false,
            &Counters::default(),
        )
        .unwrap();
        let kinds: Vec<&Kind> = entries.iter().map(|e| &e.kind).collect();
        assert!(
            matches!(kinds[0], Kind::Symlink { target } if target == outside.to_str().unwrap())
        );
        assert_eq!(
            kinds[1],
            &Kind::ThroughSymlink {
                link: "evil_data".into()
            }
        );
        assert!(matches!(
            kinds[2],
            Kind::File {
                size: 1,
                blake3: Some(_),
                ..
            }
        ));
        assert_eq!(kinds[3], &Kind::Missing);
        assert_eq!(kinds[4], &Kind::Missing);
        assert!(matches!(kinds[5], Kind::File { size: 2, .. }));
        for k in &kinds[6..] {
            assert_eq!(
                *k,
                &Kind::ThroughSymlink {
                    link: "pkg/sub/deep".into()
                }
            );
        }
    }
}
