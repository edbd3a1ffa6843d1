//! File-system operations that stay beneath one directory, made relative to
//! directory fds at the moment they happen.
//!
//! A [`Beneath`] is an open directory (a venv root, a staging folder). Every
//! path given to it is relative and normalized ([`normalize`]): no empty,
//! `.` or `..` component, no leading `/`, no NUL. Its parent directories are
//! opened one by one from the fd with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`, or, where the kernel lacks `openat2`, by a walk of
//! `openat(O_NOFOLLOW | O_DIRECTORY)` per component; the last component is
//! then acted on with the `*at` call (`renameat`, `mkdirat`, `unlinkat`,
//! `symlinkat`, `openat(O_NOFOLLOW)`) from the parent's fd. So a symlink
//! anywhere in the chain is refused when the write happens (`ELOOP`), not
//! assumed absent since some earlier check, and nothing is ever created,
//! changed or removed outside the directory, whatever the tree holds or
//! another process does to it meanwhile.
//!
//! A [`DirCache`] does the same for a run of many operations in few
//! directories (the switch's renames): each parent is opened the same way
//! once and its fd kept for the operations after, and the fds at or below
//! a path it renames or removes are dropped at once. A directory moved
//! meanwhile by someone else carries its fd along: what comes after lands
//! in that same directory, never through a symlink, and only where that
//! someone could already write.
//!
//! Errors are plain `io::Error`s with the OS code kept (callers name the
//! host and path); a symlink or an escape in the chain is always `ELOOP`
//! ([`is_refused`]).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU8, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

/// An open directory that every operation stays beneath.
#[derive(Debug)]
pub struct Beneath {
    fd: OwnedFd,
    /// For messages only; never used to reach a file.
    path: PathBuf,
}

/// `rel` as a normalized relative path, or `None` if it is absolute, empty,
/// has an empty, `.` or `..` component, or holds a NUL. The only rewrite is
/// none: a path is either already normal or refused, so the same string is
/// meant everywhere it travels.
pub fn normalize(rel: &str) -> Option<&str> {
    if rel.is_empty() || rel.contains('\0') || rel.starts_with('/') {
        return None;
    }
    rel.split('/')
        .all(|c| !c.is_empty() && c != "." && c != "..")
        .then_some(rel)
}

/// Whether `e` is the refusal of a symlink (or an escape) in a path's chain.
pub fn is_refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::LOOP.raw_os_error())
}

fn invalid(rel: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{rel:?} is not a plain relative path"),
    )
}

fn refused() -> io::Error {
    io::Error::from_raw_os_error(Errno::LOOP.raw_os_error())
}

