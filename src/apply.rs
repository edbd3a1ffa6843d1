//! The transfer: the source agent reads exactly the added and replaced files
//! into one tar stream, cuts it into 1 MiB blocks and sends each block as a
//! data frame, compressed with zstd or stored as is; the target agent
//! decodes the blocks and unpacks the stream into the generation's staging
//! folder. Both ends hash while they stream, so a file that changed since
//! the plan, or was damaged on the way, is caught without a second pass.
//!
//! The stream is pipelined end to end: on the source, one thread reads and
//! hashes, a compressor per core packs blocks, and a writer puts them on the
//! connection in order; on the target, one thread reads and decodes frames,
//! another unpacks and hashes them into chunk buffers, a writer writes the
//! chunks (big files with `O_DIRECT`, around the page cache), and fsyncs run
//! beside all three. Neither side holds more than a few tens of megabytes;
//! the controller only relays frames.
//!
//! With [`Compression::Auto`] the writer picks the zstd level for the link
//! as it goes, the way `zstd --adapt` does: it measures how many bytes of
//! files per second actually get through at each level (no compression,
//! 1, 3, ...) and keeps the fastest, probing a neighbour now and then. A
//! fast link is best served uncompressed (compression would only cost
//! CPU); a slow one by a level that the cores can keep ahead of it.
//!
//! Tar entries are named by their index in the generation's change list, and
//! the target writes each to `staging/<index>`: a name in the stream never
//! chooses where a file lands.
//!
//! The target trusts nothing in the stream. It reads the 512-byte headers
//! itself ([`parse_head`]): checksum, name (a change index), type and
//! size. Only regular files and symlinks are accepted — no GNU long-name or
//! PAX records, hard links, devices, FIFOs or directories, each refused
//! from its header before a byte after it is read — and an entry's size
//! must be the plan's before anything is created; reading stops at it. A
//! symlink's target is its entry's data (protocol 7: no long-link record is
//! ever needed), as long as the plan's target and equal to it. Every staged
//! file is created through a [`Beneath`](crate::beneath::Beneath) of the
//! staging directory (`O_CREAT|O_EXCL|O_NOFOLLOW`), its mode masked to
//! `0o777`; as root its owner is that of the file it replaces or the
//! directory it lands in, or with `apply --same-owner` the source's.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::atomic::{AtomicBool, AtomicI32};
use std::sync::{Arc, Mutex, mpsc};

use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::{
    Blocked, ContentHasher, Counters, Venv, Walker, content_hex, rewrite_shebang, stamp_of,
};
use crate::journal::{Generation, free_bytes};
use crate::model::{
    Action, BLOCK, Compression, FileStamp, HashMode, Kind, Progress, SendFile, ShebangRewrite,
    Written,
};
use crate::protocol::{Response, write_data_parts, write_frame};
use rustix::fs::FileType;

/// The first byte of a data frame's payload: how the block is packed.
const TAG_STORED: u8 = 0;
const TAG_ZSTD: u8 = 1;
/// `Auto`'s levels, fastest first (0: stored).
const LADDER: [i32; 4] = [0, 1, 3, 6];
/// `Auto` measures in windows of this many bytes of files, timing only the
/// part after the first `WINDOW_SKIP` bytes (blocks packed at the previous
/// level are still draining then).
const WINDOW: u64 = 48 << 20;
const WINDOW_SKIP: u64 = 16 << 20;
/// How much faster than the level it left a probed level with more
/// compression must be to stay.
const PROBE_MARGIN: f64 = 1.1;

/// A block of the tar stream, to be packed at `level` (0: stored).
struct Block {
    seq: u64,
    level: i32,
    data: Vec<u8>,
}

/// A packed block: `tag` says how `payload` holds `raw` bytes of the stream.
struct Packed {
    seq: u64,
    raw: usize,
    tag: u8,
    payload: Vec<u8>,
}

/// Cuts the tar stream into blocks for the packers.
struct BlockCutter<'a> {
    buf: Vec<u8>,
    seq: u64,
    tx: mpsc::SyncSender<Block>,
    level: &'a AtomicI32,
    /// Set when the writer failed: no more blocks are wanted.
    stop: &'a AtomicBool,
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
    /// arrives. Returns the bytes read: 0 at the end of the file.
    fn read_from(&mut self, file: &File, hasher: &mut ContentHasher) -> std::io::Result<usize> {
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
        hasher.update(&self.buf[start..]);
        if self.buf.len() >= BLOCK {
            self.emit()?;
        }
        Ok(n)
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
            raw,
            tag,
            payload,
        };
        if tx.send(p).is_err() {
            return;
        }
    }
}

/// Picks `Auto`'s level: the one that moves the most bytes of files per
/// second, measured a window at a time. Starting at zstd 1, it tries the
/// neighbouring levels (faster first); each probe that loses doubles the
/// wait before the next (up to 32 windows), one that wins is kept.
struct Tuner {
    /// Index into `LADDER` of the level in use.
    at: usize,
    /// Latest rate measured at each level (bytes of files per second).
    rates: [Option<f64>; LADDER.len()],
    window_raw: u64,
    timed_from: Option<(std::time::Instant, u64)>,
    /// Windows measured at this level since the last probe.
    since_probe: u32,
    probe_every: u32,
    /// While probing: the level the probe left.
    probing: Option<usize>,
    /// Probe downwards (less compression) next.
    down_next: bool,
    /// Every measured window: (level, bytes of files per second).
    log: Vec<(i32, f64)>,
}

impl Tuner {
    fn new() -> Tuner {
        Tuner {
            at: 1,
            rates: [None; LADDER.len()],
            window_raw: 0,
            timed_from: None,
            since_probe: 0,
            probe_every: 1,
            probing: None,
            down_next: true,
            log: Vec::new(),
        }
    }

    fn level(&self) -> i32 {
        LADDER[self.at]
    }

    /// `raw` more bytes of files went out; returns a new level when it changes.
    fn wrote(&mut self, raw: u64) -> Option<i32> {
        self.window_raw += raw;
        if self.timed_from.is_none() && self.window_raw >= WINDOW_SKIP {
            self.timed_from = Some((std::time::Instant::now(), self.window_raw));
        }
        if self.window_raw < WINDOW {
            return None;
        }
        let (t0, raw0) = self.timed_from.take()?;
        let secs = t0.elapsed().as_secs_f64().max(1e-6);
        let rate = (self.window_raw - raw0) as f64 / secs;
        self.window_raw = 0;
        self.log.push((self.level(), rate));
        self.record(rate)
    }

    /// Decide after a window measured at `rate`.
    fn record(&mut self, rate: f64) -> Option<i32> {
        // A window's rate swings with what it holds (big objects or small
        // files, cached or not) by 2-3x at one level, so a level's rate is
        // a running mean, and a probe is kept only if it beats the level it
        // left by a margin; otherwise noise flips the level back and forth.
        let mean = match self.rates[self.at] {
            Some(r) if self.probing.is_none() => 0.5 * r + 0.5 * rate,
            _ => rate,
        };
        self.rates[self.at] = Some(mean);
        let before = self.at;
        if let Some(from) = self.probing.take() {
            // Compression must pay for its CPU: a level with less of it is
            // kept unless it is slower, one with more only if it is clearly
            // faster. (When the disk is the limit, every level moves about
            // the same; the cheapest leaves the cores to ssh and the target.)
            let need = if self.at < from { 1.0 } else { PROBE_MARGIN };
            if self.rates[from].is_some_and(|r| r * need > rate) {
                self.at = from;
                self.probe_every = (self.probe_every * 2).min(32);
            } else {
                self.probe_every = 1;
            }
            self.since_probe = 0;
        } else {
            self.since_probe += 1;
            if self.since_probe >= self.probe_every {
                let down = self.at.checked_sub(1);
                let up = (self.at + 1 < LADDER.len()).then_some(self.at + 1);
                let next = if self.down_next {
                    down.or(up)
                } else {
                    up.or(down)
                };
                self.down_next = !self.down_next;
                if let Some(n) = next {
                    self.probing = Some(self.at);
                    self.at = n;
                }
            }
        }
        (self.at != before).then(|| self.level())
    }
}

