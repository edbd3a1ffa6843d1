//! Writing a bundle ([`write`]): the index, then each entry in the index's
//! order, into a zstd-compressed tar with fixed headers, sealed by the
//! trailer. Where the files' bytes come from is the caller's
//! ([`Contents`]): `overlay pack` reads them from the source's stream
//! (`crate::ops::pack`), and every file is checked against the index's size
//! and BLAKE3 as it is written, so a bundle never holds bytes its index
//! does not vouch for.

use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::{INDEX_NAME, LEVEL, SKIPPABLE_MAGIC, TAG, TRAILER};
use crate::err;
use crate::error::{Result, io_cause};
use crate::model::{BundleEntry, BundleIndex, BundleKind};

/// A bundle written: its size and whole-file BLAKE3.
#[derive(Debug, Clone)]
pub struct Packed {
    pub bytes: u64,
    /// The BLAKE3 of the bytes before the trailer (the trailer's own hash).
    pub blake3: String,
}

/// Where a bundle's files and symlinks come from, asked for in the
/// index's order (directories need nothing).
pub trait Contents {
    /// The next file, `entry` of `size` bytes: its modification time (whole
    /// seconds, carried in its header) and a reader of its bytes.
    fn file<'a>(&'a mut self, entry: &BundleEntry, size: u64) -> Result<(u64, Box<dyn Read + 'a>)>;
    /// The next symlink, `entry`, which must point to `target`.
    fn symlink(&mut self, entry: &BundleEntry, target: &str) -> Result<()>;
    /// How to name `path` (relative to the venv) in an error.
    fn shown(&self, path: &str) -> String;
    /// After the last entry, before the bundle is kept. An error here
    /// leaves no bundle.
    fn end(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A member's header: mtime 0, uid and gid 0, no names.
pub(super) fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode & 0o7777);
    h.set_size(size);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// Write the bundle of `index` to `out` atomically (a temporary file beside
/// it, renamed over it once complete and synced), taking each file's bytes
/// and each symlink's check from `contents`, in one read of them. Each file
/// is checked against the index's size and hash as it is written; a file
/// whose hash the index leaves empty is hashed as it is written, and the
/// index records that hash.
///
/// The index is the tar's first member, but it is complete only once the
/// last file has been read. So the entries are written first, compressed,
/// at an offset that leaves room for the index's own zstd frame (the most
/// zstd can make of its member, whose length is known before the hashes
/// are: every hash is 64 hex digits); then the index's frame goes at the
/// start, and a skippable frame fills the rest of its room. A reader sees
/// one zstd stream of one tar; the bytes depend only on the files.
pub fn write(index: &mut BundleIndex, contents: &mut dyn Contents, out: &Path) -> Result<Packed> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let failed = |e: &dyn std::fmt::Display| {
        err!(
            hint = "check that the folder exists and has room, or write elsewhere with -o",
            "Cannot write the bundle {}: {e}",
            out.display()
        )
    };
    let io = |e: io::Error| failed(&io_cause(&e));
    let tmp = tempfile::Builder::new()
        .prefix(".overlay-pack.")
        .tempfile_in(&dir)
        .map_err(|e| failed(&io_cause(&e)))?;
    let mut file = tmp.as_file().try_clone().map_err(|e| failed(&e))?;
    let unhashed: Vec<bool> = index
        .entries
        .iter_mut()
        .map(|e| match &mut e.kind {
            BundleKind::File { blake3, .. } if blake3.is_empty() => {
                *blake3 = UNHASHED.to_string();
                true
            }
            _ => false,
        })
        .collect();
    let room = zstd::zstd_safe::compress_bound(index_member(index, &failed)?.len()) as u64
        + SKIPPABLE_HEAD;
    file.seek(SeekFrom::Start(room)).map_err(io)?;
    {
        let mut sink = BufWriter::with_capacity(1 << 20, &mut file);
        let enc = encoder(&mut sink, compress_workers()).map_err(io)?;
        let mut tar = tar::Builder::new(enc);
        for (e, unhashed) in index.entries.iter_mut().zip(unhashed) {
            let read = append(&mut tar, e, contents, unhashed, &failed)?;
            if let (Some(h), BundleKind::File { blake3, .. }) = (read, &mut e.kind) {
                *blake3 = h;
            }
        }
        let enc = tar.into_inner().map_err(io)?;
        enc.finish().map_err(io)?;
        sink.flush().map_err(io)?;
    }
    contents.end()?;
    let body = file.stream_position().map_err(io)?;
    let frame = zstd::bulk::compress(&index_member(index, &failed)?, LEVEL).map_err(io)?;
    let gap = room
        .checked_sub(frame.len() as u64 + SKIPPABLE_HEAD)
        .ok_or_else(|| err!(kind = Internal, "the bundle's index outgrew its room"))?;
    let mut head = frame;
    head.extend_from_slice(&PAD_MAGIC.to_le_bytes());
    head.extend_from_slice(&(gap as u32).to_le_bytes());
    head.resize(room as usize, 0);
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    file.write_all(&head).map_err(io)?;
    let digest = hash_of(&mut file, body).map_err(io)?;
    file.seek(SeekFrom::Start(body)).map_err(io)?;
    file.write_all(&trailer(&digest, body)).map_err(io)?;
    // Not secret: readable as any copied file (the temporary one is 0600).
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .map_err(io)?;
    file.sync_all().map_err(io)?;
    tmp.persist(out).map_err(|e| io(e.error))?;
    Ok(Packed {
        bytes: body + TRAILER,
        blake3: digest.to_hex().to_string(),
    })
}

