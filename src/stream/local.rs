//! The local route's copy: when the source venv is on the target's own
//! machine, the target's agent stages the generation's files from it
//! itself ([`copy_local`]), with the kernel's copy instead of a tar stream
//! through three processes' pipes.
//!
//! The source venv is opened once and every file is reached from its fd
//! without following a symlink, with the sender's own checks (`source_file`'s
//! [`Source`] and [`FileToSend`]: type, size, symlink target, hash or
//! stamp since the plan); a file that changed stops the copy with the
//! stream's error (plan again), and nothing is switched. The list of files
//! is the generation's own (what `Prepare` recorded), not anything sent
//! with the request.
//!
//! Each file is created as `staging/<index>` through a [`Beneath`] of the
//! staging directory (`O_CREAT|O_EXCL|O_NOFOLLOW`), as the stream's writer
//! does, with the same owners ([`Owners`]), modes (masked to `0o777`) and
//! fsync threads ([`sync_files`]). Its bytes come from, in this order:
//! - a clone of the whole file (`FICLONE`: shared extents, no bytes
//!   copied) where the filesystem has reflinks (btrfs, XFS);
//! - for a big file ([`DIRECT_MIN`] and up) where staging takes `O_DIRECT`
//!   (ext4 here): reads into aligned chunks, hashed here, which the
//!   stream's own writer thread ([`write_staged`]) writes past the page
//!   cache while the next chunk is read. Filling the page cache costs more
//!   than the copy itself (on a host that reclaims free memory, every page
//!   of it is a fresh one), and every staged file is made durable before
//!   the switch anyway;
//! - `copy_file_range` (in the kernel, page cache to page cache; a short
//!   copy is continued where it stopped), where the two are on one
//!   filesystem that allows it;
//! - plain reads and writes, where the kernel refuses both (`EXDEV`,
//!   `EINVAL`, `EOPNOTSUPP`, `ENOSYS`); and for a script whose shebang is
//!   rewritten for the target (read, rewritten, written), as the stream does.
//!
//! The source's disk is kept busy ahead of the copy with the stream's own
//! read-ahead (`read_ahead`'s [`read_ahead`]: `posix_fadvise(WILLNEED)` of the
//! files the copy comes to next, at most 64 MiB past it): a source venv
//! that is not in the page cache is read with many requests in flight, not
//! one file at a time.
//!
//! Every staged regular file is then checked against the plan: its blake3
//! must be the plan's (or, unhashed in the plan, the source's stamp did not
//! move while it was copied). Where the copy read the bytes anyway (big
//! files past the page cache, reads and writes, rewritten scripts) they
//! are hashed as they are read, and the buffer hashed is the one written; after
//! a clone or a `copy_file_range` the staged file is read back and hashed.
//! Reading back is the cheaper check there, and the stronger: it hashes
//! the very bytes the switch will put in place, while the kernel's copy
//! moved them without a copy through this process (a read-and-write copy
//! that hashes as it reads costs two copies through user space; a
//! `copy_file_range` and a read-back, one in the kernel and one out of the
//! page cache the copy just filled).

use std::fs::File;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};

use super::read_ahead::{ADVICE, READ_AHEAD, ReadAhead, ReaderDone, advise_willneed, read_ahead};
use super::source_file::{FileToSend, Source};
use super::write::{
    AlignedBuf, DIRECT_MIN, Finish, Owners, SyncSender, WRITE_BUFFERS, WRITE_CHUNK, WriteJob,
    direct_io_fs, set_direct, set_mtime, stage_error, staged_durably, write_staged, writer_stopped,
};
use crate::beneath::Beneath;
use crate::err;
use crate::error::{Error, Result, io_cause};
use crate::inventory::{ContentHasher, Counters, Venv, Walker, content_hex};
use crate::journal::Generation;
use crate::model::{Copied, FileStamp, Kind, SendFile, ShebangRewrite, SourceHash, Written};

/// Bytes per `copy_file_range` call (and per read of the fallback's): a big
/// file's progress moves, and a stop is seen, within it.
const COPY_STEP: usize = 16 << 20;
/// The buffer that reads and read-backs go through.
const READ_BUF: usize = 1 << 20;

/// How one file's bytes were copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    Reflink,
    CopyRange,
    ReadWrite,
}

/// Which of the kernel's copies this source and staging allow, as learnt
/// from the files copied so far (a refusal is not asked again).
#[derive(Debug, Default, Clone, Copy)]
struct Kernel {
    no_reflink: bool,
    no_direct: bool,
    no_copy_range: bool,
}