/// Put packed blocks on `out` in order, with progress frames; tune the level.
/// Returns the bytes sent and the tuner's log.
fn write_blocks(
    rx: mpsc::Receiver<Packed>,
    out: &mut dyn Write,
    progress: bool,
    counters: &Counters,
    level: &AtomicI32,
    mut tuner: Option<Tuner>,
) -> std::io::Result<(u64, Vec<(i32, f64)>)> {
    let mut waiting: std::collections::BTreeMap<u64, Packed> = std::collections::BTreeMap::new();
    let (mut next, mut sent, mut frames) = (0u64, 0u64, 0u64);
    for p in rx {
        waiting.insert(p.seq, p);
        while let Some(p) = waiting.remove(&next) {
            if counters.cancel.load(Ordering::Relaxed) {
                return Err(std::io::Error::other("the controller went away"));
            }
            write_data_parts(out, &[p.tag], &p.payload)?;
            sent += p.payload.len() as u64 + 1;
            next += 1;
            frames += 1;
            if let Some(t) = tuner.as_mut()
                && let Some(l) = t.wrote(p.raw as u64)
            {
                level.store(l, Ordering::Relaxed);
            }
            if progress && frames % 8 == 0 {
                let p = Progress {
                    files: counters.files.load(Ordering::Relaxed),
                    bytes: counters.bytes.load(Ordering::Relaxed),
                    total_files: counters.total_files.load(Ordering::Relaxed),
                    total_bytes: counters.total_bytes.load(Ordering::Relaxed),
                };
                write_frame(out, &Response::Progress(p))?;
            }
        }
    }
    out.flush()?;
    Ok((sent, tuner.map(|t| t.log).unwrap_or_default()))
}

/// Decode one data frame of the stream back into bytes of the tar stream.
/// Returns the bytes and where they start in the vector.
pub fn unpack_block(
    frame: Vec<u8>,
    z: &mut zstd::bulk::Decompressor<'static>,
) -> Result<(Vec<u8>, usize)> {
    match frame.first() {
        Some(&TAG_STORED) => Ok((frame, 1)),
        Some(&TAG_ZSTD) => z
            .decompress(&frame[1..], BLOCK)
            .map(|v| (v, 0))
            .map_err(|e| {
                err!(
                    hint = "the source is not a compatible overlay agent (or is hostile); nothing was switched",
                    "a block of the stream does not decompress to at most {BLOCK} bytes: {e}"
                )
            }),
        _ => Err(err!("a block of the stream has an unknown packing")),
    }
}

/// Source side: write the files as a tar stream in packed data frames to
/// `out`. Returns the bytes of files, the bytes sent, the blake3 of each
/// file, and with `Auto` the tuner's log.
pub fn send(
    venv_root: &str,
    files: &[SendFile],
    shebang: Option<&ShebangRewrite>,
    compression: Compression,
    out: &mut dyn Write,
    progress: bool,
    counters: &Counters,
) -> Result<SendResult> {
    let venv = Venv::open(venv_root)?;
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
        };
        let venv = &venv;
        let reader = scope.spawn(move || read_files(venv, files, shebang, cutter, counters));
        // Once the reader drops the cutter, the packers finish, then the writer.
        let sent = write_blocks(packed_rx, out, progress, counters, level, tuner);
        if sent.is_err() {
            // The packers stop with the writer gone; stop the reader, and
            // unblock it if it waits on a full queue.
            stop.store(true, Ordering::Relaxed);
            drop(block_rx.lock().map(|r| drain_blocks(&r)));
        }
        let read = reader
            .join()
            .unwrap_or_else(|_| Err(err!("the stream's reader panicked")));
        match (read, sent) {
            (Ok((raw, hashes)), Ok((sent, log))) => Ok((raw, sent, hashes, log)),
            // A read error explains a writer that stopped for it, not the reverse.
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(err!("Failed to send: {e}")),
        }
    })
}

/// Where the direct route goes (`Request::SendDirect`).
pub struct Direct<'a> {
    pub ssh: &'a str,
    pub agent: &'a str,
    pub target_venv: &'a str,
    pub generation: &'a str,
    pub timeout: std::time::Duration,
}

/// Source side of `apply --direct`: start the agent on the target with this
/// host's `ssh` client and send the stream straight into the generation's
/// staging folder there. Returns what `send` does, plus what the target wrote.
pub fn send_direct(
    venv_root: &str,
    files: &[SendFile],
    shebang: Option<&ShebangRewrite>,
    compression: Compression,
    to: &Direct<'_>,
    counters: &Counters,
) -> Result<DirectResult> {
    use crate::client::Client;
    use crate::protocol::Request;
    let here = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let unreachable = |why: String| {
        err!(
            hint = "the direct route uses the source host's own ssh (its ~/.ssh/config, keys and known_hosts) without prompting: check `ssh -o BatchMode=yes DEST true` on the source, set `direct_ssh` for the target in the manifest, or apply without --direct",
            "The source ({here}) could not reach the target as {:?} over SSH: {}",
            to.ssh,
            why.trim()
        )
    };
    let pipe = crate::transport::openssh::start_agent(to.ssh, to.ssh, to.agent, to.timeout)?;
    let mut target = match Client::over(to.ssh, pipe) {
        Ok(c) => c,
        Err(e) => return Err(unreachable(e.message)),
    };
    target.request(&Request::Receive {
        venv: to.target_venv.to_string(),
        generation: to.generation.to_string(),
    })?;
    let sent = send(
        venv_root,
        files,
        shebang,
        compression,
        target.writer()?,
        false,
        counters,
    );
    let (raw, compressed, hashes, windows) = match sent {
        Ok(s) => s,
        Err(e) => {
            // The target may have said why it stopped reading.
            let _ = target.request(&Request::Abort);
            return match target.response(&mut |_| {}) {
                Ok(_) | Err(_) => Err(e),
            };
        }
    };
    target.request(&Request::EndData {
        hashes: hashes.clone(),
    })?;
    let written = match target.response(&mut |_| {})? {
        Response::Received { written, .. } => written,
        other => return Err(err!("unexpected answer from {}: {other:?}", to.ssh)),
    };
    target.close()?;
    Ok((raw, compressed, hashes, windows, written))
}

/// After a direct stream: every file the generation adds or replaces is in
/// staging, and each regular file is the very inode the receiving agent
/// reported writing (unchanged since). Returns (files, bytes).
pub fn check_staged(g: &Generation, written: &[Written]) -> Result<(u64, u64)> {
    let by_index: std::collections::HashMap<usize, &FileStamp> =
        written.iter().map(|w| (w.index, &w.stamp)).collect();
    let staging = g.dir.join("staging");
    let (mut files, mut bytes) = (0u64, 0u64);
    for (i, c) in g.meta.changes.iter().enumerate() {
        if c.action == Action::Delete {
            continue;
        }
        let p = staging.join(i.to_string());
        let meta = fs::symlink_metadata(&p).map_err(|e| {
            err!(
                "After the direct stream, {} is missing from staging: {}",
                c.path,
                io_cause(&e)
            )
        })?;
        match (&c.source, by_index.get(&i)) {
            (Some(Kind::File { size, .. }), Some(st))
                if meta.is_file()
                    && meta.len() == *size
                    && st.same_inode_unchanged(&FileStamp::of(&meta)) => {}
            (Some(Kind::Symlink { .. }), None) if meta.file_type().is_symlink() => {}
            _ => {
                return Err(err!(
                    "After the direct stream, staging/{i} ({}) is not what the receiving agent reported",
                    c.path
                ));
            }
        }
        files += 1;
        bytes += c.source.as_ref().map_or(0, Kind::size);
    }
    Ok((files, bytes))
}

