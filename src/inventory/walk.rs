//! Reaching venv paths without following a symlinked parent: [`Walker`]
//! keeps a chain of directory fds opened one component at a time with
//! `O_NOFOLLOW`, and says why a chain could not be opened ([`Blocked`]);
//! [`Probe`] is one `lstat` through it.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::error::io_cause;
use crate::inventory::stamp_of;
use crate::model::FileStamp;

/// Why a path's parent directories could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// A parent is absent, or is a file: the path does not exist.
    Missing,
    /// A parent is a symlink (its path relative to the venv root): overlay
    /// never goes through one.
    Link(String),
    /// Anything else (permission denied...), as a message naming the directory.
    Error(String),
}

/// Parent directories of venv paths, opened one component at a time from
/// the venv root's fd with `openat(O_PATH | O_DIRECTORY | O_NOFOLLOW)`, so
/// a symlink anywhere in a path's parent chain is seen, never followed. The
/// chain stays open for the next path: paths arrive sorted, a directory's
/// subtree is contiguous in sorted order, so each directory is opened about
/// once per worker and every file costs one `statat` from its parent's fd
/// (cheaper than an `lstat` of the whole path, which walks every component).
pub struct Walker<'a> {
    root: BorrowedFd<'a>,
    /// The open chain below the root: each component's name and fd.
    stack: Vec<(String, OwnedFd)>,
    /// The last chain that could not be opened (venv-relative) and why.
    blocked: Option<(String, Blocked)>,
}

const WALK_FLAGS: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Split a venv-relative path into its parent directory (`""`: the root) and name.
pub(super) fn split_rel(rel: &str) -> (&str, &str) {
    match rel.rfind('/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => ("", rel),
    }
}

impl<'a> Walker<'a> {
    /// A walker from `root`, the venv root's fd.
    pub fn new(root: BorrowedFd<'a>) -> Walker<'a> {
        Walker {
            root,
            stack: Vec::new(),
            blocked: None,
        }
    }

    /// The directory `dir` (venv-relative, normalized; `""` is the root),
    /// opened without following any symlink.
    pub fn dir(&mut self, dir: &str) -> std::result::Result<BorrowedFd<'_>, Blocked> {
        if let Some((b, why)) = &self.blocked
            && dir
                .strip_prefix(b.as_str())
                .is_some_and(|r| r.is_empty() || r.starts_with('/'))
        {
            return Err(why.clone());
        }
        self.blocked = None;
        let mut keep = 0;
        let mut parts = if dir.is_empty() {
            None
        } else {
            Some(dir.split('/'))
        }
        .into_iter()
        .flatten()
        .peekable();
        while let Some(c) = parts.peek() {
            match self.stack.get(keep) {
                Some((name, _)) if name == c => {
                    keep += 1;
                    parts.next();
                }
                _ => break,
            }
        }
        self.stack.truncate(keep);
        for c in parts {
            let base = self.stack.last().map_or(self.root, |(_, fd)| fd.as_fd());
            match rustix::fs::openat(base, c, WALK_FLAGS, Mode::empty()) {
                Ok(fd) => self.stack.push((c.to_string(), fd)),
                Err(e) => {
                    let mut prefix: String = self
                        .stack
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join("/");
                    if !prefix.is_empty() {
                        prefix.push('/');
                    }
                    prefix.push_str(c);
                    let why = match e {
                        Errno::NOENT => Blocked::Missing,
                        Errno::LOOP | Errno::NOTDIR => {
                            match rustix::fs::statat(base, c, AtFlags::SYMLINK_NOFOLLOW) {
                                Ok(st) if FileType::from_raw_mode(st.st_mode).is_symlink() => {
                                    Blocked::Link(prefix.clone())
                                }
                                _ => Blocked::Missing,
                            }
                        }
                        e => Blocked::Error(format!("{prefix}: {}", io_cause(&e.into()))),
                    };
                    self.blocked = Some((prefix, why.clone()));
                    return Err(why);
                }
            }
        }
        Ok(self.stack.last().map_or(self.root, |(_, fd)| fd.as_fd()))
    }

