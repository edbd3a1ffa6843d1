//! The file system as the loader would see it after the overlay:
//! [`LoaderView`] and its implementation [`OverlayView`], which lays the
//! overlay's placed and deleted objects over the real disk, follows symlinks
//! through both, and caches what it read from disk (in memory, and between
//! runs in a [`StampCache`] keyed by file stamp). Also [`normalize`], the
//! kernel's resolution of `.` and `..` used for every path the loader looks at.

use std::collections::HashMap;
use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::hashcache::StampCache;

use super::ElfInfo;
use super::read::read_elf;

/// The file system as the loader would see it after the overlay.
pub trait LoaderView {
    /// ELF info of the file at absolute path `p` (following symlinks as the
    /// loader would), or None if absent/not ELF.
    fn elf(&mut self, p: &Path) -> Option<Arc<ElfInfo>>;
}

/// What the disk holds at one path (cached).
#[derive(Debug, Clone)]
enum OnDisk {
    Link(PathBuf),
    File(Option<Arc<ElfInfo>>),
    Absent,
}

/// An overlay of changes on top of the real file system, with a cache of
/// what was read from disk.
#[derive(Debug, Default, Clone)]
pub struct OverlayView {
    /// After the overlay: `Some` = this object is there, `None` = deleted.
    overrides: HashMap<PathBuf, Option<Arc<ElfInfo>>>,
    disk: HashMap<PathBuf, OnDisk>,
    /// Directory -> its canonical form on disk (None if it does not exist).
    dirs: HashMap<PathBuf, Option<PathBuf>>,
    /// ELF facts kept between runs, keyed by file stamp.
    persistent: Option<Arc<StampCache<Option<ElfInfo>>>>,
}

impl OverlayView {
    pub fn new() -> Self {
        Self::default()
    }

    /// Read disk objects through (and into) a persistent cache.
    pub fn with_cache(cache: Arc<StampCache<Option<ElfInfo>>>) -> Self {
        OverlayView {
            persistent: Some(cache),
            ..Self::default()
        }
    }

    /// After the overlay, `p` holds this object (Some) or is gone (None).
    pub fn set(&mut self, p: PathBuf, info: Option<ElfInfo>) {
        self.overrides.insert(normalize(&p), info.map(Arc::new));
    }

    /// Like [`set`](Self::set), sharing an already parsed object.
    pub fn set_shared(&mut self, p: PathBuf, info: Option<Arc<ElfInfo>>) {
        self.overrides.insert(normalize(&p), info);
    }

    /// The disk holds a regular file at `p` whose facts are `info` (read
    /// ahead, in parallel, by the agent): the view does not read it again.
    pub fn known(&mut self, p: &Path, info: Option<Arc<ElfInfo>>) {
        self.disk.insert(normalize(p), OnDisk::File(info));
    }

    fn override_of(&mut self, p: &Path) -> Option<Option<Arc<ElfInfo>>> {
        if let Some(v) = self.overrides.get(p) {
            return Some(v.clone());
        }
        // The same file reached through a symlinked directory.
        let (dir, name) = (p.parent()?, p.file_name()?);
        let canonical = self
            .dirs
            .entry(dir.to_path_buf())
            .or_insert_with(|| fs::canonicalize(dir).ok())
            .clone()?;
        if canonical == dir {
            return None;
        }
        self.overrides.get(&canonical.join(name)).cloned()
    }

    fn lookup(&mut self, p: &Path, depth: u32) -> Option<Arc<ElfInfo>> {
        let p = normalize(p);
        if let Some(v) = self.override_of(&p) {
            return v;
        }
        let persistent = self.persistent.clone();
        let entry = self
            .disk
            .entry(p.clone())
            .or_insert_with(|| read_disk(&p, persistent.as_deref()));
        match entry.clone() {
            OnDisk::File(info) => info,
            OnDisk::Absent => None,
            OnDisk::Link(_) if depth >= 40 => None,
            OnDisk::Link(target) => self.lookup(&target, depth + 1),
        }
    }
}

/// What the disk holds at `p`, a regular file's ELF facts read through (and
/// into) the `persistent` cache when there is one.
fn read_disk(p: &Path, persistent: Option<&StampCache<Option<ElfInfo>>>) -> OnDisk {
    match fs::symlink_metadata(p) {
        Ok(m) if m.file_type().is_symlink() => match fs::read_link(p) {
            Ok(target) => OnDisk::Link(p.parent().unwrap_or(Path::new("/")).join(target)),
            Err(_) => OnDisk::Absent,
        },
        Ok(m) if m.is_file() => {
            let cached = persistent
                .and_then(|c| c.get(p, &m))
                .filter(|info| super::fatbin::serves(p, info));
            let info = match cached {
                Some(info) => info,
                None => {
                    let info = read_elf(p).ok().flatten();
                    if let Some(c) = persistent {
                        c.put(p, &m, &info);
                    }
                    info
                }
            };
            OnDisk::File(info.map(Arc::new))
        }
        _ => OnDisk::Absent,
    }
}

impl LoaderView for OverlayView {
    fn elf(&mut self, p: &Path) -> Option<Arc<ElfInfo>> {
        self.lookup(p, 0)
    }
}

/// Remove `.` and resolve `..` as the kernel would: lexically, unless the
/// component before `..` is a symlink on disk (then relative to its target).
pub(super) fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                let is_link = fs::symlink_metadata(&out)
                    .map(|m| m.file_type().is_symlink())
                    .unwrap_or(false);
                if is_link && let Ok(real) = fs::canonicalize(&out) {
                    out = real;
                }
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::elf::testutil::{BaseAndUser, base_and_user};

    #[test]
    fn overlay_view_follows_symlinks_through_overrides() {
        let t = tempfile::tempdir().unwrap();
        let BaseAndUser { base, .. } = base_and_user(t.path());
        let real = t.path().join("deps/libbase.so.1.0");
        fs::rename(&base, &real).unwrap();
        std::os::unix::fs::symlink("libbase.so.1.0", &base).unwrap();
        let mut view = OverlayView::new();
        assert_eq!(
            view.elf(&base).unwrap().soname.as_deref(),
            Some("libbase.so.1")
        );
        let mut view = OverlayView::new();
        let replaced = ElfInfo {
            soname: Some("replaced".into()),
            ..Default::default()
        };
        view.set(real.clone(), Some(replaced));
        assert_eq!(view.elf(&base).unwrap().soname.as_deref(), Some("replaced"));
        view.set(real, None);
        assert!(view.elf(&base).is_none());
        // A path with `..` and `.` reaches the same override.
        let odd = t.path().join("deps/../deps/./libbase.so.1.0");
        view.set(odd.clone(), Some(ElfInfo::default()));
        assert!(view.elf(&t.path().join("deps/libbase.so.1")).is_some());
    }

    #[test]
    fn normalize_resolves_dot_and_dotdot() {
        assert_eq!(
            normalize(Path::new("/a/b/../c/./d")),
            PathBuf::from("/a/c/d")
        );
    }
}
