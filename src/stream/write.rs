//! The target's staged-file writer. The unpacker hands it chunks of each
//! file ([`WriteJob`], in [`AlignedBuf`]s); the writer thread
//! ([`write_staged`]) writes them, finishes each file (owner, mode, stamp)
//! and passes it to the fsync threads ([`staged_durably`]), so that neither a
//! wait on the disk nor an fsync stalls the stream.
//!
//! Big files bypass the page cache (`O_DIRECT`, [`DIRECT_MIN`] and up, on
//! the local block filesystems of [`direct_io_fs`]): every staged file is
//! fsynced before the switch anyway, so caching its pages gains nothing,
//! while copying gigabytes into the cache costs the host CPU and evicts
//! what its workloads keep hot. A tail that is not a whole block, or a
//! filesystem that refuses, is written through the page cache.
//!
//! Every staged file is durable before the stage is reported done, so
//! before any switch. Where one `syncfs` writes back and vouches for every
//! file of the staging file system ([`durable::barrier`]: ext4, XFS, btrfs
//! and the like, on Linux 5.8+, which reports writeback errors through
//! it), the fsync threads only start
//! each finished file's writeback (`sync_file_range`), and the stage ends
//! with one `syncfs` of the staging file system through an fd opened
//! before the first write ([`staged_durably`]): it
//! waits for every staged file's data, inode and directory entry, and fails
//! if any of them failed to reach the disk, in one journal commit instead
//! of one per file. Elsewhere (FUSE, NFS, an unknown file system) each
//! file is fsynced on its own, and then the staging directory.
//!
//! As root, a staged file's owner is that of the file it replaces or the
//! directory it lands in ([`Owners`]), or with `apply --same-owner` the
//! source's; its mode is masked to `0o777` whatever the plan says.

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};

use crate::err;
use crate::error::{Error, Result, io_cause};
use crate::inventory::Venv;
use crate::journal::{Generation, durable, free_bytes};
use crate::model::{FileStamp, Kind, Written};

/// Staged files are written in chunks of this many bytes.
pub(super) const WRITE_CHUNK: usize = 4 << 20;
/// Chunk buffers in flight between the unpacker and the writer.
pub(super) const WRITE_BUFFERS: usize = 4;
/// Staged files at least this big are written with `O_DIRECT`.
pub(super) const DIRECT_MIN: u64 = 4 << 20;
/// What `O_DIRECT` asks of buffer addresses, file offsets and lengths; 4096
/// covers every common block device (a larger need shows as `EINVAL`, and
/// the file is finished through the page cache).
pub(super) const DIRECT_ALIGN: usize = 4096;

/// A zeroed buffer whose usable part starts on a `DIRECT_ALIGN` boundary.
pub(super) struct AlignedBuf {
    mem: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub(super) fn new(len: usize) -> AlignedBuf {
        let mem = vec![0u8; len + DIRECT_ALIGN];
        let start = mem.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf { mem, start, len }
    }
    pub(super) fn get(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + self.len]
    }
}

/// A chunk of a staged file for the writer: the first `len` bytes of `buf`
/// go at the file's current offset.
pub(super) struct WriteJob {
    pub(super) index: usize,
    pub(super) file: Arc<File>,
    pub(super) buf: AlignedBuf,
    pub(super) len: usize,
    /// On a file's last chunk: how to finish it.
    pub(super) last: Option<Finish>,
}

/// What the writer does to a staged file after its last byte.
pub(super) struct Finish {
    pub(super) digest: String,
    pub(super) mode: u32,
    /// Owner to set (when running as root).
    pub(super) owner: Option<(u32, u32)>,
    /// Modification time to set (the source's): bytecode carried with a
    /// `.py` stays valid only if the `.py` keeps its mtime.
    pub(super) mtime: Option<std::time::SystemTime>,
}

/// Give a staged file the source's modification time (rsync -t, tar x):
/// best effort, as the owner is. Set last, after the writes, which move it.
pub(super) fn set_mtime(out: &File, mtime: Option<std::time::SystemTime>) {
    if let Some(t) = mtime {
        let _ = out.set_modified(t);
    }
}

/// A modification time in whole seconds since the epoch, as tar headers
/// and the stat the source sends carry it.
pub(super) fn mtime_of_secs(secs: Option<u64>) -> Option<std::time::SystemTime> {
    secs.map(|s| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s))
}