/// What `send_direct` returns: `send`'s result and what the target wrote.
pub type DirectResult = (
    u64,
    u64,
    Vec<(usize, String)>,
    Vec<(i32, f64)>,
    Vec<Written>,
);

/// What `send` returns.
pub type SendResult = (u64, u64, Vec<(usize, String)>, Vec<(i32, f64)>);

/// Read, check and hash the files into the tar stream. Every file is
/// reached from the venv root's fd without following a symlink in its
/// parent chain ([`Walker`]), so nothing outside the venv is ever read.
fn read_files(
    venv: &Venv,
    files: &[SendFile],
    shebang: Option<&ShebangRewrite>,
    cutter: BlockCutter<'_>,
    counters: &Counters,
) -> Result<(u64, Vec<(usize, String)>)> {
    let mut hashes = Vec::with_capacity(files.len());
    let mut tar = tar::Builder::new(cutter);
    let mut raw = 0u64;
    let root = venv.beneath()?;
    let mut walker = Walker::new(std::os::fd::AsFd::as_fd(&root));
    for f in files {
        let (abs, rel) = venv.resolve(&f.path)?;
        let changed = || {
            err!(
                hint = "the source changed since the plan; run `overlay plan` again",
                "Source file {} changed since the plan; nothing was applied",
                abs.display()
            )
        };
        let blocked = |b: Blocked| match b {
            Blocked::Link(link) => err!(
                hint = "the source changed since the plan; run `overlay plan` again",
                "Source file {}: its parent {} is a symlink; overlay never reads through one; nothing was applied",
                abs.display(),
                venv.root.join(link).display()
            ),
            Blocked::Missing => changed(),
            Blocked::Error(m) => err!("Failed to read {}: {m}", abs.display()),
        };
        let meta = walker.lstat(&rel).map_err(blocked)?.ok_or_else(changed)?;
        let is_file = FileType::from_raw_mode(meta.st_mode) == FileType::RegularFile;
        let mut h = tar::Header::new_gnu();
        h.set_uid(meta.st_uid as u64);
        h.set_gid(meta.st_gid as u64);
        h.set_mtime(meta.st_mtime.max(0) as u64);
        let name = f.index.to_string();
        match &f.kind {
            Kind::Symlink { target } => {
                let now = walker.read_link(&rel).map_err(|_| changed())?;
                if now != *target {
                    return Err(changed());
                }
                // The target travels as the entry's data (as long as the
                // plan says), never in a GNU long-link record.
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(target.len() as u64);
                h.set_mode(0o777);
                tar.append_data(&mut h, &name, target.as_bytes())
                    .map_err(|e| err!("Failed to stream {}: {e}", abs.display()))?;
            }
            Kind::File {
                size,
                mode,
                blake3,
                stamp,
            } => {
                // Unhashed in the plan: the stamp must be as the plan saw it.
                if !is_file || (blake3.is_none() && *stamp != Some(stamp_of(&meta))) {
                    return Err(changed());
                }
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(*size);
                let file = walker.open(&rel).map_err(blocked)?;
                let len = meta.st_size as u64;
                let digest = if rel.starts_with("bin/") && len < (1 << 20) && shebang.is_some() {
                    let mut content = Vec::new();
                    (&file)
                        .read_to_end(&mut content)
                        .map_err(|e| err!("Failed to read {}: {}", abs.display(), io_cause(&e)))?;
                    let content = shebang
                        .and_then(|rw| rewrite_shebang(&content, rw))
                        .unwrap_or(content);
                    if content.len() as u64 != *size {
                        return Err(changed());
                    }
                    tar.append_data(&mut h, &name, &content[..])
                        .map_err(|e| err!("Failed to stream {}: {e}", abs.display()))?;
                    content_hex(ContentHasher::new().update(&content))
                } else {
                    if len != *size {
                        return Err(changed());
                    }
                    // Read straight into the stream's block and hash it
                    // there: no copy through tar's 8 KiB buffer.
                    let failed = |e: std::io::Error| {
                        err!("Failed to stream {}: {}", abs.display(), io_cause(&e))
                    };
                    h.set_path(&name).map_err(failed)?;
                    h.set_cksum();
                    let cutter = tar.get_mut();
                    cutter.write_all(h.as_bytes()).map_err(failed)?;
                    let mut hasher = ContentHasher::new();
                    let mut left = *size;
                    while left > 0 {
                        let n = cutter.read_from(&file, &mut hasher).map_err(failed)?;
                        if n == 0 || n as u64 > left {
                            // Shorter or longer than the plan said.
                            return Err(changed());
                        }
                        left -= n as u64;
                    }
                    let pad = (512 - (*size % 512) as usize) % 512;
                    cutter.write_all(&[0u8; 512][..pad]).map_err(failed)?;
                    content_hex(&hasher)
                };
                match blake3 {
                    Some(want) if *want != digest => return Err(changed()),
                    // Read while something wrote to it: the stamp moved.
                    None if rustix::fs::fstat(&file).map(|m| stamp_of(&m)).ok() != *stamp => {
                        return Err(changed());
                    }
                    _ => {}
                }
                hashes.push((f.index, digest));
                raw += size;
                counters.bytes.fetch_add(*size, Ordering::Relaxed);
            }
            other => {
                return Err(err!(
                    "Cannot send {}: it is {other:?} in the plan",
                    abs.display()
                ));
            }
        }
        counters.files.fetch_add(1, Ordering::Relaxed);
    }
    let mut cutter = tar
        .into_inner()
        .map_err(|e| err!("Failed to finish the stream: {e}"))?;
    cutter
        .emit()
        .map_err(|e| err!("Failed to finish the stream: {e}"))?;
    Ok((raw, hashes))
}

/// A `Read` over chunks arriving on a channel.
pub struct ChannelReader {
    rx: mpsc::Receiver<(Vec<u8>, usize)>,
    cur: Vec<u8>,
    pos: usize,
}

