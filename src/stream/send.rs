//! The source's side of the stream: read and check the files the plan
//! sends (hashing those the plan did not hash: the target checks the
//! others against the plan) into one tar stream ([`read_files`]), cut it
//! into blocks ([`BlockCutter`]), pack the blocks on every core
//! ([`packer`]: zstd at the level of the moment, or stored when that is not
//! smaller), and hand them to the [`BlockSink`] in order ([`write_blocks`],
//! which also feeds the level tuner each block's cost: how long handing it
//! over blocked).
//! [`send`] runs the three on their own threads.
//!
//! Progress is counted at the block level: each block carries how far the
//! files were read when it was cut ([`Done`]: whole files, and bytes of
//! files including the part of the one being read), and the writer
//! publishes that in the [`Counters`] once the block is handed to the sink,
//! with a progress report after every block. So the bytes move within a
//! large file, and they count what went onto the link, not what was read.
//!
//! Every file is reached from the venv root's fd without following a
//! symlink ([`Walker`]); one that changed since the plan (type, size,
//! symlink target, hash or stamp) stops the stream with an error that says
//! to plan again.
//!
//! The disk is kept busy ahead of the reader ([`read_ahead`], a thread of
//! its own): it opens the files the reader comes to next, in the plan's
//! order and the same way (from the root's fd, never through a symlink),
//! and asks the kernel to read them into the page cache
//! (`posix_fadvise(WILLNEED)`), in pieces of at most [`ADVICE`] bytes and
//! never more than [`READ_AHEAD`] bytes past where the reader is, so a venv
//! larger than the page cache does not evict what is about to be read. The
//! advice is only a hint: what is sent, checked and hashed is what the
//! reader itself reads.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Condvar, Mutex, mpsc};

use rustix::fs::FileType;

use super::tune::{BlockCost, Tuner};
use super::{BlockSink, TAG_STORED, TAG_ZSTD};
use crate::err;
use crate::error::{Error, Result, io_cause};
use crate::inventory::{
    Blocked, ContentHasher, Counters, Venv, Walker, content_hex, rewrite_shebang, stamp_of,
};
use crate::model::{
    BLOCK, Compression, Kind, LevelWindow, Progress, SendFile, Sent, ShebangRewrite, SourceHash,
};

/// How far the files were read into the stream when a block was cut.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Done {
    /// Files wholly in this block or earlier ones.
    files: u64,
    /// Bytes of files (as the plan sized them) in this block or earlier ones.
    bytes: u64,
}

/// A block of the tar stream, to be packed at `level` (0: stored).
struct Block {
    seq: u64,
    level: i32,
    data: Vec<u8>,
    done: Done,
}

/// A packed block: `tag` says how `payload` holds `raw` bytes of the
/// stream, packed at `level` (stored when zstd was not smaller).
struct Packed {
    seq: u64,
    level: i32,
    raw: usize,
    tag: u8,
    payload: Vec<u8>,
    done: Done,
}

/// Cuts the tar stream into blocks for the packers.
struct BlockCutter<'a> {
    buf: Vec<u8>,
    seq: u64,
    tx: mpsc::SyncSender<Block>,
    level: &'a AtomicI32,
    /// Set when the writer failed: no more blocks are wanted.
    stop: &'a AtomicBool,
    /// The files finished so far, for the blocks' [`Done`].
    finished: Done,
    /// Bytes read so far of the file being read through ([`Self::read_from`]).
    partial: u64,
    /// Told how far the files were read, for the read-ahead.
    ahead: Option<&'a ReadAhead>,
}