/// What an index's hash holds while its file is still to be read: as long
/// as a BLAKE3 in hex, so the index's length is known before the hashes.
const UNHASHED: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// The skippable frame that fills the rest of the index's room (a magic of
/// its own, not the trailer's).
const PAD_MAGIC: u32 = 0x184D_2A5D;
/// A skippable frame's magic and size.
const SKIPPABLE_HEAD: u64 = 8;

/// The index as the tar's first member: its header, its JSON, padded to
/// the tar's 512-byte blocks (no end-of-archive: the entries follow).
fn index_member(
    index: &BundleIndex,
    failed: &dyn Fn(&dyn std::fmt::Display) -> crate::error::Error,
) -> Result<Vec<u8>> {
    let json = serde_json::to_vec(index).map_err(|e| failed(&e))?;
    let mut h = header(tar::EntryType::Regular, 0o644, json.len() as u64);
    h.set_path(INDEX_NAME).map_err(|e| failed(&e))?;
    h.set_cksum();
    let mut member = h.as_bytes().to_vec();
    member.extend_from_slice(&json);
    member.resize(member.len().div_ceil(512) * 512, 0);
    Ok(member)
}

/// The BLAKE3 of the first `len` bytes of `file`, read back in large
/// pieces each hashed on every core.
fn hash_of(file: &mut std::fs::File, len: u64) -> io::Result<blake3::Hash> {
    file.seek(SeekFrom::Start(0))?;
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 16 << 20];
    let mut left = len;
    while left > 0 {
        let n = (left.min(buf.len() as u64)) as usize;
        file.read_exact(&mut buf[..n])?;
        hasher.update_rayon(&buf[..n]);
        left -= n as u64;
    }
    Ok(hasher.finalize())
}

/// Threads that compress a bundle: one per core (at least one).
fn compress_workers() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// The bundle's zstd stream at [`LEVEL`], compressed by `workers` threads
/// (zstd's multi-threaded streaming mode; `workers` ≥ 1). Its bytes do not
/// depend on `workers`, so a bundle packed on a 2-core machine and on a
/// 128-core one are the same file (`tests::workers_do_not_change_the_bytes`);
/// they differ from zstd's single-threaded mode, which no bundle uses.
fn encoder<W: Write>(w: W, workers: u32) -> io::Result<zstd::Encoder<'static, W>> {
    let mut enc = zstd::Encoder::new(w, LEVEL)?;
    enc.multithread(workers.max(1))?;
    Ok(enc)
}