/// 0: not tried yet, 1: `openat2` works, 2: use the component walk.
static OPENAT2: AtomicU8 = AtomicU8::new(0);

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Open the directory `rel` (normalized, non-empty) beneath `fd`.
fn open_dir_at(fd: BorrowedFd<'_>, rel: &str) -> io::Result<OwnedFd> {
    if OPENAT2.load(Ordering::Relaxed) != 2 {
        let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        for _ in 0..16 {
            match rustix::fs::openat2(fd, rel, DIR_FLAGS, Mode::empty(), how) {
                Ok(d) => {
                    OPENAT2.store(1, Ordering::Relaxed);
                    return Ok(d);
                }
                // A rename elsewhere raced the lookup: try again.
                Err(Errno::AGAIN) => continue,
                Err(Errno::XDEV | Errno::LOOP) => return Err(refused()),
                // A symlink or a file in the chain: the walk below tells which.
                Err(Errno::NOTDIR) => return walk(fd, rel),
                Err(Errno::NOSYS | Errno::PERM) if OPENAT2.load(Ordering::Relaxed) == 0 => {
                    OPENAT2.store(2, Ordering::Relaxed);
                    break;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if OPENAT2.load(Ordering::Relaxed) != 2 {
            return Err(Errno::AGAIN.into());
        }
    }
    walk(fd, rel)
}

/// [`open_dir_at`] by `openat(O_NOFOLLOW | O_DIRECTORY)`, one component at a time.
fn walk(fd: BorrowedFd<'_>, rel: &str) -> io::Result<OwnedFd> {
    let mut cur: Option<OwnedFd> = None;
    for part in rel.split('/') {
        let base = cur.as_ref().map_or(fd, |c| c.as_fd());
        let next = match rustix::fs::openat(base, part, DIR_FLAGS, Mode::empty()) {
            Ok(d) => d,
            Err(Errno::LOOP) => return Err(refused()),
            Err(Errno::NOTDIR) => {
                // A symlink (to anything) or a file in the chain.
                return match rustix::fs::statat(base, part, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode).is_symlink() => {
                        Err(refused())
                    }
                    _ => Err(Errno::NOTDIR.into()),
                };
            }
            Err(e) => return Err(e.into()),
        };
        cur = Some(next);
    }
    cur.ok_or_else(|| invalid(rel))
}

/// Remove the entry `name` of the directory `fd`, recursively.
fn remove_tree(fd: BorrowedFd<'_>, name: &str, depth: usize) -> io::Result<()> {
    match rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
        Ok(st) if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() => {
            return match rustix::fs::unlinkat(fd, name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => Ok(()),
                Err(e) => Err(e.into()),
            };
        }
        Ok(_) => {}
    }
    if depth > 4096 {
        return Err(Errno::LOOP.into());
    }
    let d = rustix::fs::openat(fd, name, DIR_FLAGS, Mode::empty())?;
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(&d)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push(String::from_utf8_lossy(n).into_owned());
        }
    }
    for n in names {
        remove_tree(d.as_fd(), &n, depth + 1)?;
    }
    match rustix::fs::unlinkat(fd, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Split a normalized path into its parent (`""` for the top) and name.
fn split(rel: &str) -> (&str, &str) {
    match rel.rfind('/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => ("", rel),
    }
}

impl Beneath {
    /// Open the directory at `path` (an absolute path the caller trusts:
    /// the venv root, as canonicalized). Everything after goes through the fd.
    pub fn open(path: &Path) -> io::Result<Beneath> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Beneath {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The directory's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `rel` joined to the directory's path, for messages.
    pub fn shown(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.path.clone()
        } else {
            self.path.join(rel)
        }
    }

    fn check<'a>(&self, rel: &'a str) -> io::Result<&'a str> {
        normalize(rel).ok_or_else(|| invalid(rel))
    }

    /// The directory `rel` beneath this one (`""`: this one again).
    pub fn dir(&self, rel: &str) -> io::Result<Beneath> {
        let fd = if rel.is_empty() {
            self.fd.try_clone()?
        } else {
            open_dir_at(self.fd.as_fd(), self.check(rel)?)?
        };
        Ok(Beneath {
            fd,
            path: self.shown(rel),
        })
    }

    /// The parent directory of `rel`, opened now, and `rel`'s last component.
    fn parent<'a>(&self, rel: &'a str) -> io::Result<(OwnedFd, &'a str)> {
        let (parent, name) = split(self.check(rel)?);
        let fd = if parent.is_empty() {
            self.fd.try_clone()?
        } else {
            open_dir_at(self.fd.as_fd(), parent)?
        };
        Ok((fd, name))
    }

    /// `lstat` of `rel`; `None` if it (or a parent) does not exist.
    pub fn lstat(&self, rel: &str) -> io::Result<Option<Stat>> {
        if rel.is_empty() {
            return rustix::fs::fstat(&self.fd).map(Some).map_err(Into::into);
        }
        lstat_in(self.parent(rel))
    }

    /// What `rel` is now, without following a symlink at its end.
    pub fn kind(&self, rel: &str) -> io::Result<Option<rustix::fs::FileType>> {
        Ok(self
            .lstat(rel)?
            .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode)))
    }

    /// Whether anything (a file, a symlink, a directory) is at `rel`.
    /// A symlink or a file in the parent chain counts as absent there.
    pub fn exists(&self, rel: &str) -> bool {
        matches!(self.lstat(rel), Ok(Some(_)))
    }

    /// Create the directory `rel` (its parent must exist).
    pub fn create_dir(&self, rel: &str, mode: u32) -> io::Result<()> {
        let (fd, name) = self.parent(rel)?;
        rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(mode)).map_err(Into::into)
    }

    /// Create `rel` and its missing parents, each with `mode`; existing
    /// directories are kept (a symlink in the chain is refused).
    pub fn create_dir_all(&self, rel: &str, mode: u32) -> io::Result<()> {
        let rel = self.check(rel)?;
        let mut cur = self.fd.try_clone()?;
        for part in rel.split('/') {
            match rustix::fs::mkdirat(&cur, part, Mode::from_raw_mode(mode)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
            cur = open_dir_at(cur.as_fd(), part)?;
        }
        Ok(())
    }

    /// Remove the file or symlink `rel`.
    pub fn remove_file(&self, rel: &str) -> io::Result<()> {
        let (fd, name) = self.parent(rel)?;
        rustix::fs::unlinkat(&fd, name, AtFlags::empty()).map_err(Into::into)
    }

    /// Remove the empty directory `rel`.
    pub fn remove_dir(&self, rel: &str) -> io::Result<()> {
        let (fd, name) = self.parent(rel)?;
        rustix::fs::unlinkat(&fd, name, AtFlags::REMOVEDIR).map_err(Into::into)
    }

    /// Rename `from` (beneath `self`) to `to` (beneath `dest`); both
    /// parents are opened now, and the rename itself never follows a link.
    pub fn rename(&self, from: &str, dest: &Beneath, to: &str) -> io::Result<()> {
        let (from_fd, from_name) = self.parent(from)?;
        let (to_fd, to_name) = dest.parent(to)?;
        rustix::fs::renameat(&from_fd, from_name, &to_fd, to_name).map_err(Into::into)
    }

    /// Rename `from` to `to` only if nothing is at `to` (`EEXIST` otherwise);
    /// where the file system refuses the flag, see [`rename_noreplace_at`].
    pub fn rename_noreplace(&self, from: &str, dest: &Beneath, to: &str) -> io::Result<()> {
        let (from_fd, from_name) = self.parent(from)?;
        let (to_fd, to_name) = dest.parent(to)?;
        rename_noreplace_at(from_fd.as_fd(), from_name, to_fd.as_fd(), to_name)
    }

    /// Create the symlink `rel` pointing at `target` (stored as is; never followed here).
    pub fn symlink(&self, target: &str, rel: &str) -> io::Result<()> {
        let (fd, name) = self.parent(rel)?;
        rustix::fs::symlinkat(target, &fd, name).map_err(Into::into)
    }

    /// The target of the symlink `rel`.
    pub fn read_link(&self, rel: &str) -> io::Result<String> {
        let (fd, name) = self.parent(rel)?;
        let t = rustix::fs::readlinkat(&fd, name, Vec::new())?;
        Ok(t.to_string_lossy().into_owned())
    }

    /// Create the new file `rel` for writing, with `mode` (never an existing
    /// file, never through a symlink).
    pub fn create_new(&self, rel: &str, mode: u32) -> io::Result<File> {
        let (fd, name) = self.parent(rel)?;
        let f = rustix::fs::openat(
            &fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )?;
        Ok(File::from(f))
    }

    /// Open the file `rel` for reading; a symlink at its end is refused (`ELOOP`).
    pub fn open_read(&self, rel: &str) -> io::Result<File> {
        let (fd, name) = self.parent(rel)?;
        let f = rustix::fs::openat(
            &fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )?;
        Ok(File::from(f))
    }

    /// Read the whole file `rel` (no symlinks), at most `limit` bytes.
    pub fn read(&self, rel: &str, limit: u64) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let f = self.open_read(rel)?;
        let mut out = Vec::new();
        f.take(limit + 1).read_to_end(&mut out)?;
        if out.len() as u64 > limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("larger than {limit} bytes"),
            ));
        }
        Ok(out)
    }

    /// Whether the directory `rel` has no entries.
    pub fn is_empty_dir(&self, rel: &str) -> io::Result<bool> {
        let d = self.dir(rel)?;
        let mut dir = rustix::fs::Dir::read_from(&d.fd)?;
        for e in dir.by_ref() {
            let e = e?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The names in directory `rel` (without `.` and `..`).
    pub fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        let d = self.dir(rel)?;
        let mut dir = rustix::fs::Dir::read_from(&d.fd)?;
        let mut out = Vec::new();
        for e in dir.by_ref() {
            let e = e?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                out.push(String::from_utf8_lossy(n).into_owned());
            }
        }
        Ok(out)
    }

    /// Open the file `rel` for appending, creating it with `mode` if absent
    /// (never through a symlink, never a symlink at its end).
    pub fn open_append(&self, rel: &str, mode: u32) -> io::Result<File> {
        let (fd, name) = self.parent(rel)?;
        let f = rustix::fs::openat(
            &fd,
            name,
            OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )?;
        Ok(File::from(f))
    }

    /// Set the permission bits of the directory `rel` (opened first, so a
    /// symlink is never followed).
    pub fn set_dir_mode(&self, rel: &str, mode: u32) -> io::Result<()> {
        let d = self.dir(rel)?;
        rustix::fs::fchmod(&d.fd, Mode::from_raw_mode(mode)).map_err(Into::into)
    }

    /// Remove `rel` and everything below it, if present: files and symlinks
    /// are unlinked, directories emptied through their own fds (a symlink is
    /// removed, never followed). Absent is fine.
    pub fn remove_all(&self, rel: &str) -> io::Result<()> {
        let (fd, name) = match self.parent(rel) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        remove_tree(fd.as_fd(), name, 0)
    }

    /// Make this directory's entries durable.
    pub fn sync(&self) -> io::Result<()> {
        rustix::fs::fsync(&self.fd).map_err(Into::into)
    }

    /// Replace the file `rel` durably: write a temporary file beside it
    /// (`mode`), fsync it, rename it over `rel`, fsync the directory. A
    /// crash leaves either the old file or the new one, never a torn one.
    pub fn write_atomic(&self, rel: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
        use std::io::Write;
        let (parent, name) = split(self.check(rel)?);
        let dir = self.dir(parent)?;
        let tmp = format!(".{name}.tmp{}", std::process::id());
        let _ = rustix::fs::unlinkat(&dir.fd, tmp.as_str(), AtFlags::empty());
        let written = (|| -> io::Result<()> {
            let mut f = dir.create_new(&tmp, mode)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            rustix::fs::renameat(&dir.fd, tmp.as_str(), &dir.fd, name)?;
            Ok(())
        })();
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&dir.fd, tmp.as_str(), AtFlags::empty());
        }
        written?;
        dir.sync()
    }
}