impl Kernel {
    /// With `OVERLAY_TEST_LOCAL_COPY` (tests and the benchmark):
    /// `read-write`, reads and writes through the page cache only;
    /// `copy-range`, no big file past the page cache.
    fn new() -> Kernel {
        let mode = std::env::var("OVERLAY_TEST_LOCAL_COPY").unwrap_or_default();
        let rw = mode == "read-write";
        Kernel {
            no_reflink: rw,
            no_direct: rw || mode == "copy-range",
            no_copy_range: rw,
        }
    }
}

/// Why a file's copy stopped.
#[derive(Debug)]
enum CopyError {
    /// The source is shorter or longer than the plan says.
    Changed,
    /// Stopped on request.
    Stopped,
    /// Reading the source failed.
    Read(std::io::Error),
    /// Copying or writing into staging failed.
    Write(std::io::Error),
}

/// An errno after which the kernel's copy is not tried again: it does not
/// do this pair of files (or this kernel has none).
fn refused(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EXDEV | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS | libc::ENOTTY)
    )
}

/// Stage every file the generation adds or replaces from the source venv
/// at `source_root` on this machine, checking each against the plan.
/// `stop` is asked between files and between steps of a big one.
pub fn copy_local(
    g: &Generation,
    host_dir: &Path,
    source_root: &str,
    shebang: Option<&ShebangRewrite>,
    counters: &Counters,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<Copied> {
    staged_durably(g, host_dir, |sync_tx| {
        let venv = Venv::open(source_root)?;
        let files = SendFile::of_changes(&g.meta.changes);
        let ahead = ReadAhead::new(READ_AHEAD, ADVICE);
        let mut kernel = Kernel::new();
        kernel.no_direct |= !direct_io_fs(&g.dir.join("staging"))
            || !files.iter().any(|f| f.kind.size() >= DIRECT_MIN);
        let (job_tx, job_rx) = mpsc::sync_channel::<WriteJob>(WRITE_BUFFERS);
        let (free_tx, free_rx) = mpsc::sync_channel::<AlignedBuf>(WRITE_BUFFERS);
        if !kernel.no_direct {
            for _ in 0..WRITE_BUFFERS {
                let _ = free_tx.send(AlignedBuf::new(WRITE_CHUNK));
            }
        }
        std::thread::scope(|scope| {
            let (venv, files, ahead) = (&venv, &files, &ahead);
            scope.spawn(move || read_ahead(venv, files, ahead, advise_willneed));
            // Done, failed or panicked: the read-ahead has nothing left to do.
            let _done = ReaderDone(ahead);
            let writer_sync = sync_tx.clone();
            let writer =
                scope.spawn(move || write_staged(g, host_dir, job_rx, free_tx, writer_sync));
            let writer_queue = Direct {
                jobs: job_tx,
                free: free_rx,
            };
            let copied = Copier::new(g, host_dir, counters, stop, sync_tx, ahead, writer_queue)
                .and_then(|c| c.run(venv, files, shebang, kernel));
            let written = writer
                .join()
                .unwrap_or_else(|_| Err(err!(kind = Internal, "the staging writer panicked")));
            // The writer's own error explains a copy that stopped because of it.
            let written = written?;
            let mut copied = copied?;
            copied.written.extend(written);
            Ok(copied)
        })
    })
}

/// The queues to the writer thread, for big files past the page cache:
/// chunks to write, and the buffers it is done with.
struct Direct {
    jobs: mpsc::SyncSender<WriteJob>,
    free: mpsc::Receiver<AlignedBuf>,
}

/// The copying thread's state.
struct Copier<'a> {
    g: &'a Generation,
    host_dir: &'a Path,
    counters: &'a Counters,
    stop: &'a (dyn Fn() -> bool + Sync),
    staging_path: std::path::PathBuf,
    /// Every staged file is made relative to this fd, with `O_EXCL|O_NOFOLLOW`.
    staging: Beneath,
    /// Who staged files belong to, as root without `--same-owner`.
    owners: Option<Owners>,
    is_root: bool,
    sync: SyncSender,
    kernel: Kernel,
    direct: Direct,
    buf: Vec<u8>,
    out: Copied,
    /// Told how far the files were copied, for the read-ahead.
    ahead: &'a ReadAhead,
    /// Where the file being copied starts among the files' bytes, as the
    /// read-ahead counts.
    at: u64,
}