/// The writer thread: write each chunk, finish each file (owner, mode,
/// stamp) and hand it to the fsync threads. A big file bypasses the page
/// cache (`O_DIRECT`, set by the unpacker): every staged file is fsynced
/// before the switch anyway, so caching its pages gains nothing, while
/// copying gigabytes into the cache costs the host CPU and evicts what its
/// workloads keep hot (model weights, say). Where the filesystem refuses
/// `O_DIRECT`, the file is written the ordinary way.
pub(super) fn write_staged(
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
            set_mtime(out, fin.mtime);
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

/// The error of a stage whose writer thread went away (its own error, if
/// any, is the one reported).
pub(super) fn writer_stopped() -> Error {
    err!("the staging writer stopped")
}

/// Write `data` at `file`'s offset. With `O_DIRECT` on, a last chunk's tail
/// (past the last whole block) goes through the page cache.
pub(super) fn write_chunk(file: &File, data: &[u8], last: bool) -> std::io::Result<()> {
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
pub(super) fn direct_io_fs(dir: &Path) -> bool {
    const EXT4: u64 = 0xEF53;
    const XFS: u64 = 0x5846_5342;
    const BTRFS: u64 = 0x9123_683E;
    rustix::fs::statfs(dir).is_ok_and(|s| matches!(s.f_type as u64, EXT4 | XFS | BTRFS))
}

pub(super) fn is_direct(file: &File) -> bool {
    rustix::fs::fcntl_getfl(file).is_ok_and(|f| f.contains(rustix::fs::OFlags::DIRECT))
}

/// Turn `O_DIRECT` on or off for `file`; false if the filesystem refuses.
pub(super) fn set_direct(file: &File, on: bool) -> bool {
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

/// Who a staged file will belong to, when the agent runs as root: the
/// owner of the file it replaces, or of the directory it lands in (the
/// nearest that exists), looked up without following a symlink anywhere.
pub(super) struct Owners {
    root: Option<crate::beneath::Beneath>,
    site_rel: String,
}

impl Owners {
    pub(super) fn new(host_dir: &Path) -> Owners {
        let site_rel = Venv::open(&host_dir.to_string_lossy())
            .map(|v| v.site_rel)
            .unwrap_or_default();
        Owners {
            root: crate::beneath::Beneath::open(host_dir).ok(),
            site_rel,
        }
    }

    /// The owner for the file at `path` (relative to site-packages).
    pub(super) fn of(&self, path: &str) -> Option<(u32, u32)> {
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

/// Where a stage hands each finished staged file, to be made durable.
pub(super) type SyncSender = mpsc::SyncSender<(Arc<File>, PathBuf)>;

/// Run `stage` (the stream's unpacker or the local route's copy) with a
/// sender to two fsync threads ([`sync_files`]) for every file it
/// finishes; then make the stage durable: wait for the threads and, where
/// one `syncfs` vouches for the stage, sync the staging file system
/// through an fd opened before the first write (see the module doc). The
/// stage's own error comes first: it explains a disk error it stopped on.
pub(super) fn staged_durably<T>(
    g: &Generation,
    host_dir: &Path,
    stage: impl FnOnce(SyncSender) -> Result<T>,
) -> Result<T> {
    let (sync_tx, sync_rx) = mpsc::sync_channel::<(Arc<File>, PathBuf)>(256);
    let sync_rx = Mutex::new(sync_rx);
    let staging_dir = g.dir.join("staging");
    let staging_fd =
        File::open(&staging_dir).map_err(|e| stage_error(&staging_dir, e, host_dir, g))?;
    // One syncfs only where the staging file system writes file data back
    // through it (`journal::durable`); an fsync per file elsewhere.
    let batched = durable::barrier(&[staging_fd.as_fd()]) == durable::Barrier::Syncfs;
    std::thread::scope(|scope| {
        let syncers: Vec<_> = (0..2)
            .map(|_| {
                let rx = &sync_rx;
                scope.spawn(move || sync_files(rx, host_dir, g, batched))
            })
            .collect();
        let staged = stage(sync_tx);
        let mut synced = Ok(());
        for s in syncers {
            let r = s
                .join()
                .unwrap_or_else(|_| Err(err!(kind = Internal, "an fsync thread panicked")));
            if synced.is_ok() {
                synced = r;
            }
        }
        let staged = staged?;
        synced?;
        if batched {
            // Every staged file's data, inode and name, in one commit.
            durable::sync_fs(&staging_fd).map_err(|e| stage_error(&staging_dir, e, host_dir, g))?;
        } else {
            let _ = staging_fd.sync_all();
        }
        Ok(staged)
    })
}

/// An fsync thread: fsync each staged file the writer finished, until the
/// writer is done; with `batched`, only start its writeback (the stage's
/// closing `syncfs` waits for it). Returns the first failure (the others
/// are the same disk's).
fn sync_files(
    files: &Mutex<mpsc::Receiver<(Arc<File>, PathBuf)>>,
    host_dir: &Path,
    g: &Generation,
    batched: bool,
) -> Result<()> {
    let mut first = Ok(());
    loop {
        let next = files.lock().ok().and_then(|r| r.recv().ok());
        let Some((f, dest)) = next else { break };
        if batched {
            durable::start_writeback(&*f);
            continue;
        }
        if let Err(e) = f.sync_all()
            && first.is_ok()
        {
            first = Err(stage_error(&dest, e, host_dir, g));
        }
    }
    first
}

/// Describe a write failure in staging; a full disk says how much is needed.
pub(super) fn stage_error(dest: &Path, e: std::io::Error, dir: &Path, g: &Generation) -> Error {
    if e.raw_os_error() == Some(28) {
        let need: u64 = g
            .meta
            .changes
            .iter()
            .filter_map(|c| c.source.as_ref())
            .map(Kind::size)
            .sum();
        let free = match free_bytes(dir) {
            Ok(Some(free)) => format!("{free} bytes are free"),
            _ => "its file system does not say how much is free".to_string(),
        };
        return err!(
            hint = "free space on that file system and run `overlay apply` again; the venv was not changed",
            "No space left on device while staging {}: the apply needs {need} bytes, {free}",
            dest.display()
        );
    }
    err!("Failed to write {}: {}", dest.display(), io_cause(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