    /// `lstat` of the venv-relative `rel`; `Ok(None)` if it is absent.
    pub fn lstat(&mut self, rel: &str) -> std::result::Result<Option<rustix::fs::Stat>, Blocked> {
        let (dir, name) = split_rel(rel);
        let fd = match self.dir(dir) {
            Ok(fd) => fd,
            Err(Blocked::Missing) => return Ok(None),
            Err(e) => return Err(e),
        };
        match rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::NOENT | Errno::NOTDIR) => Ok(None),
            Err(e) => Err(Blocked::Error(format!("{rel}: {}", io_cause(&e.into())))),
        }
    }

    /// The target of the symlink `rel`.
    pub fn read_link(&mut self, rel: &str) -> std::result::Result<String, Blocked> {
        let (dir, name) = split_rel(rel);
        let fd = self.dir(dir)?;
        rustix::fs::readlinkat(fd, name, Vec::new())
            .map(|t| t.to_string_lossy().into_owned())
            .map_err(|e| Blocked::Error(format!("{rel}: {}", io_cause(&e.into()))))
    }

    /// Open the regular file `rel` for reading (a symlink at its end is refused).
    pub fn open(&mut self, rel: &str) -> std::result::Result<std::fs::File, Blocked> {
        let (dir, name) = split_rel(rel);
        let fd = self.dir(dir)?;
        rustix::fs::openat(
            fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )
        .map(std::fs::File::from)
        .map_err(|e| Blocked::Error(format!("{rel}: {}", io_cause(&e.into()))))
    }

    /// The names in the directory `rel`; empty if it is absent or not a
    /// plain directory.
    pub(super) fn list(&mut self, rel: &str) -> Vec<String> {
        let (dir, name) = split_rel(rel);
        let Ok(fd) = self.dir(dir) else {
            return Vec::new();
        };
        let Ok(d) = rustix::fs::openat(
            fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return Vec::new();
        };
        let Ok(mut entries) = rustix::fs::Dir::read_from(&d) else {
            return Vec::new();
        };
        entries
            .by_ref()
            .flatten()
            .map(|e| String::from_utf8_lossy(e.file_name().to_bytes()).into_owned())
            .filter(|n| n != "." && n != "..")
            .collect()
    }
}

/// What one `lstat` said, kept small: a stat request names every file of
/// a torch stack (35,000), and the first pass holds them all at once.
pub(super) enum Probe {
    Missing,
    Symlink(String),
    Dir {
        mode: u32,
    },
    File {
        size: u64,
        mode: u32,
        stamp: FileStamp,
    },
    Other,
    /// Behind a symlinked parent (venv-relative).
    Through(String),
}

impl Probe {
    /// `lstat` the venv-relative `rel` from `w`'s open parents; `Err`
    /// carries the message for anything but absence.
    pub(super) fn at(w: &mut Walker<'_>, rel: &str) -> std::result::Result<Probe, String> {
        let st = match w.lstat(rel) {
            Ok(Some(st)) => st,
            Ok(None) => return Ok(Probe::Missing),
            Err(Blocked::Missing) => return Ok(Probe::Missing),
            Err(Blocked::Link(l)) => return Ok(Probe::Through(l)),
            Err(Blocked::Error(m)) => return Err(m),
        };
        let mode = st.st_mode & 0o7777;
        Ok(match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => match w.read_link(rel) {
                Ok(t) => Probe::Symlink(t),
                Err(Blocked::Error(m)) => return Err(m),
                Err(_) => Probe::Missing,
            },
            FileType::Directory => Probe::Dir { mode },
            FileType::RegularFile => Probe::File {
                size: st.st_size as u64,
                mode,
                stamp: stamp_of(&st),
            },
            _ => Probe::Other,
        })
    }
}
