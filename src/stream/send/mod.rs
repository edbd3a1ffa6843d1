//! The source's side of the stream: read and check the files the plan
//! sends (hashing those the plan did not hash: the target checks the
//! others against the plan) into one tar stream ([`read_files`]), cut it
//! into blocks ([`BlockCutter`]), pack the blocks on every core
//! ([`packer`]: zstd at the level of the moment, or stored when that is not
//! smaller), and hand them to the [`BlockSink`] in order ([`write_blocks`],
//! which also feeds the level tuner each block's cost: how long handing it
//! over blocked).
//! [`send`] runs the three on their own threads, beside the read-ahead
//! ([`read_ahead`](super::read_ahead)), which keeps the disk busy ahead of
//! the reader.
//!
//! Progress is counted at the block level: each block carries how far the
//! files were read when it was cut ([`Done`]: whole files, and bytes of
//! files including the part of the one being read), and the writer
//! publishes that in the [`Counters`] once the block is handed to the sink,
//! with a progress report after every block. So the bytes move within a
//! large file, and they count what went onto the link, not what was read.
//!
//! Every file is reached and checked against the plan as
//! [`source_file`](super::source_file) does it; one that changed since the
//! plan stops the stream with an error that says to plan again.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use super::read_ahead::{ADVICE, READ_AHEAD, ReadAhead, ReaderDone, advise_willneed, read_ahead};
use super::source_file::{FileToSend, Source};
use super::tune::{BlockCost, Tuner};
use super::{BlockSink, TAG_STORED, TAG_ZSTD};
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::{ContentHasher, Counters, Venv, Walker, content_hex};
use crate::model::{
    BLOCK, Compression, Kind, LevelWindow, Progress, SendFile, SendWaits, Sent, ShebangRewrite,
    SourceHash, StageWaits,
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
    /// The segment this block starts ([`BlockSink::segment`]), if it
    /// starts one.
    segment: Option<usize>,
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
    segment: Option<usize>,
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
    /// The segment the next block starts, after a [`Self::cut`].
    starts: Option<usize>,
    /// Segments cut so far.
    segments: usize,
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

    /// End the block being cut here (the next entry starts a new block)
    /// and mark the next block as the start of the next segment.
    fn cut(&mut self) -> std::io::Result<()> {
        self.emit()?;
        self.starts = Some(self.segments);
        self.segments += 1;
        Ok(())
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
            segment: self.starts.take(),
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
            segment: block.segment,
        };
        if tx.send(p).is_err() {
            return;
        }
    }
}

/// What the writer handed over: bytes (tags included), the tuner's
/// windows, and where its time went.
struct Handed {
    sent: u64,
    windows: Vec<LevelWindow>,
    waits: SendWaits,
}

/// Hand packed blocks to `sink` in order, each followed by a progress
/// report of how far the files are once it is handed over (also kept in
/// `counters`, which the direct route's reporter reads); tune the level
/// from each block's cost, timed around the hand-over (clock reads per
/// block, from the vDSO), and sum the waits for packed blocks and on the
/// sink ([`SendWaits`]).
fn write_blocks(
    rx: mpsc::Receiver<Packed>,
    sink: &mut dyn BlockSink,
    counters: &Counters,
    level: &AtomicI32,
    mut tuner: Option<Tuner>,
) -> std::io::Result<Handed> {
    let mut waiting: std::collections::BTreeMap<u64, Packed> = std::collections::BTreeMap::new();
    let (mut next, mut sent) = (0u64, 0u64);
    let (mut sink_time, mut starved) = (Duration::ZERO, Duration::ZERO);
    let mut first: Option<Instant> = None;
    loop {
        let asked = Instant::now();
        let Ok(p) = rx.recv() else { break };
        let got = Instant::now();
        // Before the first block, the reader is starting, not starving the writer.
        match first {
            Some(_) => starved += got - asked,
            None => first = Some(got),
        }
        waiting.insert(p.seq, p);
        while let Some(p) = waiting.remove(&next) {
            if counters.cancel.load(Ordering::Relaxed) {
                return Err(std::io::Error::other("the controller went away"));
            }
            if let Some(s) = p.segment {
                sink.segment(s)?;
            }
            let t0 = Instant::now();
            sink.block(p.tag, &p.payload)?;
            let blocked = t0.elapsed();
            sink_time += blocked;
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
                    sink_secs: blocked.as_secs_f64(),
                };
                if let Some(l) = t.wrote(cost) {
                    level.store(l, Ordering::Relaxed);
                }
            }
        }
    }
    let t0 = Instant::now();
    sink.flush()?;
    sink_time += t0.elapsed();
    Ok(Handed {
        sent,
        windows: tuner.map(Tuner::into_log).unwrap_or_default(),
        waits: SendWaits {
            secs: first.map_or(0.0, |t| t.elapsed().as_secs_f64()),
            sink_secs: sink_time.as_secs_f64(),
            starved_secs: starved.as_secs_f64(),
        },
    })
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
///
/// `cuts` (positions in `files`, ascending, the first 0; or empty) cut
/// the stream into segments: a block never holds entries of two, the sink
/// hears where each starts ([`BlockSink::segment`]), and the end-of-archive
/// blocks are a last segment of their own. A controller that fans the
/// stream out to several targets passes each only the segments it needs.
pub fn send(
    venv_root: &str,
    files: &[SendFile],
    cuts: &[usize],
    shebang: Option<&ShebangRewrite>,
    compression: Compression,
    sink: &mut dyn BlockSink,
    counters: &Counters,
) -> Result<Sent> {
    let venv = Venv::open_source(venv_root)?;
    let ahead = ReadAhead::new(READ_AHEAD, ADVICE);
    let (venv, ahead_ref) = (&venv, &ahead);
    std::thread::scope(|scope| {
        scope.spawn(move || read_ahead(venv, files, ahead_ref, advise_willneed));
        pipeline(
            files,
            compression,
            sink,
            counters,
            Some(ahead_ref),
            |cutter| {
                // Done, failed or panicked: the read-ahead has nothing left to do.
                let _done = ReaderDone(ahead_ref);
                read_files(venv, files, cuts, shebang, cutter)
            },
        )
    })
}

