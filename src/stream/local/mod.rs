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
//! fsync threads ([`sync_files`]). Its bytes come from, in this order
//! (the kernel's copies are in `kernel`):
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

mod kernel;

use std::fs::File;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, mpsc};

use self::kernel::{CopyError, How, Kernel, clone_whole, copy_file};
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
use crate::journal::{Generation, fs_lanes};
use crate::model::{Copied, FileStamp, Kind, SendFile, ShebangRewrite, SourceHash, Written};

/// The buffer that reads and read-backs go through.
const READ_BUF: usize = 1 << 20;

/// Stage every file the generation adds or replaces from the source venv
/// at `source_root` on this machine, checking each against the plan.
/// `stop` is asked between files and between steps of a big one.
///
/// The files are copied by [`lanes`] threads at once, each taking the
/// next file as it is done with one (so one big file holds one lane while
/// the others go on through the small ones), each with its own writer
/// thread for big files past the page cache. The big files ([`DIRECT_MIN`]
/// and up) come first, biggest first, so that none is left to copy alone
/// at the end; then the others, in the plan's order. The read-ahead reads
/// in the same order. Nothing
/// is switched until every lane is done and every staged file durable, so
/// the order in which files are staged changes nothing of the journal's
/// guarantees. A lane that fails stops the others at their next file or
/// chunk; its error is the one reported.
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
        let mut files = SendFile::of_changes(&g.meta.changes);
        // The big files first, biggest first, then the rest in the plan's
        // order: a lane that takes the biggest file last would copy it
        // alone while the others wait for it.
        files.sort_by_key(|f| std::cmp::Reverse(Some(f.kind.size()).filter(|s| *s >= DIRECT_MIN)));
        let ahead = ReadAhead::new(READ_AHEAD, ADVICE);
        let mut kernel = Kernel::new();
        kernel.no_direct |= !direct_io_fs(&g.dir.join("staging"))
            || !files.iter().any(|f| f.kind.size() >= DIRECT_MIN);
        counters
            .total_files
            .store(files.len() as u64, Ordering::Relaxed);
        let mut starts = Vec::with_capacity(files.len());
        let mut total = 0u64;
        for f in &files {
            starts.push(total);
            total += f.kind.size();
        }
        counters.total_bytes.store(total, Ordering::Relaxed);
        let queue = Queue {
            files: &files,
            starts: &starts,
            next: AtomicUsize::new(0),
        };
        let failed = AtomicBool::new(false);
        let lane_stop = || stop() || failed.load(Ordering::Relaxed);
        let work = Lane {
            g,
            host_dir,
            counters,
            stop: &lane_stop,
            ahead: &ahead,
            venv: &venv,
            queue: &queue,
            shebang,
            kernel,
        };
        std::thread::scope(|scope| {
            let (venv, files, ahead) = (&venv, &files, &ahead);
            scope.spawn(move || read_ahead(venv, files, ahead, advise_willneed));
            // Done, failed or panicked: the read-ahead has nothing left to do.
            let _done = ReaderDone(ahead);
            let n = lanes(files.len());
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    let (work, sync, failed) = (&work, sync_tx.clone(), &failed);
                    scope.spawn(move || {
                        let r = work.run(sync);
                        if r.is_err() {
                            failed.store(true, Ordering::Relaxed);
                        }
                        r
                    })
                })
                .collect();
            drop(sync_tx);
            let results: Vec<Result<Copied>> = handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(err!(kind = Internal, "a local copy lane panicked"))
                    })
                })
                .collect();
            let mut copied = merge(results)?;
            copied.copies.lanes = n as u64;
            Ok(copied)
        })
    })
}