impl Write for BlockCutter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        // Blocks are at most BLOCK bytes: the target decodes into that much.
        let n = (BLOCK - self.buf.len()).min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= BLOCK {
            self.emit()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl BlockCutter<'_> {
    /// Read from `file` straight into the block being cut, hashing what
    /// arrives (with a `hasher`). Returns the bytes read: 0 at the end of
    /// the file.
    fn read_from(
        &mut self,
        file: &File,
        hasher: Option<&mut ContentHasher>,
    ) -> std::io::Result<usize> {
        // A full block was emitted by whoever filled it (here or `write`);
        // the block's capacity is exactly BLOCK, so a read never overfills.
        debug_assert!(self.buf.len() < BLOCK && self.buf.capacity() == BLOCK);
        let start = self.buf.len();
        let n = loop {
            match rustix::io::read(file, rustix::buffer::spare_capacity(&mut self.buf)) {
                Ok(n) => break n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        };
        if let Some(h) = hasher {
            h.update(&self.buf[start..]);
        }
        self.partial += n as u64;
        if let Some(a) = self.ahead {
            a.reader_at(self.finished.bytes + self.partial);
        }
        if self.buf.len() >= BLOCK {
            self.emit()?;
        }
        Ok(n)
    }

    /// A file of `size` bytes is wholly in the stream (a symlink: 0).
    fn file_done(&mut self, size: u64) {
        self.finished.files += 1;
        self.finished.bytes += size;
        self.partial = 0;
        if let Some(a) = self.ahead {
            a.reader_at(self.finished.bytes);
        }
    }

    fn emit(&mut self) -> std::io::Result<()> {
        let broken = || {
            std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the stream's writer stopped",
            )
        };
        if self.stop.load(Ordering::Relaxed) {
            return Err(broken());
        }
        if self.buf.is_empty() {
            return Ok(());
        }
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(BLOCK));
        let block = Block {
            seq: self.seq,
            level: self.level.load(Ordering::Relaxed),
            data,
            done: Done {
                files: self.finished.files,
                bytes: self.finished.bytes + self.partial,
            },
        };
        self.seq += 1;
        self.tx.send(block).map_err(|_| broken())
    }
}

/// Empty the block queue after the writer failed, until the reader (told to
/// stop) lets go of it.
fn drain_blocks(rx: &mpsc::Receiver<Block>) {
    while rx.recv().is_ok() {}
}

/// Pack blocks until the cutter is done: zstd at the block's level, or
/// stored when that is not smaller.
fn packer(rx: &Mutex<mpsc::Receiver<Block>>, tx: mpsc::SyncSender<Packed>) {
    let mut z: Option<zstd::bulk::Compressor<'static>> = None;
    let mut z_level = i32::MIN;
    loop {
        let block = match rx.lock() {
            Ok(r) => match r.recv() {
                Ok(b) => b,
                Err(_) => return,
            },
            Err(_) => return,
        };
        let raw = block.data.len();
        let mut packed = None;
        if block.level != 0 {
            if z.is_none() || z_level != block.level {
                z = zstd::bulk::Compressor::new(block.level).ok();
                z_level = block.level;
            }
            if let Some(c) = z.as_mut()
                && let Ok(out) = c.compress(&block.data)
                && out.len() < raw
            {
                packed = Some((TAG_ZSTD, out));
            }
        }
        let (tag, payload) = packed.unwrap_or((TAG_STORED, block.data));
        let p = Packed {
            seq: block.seq,
            level: block.level,
            raw,
            tag,
            payload,
            done: block.done,
        };
        if tx.send(p).is_err() {
            return;
        }
    }
}

/// Hand packed blocks to `sink` in order, each followed by a progress
/// report of how far the files are once it is handed over (also kept in
/// `counters`, which the direct route's reporter reads); tune the level
/// from each block's cost, timed around the hand-over (two clock reads
/// per block, from the vDSO). Returns the bytes handed over (tags
/// included) and the tuner's windows.
fn write_blocks(
    rx: mpsc::Receiver<Packed>,
    sink: &mut dyn BlockSink,
    counters: &Counters,
    level: &AtomicI32,
    mut tuner: Option<Tuner>,
) -> std::io::Result<(u64, Vec<LevelWindow>)> {
    let mut waiting: std::collections::BTreeMap<u64, Packed> = std::collections::BTreeMap::new();
    let (mut next, mut sent) = (0u64, 0u64);
    for p in rx {
        waiting.insert(p.seq, p);
        while let Some(p) = waiting.remove(&next) {
            if counters.cancel.load(Ordering::Relaxed) {
                return Err(std::io::Error::other("the controller went away"));
            }
            let t0 = tuner.is_some().then(std::time::Instant::now);
            sink.block(p.tag, &p.payload)?;
            counters.files.store(p.done.files, Ordering::Relaxed);
            counters.bytes.store(p.done.bytes, Ordering::Relaxed);
            sink.progress(&progress(counters))?;
            sent += p.payload.len() as u64 + 1;
            next += 1;
            if let Some(t) = tuner.as_mut() {
                let cost = BlockCost {
                    level: p.level,
                    raw: p.raw as u64,
                    wire: p.payload.len() as u64 + 1,
                    sink_secs: t0.map_or(0.0, |t0| t0.elapsed().as_secs_f64()),
                };
                if let Some(l) = t.wrote(cost) {
                    level.store(l, Ordering::Relaxed);
                }
            }
        }
    }
    sink.flush()?;
    Ok((sent, tuner.map(Tuner::into_log).unwrap_or_default()))
}

