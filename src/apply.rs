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

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::atomic::{AtomicBool, AtomicI32};
use std::sync::{Arc, Mutex, mpsc};

use crate::agent::protocol::{
    Compression, FileStamp, Kind, Progress, Response, SendFile, ShebangRewrite, write_data_parts,
    write_frame,
};
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::{ContentHasher, Counters, Venv, content_hex, rewrite_shebang};
use crate::journal::{Generation, free_bytes};
use crate::plan::Action;

/// Bytes of the tar stream per block; each block is packed on its own.
pub const BLOCK: usize = 1 << 20;
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
            .map_err(|e| err!("a block of the stream does not decompress: {e}")),
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
    use crate::agent::client::Client;
    use crate::agent::protocol::Request;
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
        written.iter().map(|(i, _, st)| (*i, st)).collect();
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

/// Read, check and hash the files into the tar stream.
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
    for f in files {
        let (abs, rel) = venv.resolve(&f.path)?;
        let changed = || {
            err!(
                hint = "the source changed since the plan; run `overlay plan` again",
                "Source file {} changed since the plan; nothing was applied",
                abs.display()
            )
        };
        let meta = fs::symlink_metadata(&abs).map_err(|_| changed())?;
        let mut h = tar::Header::new_gnu();
        h.set_uid(std::os::unix::fs::MetadataExt::uid(&meta) as u64);
        h.set_gid(std::os::unix::fs::MetadataExt::gid(&meta) as u64);
        h.set_mtime(std::os::unix::fs::MetadataExt::mtime(&meta).max(0) as u64);
        let name = f.index.to_string();
        match &f.kind {
            Kind::Symlink { target } => {
                let now = fs::read_link(&abs).map_err(|_| changed())?;
                if now.to_string_lossy() != *target {
                    return Err(changed());
                }
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                h.set_mode(0o777);
                tar.append_link(&mut h, &name, target)
                    .map_err(|e| err!("Failed to stream {}: {e}", abs.display()))?;
            }
            Kind::File {
                size,
                mode,
                blake3,
                stamp,
            } => {
                // Unhashed in the plan: the stamp must be as the plan saw it.
                if !meta.is_file() || (blake3.is_none() && *stamp != Some(FileStamp::of(&meta))) {
                    return Err(changed());
                }
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(*size);
                let file = File::open(&abs)
                    .map_err(|e| err!("Failed to read {}: {}", abs.display(), io_cause(&e)))?;
                let digest =
                    if rel.starts_with("bin/") && meta.len() < (1 << 20) && shebang.is_some() {
                        let mut content = Vec::new();
                        { file }.read_to_end(&mut content).map_err(|e| {
                            err!("Failed to read {}: {}", abs.display(), io_cause(&e))
                        })?;
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
                        if meta.len() != *size {
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
                    None if fs::symlink_metadata(&abs).map(|m| FileStamp::of(&m)).ok()
                        != *stamp =>
                    {
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

/// A staged file: its change index, the blake3 written, and its stamp.
pub type Written = (usize, String, FileStamp);

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
    owner: Option<(Option<u32>, Option<u32>)>,
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
                let _ = std::os::unix::fs::fchown(&**out, uid, gid);
            }
            out.set_permissions(fs::Permissions::from_mode(fin.mode))
                .map_err(|e| stage_error(&dest(), e, host_dir, g))?;
            let stamp = out
                .metadata()
                .map_err(|e| stage_error(&dest(), e, host_dir, g))?;
            written.push((job.index, fin.digest, FileStamp::of(&stamp)));
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

fn unpack_into(
    g: &Generation,
    host_dir: &Path,
    input: ChannelReader,
    counters: &Counters,
    direct: bool,
    jobs: mpsc::SyncSender<WriteJob>,
    free: mpsc::Receiver<AlignedBuf>,
) -> Result<(u64, u64)> {
    let staging = g.dir.join("staging");
    let stopped = || err!("the staging writer stopped");
    let next_buf = || free.recv().map_err(|_| stopped());
    let mut buf = next_buf()?;
    let is_root = rustix::process::geteuid().is_root();
    let mut archive = tar::Archive::new(input);
    let mut seen = vec![false; g.meta.changes.len()];
    let (mut files, mut bytes) = (0u64, 0u64);
    let entries = archive
        .entries()
        .map_err(|e| err!("Failed to read the stream: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| err!("Failed to read the stream: {e}"))?;
        let name = entry
            .path()
            .map_err(|e| err!("bad entry in the stream: {e}"))?
            .to_string_lossy()
            .into_owned();
        let i: usize = name
            .parse()
            .map_err(|_| err!("unexpected entry {name:?} in the stream"))?;
        let c = g
            .meta
            .changes
            .get(i)
            .filter(|c| c.action != Action::Delete)
            .ok_or_else(|| err!("unexpected entry {i} in the stream"))?;
        if std::mem::replace(&mut seen[i], true) {
            return Err(err!("entry {i} appears twice in the stream"));
        }
        let dest = staging.join(i.to_string());
        let header = entry.header().clone();
        let owner = is_root.then(|| {
            (
                header.uid().ok().map(|u| u as u32),
                header.gid().ok().map(|u| u as u32),
            )
        });
        match (&c.source, header.entry_type()) {
            (Some(Kind::Symlink { target }), tar::EntryType::Symlink) => {
                let link = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .map(|l| l.to_string_lossy().into_owned());
                if link.as_deref() != Some(target.as_str()) {
                    return Err(err!(
                        "{} arrived with link target {link:?}, the plan says {target:?}",
                        c.path
                    ));
                }
                std::os::unix::fs::symlink(target, &dest)
                    .map_err(|e| stage_error(&dest, e, host_dir, g))?;
                if let Some((uid, gid)) = owner {
                    let _ = std::os::unix::fs::lchown(&dest, uid, gid);
                }
            }
            (
                Some(Kind::File {
                    size, mode, blake3, ..
                }),
                tar::EntryType::Regular,
            ) => {
                let out = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&dest)
                    .map_err(|e| stage_error(&dest, e, host_dir, g))?;
                if direct && *size >= DIRECT_MIN {
                    set_direct(&out, true);
                }
                let out = Arc::new(out);
                let mut hasher = ContentHasher::new();
                let (mut n_total, mut fill) = (0u64, 0usize);
                loop {
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
                    let space = &mut buf.get()[fill..];
                    let n = entry
                        .read(space)
                        .map_err(|e| err!("Failed to read the stream: {e}"))?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&space[..n]);
                    fill += n;
                    n_total += n as u64;
                    counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                let digest = content_hex(&hasher);
                if n_total != *size || blake3.as_ref().is_some_and(|want| *want != digest) {
                    return Err(err!(
                        hint = "run `overlay apply` again; if it repeats, check the source file and the network",
                        "{} arrived damaged (blake3 {digest}, {n_total} bytes; the plan says {} bytes)",
                        c.path,
                        size
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
            (expected, got) => {
                return Err(err!(
                    "{} arrived as {got:?}, the plan expects {expected:?}",
                    c.path
                ));
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The target's side of a stream: a file bigger than two write chunks
    /// (written around the page cache, with an unaligned tail), a small one
    /// and a symlink arrive intact in staging, with their modes, and the
    /// digests the writer reports are what arrived.
    #[test]
    fn unpack_stages_big_and_small_files_exactly() {
        use crate::journal::{GenChange, PrepareRequest, State};
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
        let change = |path: &str, source| GenChange {
            path: path.into(),
            action: Action::Add,
            source: Some(source),
            target: None,
            bytecode: false,
            staged: None,
        };
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
        h.set_size(0);
        tar.append_link(&mut h, "2", "big.so").unwrap();
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
            written.into_iter().map(|(i, d, _)| (i, d)).collect();
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