impl ChannelReader {
    pub fn new(rx: mpsc::Receiver<(Vec<u8>, usize)>) -> Self {
        ChannelReader {
            rx,
            cur: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos >= self.cur.len() {
            match self.rx.recv() {
                Ok((v, start)) => {
                    self.cur = v;
                    self.pos = start;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Target side: unpack the stream into `staging/<index>`, checking each
/// file against the plan. Runs on its own thread, fed by [`ChannelReader`].
///
/// Three kinds of thread share the work: this one parses the tar stream and
/// hashes each file into a chunk buffer, one writer writes the chunks out
/// (so that a wait on the disk does not stall the stream), and two fsync
/// each staged file beside both. The stage is done when every fsync is.
pub fn unpack(
    g: &Generation,
    host_dir: &Path,
    input: ChannelReader,
    counters: &Counters,
) -> Result<(u64, u64, Vec<Written>)> {
    let (sync_tx, sync_rx) = mpsc::sync_channel::<(Arc<File>, PathBuf)>(256);
    let sync_rx = Mutex::new(sync_rx);
    let (job_tx, job_rx) = mpsc::sync_channel::<WriteJob>(WRITE_BUFFERS);
    let (free_tx, free_rx) = mpsc::sync_channel::<AlignedBuf>(WRITE_BUFFERS);
    for _ in 0..WRITE_BUFFERS {
        let _ = free_tx.send(AlignedBuf::new(WRITE_CHUNK));
    }
    std::thread::scope(|scope| {
        let syncers: Vec<_> = (0..2)
            .map(|_| {
                let rx = &sync_rx;
                scope.spawn(move || -> Result<()> {
                    let mut first = Ok(());
                    loop {
                        let next = rx.lock().ok().and_then(|r| r.recv().ok());
                        let Some((f, dest)) = next else { break };
                        if let Err(e) = f.sync_all()
                            && first.is_ok()
                        {
                            first = Err(stage_error(&dest, e, host_dir, g));
                        }
                    }
                    first
                })
            })
            .collect();
        let writer = scope.spawn(move || write_staged(g, host_dir, job_rx, free_tx, sync_tx));
        let direct = direct_io_fs(&g.dir.join("staging"));
        let r = unpack_into(g, host_dir, input, counters, direct, job_tx, free_rx);
        let written = writer
            .join()
            .unwrap_or_else(|_| Err(err!("the staging writer panicked")));
        let mut synced = Ok(());
        for s in syncers {
            let r = s
                .join()
                .unwrap_or_else(|_| Err(err!("an fsync thread panicked")));
            if synced.is_ok() {
                synced = r;
            }
        }
        // The writer's own error explains a stream that stopped because of it.
        let written = written?;
        let (files, bytes) = r?;
        synced?;
        if let Ok(d) = File::open(g.dir.join("staging")) {
            let _ = d.sync_all();
        }
        Ok((files, bytes, written))
    })
}

/// Staged files are written in chunks of this many bytes.
const WRITE_CHUNK: usize = 4 << 20;
/// Chunk buffers in flight between the unpacker and the writer.
const WRITE_BUFFERS: usize = 4;
/// Staged files at least this big are written with `O_DIRECT`.
const DIRECT_MIN: u64 = 4 << 20;
/// What `O_DIRECT` asks of buffer addresses, file offsets and lengths; 4096
/// covers every common block device (a larger need shows as `EINVAL`, and
/// the file is finished through the page cache).
const DIRECT_ALIGN: usize = 4096;

/// A zeroed buffer whose usable part starts on a `DIRECT_ALIGN` boundary.
struct AlignedBuf {
    mem: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let mem = vec![0u8; len + DIRECT_ALIGN];
        let start = mem.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf { mem, start, len }
    }
    fn get(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + self.len]
    }
}

/// A chunk of a staged file for the writer: the first `len` bytes of `buf`
/// go at the file's current offset.
struct WriteJob {
    index: usize,
    file: Arc<File>,
    buf: AlignedBuf,
    len: usize,
    /// On a file's last chunk: how to finish it.
    last: Option<Finish>,
}

/// What the writer does to a staged file after its last byte.
struct Finish {
    digest: String,
    mode: u32,
    /// Owner to set (when running as root).
    owner: Option<(u32, u32)>,
}

/// The writer thread: write each chunk, finish each file (owner, mode,
/// stamp) and hand it to the fsync threads. A big file bypasses the page
/// cache (`O_DIRECT`, set by the unpacker): every staged file is fsynced
/// before the switch anyway, so caching its pages gains nothing, while
/// copying gigabytes into the cache costs the host CPU and evicts what its
/// workloads keep hot (model weights, say). Where the filesystem refuses
/// `O_DIRECT`, the file is written the ordinary way.
fn write_staged(
    g: &Generation,
    host_dir: &Path,
    jobs: mpsc::Receiver<WriteJob>,
    free: mpsc::SyncSender<AlignedBuf>,
    sync: mpsc::SyncSender<(Arc<File>, PathBuf)>,
) -> Result<Vec<Written>> {
    let staging = g.dir.join("staging");
    let mut written = Vec::new();
    for mut job in jobs {
        let dest = || staging.join(job.index.to_string());
        write_chunk(&job.file, &job.buf.get()[..job.len], job.last.is_some())
            .map_err(|e| stage_error(&dest(), e, host_dir, g))?;
        if let Some(fin) = job.last.take() {
            let out = &job.file;
            if let Some((uid, gid)) = fin.owner {
                let _ = std::os::unix::fs::fchown(&**out, Some(uid), Some(gid));
            }
            // Never a setuid, setgid or sticky bit, whatever the plan says
            // (after the chown, which would clear them anyway).
            out.set_permissions(fs::Permissions::from_mode(fin.mode & 0o777))
                .map_err(|e| stage_error(&dest(), e, host_dir, g))?;
            let stamp = out
                .metadata()
                .map_err(|e| stage_error(&dest(), e, host_dir, g))?;
            written.push(Written {
                index: job.index,
                blake3: fin.digest,
                stamp: FileStamp::of(&stamp),
            });
            sync.send((job.file, dest()))
                .map_err(|_| err!("the fsync threads stopped"))?;
        }
        // The unpacker may be gone (it failed); then nobody needs the buffer.
        let _ = free.send(job.buf);
    }
    Ok(written)
}

/// Write `data` at `file`'s offset. With `O_DIRECT` on, a last chunk's tail
/// (past the last whole block) goes through the page cache.
fn write_chunk(file: &File, data: &[u8], last: bool) -> std::io::Result<()> {
    let mut direct = is_direct(file);
    let end = data.len();
    let aligned = if direct && last {
        end / DIRECT_ALIGN * DIRECT_ALIGN
    } else {
        end
    };
    let mut f = file;
    let mut at = 0;
    while at < end {
        if direct && at >= aligned {
            // Should clearing fail, the tail's write fails with EINVAL below.
            set_direct(file, false);
            direct = false;
        }
        let to = if direct { aligned } else { end };
        match f.write(&data[at..to]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // An alignment this filesystem does not accept, or a short
            // write that left the offset unaligned: go on buffered.
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                set_direct(file, false);
                direct = false;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether big staged files in `dir` are written with `O_DIRECT`: only on
/// the local block filesystems where it is a plain DMA from our buffer
/// (ext4, XFS, btrfs). Elsewhere (NFS, where every direct write is a
/// synchronous round trip to the server; FUSE; tmpfs, which is the page
/// cache) the page cache stays in the way.
fn direct_io_fs(dir: &Path) -> bool {
    const EXT4: u64 = 0xEF53;
    const XFS: u64 = 0x5846_5342;
    const BTRFS: u64 = 0x9123_683E;
    rustix::fs::statfs(dir).is_ok_and(|s| matches!(s.f_type as u64, EXT4 | XFS | BTRFS))
}

fn is_direct(file: &File) -> bool {
    rustix::fs::fcntl_getfl(file).is_ok_and(|f| f.contains(rustix::fs::OFlags::DIRECT))
}

/// Turn `O_DIRECT` on or off for `file`; false if the filesystem refuses.
fn set_direct(file: &File, on: bool) -> bool {
    use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
    let Ok(flags) = fcntl_getfl(file) else {
        return false;
    };
    let flags = if on {
        flags | OFlags::DIRECT
    } else {
        flags - OFlags::DIRECT
    };
    fcntl_setfl(file, flags).is_ok()
}

/// One entry of the stream, as its 512-byte header declares it. The stream
/// is overlay's own: a ustar/GNU header per file, named by change index,
/// and nothing else — no long names, no PAX records, no links, devices or
/// directories. Anything else is refused from the header alone, before a
/// byte of what follows it is read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct EntryHead {
    pub index: usize,
    /// A symlink (its target follows as the entry's data), or a regular file.
    pub symlink: bool,
    pub size: u64,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// The size of a tar header and the unit entries are padded to.
const TAR_BLOCK: usize = 512;

/// A tar header's checksum: the sum of its 512 bytes, with the checksum
/// field itself counted as spaces.
fn header_sum(block: &[u8]) -> u32 {
    block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                b as u32
            }
        })
        .sum()
}

/// Read the header in `block`: `Ok(None)` for the zero block that ends the
/// stream.
pub(crate) fn parse_head(block: &[u8; TAR_BLOCK]) -> Result<Option<EntryHead>> {
    if block.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let bad = |what: String| {
        err!(
            hint = "the stream did not come from a compatible overlay source; nothing was switched, run `overlay apply` again",
            "Refused an entry of the stream: {what}"
        )
    };
    let h = tar::Header::from_byte_slice(block);
    if h.cksum().ok() != Some(header_sum(block)) {
        return Err(bad("its header's checksum is wrong".into()));
    }
    let symlink = match h.entry_type() {
        tar::EntryType::Regular => false,
        tar::EntryType::Symlink => true,
        other => {
            return Err(bad(format!(
                "type {:?} ({other:?}) is not a regular file or a symlink",
                other.as_byte() as char
            )));
        }
    };
    let name = &h.as_old().name;
    let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
    let index = std::str::from_utf8(name)
        .ok()
        .filter(|n| !n.is_empty() && n.len() <= 12 && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<usize>().ok())
        .ok_or_else(|| {
            bad(format!(
                "its name {:?} is not a change index",
                String::from_utf8_lossy(name)
            ))
        })?;
    // The link name is unused: a symlink's target comes as its data.
    if h.as_old().linkname[0] != 0 {
        return Err(bad(format!("entry {index} has a link name")));
    }
    let size = h
        .entry_size()
        .map_err(|_| bad(format!("entry {index} has no readable size")))?;
    let id = |v: std::io::Result<u64>| {
        v.ok()
            .and_then(|v| u32::try_from(v).ok())
            .filter(|&v| v != u32::MAX)
    };
    Ok(Some(EntryHead {
        index,
        symlink,
        size,
        uid: id(h.uid()),
        gid: id(h.gid()),
    }))
}

/// Who a staged file will belong to, when the agent runs as root: the
/// owner of the file it replaces, or of the directory it lands in (the
/// nearest that exists), looked up without following a symlink anywhere.
struct Owners {
    root: Option<crate::beneath::Beneath>,
    site_rel: String,
}

impl Owners {
    fn new(host_dir: &Path) -> Owners {
        let site_rel = Venv::open(&host_dir.to_string_lossy())
            .map(|v| v.site_rel)
            .unwrap_or_default();
        Owners {
            root: crate::beneath::Beneath::open(host_dir).ok(),
            site_rel,
        }
    }

    /// The owner for the file at `path` (relative to site-packages).
    fn of(&self, path: &str) -> Option<(u32, u32)> {
        let root = self.root.as_ref()?;
        let mut rel = if self.site_rel.is_empty() {
            path.to_string()
        } else {
            format!("{}/{path}", self.site_rel)
        };
        loop {
            if let Ok(Some(st)) = root.lstat(&rel) {
                return Some((st.st_uid, st.st_gid));
            }
            if rel.is_empty() {
                return None;
            }
            rel.truncate(rel.rfind('/').unwrap_or(0));
        }
    }
}

/// Read exactly `buf.len()` bytes of the stream.
fn read_exact_stream(input: &mut ChannelReader, buf: &mut [u8], what: &str) -> Result<()> {
    input.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            err!(
                hint = "run `overlay apply` again; if it repeats, check the source host and the network",
                "The stream ended in the middle of {what}"
            )
        } else {
            err!("Failed to read the stream: {e}")
        }
    })
}

fn unpack_into(
    g: &Generation,
    host_dir: &Path,
    mut input: ChannelReader,
    counters: &Counters,
    direct: bool,
    jobs: mpsc::SyncSender<WriteJob>,
    free: mpsc::Receiver<AlignedBuf>,
) -> Result<(u64, u64)> {
    let staging_path = g.dir.join("staging");
    // Every staged file is made relative to this fd, with O_EXCL|O_NOFOLLOW:
    // whatever appears in staging meanwhile, a write never leaves it.
    let staging = crate::beneath::Beneath::open(&staging_path)
        .map_err(|e| stage_error(&staging_path, e, host_dir, g))?;
    let stopped = || err!("the staging writer stopped");
    let next_buf = || free.recv().map_err(|_| stopped());
    let mut buf = next_buf()?;
    let is_root = rustix::process::geteuid().is_root();
    let owners = (is_root && !g.meta.same_owner).then(|| Owners::new(host_dir));
    let mut seen = vec![false; g.meta.changes.len()];
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut block = [0u8; TAR_BLOCK];
    loop {
        // A stream that stops at an entry's boundary ends like one with
        // the end-of-archive block; what is missing is named below.
        match input.read(&mut block[..1]) {
            Ok(0) => break,
            Ok(_) => read_exact_stream(&mut input, &mut block[1..], "a header")?,
            Err(e) => return Err(err!("Failed to read the stream: {e}")),
        }
        let Some(head) = parse_head(&block)? else {
            break;
        };
        let i = head.index;
        let c = g
            .meta
            .changes
            .get(i)
            .filter(|c| c.action != Action::Delete)
            .ok_or_else(|| err!("unexpected entry {i} in the stream"))?;
        if std::mem::replace(&mut seen[i], true) {
            return Err(err!("entry {i} appears twice in the stream"));
        }
        let name = i.to_string();
        let dest = || staging_path.join(&name);
        let owner = match &owners {
            _ if !is_root => None,
            Some(o) => o.of(&c.path),
            None => head.uid.zip(head.gid),
        };
        // The header's size is the plan's, or nothing of the entry is read.
        let want = match &c.source {
            Some(Kind::Symlink { target }) if head.symlink => target.len() as u64,
            Some(Kind::File { size, .. }) if !head.symlink => *size,
            expected => {
                return Err(err!(
                    "{} arrived as a {}, the plan expects {expected:?}",
                    c.path,
                    if head.symlink {
                        "symlink"
                    } else {
                        "regular file"
                    }
                ));
            }
        };
        if head.size != want {
            return Err(err!(
                hint = "the source sent something other than the plan; nothing was switched, run `overlay plan` and `overlay apply` again",
                "{} arrived declaring {} bytes, the plan says {want}; refused before writing",
                c.path,
                head.size
            ));
        }
        let pad = (TAR_BLOCK - (want % TAR_BLOCK as u64) as usize) % TAR_BLOCK;
        match &c.source {
            Some(Kind::Symlink { target }) => {
                let mut link = vec![0u8; target.len()];
                read_exact_stream(&mut input, &mut link, &c.path)?;
                if link != target.as_bytes() {
                    return Err(err!(
                        "{} arrived with link target {:?}, the plan says {target:?}",
                        c.path,
                        String::from_utf8_lossy(&link)
                    ));
                }
                staging
                    .symlink(target, &name)
                    .map_err(|e| stage_error(&dest(), e, host_dir, g))?;
                if let Some((uid, gid)) = owner {
                    let _ = rustix::fs::chownat(
                        &staging,
                        name.as_str(),
                        Some(rustix::fs::Uid::from_raw(uid)),
                        Some(rustix::fs::Gid::from_raw(gid)),
                        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                    );
                }
            }
            Some(Kind::File {
                size, mode, blake3, ..
            }) => {
                let out = staging
                    .create_new(&name, 0o600)
                    .map_err(|e| stage_error(&dest(), e, host_dir, g))?;
                if direct && *size >= DIRECT_MIN {
                    set_direct(&out, true);
                }
                let out = Arc::new(out);
                let mut hasher = ContentHasher::new();
                let (mut left, mut fill) = (*size, 0usize);
                while left > 0 {
                    if fill == WRITE_CHUNK {
                        let full = std::mem::replace(&mut buf, next_buf()?);
                        let job = WriteJob {
                            index: i,
                            file: out.clone(),
                            buf: full,
                            len: fill,
                            last: None,
                        };
                        jobs.send(job).map_err(|_| stopped())?;
                        fill = 0;
                    }
                    let room =
                        (WRITE_CHUNK - fill).min(usize::try_from(left).unwrap_or(usize::MAX));
                    let space = &mut buf.get()[fill..fill + room];
                    let n = input
                        .read(space)
                        .map_err(|e| err!("Failed to read the stream: {e}"))?;
                    if n == 0 {
                        return Err(err!(
                            hint = "run `overlay apply` again; if it repeats, check the source host and the network",
                            "The stream ended in the middle of {} ({} of {size} bytes)",
                            c.path,
                            size - left
                        ));
                    }
                    hasher.update(&space[..n]);
                    fill += n;
                    left -= n as u64;
                    counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                let digest = content_hex(&hasher);
                if blake3.as_ref().is_some_and(|want| *want != digest) {
                    return Err(err!(
                        hint = "run `overlay apply` again; if it repeats, check the source file and the network",
                        "{} arrived damaged (blake3 {digest}, {size} bytes; the plan says {})",
                        c.path,
                        blake3.as_deref().unwrap_or_default()
                    ));
                }
                let job = WriteJob {
                    index: i,
                    file: out,
                    buf: std::mem::replace(&mut buf, next_buf()?),
                    len: fill,
                    last: Some(Finish {
                        digest,
                        mode: *mode,
                        owner,
                    }),
                };
                jobs.send(job).map_err(|_| stopped())?;
                bytes += size;
            }
            _ => unreachable!("checked against the header above"),
        }
        let mut skip = [0u8; TAR_BLOCK];
        read_exact_stream(&mut input, &mut skip[..pad], &c.path)?;
        files += 1;
        counters.files.fetch_add(1, Ordering::Relaxed);
    }
    let missing: Vec<&str> = g
        .meta
        .changes
        .iter()
        .enumerate()
        .filter(|(i, c)| c.action != Action::Delete && !seen[*i])
        .map(|(_, c)| c.path.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(err!(
            "The stream ended without {} file(s), e.g. {}",
            missing.len(),
            missing[0]
        ));
    }
    Ok((files, bytes))
}

/// Describe a write failure in staging; a full disk says how much is needed.
fn stage_error(dest: &Path, e: std::io::Error, dir: &Path, g: &Generation) -> crate::error::Error {
    if e.raw_os_error() == Some(28) {
        let need: u64 = g
            .meta
            .changes
            .iter()
            .filter_map(|c| c.source.as_ref())
            .map(Kind::size)
            .sum();
        let free = free_bytes(dir).unwrap_or(0);
        return err!(
            hint = "free space on that file system and run `overlay apply` again; the venv was not changed",
            "No space left on device while staging {}: the apply needs {need} bytes, {free} bytes are free",
            dest.display()
        );
    }
    err!("Failed to write {}: {}", dest.display(), io_cause(&e))
}

/// A small prepared generation to throw crafted streams at: shared by the
/// property tests and the fuzz target (`fuzz/`). Not part of the API.
#[doc(hidden)]
pub mod testing {
    use super::*;
    use crate::journal::State;
    use crate::model::{GenChange, PrepareRequest};

    /// A venv with a generation of three adds — a 10-byte file (mode 4755
    /// in the plan), a symlink, and a symlink with a 300-byte target — and
    /// the replacement of `a.py` (7 bytes).
    pub struct Intake {
        pub dir: tempfile::TempDir,
        _state: State,
        pub g: Generation,
        before: Vec<(String, u32, u64)>,
    }

    /// Every path below `root`, its mode and size, without following
    /// symlinks; staged entries are left out.
    fn tree(root: &Path, staging: &Path) -> Vec<(String, u32, u64)> {
        use std::os::unix::fs::MetadataExt;
        let mut out = Vec::new();
        for e in walkdir::WalkDir::new(root).sort_by_file_name() {
            let Ok(e) = e else { continue };
            if e.path().parent() == Some(staging) {
                continue;
            }
            if let Ok(m) = e.path().symlink_metadata() {
                let size = if m.is_dir() { 0 } else { m.len() };
                out.push((e.path().display().to_string(), m.mode(), size));
            }
        }
        out
    }

    pub const LONG_TARGET_LEN: usize = 300;

    impl Intake {
        pub fn new(base: &Path, same_owner: bool) -> Intake {
            let dir = tempfile::tempdir_in(base).expect("tempdir");
            let site = dir.path().join("lib/python3.11/site-packages");
            fs::create_dir_all(site.join("pkg")).expect("venv");
            fs::write(dir.path().join("pyvenv.cfg"), "version = 3.11.2\n").expect("venv");
            fs::write(site.join("a.py"), "a = 1\n").expect("venv");
            let v = dir.path().to_str().expect("utf-8").to_string();
            let change = GenChange::add;
            let state = State::open(&v).expect("state");
            let now = crate::inventory::stat(
                &v,
                &["a.py".to_string()],
                HashMode::All,
                None,
                false,
                &Counters::default(),
            )
            .expect("stat")
            .remove(0);
            let req = PrepareRequest {
                venv: v,
                source: "s".into(),
                target: "t".into(),
                plan_created: 0,
                changes: vec![
                    change(
                        "new.py",
                        Kind::File {
                            size: 10,
                            mode: 0o4755,
                            blake3: None,
                            stamp: None,
                        },
                    ),
                    change(
                        "link",
                        Kind::Symlink {
                            target: "a.py".into(),
                        },
                    ),
                    change(
                        "pkg/long",
                        Kind::Symlink {
                            target: "x".repeat(LONG_TARGET_LEN),
                        },
                    ),
                    GenChange {
                        action: Action::Replace,
                        target: Some(now.kind),
                        ..change(
                            "a.py",
                            Kind::File {
                                size: 7,
                                mode: 0o644,
                                blake3: None,
                                stamp: None,
                            },
                        )
                    },
                ],
                backup: false,
                resume: false,
                same_owner,
            };
            let g = state.prepare(&req, &Counters::default()).expect("prepare");
            let before = tree(dir.path(), &g.dir.join("staging"));
            Intake {
                dir,
                _state: state,
                g,
                before,
            }
        }

        /// A well-formed stream for this generation, as the source writes it.
        pub fn valid_stream(&self) -> Vec<u8> {
            let mut tar = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_gnu();
            h.set_size(10);
            h.set_mode(0o4755);
            tar.append_data(&mut h, "0", &b"0123456789"[..])
                .expect("tar");
            for (name, target) in [
                ("1", "a.py".to_string()),
                ("2", "x".repeat(LONG_TARGET_LEN)),
            ] {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(target.len() as u64);
                tar.append_data(&mut h, name, target.as_bytes())
                    .expect("tar");
            }
            let mut h = tar::Header::new_gnu();
            h.set_size(7);
            h.set_mode(0o644);
            tar.append_data(&mut h, "3", &b"a = 2\n\n"[..])
                .expect("tar");
            tar.into_inner().expect("tar")
        }

        /// Unpack `data` (in pieces of `piece` bytes) into staging, then
        /// check that nothing outside staging changed, and that staging
        /// holds only entries named by the generation's indexes, none with
        /// a setuid, setgid or sticky bit. Staging is emptied after.
        pub fn run_in_pieces(&self, data: &[u8], piece: usize) -> Result<(u64, u64)> {
            self.run_with(data, piece, |_| {})
        }

        /// [`Intake::run_in_pieces`], with a look at staging before it is emptied.
        pub fn run_with(
            &self,
            data: &[u8],
            piece: usize,
            inspect: impl FnOnce(&Path),
        ) -> Result<(u64, u64)> {
            let (tx, rx) = mpsc::sync_channel(data.len() / piece.max(1) + 2);
            for p in data.chunks(piece.max(1)) {
                tx.send((p.to_vec(), 0)).expect("queue");
            }
            drop(tx);
            let r = unpack(
                &self.g,
                self.dir.path(),
                ChannelReader::new(rx),
                &Counters::default(),
            );
            let staging = self.g.dir.join("staging");
            inspect(&staging);
            assert_eq!(
                tree(self.dir.path(), &staging),
                self.before,
                "something outside staging changed"
            );
            for e in fs::read_dir(&staging).expect("staging") {
                let e = e.expect("staging");
                let name = e.file_name().to_string_lossy().into_owned();
                assert!(
                    ["0", "1", "2", "3"].contains(&name.as_str()),
                    "staged {name:?}"
                );
                let m = e.path().symlink_metadata().expect("staged");
                assert_eq!(
                    m.permissions().mode() & 0o7000,
                    0,
                    "{name} has {:o}",
                    m.permissions().mode()
                );
                fs::remove_file(e.path()).expect("clear staging");
            }
            r.map(|(files, bytes, _)| (files, bytes))
        }

        pub fn run(&self, data: &[u8]) -> Result<(u64, u64)> {
            self.run_in_pieces(data, data.len().max(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::testing::{Intake, LONG_TARGET_LEN};

    /// A 512-byte header for entry `name` of type `kind` declaring `size`
    /// bytes (the checksum set), as a hostile sender would craft it.
    fn raw_header(name: &str, kind: u8, size: u64) -> Vec<u8> {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(tar::EntryType::new(kind));
        h.set_size(size);
        h.set_mode(0o644);
        h.set_cksum();
        h.as_bytes().to_vec()
    }

    fn staged_names(staging: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(staging)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_valid_stream_stages_everything_and_a_long_symlink_target_needs_no_extension() {
        let intake = Intake::new(&std::env::temp_dir(), false);
        let stream = intake.valid_stream();
        // No GNU long-link ('K') or PAX record: every header is a file or a symlink.
        let mut at = 0;
        while let Some(h) = parse_head(stream[at..at + 512].try_into().unwrap()).unwrap() {
            at += 512 + (h.size as usize).div_ceil(512) * 512;
        }
        assert_eq!(stream.len() - at, 1024, "four entries, then the end");
        for piece in [1, 511, 512, 4096, stream.len()] {
            let r = intake.run_with(&stream, piece, |staging| {
                assert_eq!(staged_names(staging), ["0", "1", "2", "3"]);
                let long = fs::read_link(staging.join("2")).unwrap();
                assert_eq!(long.as_os_str().len(), LONG_TARGET_LEN);
                assert_eq!(fs::read(staging.join("0")).unwrap(), b"0123456789");
                // The plan's 4755 arrives as 755.
                let mode = fs::metadata(staging.join("0"))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o7777, 0o755);
            });
            assert_eq!(r.unwrap(), (4, 17), "in pieces of {piece}");
        }
        let Some(Kind::File { mode, .. }) = &intake.g.meta.changes[0].source else {
            panic!()
        };
        assert_eq!(*mode, 0o755, "the generation keeps the masked mode");
    }

    #[test]
    fn a_header_declaring_more_than_the_plan_is_refused_before_writing() {
        let intake = Intake::new(&std::env::temp_dir(), false);
        // Entry 0 is 10 bytes in the plan; the header claims 64 MiB and
        // 64 KiB follow.
        let mut stream = raw_header("0", b'0', 64 << 20);
        stream.extend(vec![7u8; 64 << 10]);
        let e = intake
            .run_with(&stream, 4096, |staging| {
                assert!(staged_names(staging).is_empty(), "nothing was written");
            })
            .unwrap_err();
        assert!(
            e.message
                .contains("declaring 67108864 bytes, the plan says 10"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("refused before writing"),
            "{}",
            e.message
        );
        assert!(e.hint.is_some());
        // A symlink whose target would be longer than the plan's.
        let stream = raw_header("1", b'2', 1 << 30);
        let e = intake.run(&stream).unwrap_err();
        assert!(e.message.contains("the plan says 4"), "{}", e.message);
    }

    #[test]
    fn extensions_links_and_special_files_are_refused_from_the_header_alone() {
        let intake = Intake::new(&std::env::temp_dir(), false);
        // GNU long name/link, PAX, hard link, char/block device, directory,
        // FIFO, contiguous, sparse, volume label: each claims 512 MiB, none
        // has a body.
        for kind in [
            b'L', b'K', b'x', b'g', b'1', b'3', b'4', b'5', b'6', b'7', b'S', b'V',
        ] {
            let stream = raw_header("0", kind, 512 << 20);
            let e = intake
                .run_with(&stream, 512, |staging| {
                    assert!(staged_names(staging).is_empty());
                })
                .unwrap_err();
            assert!(
                e.message.contains("is not a regular file or a symlink"),
                "{}: {}",
                kind as char,
                e.message
            );
        }
    }

    #[test]
    fn malformed_headers_are_refused() {
        let intake = Intake::new(&std::env::temp_dir(), false);
        let mut bad_sum = raw_header("0", b'0', 10);
        bad_sum[0] = b'1';
        let mut link_name = raw_header("1", b'2', 4);
        link_name[157] = b'a';
        let sum = header_sum(&link_name);
        link_name[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        for (stream, says) in [
            (bad_sum, "checksum"),
            (raw_header("../x", b'0', 10), "not a change index"),
            (raw_header("1e3", b'0', 10), "not a change index"),
            (raw_header("99", b'0', 10), "unexpected entry 99"),
            (raw_header("1", b'0', 4), "arrived as a regular file"),
            (link_name, "has a link name"),
        ] {
            let e = intake.run(&stream).unwrap_err();
            assert!(e.message.contains(says), "{says}: {}", e.message);
        }
    }

    /// As root, a new file takes the owner of the file it replaces, or of
    /// the directory it lands in; not the uid/gid in the stream, unless
    /// `--same-owner` asks for them.
    #[test]
    fn staged_files_take_the_targets_owners_unless_same_owner() {
        use std::os::unix::fs::MetadataExt;
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        for same_owner in [false, true] {
            let intake = Intake::new(&std::env::temp_dir(), same_owner);
            let site = intake.dir.path().join("lib/python3.11/site-packages");
            std::os::unix::fs::chown(&site, Some(4242), Some(4243)).unwrap();
            std::os::unix::fs::lchown(site.join("a.py"), Some(4343), Some(4344)).unwrap();
            // A stream whose headers say uid/gid 1234/1235.
            let mut stream = intake.valid_stream();
            let mut at = 0;
            while let Some(head) = parse_head(stream[at..at + 512].try_into().unwrap()).unwrap() {
                let mut h = tar::Header::from_byte_slice(&stream[at..at + 512]).clone();
                h.set_uid(1234);
                h.set_gid(1235);
                h.set_cksum();
                stream[at..at + 512].copy_from_slice(h.as_bytes());
                at += 512 + (head.size as usize).div_ceil(512) * 512;
            }
            intake
                .run_with(&stream, 4096, |staging| {
                    let owner = |n: &str| {
                        let m = fs::symlink_metadata(staging.join(n)).unwrap();
                        (m.uid(), m.gid())
                    };
                    if same_owner {
                        for n in ["0", "1", "3"] {
                            assert_eq!(owner(n), (1234, 1235), "{n}");
                        }
                    } else {
                        assert_eq!(owner("0"), (4242, 4243), "new.py: the directory's");
                        assert_eq!(owner("1"), (4242, 4243), "link: the directory's");
                        assert_eq!(owner("3"), (4343, 4344), "a.py: the replaced file's");
                        // pkg/ is root's.
                        assert_eq!(owner("2"), (0, 0));
                    }
                })
                .unwrap();
        }
    }

    /// A symlink planted in staging (where `staging/0` will be written)
    /// does not redirect the write.
    #[test]
    fn a_symlink_planted_in_staging_is_not_followed() {
        let intake = Intake::new(&std::env::temp_dir(), false);
        let outside = intake.dir.path().join("outside");
        let staging = intake.g.dir.join("staging");
        std::os::unix::fs::symlink(&outside, staging.join("0")).unwrap();
        let (tx, rx) = mpsc::sync_channel(1);
        tx.send((intake.valid_stream(), 0)).unwrap();
        drop(tx);
        let e = unpack(
            &intake.g,
            intake.dir.path(),
            ChannelReader::new(rx),
            &Counters::default(),
        )
        .unwrap_err();
        assert!(e.message.contains("staging/0"), "{}", e.message);
        assert!(!outside.exists());
        for e in fs::read_dir(&staging).unwrap() {
            fs::remove_file(e.unwrap().path()).unwrap();
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// One generation for all cases (the tests take turns with it).
        fn intake() -> std::sync::MutexGuard<'static, Intake> {
            static I: std::sync::OnceLock<Mutex<Intake>> = std::sync::OnceLock::new();
            I.get_or_init(|| Mutex::new(Intake::new(&std::env::temp_dir(), false)))
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

            /// Whatever the bytes: no panic, nothing written outside staging
            /// (`run` checks the tree), only indexed entries in staging.
            #[test]
            fn arbitrary_bytes_never_escape_staging(
                data in proptest::collection::vec(any::<u8>(), 0..4096),
                piece in 1usize..1500,
            ) {
                let _ = intake().run_in_pieces(&data, piece);
            }

            /// A valid stream with bytes changed or cut: an error or the
            /// right files, never anything else.
            #[test]
            fn a_damaged_valid_stream_never_escapes_staging(
                flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
                cut in any::<usize>(),
                piece in 1usize..3000,
            ) {
                let i = intake();
                let mut s = i.valid_stream();
                for (at, b) in flips {
                    let n = s.len();
                    s[at % n] = b;
                }
                let n = s.len();
                s.truncate(cut % (n + 1));
                if let Ok((files, bytes)) = i.run_in_pieces(&s, piece) {
                    prop_assert!(files == 4 && bytes == 17);
                }
            }
        }
    }

    /// The target's side of a stream: a file bigger than two write chunks
    /// (written around the page cache, with an unaligned tail), a small one
    /// and a symlink arrive intact in staging, with their modes, and the
    /// digests the writer reports are what arrived.
    #[test]
    fn unpack_stages_big_and_small_files_exactly() {
        use crate::journal::State;
        use crate::model::{GenChange, PrepareRequest};
        let t = tempfile::tempdir().unwrap();
        let site = t.path().join("lib/python3.11/site-packages");
        fs::create_dir_all(&site).unwrap();
        let v = t.path().to_str().unwrap();
        // Not a multiple of anything: 2 chunks, then 777 bytes past a block.
        let big: Vec<u8> = (0..2 * WRITE_CHUNK + 3 * DIRECT_ALIGN + 777)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
            .collect();
        let small = b"print('hi')\n".to_vec();
        let hex = |d: &[u8]| content_hex(ContentHasher::new().update(d));
        let file = |d: &[u8], mode| Kind::File {
            size: d.len() as u64,
            mode,
            blake3: Some(hex(d)),
            stamp: None,
        };
        let change = GenChange::add;
        let state = State::open(v).unwrap();
        let counters = Counters::default();
        let req = PrepareRequest {
            venv: v.into(),
            source: "s".into(),
            target: "t".into(),
            plan_created: 0,
            changes: vec![
                change("big.so", file(&big, 0o755)),
                change("small.py", file(&small, 0o644)),
                change(
                    "link.so",
                    Kind::Symlink {
                        target: "big.so".into(),
                    },
                ),
            ],
            backup: false,
            resume: false,
            same_owner: false,
        };
        let g = state.prepare(&req, &counters).unwrap();
        let mut tar = tar::Builder::new(Vec::new());
        for (name, data, mode) in [("0", &big, 0o755), ("1", &small, 0o644)] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(mode);
            tar.append_data(&mut h, name, &data[..]).unwrap();
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(6);
        tar.append_data(&mut h, "2", &b"big.so"[..]).unwrap();
        let stream = tar.into_inner().unwrap();
        // Blocks of odd sizes, as frames would cut it.
        let (tx, rx) = mpsc::sync_channel(stream.len() / 100_000 + 2);
        for piece in stream.chunks(100_003) {
            tx.send((piece.to_vec(), 0)).unwrap();
        }
        drop(tx);
        let (files, bytes, written) =
            unpack(&g, t.path(), ChannelReader::new(rx), &counters).unwrap();
        assert_eq!((files, bytes), (3, (big.len() + small.len()) as u64));
        let staging = g.dir.join("staging");
        assert!(fs::read(staging.join("0")).unwrap() == big);
        assert_eq!(fs::read(staging.join("1")).unwrap(), small);
        assert_eq!(
            fs::read_link(staging.join("2")).unwrap(),
            Path::new("big.so")
        );
        let mode = |p: &str| fs::metadata(staging.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!((mode("0"), mode("1")), (0o755, 0o644));
        let mut digests: Vec<(usize, String)> =
            written.into_iter().map(|w| (w.index, w.blake3)).collect();
        digests.sort();
        assert_eq!(digests, vec![(0, hex(&big)), (1, hex(&small))]);
    }

    /// `write_chunk` finishes an `O_DIRECT` file through the page cache
    /// where its tail is not a whole block, on any filesystem.
    #[test]
    fn a_direct_write_with_a_ragged_tail_is_exact() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        let f = File::create(&p).unwrap();
        let on = set_direct(&f, true);
        assert_eq!(is_direct(&f), on);
        let mut buf = AlignedBuf::new(3 * DIRECT_ALIGN);
        for (i, b) in buf.get().iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let want: Vec<u8> = buf.get()[..2 * DIRECT_ALIGN + 5].to_vec();
        write_chunk(&f, &buf.get()[..2 * DIRECT_ALIGN + 5], true).unwrap();
        assert!(!is_direct(&f), "the tail is written without O_DIRECT");
        drop(f);
        assert!(fs::read(&p).unwrap() == want);
    }

    /// Feed window rates (bytes/s) per level; returns the level after each.
    fn run(t: &mut Tuner, rate_at: impl Fn(i32, usize) -> f64, windows: usize) -> Vec<i32> {
        (0..windows)
            .map(|w| {
                let r = rate_at(t.level(), w);
                t.record(r);
                t.level()
            })
            .collect()
    }

    #[test]
    fn the_tuner_drops_compression_that_does_not_pay() {
        // Disk-bound: stored and zstd 1 move the same; the cheaper wins.
        let mut t = Tuner::new();
        let levels = run(
            &mut t,
            |l, _| match l {
                0 | 1 => 100.0,
                _ => 60.0,
            },
            64,
        );
        let at_zero = levels.iter().filter(|&&l| l == 0).count();
        assert!(at_zero >= 56, "{levels:?}");
    }

    #[test]
    fn the_tuner_adds_compression_only_when_it_clearly_pays() {
        // Link-bound: zstd 1 beats stored, zstd 3 only by 4%: stay at 1.
        let mut t = Tuner::new();
        let levels = run(
            &mut t,
            |l, _| match l {
                0 => 60.0,
                1 => 100.0,
                3 => 104.0,
                _ => 50.0,
            },
            64,
        );
        let at_one = levels.iter().filter(|&&l| l == 1).count();
        assert!(at_one >= 56, "{levels:?}");
    }

    #[test]
    fn the_tuner_moves_to_a_clearly_faster_level_and_stays() {
        // On a fast link stored wins by 40%: after the first probe it stays
        // there, probing less and less often.
        let mut t = Tuner::new();
        let levels = run(
            &mut t,
            |l, _| match l {
                0 => 140.0,
                1 => 100.0,
                _ => 50.0,
            },
            64,
        );
        assert_eq!(levels[0], 0, "{levels:?}");
        let at_zero = levels.iter().filter(|&&l| l == 0).count();
        assert!(at_zero >= 56, "{levels:?}");
    }

    #[test]
    fn the_tuner_is_not_fooled_by_one_fast_window() {
        // Windows alternate between fast and slow content at every level;
        // level 1 is truly best. A probe that lands on a fast window may
        // win, but the level it left wins back soon after.
        let mut t = Tuner::new();
        let levels = run(
            &mut t,
            |l, w| {
                let base = match l {
                    0 => 80.0,
                    1 => 100.0,
                    3 => 70.0,
                    _ => 30.0,
                };
                if w % 2 == 0 { base * 1.5 } else { base }
            },
            96,
        );
        let at_one = levels.iter().filter(|&&l| l == 1).count();
        assert!(at_one >= 70, "{levels:?}");
    }
}