/// The counters as a progress report.
fn progress(counters: &Counters) -> Progress {
    Progress {
        files: counters.files.load(Ordering::Relaxed),
        bytes: counters.bytes.load(Ordering::Relaxed),
        total_files: counters.total_files.load(Ordering::Relaxed),
        total_bytes: counters.total_bytes.load(Ordering::Relaxed),
    }
}

/// Source side: read the files into a tar stream and hand its packed
/// blocks to `sink`, in order. Returns the bytes of files and of blocks,
/// the blake3 of each regular file the plan did not hash (and of each
/// rewritten script), and with `Auto` the tuner's windows.
pub fn send(
    venv_root: &str,
    files: &[SendFile],
    shebang: Option<&ShebangRewrite>,
    compression: Compression,
    sink: &mut dyn BlockSink,
    counters: &Counters,
) -> Result<Sent> {
    let venv = Venv::open_source(venv_root)?;
    counters
        .total_files
        .store(files.len() as u64, Ordering::Relaxed);
    counters
        .total_bytes
        .store(files.iter().map(|f| f.kind.size()).sum(), Ordering::Relaxed);
    let (tuner, start) = match compression {
        Compression::Auto => {
            let t = Tuner::new();
            let l = t.level();
            (Some(t), l)
        }
        Compression::None => (None, 0),
        Compression::Zstd(l) => (None, l),
    };
    let level = AtomicI32::new(start);
    let stop = AtomicBool::new(false);
    let ahead = ReadAhead::new(READ_AHEAD, ADVICE);
    let packers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (block_tx, block_rx) = mpsc::sync_channel::<Block>(packers);
    let block_rx = Mutex::new(block_rx);
    let (packed_tx, packed_rx) = mpsc::sync_channel::<Packed>(packers * 2);
    std::thread::scope(|scope| {
        for _ in 0..packers {
            let tx = packed_tx.clone();
            let rx = &block_rx;
            scope.spawn(move || packer(rx, tx));
        }
        drop(packed_tx);
        let level = &level;
        let cutter = BlockCutter {
            buf: Vec::with_capacity(BLOCK),
            seq: 0,
            tx: block_tx,
            level,
            stop: &stop,
            finished: Done::default(),
            partial: 0,
            ahead: Some(&ahead),
        };
        let venv = &venv;
        let ahead = &ahead;
        scope.spawn(move || read_ahead(venv, files, ahead, advise_willneed));
        let reader = scope.spawn(move || {
            // Done, failed or panicked: the read-ahead has nothing left to do.
            let _done = ReaderDone(ahead);
            read_files(venv, files, shebang, cutter)
        });
        // Once the reader drops the cutter, the packers finish, then the writer.
        let sent = write_blocks(packed_rx, sink, counters, level, tuner);
        if sent.is_err() {
            // The packers stop with the writer gone; stop the reader, and
            // unblock it if it waits on a full queue.
            stop.store(true, Ordering::Relaxed);
            drop(block_rx.lock().map(|r| drain_blocks(&r)));
        }
        let read = reader
            .join()
            .unwrap_or_else(|_| Err(err!(kind = Internal, "the stream's reader panicked")));
        match (read, sent) {
            (Ok((raw_bytes, hashes)), Ok((packed_bytes, windows))) => Ok(Sent {
                raw_bytes,
                packed_bytes,
                hashes,
                windows,
            }),
            // A read error explains a writer that stopped for it, not the reverse.
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(err!("Failed to send: {e}")),
        }
    })
}

/// How far past the reader [`read_ahead`] asks the kernel to read.
pub(super) const READ_AHEAD: u64 = 64 << 20;
/// The most one read-ahead advice covers.
pub(super) const ADVICE: u64 = 8 << 20;

/// Where the reader is, for the read-ahead: bytes of files (as the plan
/// sizes them, in the plan's order) read so far, and whether it is done.
pub(super) struct ReadAhead {
    at: Mutex<(u64, bool)>,
    moved: Condvar,
    /// How far past the reader to read ([`READ_AHEAD`]).
    window: u64,
    /// The most one advice covers ([`ADVICE`]).
    piece: u64,
}

/// Tells the read-ahead that the reader is done when dropped, whether the
/// reader returned or panicked.
pub(super) struct ReaderDone<'a>(pub(super) &'a ReadAhead);

impl Drop for ReaderDone<'_> {
    fn drop(&mut self) {
        self.0.finish();
    }
}

impl ReadAhead {
    pub(super) fn new(window: u64, piece: u64) -> ReadAhead {
        ReadAhead {
            at: Mutex::new((0, false)),
            moved: Condvar::new(),
            window,
            piece,
        }
    }

