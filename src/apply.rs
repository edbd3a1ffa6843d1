//! The transfer: the source agent reads exactly the added and replaced files
//! into one tar stream, compressed with zstd and cut into data frames; the
//! target agent decompresses and unpacks it into the generation's staging
//! folder. Both ends hash while they stream, so a file that changed since
//! the plan, or was damaged on the way, is caught without a second pass.
//!
//! The stream is pipelined end to end: on the source, reading feeds the
//! zstd workers that feed the connection; on the target, one thread reads
//! frames while another decompresses and writes. Neither side holds more than
//! a few megabytes; the controller only relays frames.
//!
//! Tar entries are named by their index in the generation's change list, and
//! the target writes each to `staging/<index>`: a name in the stream never
//! chooses where a file lands.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use sha2::{Digest, Sha256};

use crate::agent::protocol::{
    FileStamp, Kind, Progress, Response, SendFile, ShebangRewrite, write_data, write_frame,
};
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::{Counters, Venv, hex, rewrite_shebang};
use crate::journal::{Generation, free_bytes};
use crate::plan::Action;

/// Size of a data frame on the wire.
const CHUNK: usize = 256 << 10;

/// Cuts a byte stream into data frames.
struct FrameWriter<'a> {
    out: &'a mut dyn Write,
    buf: Vec<u8>,
    sent: u64,
    frames: u64,
    counters: &'a Counters,
}

impl Write for FrameWriter<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush_frame()?;
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.flush_frame()?;
        self.out.flush()
    }
}

impl FrameWriter<'_> {
    fn flush_frame(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            write_data(self.out, &self.buf)?;
            self.sent += self.buf.len() as u64;
            self.buf.clear();
            self.frames += 1;
            if self.frames % 8 == 0 {
                let p = Progress {
                    files: self.counters.files.load(Ordering::Relaxed),
                    bytes: self.counters.bytes.load(Ordering::Relaxed),
                    total_files: self.counters.total_files.load(Ordering::Relaxed),
                    total_bytes: self.counters.total_bytes.load(Ordering::Relaxed),
                };
                write_frame(self.out, &Response::Progress(p))?;
            }
        }
        Ok(())
    }
}

/// A reader that hashes what passes through.
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Source side: write the files as tar + zstd data frames to `out`.
/// Returns (raw bytes, compressed bytes).
pub fn send(
    venv_root: &str,
    files: &[SendFile],
    shebang: Option<&ShebangRewrite>,
    level: i32,
    out: &mut dyn Write,
    counters: &Counters,
) -> Result<(u64, u64, Vec<(usize, String)>)> {
    let venv = Venv::open(venv_root)?;
    let mut hashes = Vec::with_capacity(files.len());
    counters
        .total_files
        .store(files.len() as u64, Ordering::Relaxed);
    counters
        .total_bytes
        .store(files.iter().map(|f| f.kind.size()).sum(), Ordering::Relaxed);
    let mut frames = FrameWriter {
        out,
        buf: Vec::with_capacity(CHUNK * 2),
        sent: 0,
        frames: 0,
        counters,
    };
    let mut enc =
        zstd::stream::write::Encoder::new(&mut frames, level).map_err(|e| err!("zstd: {e}"))?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let _ = enc.multithread(threads);
    let mut tar = tar::Builder::new(enc);
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
                sha256,
                stamp,
            } => {
                // Unhashed in the plan: the stamp must be as the plan saw it.
                if !meta.is_file() || (sha256.is_none() && *stamp != Some(FileStamp::of(&meta))) {
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
                        hex(&Sha256::digest(&content))
                    } else {
                        if meta.len() != *size {
                            return Err(changed());
                        }
                        let mut r = HashingReader {
                            inner: file.take(*size),
                            hasher: Sha256::new(),
                        };
                        tar.append_data(&mut h, &name, &mut r)
                            .map_err(|e| err!("Failed to stream {}: {e}", abs.display()))?;
                        hex(&r.hasher.finalize())
                    };
                match sha256 {
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
    let enc = tar
        .into_inner()
        .map_err(|e| err!("Failed to finish the stream: {e}"))?;
    enc.finish()
        .map_err(|e| err!("Failed to finish the stream: {e}"))?;
    frames.flush().map_err(|e| err!("Failed to send: {e}"))?;
    Ok((raw, frames.sent, hashes))
}

/// A `Read` over chunks arriving on a channel.
pub struct ChannelReader {
    rx: mpsc::Receiver<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
}

impl ChannelReader {
    pub fn new(rx: mpsc::Receiver<Vec<u8>>) -> Self {
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
                Ok(v) => {
                    self.cur = v;
                    self.pos = 0;
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
pub fn unpack(
    g: &Generation,
    host_dir: &Path,
    input: ChannelReader,
    counters: &Counters,
) -> Result<(u64, u64, Vec<(usize, String)>)> {
    let staging = g.dir.join("staging");
    let mut written = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let is_root = rustix::process::geteuid().is_root();
    let dec = zstd::stream::read::Decoder::new(input).map_err(|e| err!("zstd: {e}"))?;
    let mut archive = tar::Archive::new(dec);
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
                if is_root {
                    let _ = std::os::unix::fs::lchown(
                        &dest,
                        header.uid().ok().map(|u| u as u32),
                        header.gid().ok().map(|u| u as u32),
                    );
                }
            }
            (
                Some(Kind::File {
                    size, mode, sha256, ..
                }),
                tar::EntryType::Regular,
            ) => {
                let mut out = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&dest)
                    .map_err(|e| stage_error(&dest, e, host_dir, g))?;
                let mut hasher = Sha256::new();
                let mut n_total = 0u64;
                loop {
                    let n = entry
                        .read(&mut buf)
                        .map_err(|e| err!("Failed to read the stream: {e}"))?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                    out.write_all(&buf[..n])
                        .map_err(|e| stage_error(&dest, e, host_dir, g))?;
                    n_total += n as u64;
                    counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                let digest = hex(&hasher.finalize());
                if n_total != *size || sha256.as_ref().is_some_and(|want| *want != digest) {
                    return Err(err!(
                        hint = "run `overlay apply` again; if it repeats, check the source file and the network",
                        "{} arrived damaged (sha256 {digest}, {n_total} bytes; the plan says {} bytes)",
                        c.path,
                        size
                    ));
                }
                if is_root {
                    let _ = std::os::unix::fs::fchown(
                        &out,
                        header.uid().ok().map(|u| u as u32),
                        header.gid().ok().map(|u| u as u32),
                    );
                }
                out.set_permissions(fs::Permissions::from_mode(*mode))
                    .map_err(|e| stage_error(&dest, e, host_dir, g))?;
                out.sync_all()
                    .map_err(|e| stage_error(&dest, e, host_dir, g))?;
                bytes += size;
                written.push((i, digest));
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
    if let Ok(d) = File::open(&staging) {
        let _ = d.sync_all();
    }
    Ok((files, bytes, written))
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