impl<'a> Copier<'a> {
    fn new(
        g: &'a Generation,
        host_dir: &'a Path,
        counters: &'a Counters,
        stop: &'a (dyn Fn() -> bool + Sync),
        sync: SyncSender,
        ahead: &'a ReadAhead,
        direct: Direct,
    ) -> Result<Copier<'a>> {
        let staging_path = g.dir.join("staging");
        let staging =
            Beneath::open(&staging_path).map_err(|e| stage_error(&staging_path, e, host_dir, g))?;
        let is_root = rustix::process::geteuid().is_root();
        let owners = (is_root && !g.meta.same_owner).then(|| Owners::new(host_dir));
        Ok(Copier {
            g,
            host_dir,
            counters,
            stop,
            staging_path,
            staging,
            owners,
            is_root,
            sync,
            kernel: Kernel::default(),
            direct,
            buf: vec![0u8; READ_BUF],
            out: Copied::default(),
            ahead,
            at: 0,
        })
    }

    fn error(&self, name: &str, e: std::io::Error) -> Error {
        stage_error(&self.staging_path.join(name), e, self.host_dir, self.g)
    }

    fn stopped() -> Error {
        err!(
            kind = Interrupted,
            hint = "run `overlay apply` again to start it again",
            "the local copy was stopped on request; nothing was switched"
        )
    }

    /// Copy every file of the generation, in its order.
    fn run(
        mut self,
        venv: &Venv,
        files: &[SendFile],
        shebang: Option<&ShebangRewrite>,
        kernel: Kernel,
    ) -> Result<Copied> {
        self.kernel = kernel;
        let c = self.counters;
        c.total_files.store(files.len() as u64, Ordering::Relaxed);
        c.total_bytes
            .store(files.iter().map(|f| f.kind.size()).sum(), Ordering::Relaxed);
        let root = venv.beneath()?;
        let mut walker = Walker::new(std::os::fd::AsFd::as_fd(&root));
        for f in files {
            let (i, kind, path) = (f.index, &f.kind, f.path.as_str());
            self.ahead.reader_at(self.at);
            if (self.stop)() {
                return Err(Self::stopped());
            }
            let (abs, rel) = venv.resolve(path)?;
            let src = Source {
                venv,
                abs: &abs,
                rel: &rel,
            };
            let meta = src.lstat(&mut walker)?;
            let owner = match &self.owners {
                _ if !self.is_root => None,
                Some(o) => o.of(path),
                None => Some((meta.st_uid, meta.st_gid)),
            };
            let name = i.to_string();
            match kind {
                Kind::Symlink { target } => {
                    src.check_link(&mut walker, target)?;
                    self.staging
                        .symlink(target, &name)
                        .map_err(|e| self.error(&name, e))?;
                    if let Some((uid, gid)) = owner {
                        let _ = rustix::fs::chownat(
                            &self.staging,
                            name.as_str(),
                            Some(rustix::fs::Uid::from_raw(uid)),
                            Some(rustix::fs::Gid::from_raw(gid)),
                            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                        );
                    }
                }
                Kind::File { size, mode, .. } => {
                    let file = FileToSend {
                        src: &src,
                        kind,
                        meta: &meta,
                        name: &name,
                    };
                    self.file(&mut walker, &file, *size, *mode, owner, shebang)?;
                    self.out.count.bytes += size;
                }
                other => {
                    return Err(err!(
                        kind = Protocol,
                        "Cannot copy {}: it is {other:?} in the plan",
                        abs.display()
                    ));
                }
            }
            self.out.count.files += 1;
            c.files.fetch_add(1, Ordering::Relaxed);
            self.at += kind.size();
        }
        Ok(self.out)
    }

    /// Stage one regular file, check it, finish it (owner, mode) and hand
    /// it to the fsync threads.
    fn file(
        &mut self,
        walker: &mut Walker<'_>,
        file: &FileToSend<'_>,
        size: u64,
        mode: u32,
        owner: Option<(u32, u32)>,
        shebang: Option<&ShebangRewrite>,
    ) -> Result<()> {
        let src = file.src;
        let name = file.name;
        let input = file.open_checked(walker)?;
        let out = self
            .staging
            .create_new(name, 0o600)
            .map_err(|e| self.error(name, e))?;
        let digest = if file.rewrites(shebang) {
            let content = file.read_rewritten(&input, shebang, size)?;
            out.write_all_at(&content, 0)
                .map_err(|e| self.error(name, e))?;
            self.counters.bytes.fetch_add(size, Ordering::Relaxed);
            self.out.copies.rewritten += 1;
            content_hex(ContentHasher::new().update(&content))
        } else {
            if file.meta.st_size as u64 != size {
                return Err(src.changed());
            }
            // A big file goes past the page cache ([`Self::file_direct`]),
            // unless a clone, where the filesystem has them, copies nothing.
            let big = size >= DIRECT_MIN && !self.kernel.no_direct;
            let cloned = big
                && clone_whole(&input, &out, size, &mut self.kernel)
                    .map_err(|e| self.copy_error(file, e))?;
            if big && !cloned {
                return self.file_direct(file, &input, out, size, mode, owner);
            }
            let (counters, ahead, at) = (self.counters, self.ahead, self.at);
            let done = std::cell::Cell::new(0u64);
            let progress = |n| {
                counters.bytes.fetch_add(n, Ordering::Relaxed);
                done.set(done.get() + n);
                ahead.reader_at(at + done.get());
            };
            let (how, hashed) = if cloned {
                progress(size);
                (How::Reflink, None)
            } else {
                copy_file(
                    &input,
                    &out,
                    size,
                    &mut self.kernel,
                    &mut self.buf,
                    &progress,
                    self.stop,
                )
                .map_err(|e| self.copy_error(file, e))?
            };
            match how {
                How::Reflink => self.out.copies.reflink += 1,
                How::CopyRange => self.out.copies.copy_range += 1,
                How::ReadWrite => self.out.copies.read_write += 1,
            }
            match hashed {
                Some(d) => d,
                None => self
                    .read_back(name, &out, size)?
                    .ok_or_else(|| src.changed())?,
            }
        };
        self.finish(file, &input, out, &digest, mode, owner)
    }

    /// Finish a staged file whose bytes are all there (`digest`, as read):
    /// check it against the plan, set its owner and mode, note it, and hand
    /// it to the fsync threads.
    fn finish(
        &mut self,
        file: &FileToSend<'_>,
        input: &File,
        out: File,
        digest: &str,
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<()> {
        let name = file.name;
        let digest = digest.to_string();
        // What was staged is the plan's, or the source did not move meanwhile.
        file.check_read(input, Some(&digest))?;
        if let Some((uid, gid)) = owner {
            let _ = std::os::unix::fs::fchown(&out, Some(uid), Some(gid));
        }
        // Never a setuid, setgid or sticky bit, whatever the plan says.
        out.set_permissions(std::fs::Permissions::from_mode(mode & 0o777))
            .map_err(|e| self.error(name, e))?;
        set_mtime(&out, file.mtime());
        let stamp = out.metadata().map_err(|e| self.error(name, e))?;
        let index: usize = name.parse().expect("an index");
        self.out.written.push(Written {
            index,
            blake3: digest.clone(),
            stamp: FileStamp::of(&stamp),
        });
        self.out.hashes.push(SourceHash {
            index,
            blake3: digest,
        });
        self.sync
            .send((Arc::new(out), self.staging_path.join(name)))
            .map_err(|_| err!("the fsync threads stopped"))
    }

    /// The error for a copy of `file` that stopped.
    fn copy_error(&self, file: &FileToSend<'_>, e: CopyError) -> Error {
        match e {
            CopyError::Changed => file.src.changed(),
            CopyError::Stopped => Self::stopped(),
            CopyError::Read(e) => {
                err!(
                    "Failed to read {}: {}",
                    file.src.abs.display(),
                    io_cause(&e)
                )
            }
            CopyError::Write(e) => self.error(file.name, e),
        }
    }

    /// A big file past the page cache: read here into aligned chunks and
    /// hashed as read; the writer thread writes each with `O_DIRECT` (its
    /// tail through the cache) while the next is read, and once the file's
    /// last chunk is written, sets its owner and mode, notes it and hands
    /// it to the fsync threads. The last chunk goes only once what was
    /// read is the plan's.
    fn file_direct(
        &mut self,
        file: &FileToSend<'_>,
        input: &File,
        out: File,
        size: u64,
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<()> {
        let (src, name) = (file.src, file.name);
        let index: usize = name.parse().expect("an index");
        // Refused: written through the page cache by the same writer.
        set_direct(&out, true);
        let out = Arc::new(out);
        let mut hasher = ContentHasher::new();
        let mut at = 0u64;
        while at < size {
            if (self.stop)() {
                return Err(Self::stopped());
            }
            let mut buf = self.direct.free.recv().map_err(|_| writer_stopped())?;
            let want = usize::try_from(size - at)
                .unwrap_or(usize::MAX)
                .min(WRITE_CHUNK);
            let mut fill = 0;
            while fill < want {
                match input.read_at(&mut buf.get()[fill..want], at + fill as u64) {
                    // The source ends before the plan's size.
                    Ok(0) => return Err(src.changed()),
                    Ok(n) => fill += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        return Err(err!(
                            "Failed to read {}: {}",
                            src.abs.display(),
                            io_cause(&e)
                        ));
                    }
                }
            }
            hasher.update(&buf.get()[..fill]);
            at += fill as u64;
            self.counters
                .bytes
                .fetch_add(fill as u64, Ordering::Relaxed);
            self.ahead.reader_at(self.at + at);
            let last = if at == size {
                let digest = content_hex(&hasher);
                file.check_read(input, Some(&digest))?;
                self.out.hashes.push(SourceHash {
                    index,
                    blake3: digest.clone(),
                });
                Some(Finish {
                    digest,
                    mode,
                    owner,
                    mtime: file.mtime(),
                })
            } else {
                None
            };
            let job = WriteJob {
                index,
                file: out.clone(),
                buf,
                len: fill,
                last,
            };
            self.direct.jobs.send(job).map_err(|_| writer_stopped())?;
        }
        self.out.copies.direct += 1;
        Ok(())
    }

    /// The blake3 of staged file `name` (the very inode `out`), read back;
    /// `None` if it is not `size` bytes long.
    fn read_back(&mut self, name: &str, out: &File, size: u64) -> Result<Option<String>> {
        let again = self
            .staging
            .open_read(name)
            .map_err(|e| self.error(name, e))?;
        let (a, b) = (
            rustix::fs::fstat(out).map_err(|e| self.error(name, e.into()))?,
            rustix::fs::fstat(&again).map_err(|e| self.error(name, e.into()))?,
        );
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) {
            return Err(err!(
                kind = Internal,
                "{} was replaced while it was staged; nothing was switched",
                self.staging_path.join(name).display()
            ));
        }
        let mut hasher = ContentHasher::new();
        let mut at = 0u64;
        loop {
            let n = match again.read_at(&mut self.buf, at) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.error(name, e)),
            };
            if n == 0 {
                break;
            }
            hasher.update(&self.buf[..n]);
            at += n as u64;
        }
        Ok((at == size).then(|| content_hex(&hasher)))
    }
}