    /// The reader has read `bytes` of the files.
    pub(super) fn reader_at(&self, bytes: u64) {
        if let Ok(mut at) = self.at.lock() {
            at.0 = bytes;
        }
        self.moved.notify_one();
    }

    /// The reader is done (or failed): stop reading ahead.
    fn finish(&self) {
        if let Ok(mut at) = self.at.lock() {
            at.1 = true;
        }
        self.moved.notify_one();
    }

    /// Wait until `end` (a position in the files' bytes) is at most the
    /// window past the reader. False once the reader is done.
    fn wait_within(&self, end: u64) -> bool {
        let Ok(mut at) = self.at.lock() else {
            return false;
        };
        while !at.1 && end > at.0 + self.window {
            at = match self.moved.wait(at) {
                Ok(a) => a,
                Err(_) => return false,
            };
        }
        !at.1
    }
}

/// Ask the kernel to read `len` bytes of `file` from `offset` into the page
/// cache, without waiting for them.
pub(super) fn advise_willneed(file: &File, offset: u64, len: u64) {
    let _ = rustix::fs::fadvise(
        file,
        offset,
        std::num::NonZeroU64::new(len),
        rustix::fs::Advice::WillNeed,
    );
}

/// The read-ahead thread: open the regular files the reader comes to next
/// (from the root's fd, through no symlink, as the reader does) and
/// `advise` each piece of at most `ahead.piece` bytes once it is within
/// `ahead.window` of the reader. A file that cannot be opened is left to
/// the reader, which says what is wrong with it.
pub(super) fn read_ahead(
    venv: &Venv,
    files: &[SendFile],
    ahead: &ReadAhead,
    advise: impl Fn(&File, u64, u64),
) {
    let Ok(root) = venv.beneath() else { return };
    let mut walker = Walker::new(std::os::fd::AsFd::as_fd(&root));
    // Where the file starts among the files' bytes, as the reader counts.
    let mut at = 0u64;
    for f in files {
        let size = f.kind.size();
        let file = match (&f.kind, venv.resolve(&f.path)) {
            (Kind::File { .. }, Ok((_, rel))) if size > 0 => walker.open(&rel).ok(),
            _ => None,
        };
        if let Some(file) = file {
            let mut off = 0;
            while off < size {
                let len = ahead.piece.min(size - off);
                if !ahead.wait_within(at + off + len) {
                    return;
                }
                advise(&file, off, len);
                off += len;
            }
        }
        at += size;
    }
}

/// Read and check the files into the tar stream, hashing those the plan
/// did not hash ([`FileToSend::append`]). Every file is reached from the
/// venv root's fd without following a symlink in its parent chain
/// ([`Walker`]), so nothing outside the venv is ever read.
fn read_files(
    venv: &Venv,
    files: &[SendFile],
    shebang: Option<&ShebangRewrite>,
    cutter: BlockCutter<'_>,
) -> Result<(u64, Vec<SourceHash>)> {
    let mut hashes = Vec::with_capacity(files.len());
    let mut tar = tar::Builder::new(cutter);
    let mut raw = 0u64;
    let root = venv.beneath()?;
    let mut walker = Walker::new(std::os::fd::AsFd::as_fd(&root));
    for f in files {
        let (abs, rel) = venv.resolve(&f.path)?;
        let src = Source {
            venv,
            abs: &abs,
            rel: &rel,
        };
        let meta = src.lstat(&mut walker)?;
        let mut h = tar::Header::new_gnu();
        h.set_uid(meta.st_uid as u64);
        h.set_gid(meta.st_gid as u64);
        h.set_mtime(meta.st_mtime.max(0) as u64);
        let name = f.index.to_string();
        match &f.kind {
            Kind::Symlink { target } => {
                src.check_link(&mut walker, target)?;
                // The target travels as the entry's data (as long as the
                // plan says), never in a GNU long-link record.
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(target.len() as u64);
                h.set_mode(0o777);
                tar.append_data(&mut h, &name, target.as_bytes())
                    .map_err(|e| err!("Failed to stream {}: {e}", abs.display()))?;
            }
            Kind::File { size, .. } => {
                let file = FileToSend {
                    src: &src,
                    kind: &f.kind,
                    meta: &meta,
                    name: &name,
                };
                if let Some(blake3) = file.append(&mut tar, &mut walker, h, shebang)? {
                    hashes.push(SourceHash {
                        index: f.index,
                        blake3,
                    });
                }
                raw += size;
            }
            other => {
                return Err(err!(
                    kind = Protocol,
                    "Cannot send {}: it is {other:?} in the plan",
                    abs.display()
                ));
            }
        }
        tar.get_mut().file_done(f.kind.size());
    }
    let mut cutter = tar
        .into_inner()
        .map_err(|e| err!("Failed to finish the stream: {e}"))?;
    cutter
        .emit()
        .map_err(|e| err!("Failed to finish the stream: {e}"))?;
    Ok((raw, hashes))
}