/// The most directory fds a [`DirCache`] keeps; past it, it starts over
/// (well under the usual limit of 1,024 open files).
const CACHED_DIRS: usize = 128;

/// Directory fds beneath a [`Beneath`], opened as it opens them
/// (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`) and kept across operations,
/// so that a run of renames in few directories costs one syscall each
/// instead of an `openat2` of each parent, the call and the `close`s.
/// Everything renamed or removed through it drops the fds at or below it
/// (see the module doc). Single-threaded, and meant to live for one run of
/// operations.
pub struct DirCache<'a> {
    root: &'a Beneath,
    dirs: RefCell<BTreeMap<String, Rc<OwnedFd>>>,
}

/// A parent directory's fd: the root's, or one the cache holds.
enum Parent<'a> {
    Root(BorrowedFd<'a>),
    Cached(Rc<OwnedFd>),
}

impl Parent<'_> {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Parent::Root(fd) => *fd,
            Parent::Cached(fd) => fd.as_fd(),
        }
    }
}

impl AsFd for Parent<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }
}

/// `renameat2(RENAME_NOREPLACE)` of `from_name` (in `from_fd`) to `to_name`
/// (in `to_fd`): `EEXIST`, and nothing moved, if anything is at the
/// destination. Many FUSE file systems and NFS refuse the flag (`EINVAL`,
/// or `ENOSYS`/`EOPNOTSUPP`); only for that error, [`noreplace_fallback`]
/// gives the same guarantee another way.
pub fn rename_noreplace_at(
    from_fd: BorrowedFd<'_>,
    from_name: &str,
    to_fd: BorrowedFd<'_>,
    to_name: &str,
) -> io::Result<()> {
    match rustix::fs::renameat_with(
        from_fd,
        from_name,
        to_fd,
        to_name,
        rustix::fs::RenameFlags::NOREPLACE,
    ) {
        Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
            noreplace_fallback(from_fd, from_name, to_fd, to_name)
        }
        // Perhaps a fallback's move cut short (on this file system, or on
        // a FUSE view of it): finished, never replaced.
        Err(Errno::EXIST) => finish_link_move(from_fd, from_name, to_fd, to_name),
        r => r.map_err(Into::into),
    }
}