/// Copy the first `size` bytes of `src` into the empty `dst`: a clone of
/// the whole file, else `copy_file_range`, else reads and writes (`kernel`
/// learns which work). Returns how, and the blake3 when the copy read the
/// bytes (reads and writes from the start); else the caller reads back.
fn copy_file(
    src: &File,
    dst: &File,
    size: u64,
    kernel: &mut Kernel,
    buf: &mut [u8],
    progress: &dyn Fn(u64),
    stop: &dyn Fn() -> bool,
) -> std::result::Result<(How, Option<String>), CopyError> {
    if clone_whole(src, dst, size, kernel)? {
        progress(size);
        return Ok((How::Reflink, None));
    }
    let mut from = 0;
    if !kernel.no_copy_range {
        let step = |at: u64, len: usize| {
            let (mut off_in, mut off_out) = (at, at);
            rustix::fs::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), len)
                .map_err(std::io::Error::from)
        };
        match copy_range(size, step, progress, stop)? {
            Ranged::Done => return Ok((How::CopyRange, None)),
            Ranged::Refused { at } => {
                kernel.no_copy_range = true;
                from = at;
            }
        }
    }
    let mut hasher = (from == 0).then(ContentHasher::new);
    read_write(src, dst, from, size, buf, hasher.as_mut(), progress, stop)?;
    match hasher {
        Some(h) => Ok((How::ReadWrite, Some(content_hex(&h)))),
        // Part was copied by the kernel before it refused: read it all back.
        None => Ok((How::CopyRange, None)),
    }
}