/// A file of the source being sent: where it is, for the errors.
pub(super) struct Source<'a> {
    pub(super) venv: &'a Venv,
    pub(super) abs: &'a Path,
    /// Relative to the venv root.
    pub(super) rel: &'a str,
}

impl Source<'_> {
    /// The file's `lstat`, reached from the venv root without following a
    /// symlink; gone: changed since the plan.
    pub(super) fn lstat(&self, walker: &mut Walker<'_>) -> Result<rustix::fs::Stat> {
        walker
            .lstat(self.rel)
            .map_err(|b| self.blocked(b))?
            .ok_or_else(|| self.changed())
    }

    /// A symlink must still point where the plan saw it point.
    pub(super) fn check_link(&self, walker: &mut Walker<'_>, target: &str) -> Result<()> {
        let now = walker.read_link(self.rel).map_err(|_| self.changed())?;
        if now != *target {
            return Err(self.changed());
        }
        Ok(())
    }

    pub(super) fn changed(&self) -> Error {
        err!(
            kind = Drift,
            hint = "the source changed since the plan; run `overlay plan` again",
            "Source file {} changed since the plan; nothing was applied",
            self.abs.display()
        )
    }

    pub(super) fn blocked(&self, b: Blocked) -> Error {
        match b {
            Blocked::Link(link) => err!(
                kind = Drift,
                hint = "the source changed since the plan; run `overlay plan` again",
                "Source file {}: its parent {} is a symlink; overlay never reads through one; nothing was applied",
                self.abs.display(),
                self.venv.root.join(link).display()
            ),
            Blocked::Missing => self.changed(),
            Blocked::Error(m) => err!("Failed to read {}: {m}", self.abs.display()),
        }
    }

    fn stream_error(&self, e: impl std::fmt::Display) -> Error {
        err!("Failed to stream {}: {e}", self.abs.display())
    }
}

/// A regular file to append to the stream, as the plan and `lstat` saw it.
pub(super) struct FileToSend<'a> {
    pub(super) src: &'a Source<'a>,
    /// The plan's `Kind::File`.
    pub(super) kind: &'a Kind,
    pub(super) meta: &'a rustix::fs::Stat,
    /// The tar entry's name: the change index.
    pub(super) name: &'a str,
}