/// A tar stream being written for [`send_tar`]: entries appended whole,
/// segments cut between them.
pub struct TarWriter<'a> {
    tar: tar::Builder<BlockCutter<'a>>,
}

impl TarWriter<'_> {
    /// Append one entry named `name` (a file's index in the plan), its
    /// data read from `data` (as long as the header's size says).
    pub fn append(
        &mut self,
        h: &mut tar::Header,
        name: &str,
        data: impl std::io::Read,
    ) -> std::io::Result<()> {
        self.tar.append_data(h, name, data)
    }

    /// The entry of a file of `size` bytes (a symlink: 0) is in the stream.
    pub fn file_done(&mut self, size: u64) {
        self.tar.get_mut().file_done(size);
    }

    /// The entries from here on are the next segment (see [`send`]'s `cuts`).
    pub fn cut(&mut self) -> std::io::Result<()> {
        self.tar.get_mut().cut()
    }

    /// Segments cut so far.
    pub fn segments(&self) -> usize {
        self.tar.get_ref().segments
    }
}

/// [`send`] of a tar stream that `fill` writes (a source that is not a
/// directory: a bundle read in place). `fill` returns the bytes of files
/// it streamed and the hashes [`send`] would return; with segments cut,
/// the end-of-archive blocks are a segment of their own, as in [`send`].
pub fn send_tar(
    files: &[SendFile],
    compression: Compression,
    sink: &mut dyn BlockSink,
    counters: &Counters,
    fill: impl FnOnce(&mut TarWriter<'_>) -> Result<(u64, Vec<SourceHash>)> + Send,
) -> Result<Sent> {
    pipeline(files, compression, sink, counters, None, |cutter| {
        let mut w = TarWriter {
            tar: tar::Builder::new(cutter),
        };
        let done = fill(&mut w)?;
        finish(w.tar)?;
        Ok(done)
    })
}

/// The stream's threads: `read` fills the cutter on a thread of its own,
/// the packers pack its blocks on every core, and this thread hands them
/// to `sink` in order.
fn pipeline(
    files: &[SendFile],
    compression: Compression,
    sink: &mut dyn BlockSink,
    counters: &Counters,
    ahead: Option<&ReadAhead>,
    read: impl FnOnce(BlockCutter<'_>) -> Result<(u64, Vec<SourceHash>)> + Send,
) -> Result<Sent> {
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
            ahead,
            starts: None,
            segments: 0,
        };
        let reader = scope.spawn(move || read(cutter));
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
            (Ok((raw_bytes, hashes)), Ok(handed)) => Ok(Sent {
                raw_bytes,
                packed_bytes: handed.sent,
                hashes,
                windows: handed.windows,
                waits: handed.waits,
                target_waits: StageWaits::default(),
            }),
            // A read error explains a writer that stopped for it, not the reverse.
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(err!("Failed to send: {e}")),
        }
    })
}

/// End the tar stream: the end-of-archive blocks (a segment of their own
/// when the stream was cut), then the last block.
fn finish(mut tar: tar::Builder<BlockCutter<'_>>) -> Result<()> {
    let failed = |e: std::io::Error| err!("Failed to finish the stream: {e}");
    if tar.get_ref().segments > 0 {
        // The end-of-archive blocks: a segment every target takes.
        tar.get_mut().cut().map_err(failed)?;
    }
    let mut cutter = tar.into_inner().map_err(failed)?;
    cutter.emit().map_err(failed)
}
/// Read and check the files into the tar stream, hashing those the plan
/// did not hash ([`FileToSend::append`]). Every file is reached from the
/// venv root's fd without following a symlink in its parent chain
/// ([`Walker`]), so nothing outside the venv is ever read.
fn read_files(
    venv: &Venv,
    files: &[SendFile],
    cuts: &[usize],
    shebang: Option<&ShebangRewrite>,
    cutter: BlockCutter<'_>,
) -> Result<(u64, Vec<SourceHash>)> {
    let mut hashes = Vec::with_capacity(files.len());
    let mut tar = tar::Builder::new(cutter);
    let mut raw = 0u64;
    let root = venv.beneath()?;
    let mut walker = Walker::new(std::os::fd::AsFd::as_fd(&root));
    let cut_failed = |e: std::io::Error| err!("Failed to stream: {e}");
    let mut cuts = cuts.iter().peekable();
    for (at, f) in files.iter().enumerate() {
        if cuts.next_if_eq(&&at).is_some() {
            tar.get_mut().cut().map_err(cut_failed)?;
        }
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
    finish(tar)?;
    Ok((raw, hashes))
}

/// Appending a checked file to the tar stream.
impl FileToSend<'_> {
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
mod tests;