/// Clone all of `src` into the empty `dst` (`FICLONE`: shared extents, no
/// bytes copied) where the filesystem has reflinks. False where it has none
/// (`kernel` learns not to ask again) or when there is nothing to clone.
fn clone_whole(
    src: &File,
    dst: &File,
    size: u64,
    kernel: &mut Kernel,
) -> std::result::Result<bool, CopyError> {
    if kernel.no_reflink || size == 0 {
        return Ok(false);
    }
    match rustix::fs::ioctl_ficlone(dst, src) {
        Ok(()) => {
            // The clone is of the whole file: as long as the plan says.
            let len = rustix::fs::fstat(dst)
                .map_err(|e| CopyError::Write(e.into()))?
                .st_size as u64;
            if len != size {
                return Err(CopyError::Changed);
            }
            Ok(true)
        }
        Err(e) if refused(&e.into()) => {
            kernel.no_reflink = true;
            Ok(false)
        }
        Err(e) => Err(CopyError::Write(e.into())),
    }
}

/// How a `copy_file_range` loop ended.
#[derive(Debug, PartialEq, Eq)]
enum Ranged {
    /// All `size` bytes were copied.
    Done,
    /// The kernel refused at this offset; the rest is the caller's.
    Refused { at: u64 },
}

/// Copy `size` bytes by `step(offset, len)` (one `copy_file_range`, which
/// may copy fewer than `len`: the loop goes on from where it stopped).
fn copy_range(
    size: u64,
    mut step: impl FnMut(u64, usize) -> std::io::Result<usize>,
    progress: &dyn Fn(u64),
    stop: &dyn Fn() -> bool,
) -> std::result::Result<Ranged, CopyError> {
    let mut at = 0u64;
    while at < size {
        if stop() {
            return Err(CopyError::Stopped);
        }
        let len = usize::try_from(size - at)
            .unwrap_or(usize::MAX)
            .min(COPY_STEP);
        match step(at, len) {
            // The source ends before the plan's size.
            Ok(0) => return Err(CopyError::Changed),
            Ok(n) if n > len => return Err(CopyError::Changed),
            Ok(n) => {
                at += n as u64;
                progress(n as u64);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if refused(&e) => return Ok(Ranged::Refused { at }),
            Err(e) => return Err(CopyError::Write(e)),
        }
    }
    Ok(Ranged::Done)
}

/// Copy bytes `from..size` of `src` into `dst` at the same offsets through
/// `buf`, hashing them into `hasher` if given.
#[allow(clippy::too_many_arguments)]
fn read_write(
    src: &File,
    dst: &File,
    from: u64,
    size: u64,
    buf: &mut [u8],
    mut hasher: Option<&mut ContentHasher>,
    progress: &dyn Fn(u64),
    stop: &dyn Fn() -> bool,
) -> std::result::Result<(), CopyError> {
    let mut at = from;
    while at < size {
        if stop() {
            return Err(CopyError::Stopped);
        }
        let want = usize::try_from(size - at)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = match src.read_at(&mut buf[..want], at) {
            Ok(0) => return Err(CopyError::Changed),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        if let Some(h) = hasher.as_deref_mut() {
            h.update(&buf[..n]);
        }
        dst.write_all_at(&buf[..n], at).map_err(CopyError::Write)?;
        at += n as u64;
        progress(n as u64);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::State;
    use crate::model::{GenChange, PrepareRequest, StageCount};
    use std::fs;

    const SITE: &str = "lib/python3.11/site-packages";

    fn hex(d: &[u8]) -> String {
        content_hex(ContentHasher::new().update(d))
    }

    fn planned(d: &[u8], mode: u32) -> Kind {
        Kind::File {
            size: d.len() as u64,
            mode,
            blake3: Some(hex(d)),
            stamp: None,
        }
    }

    fn venv(dir: &Path) {
        fs::create_dir_all(dir.join(SITE)).unwrap();
        fs::create_dir_all(dir.join("bin")).unwrap();
        fs::write(dir.join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
    }

    /// A source venv and a target venv with a generation opened to carry
    /// a big file (several copy steps, not a multiple of anything), a
    /// small one, a symlink pointing out of the venv, and a script whose
    /// shebang names the source venv.
    struct Pair {
        _dir: tempfile::TempDir,
        src: std::path::PathBuf,
        dst: std::path::PathBuf,
        _state: State,
        g: Generation,
        big: Vec<u8>,
    }

    impl Pair {
        fn new() -> Pair {
            let dir = tempfile::tempdir().unwrap();
            let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
            venv(&src);
            venv(&dst);
            let big: Vec<u8> = (0..COPY_STEP + 3 * READ_BUF + 777)
                .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
                .collect();
            fs::write(src.join(SITE).join("big.so"), &big).unwrap();
            fs::write(src.join(SITE).join("small.py"), b"x = 1\n").unwrap();
            std::os::unix::fs::symlink("/etc/passwd", src.join(SITE).join("out")).unwrap();
            let script = format!("#!{}/bin/python\nprint(1)\n", src.display());
            fs::write(src.join("bin/tool"), script).unwrap();
            let rewritten = format!("#!{}/bin/python\nprint(1)\n", dst.display());
            let v = dst.to_str().unwrap().to_string();
            let state = State::open(&v).unwrap();
            let req = PrepareRequest {
                venv: v,
                source: "s".into(),
                target: "t".into(),
                plan_created: 0,
                changes: vec![
                    GenChange::add("big.so", planned(&big, 0o755)),
                    GenChange::add("small.py", planned(b"x = 1\n", 0o4644)),
                    GenChange::add(
                        "out",
                        Kind::Symlink {
                            target: "/etc/passwd".into(),
                        },
                    ),
                    GenChange::add("../../../bin/tool", planned(rewritten.as_bytes(), 0o755)),
                ],
                backup: false,
                resume: false,
                same_owner: false,
                versions: Vec::new(),
                shebang: None,
            };
            let g = state.prepare(&req, &Counters::default()).unwrap();
            Pair {
                _dir: dir,
                src,
                dst,
                _state: state,
                g,
                big,
            }
        }

        fn copy(&self) -> Result<Copied> {
            let shebang = ShebangRewrite {
                from: self.src.to_str().unwrap().into(),
                to: self.dst.to_str().unwrap().into(),
            };
            copy_local(
                &self.g,
                &self.dst,
                self.src.to_str().unwrap(),
                Some(&shebang),
                &Counters::default(),
                &|| false,
            )
        }

        fn staging(&self) -> std::path::PathBuf {
            self.g.dir.join("staging")
        }
    }

    /// Where the filesystem has no reflinks (ext4, tmpfs: where the tests
    /// run), a big file is copied past the page cache where staging takes
    /// `O_DIRECT` (ext4), the rest by `copy_file_range`, and staged exactly: the
    /// symlink that points out of the venv as a symlink, the script with
    /// its shebang rewritten, modes masked, every digest the plan's.
    #[test]
    fn without_reflinks_the_kernel_copies_by_copy_file_range_and_stages_exactly() {
        let p = Pair::new();
        let c = p.copy().unwrap();
        let st = p.staging();
        assert!(fs::read(st.join("0")).unwrap() == p.big);
        assert_eq!(fs::read(st.join("1")).unwrap(), b"x = 1\n");
        assert_eq!(
            fs::read_link(st.join("2")).unwrap(),
            Path::new("/etc/passwd")
        );
        let script = fs::read_to_string(st.join("3")).unwrap();
        assert!(script.starts_with(&format!("#!{}/bin/python", p.dst.display())));
        let mode = |n: &str| fs::metadata(st.join(n)).unwrap().permissions().mode() & 0o7777;
        assert_eq!((mode("0"), mode("1")), (0o755, 0o644));
        assert_eq!(
            c.count,
            StageCount {
                files: 4,
                bytes: p.big.len() as u64 + 6 + script.len() as u64
            }
        );
        assert_eq!(c.copies.rewritten, 1);
        assert_eq!(
            c.copies.reflink + c.copies.direct + c.copies.copy_range + c.copies.read_write,
            2
        );
        let reflinks = matches!(
            rustix::fs::statfs(&p.dst).map(|s| s.f_type as u64),
            Ok(0x9123_683E | 0x5846_5342)
        );
        if !reflinks {
            // The big file past the page cache where staging takes O_DIRECT.
            let want = if direct_io_fs(&p.staging()) {
                (1, 1)
            } else {
                (0, 2)
            };
            let got = (c.copies.direct, c.copies.copy_range);
            assert_eq!(got, want, "{:?}", c.copies);
        }
        let mut digests: Vec<(usize, String)> = c
            .written
            .iter()
            .map(|w| (w.index, w.blake3.clone()))
            .collect();
        digests.sort();
        assert_eq!(digests[0], (0, hex(&p.big)));
        assert_eq!(digests[2], (3, hex(script.as_bytes())));
    }

    /// A symlink swapped in for a source file (pointing at a file with the
    /// very content the plan expects) is refused, not followed.
    #[test]
    fn a_symlink_swapped_in_for_a_source_file_is_refused() {
        let p = Pair::new();
        let outside = p.src.parent().unwrap().join("outside.py");
        fs::write(&outside, b"x = 1\n").unwrap();
        let small = p.src.join(SITE).join("small.py");
        fs::remove_file(&small).unwrap();
        std::os::unix::fs::symlink(&outside, &small).unwrap();
        let e = p.copy().unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::Drift, "{}", e.message);
        assert!(
            e.message.contains("changed since the plan"),
            "{}",
            e.message
        );
        assert!(!p.staging().join("1").exists());
        // Its parent swapped for a symlink: refused as well.
        let p = Pair::new();
        let site = p.src.join(SITE);
        let real = p.src.join("real-site");
        fs::rename(&site, &real).unwrap();
        std::os::unix::fs::symlink(&real, &site).unwrap();
        let e = p.copy().unwrap_err();
        assert!(e.message.contains("symlink"), "{}", e.message);
    }

    /// A file changed since the plan (same size, other bytes) is refused
    /// with the stream's error, and so is one cut shorter.
    #[test]
    fn a_file_changed_since_the_plan_is_refused() {
        let p = Pair::new();
        let mut big = p.big.clone();
        big[COPY_STEP + 5] ^= 1;
        fs::write(p.src.join(SITE).join("big.so"), &big).unwrap();
        let e = p.copy().unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::Drift);
        assert!(
            e.message.contains("big.so changed since the plan"),
            "{}",
            e.message
        );
        assert!(e.hint.unwrap().contains("overlay plan"));
        let p = Pair::new();
        fs::write(p.src.join(SITE).join("small.py"), b"x = 12\n").unwrap();
        let e = p.copy().unwrap_err();
        assert!(
            e.message.contains("small.py changed since the plan"),
            "{}",
            e.message
        );
    }

    /// A `copy_file_range` that copies less than asked is continued from
    /// where it stopped; a refusal part way hands the rest to reads and
    /// writes, and the staged file is then read back whole.
    #[test]
    fn a_short_copy_file_range_is_continued() {
        let t = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..100_003u32).map(|i| (i % 253) as u8).collect();
        fs::write(t.path().join("a"), &data).unwrap();
        let src = File::open(t.path().join("a")).unwrap();
        let dst = File::create(t.path().join("b")).unwrap();
        let mut calls = 0;
        let step = |at: u64, len: usize| {
            calls += 1;
            let (mut i, mut o) = (at, at);
            // At most 999 bytes a call.
            rustix::fs::copy_file_range(&src, Some(&mut i), &dst, Some(&mut o), len.min(999))
                .map_err(std::io::Error::from)
        };
        let r = copy_range(data.len() as u64, step, &|_| {}, &|| false).unwrap();
        assert_eq!(r, Ranged::Done);
        assert_eq!(calls, data.len().div_ceil(999));
        assert!(fs::read(t.path().join("b")).unwrap() == data);
        // Refused after two short copies: the rest is read and written.
        let dst = File::create(t.path().join("c")).unwrap();
        let mut n = 0;
        let step = |at: u64, len: usize| {
            n += 1;
            if n > 2 {
                return Err(std::io::Error::from_raw_os_error(libc::EXDEV));
            }
            let (mut i, mut o) = (at, at);
            rustix::fs::copy_file_range(&src, Some(&mut i), &dst, Some(&mut o), len.min(1000))
                .map_err(std::io::Error::from)
        };
        let r = copy_range(data.len() as u64, step, &|_| {}, &|| false).unwrap();
        assert_eq!(r, Ranged::Refused { at: 2000 });
        let mut buf = vec![0u8; 4096];
        read_write(
            &src,
            &dst,
            2000,
            data.len() as u64,
            &mut buf,
            None,
            &|_| {},
            &|| false,
        )
        .unwrap();
        assert!(fs::read(t.path().join("c")).unwrap() == data);
        // A source that ends early is a change.
        let step = |_: u64, _: usize| Ok(0);
        assert!(matches!(
            copy_range(10, step, &|_| {}, &|| false),
            Err(CopyError::Changed)
        ));
        // Reads and writes from the start hash as they go.
        let dst = File::create(t.path().join("d")).unwrap();
        let mut k = Kernel {
            no_reflink: true,
            no_direct: true,
            no_copy_range: true,
        };
        let (how, digest) = copy_file(
            &src,
            &dst,
            data.len() as u64,
            &mut k,
            &mut buf,
            &|_| {},
            &|| false,
        )
        .unwrap();
        assert_eq!((how, digest), (How::ReadWrite, Some(hex(&data))));
        assert!(fs::read(t.path().join("d")).unwrap() == data);
    }
}