impl FileToSend<'_> {
    /// The source file's modification time, which its staged copy takes
    /// (the local route; the stream carries it in the tar header).
    pub(super) fn mtime(&self) -> Option<std::time::SystemTime> {
        let secs = u64::try_from(self.meta.st_mtime).ok()?;
        let nanos = u32::try_from(self.meta.st_mtime_nsec).ok()?;
        Some(std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos))
    }

    /// The file opened for reading, once its `lstat` says it is still the
    /// plan's: a regular file, and unhashed in the plan, the stamp the plan
    /// saw.
    pub(super) fn open_checked(&self, walker: &mut Walker<'_>) -> Result<File> {
        let Kind::File { blake3, stamp, .. } = self.kind else {
            unreachable!("called for regular files only");
        };
        let src = self.src;
        let is_file = FileType::from_raw_mode(self.meta.st_mode) == FileType::RegularFile;
        // Unhashed in the plan: the stamp must be as the plan saw it.
        if !is_file || (blake3.is_none() && *stamp != Some(stamp_of(self.meta))) {
            return Err(src.changed());
        }
        walker.open(src.rel).map_err(|b| src.blocked(b))
    }

    /// Whether the file goes with its shebang rewritten (a small script
    /// under `bin/`, when the plan rewrites).
    pub(super) fn rewrites(&self, shebang: Option<&ShebangRewrite>) -> bool {
        self.src.rel.starts_with("bin/")
            && (self.meta.st_size as u64) < (1 << 20)
            && shebang.is_some()
    }

    /// After the file was read: what was read (`digest`, when it was
    /// hashed) is the plan's hash, or unhashed in the plan, its stamp did
    /// not move meanwhile.
    pub(super) fn check_read(&self, file: &File, digest: Option<&str>) -> Result<()> {
        let Kind::File { blake3, stamp, .. } = self.kind else {
            unreachable!("called for regular files only");
        };
        match blake3 {
            Some(want) if digest.is_some_and(|d| d != want) => Err(self.src.changed()),
            // Read while something wrote to it: the stamp moved.
            None if rustix::fs::fstat(file).map(|m| stamp_of(&m)).ok() != *stamp => {
                Err(self.src.changed())
            }
            _ => Ok(()),
        }
    }

    /// A script's content with its shebang rewritten for the target; it
    /// must then be as long as the plan says.
    pub(super) fn read_rewritten(
        &self,
        file: &File,
        shebang: Option<&ShebangRewrite>,
        size: u64,
    ) -> Result<Vec<u8>> {
        let src = self.src;
        let mut content = Vec::new();
        (&*file)
            .read_to_end(&mut content)
            .map_err(|e| err!("Failed to read {}: {}", src.abs.display(), io_cause(&e)))?;
        let content = shebang
            .and_then(|rw| rewrite_shebang(&content, rw))
            .unwrap_or(content);
        if content.len() as u64 != size {
            return Err(src.changed());
        }
        Ok(content)
    }

    /// Check the file against the plan, append it to the stream, and
    /// return its blake3 as read: for a file the plan did not hash (its
    /// stamp vouched for it), and for a rewritten script. A file the plan
    /// hashed is not hashed here: the target hashes every file it writes
    /// and refuses one that is not the plan's (as a change since the plan,
    /// exit Drift), which is the check that counts, and hashing it here
    /// too cost a twentieth of the machine's CPU on a fast link.
    fn append(
        &self,
        tar: &mut tar::Builder<BlockCutter<'_>>,
        walker: &mut Walker<'_>,
        mut h: tar::Header,
        shebang: Option<&ShebangRewrite>,
    ) -> Result<Option<String>> {
        let Kind::File {
            size, mode, blake3, ..
        } = self.kind
        else {
            unreachable!("called for regular files only");
        };
        let file = self.open_checked(walker)?;
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(*mode);
        h.set_size(*size);
        let digest = if self.rewrites(shebang) {
            Some(self.append_rewritten(tar, &file, h, shebang, *size)?)
        } else {
            if self.meta.st_size as u64 != *size {
                return Err(self.src.changed());
            }
            let mut hasher = blake3.is_none().then(ContentHasher::new);
            self.append_read_through(tar.get_mut(), &file, h, *size, hasher.as_mut())?;
            hasher.map(|h| content_hex(&h))
        };
        self.check_read(&file, digest.as_deref())?;
        Ok(digest)
    }

    /// A script under `bin/`: read whole, its shebang rewritten for the
    /// target, appended through tar.
    fn append_rewritten(
        &self,
        tar: &mut tar::Builder<BlockCutter<'_>>,
        file: &File,
        mut h: tar::Header,
        shebang: Option<&ShebangRewrite>,
        size: u64,
    ) -> Result<String> {
        let content = self.read_rewritten(file, shebang, size)?;
        tar.append_data(&mut h, self.name, &content[..])
            .map_err(|e| self.src.stream_error(e))?;
        Ok(content_hex(ContentHasher::new().update(&content)))
    }

    /// Any other file: read straight into the stream's block (and hashed
    /// there, with a `hasher`), with no copy through tar's 8 KiB buffer.
    fn append_read_through(
        &self,
        cutter: &mut BlockCutter<'_>,
        file: &File,
        mut h: tar::Header,
        size: u64,
        mut hasher: Option<&mut ContentHasher>,
    ) -> Result<()> {
        let src = self.src;
        let failed = |e: std::io::Error| src.stream_error(io_cause(&e));
        h.set_path(self.name).map_err(failed)?;
        h.set_cksum();
        cutter.write_all(h.as_bytes()).map_err(failed)?;
        let mut left = size;
        while left > 0 {
            let n = cutter
                .read_from(file, hasher.as_deref_mut())
                .map_err(failed)?;
            if n == 0 || n as u64 > left {
                // Shorter or longer than the plan said.
                return Err(src.changed());
            }
            left -= n as u64;
        }
        let pad = (512 - (size % 512) as usize) % 512;
        cutter.write_all(&[0u8; 512][..pad]).map_err(failed)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the progress reports between blocks.
    #[derive(Default)]
    struct Recorder {
        blocks: usize,
        reports: Vec<(usize, Progress)>,
    }

    impl BlockSink for Recorder {
        fn block(&mut self, _: u8, _: &[u8]) -> std::io::Result<()> {
            self.blocks += 1;
            Ok(())
        }
        fn progress(&mut self, p: &Progress) -> std::io::Result<()> {
            self.reports.push((self.blocks, *p));
            Ok(())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn file(index: usize, path: &str, content: &[u8]) -> SendFile {
        SendFile {
            index,
            path: path.to_string(),
            kind: Kind::File {
                size: content.len() as u64,
                mode: 0o644,
                blake3: Some(content_hex(ContentHasher::new().update(content))),
                stamp: None,
            },
        }
    }

    /// A file of several blocks is counted as its blocks go out, not when
    /// it ends: a report after every block, the bytes growing while the
    /// file count still waits for it, and the last report is everything.
    #[test]
    fn bytes_move_within_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("lib/python3.11/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::write(dir.path().join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
        let small = b"a = 1\n".to_vec();
        let big: Vec<u8> = (0..5 * BLOCK + 123).map(|i| (i % 251) as u8).collect();
        std::fs::write(site.join("a.py"), &small).unwrap();
        std::fs::write(site.join("big.bin"), &big).unwrap();
        let files = vec![file(0, "a.py", &small), file(1, "big.bin", &big)];
        let total = (small.len() + big.len()) as u64;
        let mut sink = Recorder::default();
        let counters = Counters::default();
        let root = dir.path().to_str().unwrap();
        let sent = send(root, &files, None, Compression::None, &mut sink, &counters).unwrap();
        assert_eq!(sent.raw_bytes, total);
        // One report after each block, in order, never going back.
        assert_eq!(sink.reports.len(), sink.blocks);
        assert!(sink.blocks >= 6, "{} blocks", sink.blocks);
        for (i, (after, _)) in sink.reports.iter().enumerate() {
            assert_eq!(*after, i + 1);
        }
        for w in sink.reports.windows(2) {
            assert!(w[0].1.bytes <= w[1].1.bytes && w[0].1.files <= w[1].1.files);
        }
        // The big file's bytes count before it is done.
        let within: Vec<u64> = sink
            .reports
            .iter()
            .filter(|(_, p)| p.files < 2)
            .map(|(_, p)| p.bytes)
            .collect();
        assert!(
            within
                .iter()
                .any(|b| *b > small.len() as u64 + BLOCK as u64),
            "{within:?}"
        );
        let last = sink.reports.last().unwrap().1;
        assert_eq!((last.files, last.bytes), (2, total));
        assert_eq!((last.total_files, last.total_bytes), (2, total));
    }

    /// A venv with these files under site-packages; returns its folder.
    fn venv_with(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("lib/python3.11/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::write(dir.path().join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
        for (path, content) in files {
            let p = site.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
        dir
    }

    /// The read-ahead advises the plan's files in the plan's order, each
    /// whole in pieces, never further past the reader than its window, and
    /// stops when the reader is done.
    #[test]
    fn read_ahead_follows_the_plan_within_its_window() {
        use std::os::unix::fs::MetadataExt;
        let piece = 4096u64;
        let big: Vec<u8> = vec![7u8; 3 * piece as usize + 5];
        let exact: Vec<u8> = vec![1u8; piece as usize];
        let contents: [(&str, &[u8]); 4] = [
            ("a.py", b"a = 1\n"),
            ("pkg/big.bin", &big),
            ("pkg/empty", b""),
            ("z.bin", &exact),
        ];
        let dir = venv_with(&contents);
        let venv = Venv::open(dir.path().to_str().unwrap()).unwrap();
        let site = dir.path().join("lib/python3.11/site-packages");
        let files: Vec<SendFile> = contents
            .iter()
            .enumerate()
            .map(|(i, (p, c))| file(i, p, c))
            .collect();
        let inode = |p: &str| std::fs::metadata(site.join(p)).unwrap().ino();
        let names: std::collections::HashMap<u64, &str> =
            contents.iter().map(|(p, _)| (inode(p), *p)).collect();
        let ahead = ReadAhead::new(2 * piece, piece);
        let seen: Mutex<Vec<(&str, u64, u64, u64)>> = Mutex::new(Vec::new());
        let total: u64 = files.iter().map(|f| f.kind.size()).sum();
        std::thread::scope(|scope| {
            let t = scope.spawn(|| {
                read_ahead(&venv, &files, &ahead, |f, off, len| {
                    let name = names[&f.metadata().unwrap().ino()];
                    let reader = ahead.at.lock().unwrap().0;
                    seen.lock().unwrap().push((name, off, len, reader));
                })
            });
            // The reader moves on a piece at a time, as the read-ahead waits;
            // with the reader at the end, it advises the rest and returns.
            let mut at = 0;
            while at < total {
                at = (at + piece).min(total);
                ahead.reader_at(at);
            }
            t.join().unwrap();
        });
        let seen = seen.into_inner().unwrap();
        let (mut start, mut want) = (0u64, Vec::new());
        let starts: std::collections::HashMap<&str, u64> = contents
            .iter()
            .map(|(p, c)| {
                let s = start;
                start += c.len() as u64;
                (*p, s)
            })
            .collect();
        for (p, c) in &contents {
            let mut off = 0;
            while off < c.len() as u64 {
                let len = piece.min(c.len() as u64 - off);
                want.push((*p, off, len));
                off += len;
            }
        }
        // Every piece, in the plan's order.
        let got: Vec<(&str, u64, u64)> = seen.iter().map(|s| (s.0, s.1, s.2)).collect();
        assert_eq!(got, want);
        for (name, off, len, reader) in &seen {
            assert!(
                starts[name] + off + len <= reader + 2 * piece,
                "{name} at {off}: reader at {reader}"
            );
        }
        // A reader that is done stops the read-ahead.
        let done = ReadAhead::new(2 * piece, piece);
        done.finish();
        let advised = Mutex::new(0usize);
        read_ahead(&venv, &files, &done, |_, _, _| {
            *advised.lock().unwrap() += 1
        });
        assert_eq!(*advised.lock().unwrap(), 0);
    }

    /// With the read-ahead on, a file that changed since the plan still
    /// stops the stream, and a parent swapped for a symlink is neither
    /// read nor advised through.
    #[test]
    fn a_changed_file_stops_the_stream_with_read_ahead() {
        let big: Vec<u8> = (0..3 * BLOCK + 7).map(|i| (i % 253) as u8).collect();
        let contents: [(&str, &[u8]); 3] = [
            ("a.py", b"a = 1\n"),
            ("big.bin", &big),
            ("pkg/m.py", b"m = 2\n"),
        ];
        let files: Vec<SendFile> = contents
            .iter()
            .enumerate()
            .map(|(i, (p, c))| file(i, p, c))
            .collect();
        // Unchanged: all of it arrives, in order.
        let dir = venv_with(&contents);
        let root = dir.path().to_str().unwrap();
        let mut sink = Recorder::default();
        let sent = send(
            root,
            &files,
            None,
            Compression::None,
            &mut sink,
            &Counters::default(),
        )
        .unwrap();
        // The plan hashed every file: the source leaves the hashing to
        // the target, which checks each against the plan.
        assert!(sent.hashes.is_empty(), "{:?}", sent.hashes);
        // The plan did not hash the big file (its stamp vouched for it):
        // the source hashes it, and only it.
        let site = dir.path().join("lib/python3.11/site-packages");
        let stat = |p: &Path| rustix::fs::lstat(p).unwrap();
        let send_all = |files: &[SendFile]| {
            send(
                root,
                files,
                None,
                Compression::None,
                &mut Recorder::default(),
                &Counters::default(),
            )
        };
        let mut unhashed = files.clone();
        unhashed[1].kind = Kind::File {
            size: big.len() as u64,
            mode: 0o644,
            blake3: None,
            stamp: Some(stamp_of(&stat(&site.join("big.bin")))),
        };
        let sent = send_all(&unhashed).unwrap();
        let hashed: Vec<(usize, &str)> = sent
            .hashes
            .iter()
            .map(|h| (h.index, h.blake3.as_str()))
            .collect();
        let want = content_hex(ContentHasher::new().update(&big));
        assert_eq!(hashed, [(1, want.as_str())]);
        // The big file changed in its last byte: same size, other hash.
        // Unhashed in the plan, its stamp moved: the source stops.
        let mut changed = big.clone();
        *changed.last_mut().unwrap() ^= 1;
        std::fs::write(site.join("big.bin"), &changed).unwrap();
        let e = send_all(&unhashed).unwrap_err();
        assert!(e.to_string().contains("big.bin"), "{e}");
        assert!(e.to_string().contains("changed since the plan"), "{e}");
        assert_eq!(e.kind, crate::error::ErrorKind::Drift);
        // A parent swapped for a symlink to a look-alike outside the venv.
        std::fs::write(site.join("big.bin"), &big).unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("m.py"), b"m = 2\n").unwrap();
        std::fs::remove_dir_all(site.join("pkg")).unwrap();
        std::os::unix::fs::symlink(outside.path(), site.join("pkg")).unwrap();
        let venv = Venv::open(root).unwrap();
        // The files are well within the window: it never waits.
        let ahead = ReadAhead::new(READ_AHEAD, ADVICE);
        let advised = Mutex::new(0usize);
        read_ahead(&venv, &files, &ahead, |_, _, _| {
            *advised.lock().unwrap() += 1
        });
        assert_eq!(
            *advised.lock().unwrap(),
            2,
            "a.py and big.bin, not pkg/m.py"
        );
        let e = send(
            root,
            &files,
            None,
            Compression::None,
            &mut Recorder::default(),
            &Counters::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
    }
}