/// One entry of the index, as the member `venv/PATH`. A file whose hash
/// the index does not know yet (`unhashed`) is hashed as it is written:
/// that hash is returned.
fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    e: &BundleEntry,
    contents: &mut dyn Contents,
    unhashed: bool,
    failed: &dyn Fn(&dyn std::fmt::Display) -> crate::error::Error,
) -> Result<Option<String>> {
    let io = |err: io::Error| failed(&io_cause(&err));
    let name = format!("venv/{}", e.path);
    match &e.kind {
        BundleKind::Dir { mode } => {
            let mut h = header(tar::EntryType::Directory, *mode, 0);
            tar.append_data(&mut h, format!("{name}/"), io::empty())
                .map_err(io)?;
        }
        BundleKind::Symlink { target } => {
            contents.symlink(e, target)?;
            let mut h = header(tar::EntryType::Symlink, 0o777, 0);
            tar.append_link(&mut h, &name, target).map_err(io)?;
        }
        BundleKind::File { size, mode, blake3 } => {
            let shown = contents.shown(&e.path);
            let (mtime, reader) = contents.file(e, *size)?;
            let mut reader = Checked {
                inner: reader.take(*size),
                hasher: blake3::Hasher::new(),
                count: 0,
            };
            let mut h = header(tar::EntryType::Regular, *mode, *size);
            h.set_mtime(mtime);
            tar.append_data(&mut h, &name, &mut reader).map_err(io)?;
            let read = reader.hasher.finalize().to_hex().to_string();
            if reader.count != *size || (!unhashed && read != *blake3) {
                return Err(failed(&format!("{shown} changed while it was packed")));
            }
            if unhashed {
                return Ok(Some(read));
            }
        }
    }
    Ok(None)
}

/// The trailer after `body` bytes whose BLAKE3 is `digest`.
pub(super) fn trailer(digest: &blake3::Hash, body: u64) -> Vec<u8> {
    let mut t = Vec::with_capacity(TRAILER as usize);
    t.extend_from_slice(&SKIPPABLE_MAGIC.to_le_bytes());
    t.extend_from_slice(&((TRAILER - 8) as u32).to_le_bytes());
    t.extend_from_slice(TAG);
    t.extend_from_slice(digest.as_bytes());
    t.extend_from_slice(&body.to_le_bytes());
    t
}

/// A reader that hashes and counts what it reads.
pub(super) struct Checked<R: Read> {
    pub(super) inner: R,
    pub(super) hasher: blake3::Hasher,
    pub(super) count: u64,
}

impl<R: Read> Read for Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// A venv-shaped folder holding exactly the index's entries, as contents
/// (bundles made by hand: tests, fixtures). Its symlinks are not checked.
pub struct Folder(pub PathBuf);

impl Contents for Folder {
    fn file<'a>(&'a mut self, e: &BundleEntry, _: u64) -> Result<(u64, Box<dyn Read + 'a>)> {
        let f = std::fs::File::open(self.0.join(&e.path))
            .map_err(|err| err!("{}: {}", self.shown(&e.path), io_cause(&err)))?;
        let mtime = f
            .metadata()
            .map(|m| std::os::unix::fs::MetadataExt::mtime(&m).max(0) as u64)
            .unwrap_or(0);
        Ok((mtime, Box::new(f)))
    }
    fn symlink(&mut self, _: &BundleEntry, _: &str) -> Result<()> {
        Ok(())
    }
    fn shown(&self, path: &str) -> String {
        self.0.join(path).display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bundle's bytes are the same whatever the number of compressing
    /// threads: 40 MB of mixed data (several of zstd's jobs), compressed
    /// by 1, 2 and 5 workers, written in uneven pieces.
    #[test]
    fn workers_do_not_change_the_bytes() {
        let mut data = Vec::with_capacity(40 << 20);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        while data.len() < 40 << 20 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Runs of text and of noise, so that it compresses unevenly.
            if x.is_multiple_of(3) {
                data.extend_from_slice(&x.to_le_bytes());
            } else {
                data.extend_from_slice(b"import torch  # a line of python\n");
            }
        }
        let pack = |workers: u32| {
            let mut enc = encoder(Vec::new(), workers).unwrap();
            for piece in data.chunks(777_777) {
                enc.write_all(piece).unwrap();
            }
            enc.finish().unwrap()
        };
        let one = pack(1);
        assert!(one.len() < data.len());
        assert!(pack(2) == one, "2 workers gave other bytes than 1");
        assert!(pack(5) == one, "5 workers gave other bytes than 1");
        assert_eq!(zstd::decode_all(one.as_slice()).unwrap(), data);
    }
}