/// A no-replace rename without the flag. A file or symlink: `link(2)` to
/// the destination, which fails with `EEXIST` if anything is there (the
/// same no-clobber guarantee, and it works on NFS), then `unlink(2)` of the
/// source. A crash between the two leaves both names on one inode: the
/// next attempt finishes the move ([`finish_link_move`]). A directory
/// cannot be hard-linked (nor a file where the file system has no hard
/// links): it is renamed after checking that nothing is at the
/// destination. The residual race: an *empty directory* someone makes at
/// the destination between the check and the rename is replaced (a file or
/// a non-empty directory makes the rename fail); overlay holds the venv's
/// lock, so only a writer that ignores it could, and it loses nothing but
/// an empty directory.
pub fn noreplace_fallback(
    from_fd: BorrowedFd<'_>,
    from_name: &str,
    to_fd: BorrowedFd<'_>,
    to_name: &str,
) -> io::Result<()> {
    let st = rustix::fs::statat(from_fd, from_name, AtFlags::SYMLINK_NOFOLLOW)?;
    if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir() {
        match rustix::fs::linkat(from_fd, from_name, to_fd, to_name, AtFlags::empty()) {
            Ok(()) => {
                return rustix::fs::unlinkat(from_fd, from_name, AtFlags::empty())
                    .map_err(Into::into);
            }
            Err(Errno::EXIST) => return finish_link_move(from_fd, from_name, to_fd, to_name),
            // No hard links here: move it as a directory is moved.
            Err(Errno::PERM | Errno::OPNOTSUPP | Errno::NOSYS | Errno::MLINK) => {}
            Err(e) => return Err(e.into()),
        }
    }
    match rustix::fs::statat(to_fd, to_name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => return Err(Errno::EXIST.into()),
        Err(Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    rustix::fs::renameat(from_fd, from_name, to_fd, to_name).map_err(Into::into)
}

/// The destination exists: if it is the source's own inode (a non-directory
/// left with both names by a link-then-unlink move a crash cut short),
/// finish that move by unlinking the source; otherwise `EEXIST`.
fn finish_link_move(
    from_fd: BorrowedFd<'_>,
    from_name: &str,
    to_fd: BorrowedFd<'_>,
    to_name: &str,
) -> io::Result<()> {
    let from = rustix::fs::statat(from_fd, from_name, AtFlags::SYMLINK_NOFOLLOW);
    let to = rustix::fs::statat(to_fd, to_name, AtFlags::SYMLINK_NOFOLLOW);
    match (from, to) {
        (Ok(a), Ok(b))
            if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
                && !rustix::fs::FileType::from_raw_mode(a.st_mode).is_dir() =>
        {
            rustix::fs::unlinkat(from_fd, from_name, AtFlags::empty()).map_err(Into::into)
        }
        _ => Err(Errno::EXIST.into()),
    }
}

/// `lstat` of `name` in the parent directory just opened for it; `None` if
/// the parent (a component missing) or `name` does not exist.
fn lstat_in<Fd: AsFd>(parent: io::Result<(Fd, &str)>) -> io::Result<Option<Stat>> {
    let (fd, name) = match parent {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match rustix::fs::statat(fd.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl<'a> DirCache<'a> {
    pub fn new(root: &'a Beneath) -> DirCache<'a> {
        DirCache {
            root,
            dirs: RefCell::new(BTreeMap::new()),
        }
    }

    /// The directory `dir` (normalized; `""`: the root), from the cache or
    /// opened now.
    fn open(&self, dir: &str) -> io::Result<Parent<'a>> {
        if dir.is_empty() {
            return Ok(Parent::Root(self.root.fd.as_fd()));
        }
        if let Some(fd) = self.dirs.borrow().get(dir) {
            return Ok(Parent::Cached(fd.clone()));
        }
        let fd = Rc::new(open_dir_at(self.root.fd.as_fd(), dir)?);
        self.keep(dir, fd.clone());
        Ok(Parent::Cached(fd))
    }

    fn keep(&self, dir: &str, fd: Rc<OwnedFd>) {
        let mut dirs = self.dirs.borrow_mut();
        if dirs.len() >= CACHED_DIRS {
            dirs.clear();
        }
        dirs.insert(dir.to_string(), fd);
    }

    /// The parent of `rel`, and `rel`'s last component.
    fn parent<'r>(&self, rel: &'r str) -> io::Result<(Parent<'a>, &'r str)> {
        let (parent, name) = split(self.root.check(rel)?);
        Ok((self.open(parent)?, name))
    }

    /// Drop the fds of `rel` and of everything below it (it was renamed
    /// or removed).
    fn forget(&self, rel: &str) {
        let mut dirs = self.dirs.borrow_mut();
        dirs.remove(rel);
        // Below `rel`: the keys from "rel/" up to "rel0" ('0' follows '/').
        let (lo, hi) = (format!("{rel}/"), format!("{rel}0"));
        let below: Vec<String> = dirs
            .range::<str, _>((Bound::Included(lo.as_str()), Bound::Excluded(hi.as_str())))
            .map(|(k, _)| k.clone())
            .collect();
        for k in below {
            dirs.remove(&k);
        }
    }

    /// [`Beneath::lstat`].
    pub fn lstat(&self, rel: &str) -> io::Result<Option<Stat>> {
        if rel.is_empty() {
            return self.root.lstat(rel);
        }
        lstat_in(self.parent(rel))
    }

    /// [`Beneath::exists`].
    pub fn exists(&self, rel: &str) -> bool {
        matches!(self.lstat(rel), Ok(Some(_)))
    }

    /// [`Beneath::create_dir`].
    pub fn create_dir(&self, rel: &str, mode: u32) -> io::Result<()> {
        let (fd, name) = self.parent(rel)?;
        rustix::fs::mkdirat(fd.fd(), name, Mode::from_raw_mode(mode)).map_err(Into::into)
    }

    /// [`Beneath::create_dir_all`]; a directory the cache holds is taken
    /// as there.
    pub fn create_dir_all(&self, rel: &str, mode: u32) -> io::Result<()> {
        let rel = self.root.check(rel)?;
        if self.dirs.borrow().contains_key(rel) {
            return Ok(());
        }
        let (parent, name) = split(rel);
        if !parent.is_empty() {
            self.create_dir_all(parent, mode)?;
        }
        let pfd = self.open(parent)?;
        match rustix::fs::mkdirat(pfd.fd(), name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        let fd = Rc::new(open_dir_at(pfd.fd(), name)?);
        self.keep(rel, fd);
        Ok(())
    }

    /// [`Beneath::remove_dir`].
    pub fn remove_dir(&self, rel: &str) -> io::Result<()> {
        let (fd, name) = self.parent(rel)?;
        rustix::fs::unlinkat(fd.fd(), name, AtFlags::REMOVEDIR)?;
        self.forget(rel);
        Ok(())
    }

    /// [`Beneath::rename_noreplace`], from beneath this cache's root to
    /// beneath `dest`'s.
    pub fn rename_noreplace(&self, from: &str, dest: &DirCache<'_>, to: &str) -> io::Result<()> {
        let (from_fd, from_name) = self.parent(from)?;
        let (to_fd, to_name) = dest.parent(to)?;
        rename_noreplace_at(from_fd.fd(), from_name, to_fd.fd(), to_name)?;
        self.forget(from);
        dest.forget(to);
        Ok(())
    }
}

impl AsFd for Beneath {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests;