/// How many lanes copy at once: [`fs_lanes`] (every lane holds
/// [`WRITE_BUFFERS`] chunks of [`WRITE_CHUNK`] bytes for big files);
/// `OVERLAY_COPY_LANES` (1 to 64) sets it, for the benchmark.
fn lanes(files: usize) -> usize {
    std::env::var("OVERLAY_COPY_LANES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| (1..=64).contains(n))
        .map_or_else(|| fs_lanes(files), |n| n.min(files).max(1))
}

/// The lanes' results as one: what each copied, or the error of the lane
/// that failed first in the lanes' order, rather than another lane's
/// report that it was stopped because of it.
fn merge(results: Vec<Result<Copied>>) -> Result<Copied> {
    let mut out = Copied::default();
    let mut stopped = None;
    for r in results {
        match r {
            Ok(c) => {
                out.count.files += c.count.files;
                out.count.bytes += c.count.bytes;
                out.copies.reflink += c.copies.reflink;
                out.copies.copy_range += c.copies.copy_range;
                out.copies.read_write += c.copies.read_write;
                out.copies.direct += c.copies.direct;
                out.copies.rewritten += c.copies.rewritten;
                out.written.extend(c.written);
                out.hashes.extend(c.hashes);
            }
            Err(e) if e.kind == crate::error::ErrorKind::Interrupted => {
                stopped.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    match stopped {
        Some(e) => Err(e),
        None => {
            out.written.sort_by_key(|w| w.index);
            out.hashes.sort_by_key(|h| h.index);
            Ok(out)
        }
    }
}

/// The files to copy (big files first, see [`copy_local`]), and the next
/// one a lane takes.
struct Queue<'a> {
    files: &'a [SendFile],
    /// Where each file starts among the files' bytes, as the read-ahead counts.
    starts: &'a [u64],
    next: AtomicUsize,
}

impl Queue<'_> {
    /// The next file no lane has taken, and where it starts.
    fn take(&self) -> Option<(&SendFile, u64)> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        Some((self.files.get(i)?, self.starts[i]))
    }
}

/// What every lane shares.
struct Lane<'a> {
    g: &'a Generation,
    host_dir: &'a Path,
    counters: &'a Counters,
    /// The user's stop, or another lane's failure.
    stop: &'a (dyn Fn() -> bool + Sync),
    ahead: &'a ReadAhead,
    venv: &'a Venv,
    queue: &'a Queue<'a>,
    shebang: Option<&'a ShebangRewrite>,
    kernel: Kernel,
}

impl Lane<'_> {
    /// One lane: a copier and its writer thread, taking files from the
    /// queue until it is empty.
    fn run(&self, sync_tx: SyncSender) -> Result<Copied> {
        let (job_tx, job_rx) = mpsc::sync_channel::<WriteJob>(WRITE_BUFFERS);
        let (free_tx, free_rx) = mpsc::sync_channel::<AlignedBuf>(WRITE_BUFFERS);
        if !self.kernel.no_direct {
            for _ in 0..WRITE_BUFFERS {
                let _ = free_tx.send(AlignedBuf::new(WRITE_CHUNK));
            }
        }
        std::thread::scope(|scope| {
            let (g, host_dir) = (self.g, self.host_dir);
            let writer_sync = sync_tx.clone();
            let writer =
                scope.spawn(move || write_staged(g, host_dir, job_rx, free_tx, writer_sync));
            let writer_queue = Direct {
                jobs: job_tx,
                free: free_rx,
            };
            let copied = Copier::new(
                g,
                host_dir,
                self.counters,
                self.stop,
                sync_tx,
                self.ahead,
                writer_queue,
            )
            .and_then(|c| c.run(self.venv, self.queue, self.shebang, self.kernel));
            let written = writer
                .join()
                .unwrap_or_else(|_| Err(err!(kind = Internal, "the staging writer panicked")));
            // The writer's own error explains a copy that stopped because of it.
            let written = written?;
            let mut copied = copied?;
            copied.written.extend(written);
            Ok(copied)
        })
    }
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

    /// Copy files from the queue, in its order, until none is left.
    fn run(
        mut self,
        venv: &Venv,
        queue: &Queue<'_>,
        shebang: Option<&ShebangRewrite>,
        kernel: Kernel,
    ) -> Result<Copied> {
        self.kernel = kernel;
        let c = self.counters;
        let root = venv.beneath()?;
        let mut walker = Walker::new(std::os::fd::AsFd::as_fd(&root));
        while let Some((f, start)) = queue.take() {
            let (i, kind, path) = (f.index, &f.kind, f.path.as_str());
            self.at = start;
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

#[cfg(test)]
mod tests;
