//! Making many changes durable at once, and which barrier a file system
//! gets ([`barrier`]). A staging of 15,000 files and a switch that touches
//! 2,000 directories cost one journal commit of the file system each per
//! fsync (ext4, XFS: a commit and a cache flush of the disk); one
//! `syncfs(2)` of the file system instead writes back every dirty page and
//! all metadata (inodes, directory entries, renames) of it and waits for
//! that, in one commit.
//!
//! That holds only where the file system's own `sync_fs` writes back and
//! commits file data: the local file systems of [`SYNCFS_WRITES_BACK`]. On
//! FUSE, `syncfs` never reaches the daemon (LazyFS lost every staged file's
//! data after one); on NFS, CIFS and the cluster file systems (Lustre, GPFS,
//! BeeGFS, Ceph) it is not what makes data durable on the server either.
//! Those, overlayfs and every file system not in the list get an fsync per
//! file and per directory, which each of them passes on to its storage.
//!
//! `syncfs` reports a writeback error of any file of the file system that
//! happened since the fd it is given was opened only from Linux 5.8 on;
//! before that it says nothing of them, so there every file system gets the
//! fsyncs too. An fd for [`sync_fs`] is opened before the writes it vouches
//! for.

use std::os::fd::AsFd;

/// Whether the kernel reports writeback errors through `syncfs` (Linux
/// 5.8 and later): without that, no file system gets [`Barrier::Syncfs`].
fn kernel_reports_syncfs_errors() -> bool {
    static BATCHED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BATCHED.get_or_init(|| {
        let u = rustix::system::uname();
        kernel_at_least(&u.release().to_string_lossy(), (5, 8))
    })
}

/// The file systems whose `syncfs` writes back and commits every file's
/// data, inodes and directory entries, as an fsync of each would (their
/// `super_operations.sync_fs` commits the journal or the log, after the
/// generic writeback of every dirty inode): `f_type` from `statfs(2)`, as
/// `include/uapi/linux/magic.h` and statfs(2) list them. tmpfs and ramfs
/// have nothing to write back (what they hold does not outlive a reboot).
pub const SYNCFS_WRITES_BACK: &[(u64, &str)] = &[
    (0xEF53, "ext4"), // ext2, ext3 and ext4 share it
    (0x5846_5342, "xfs"),
    (0x9123_683E, "btrfs"),
    (0xF2F5_2010, "f2fs"),
    (0xCA45_1A4E, "bcachefs"),
    (0x3153_464A, "jfs"),
    (0x5265_4973, "reiserfs"),
    (0x0102_1994, "tmpfs"),
    (0x8584_58F6, "ramfs"),
];

/// File systems known to need an fsync per file and per directory, named
/// for messages and `history` (any other gets its hex `f_type`).
const FSYNC_ONLY: &[(u64, &str)] = &[
    (0x6573_5546, "fuse"),
    (0x6969, "nfs"),
    (0xFF53_4D42, "cifs"),
    (0xFE53_4D42, "smb2"),
    (0x0BD0_0BD0, "lustre"),
    (0x4750_4653, "gpfs"),
    (0x1983_0326, "beegfs"),
    (0x00C3_6400, "ceph"),
    (0x0116_1970, "gfs2"),
    (0x7461_636F, "ocfs2"),
    (0x0102_1997, "9p"),
    (0x794C_7630, "overlayfs"),
    (0x2FC1_2FC1, "zfs"),
];

/// The barrier that makes a stage and a switch durable on one file system.
pub use crate::model::Barrier;

/// The barrier for a file system of `statfs` type `f_type`, on a kernel
/// that does (`reports_errors`) or does not report writeback errors
/// through `syncfs`.
pub fn barrier_for_type(f_type: u64, reports_errors: bool) -> Barrier {
    if reports_errors && SYNCFS_WRITES_BACK.iter().any(|(m, _)| *m == f_type) {
        Barrier::Syncfs
    } else {
        Barrier::Fsync
    }
}

/// The name of a file system type (`ext4`, `fuse`), or its hex `f_type`.
pub fn fs_type_name(f_type: u64) -> String {
    SYNCFS_WRITES_BACK
        .iter()
        .chain(FSYNC_ONLY)
        .find(|(m, _)| *m == f_type)
        .map_or_else(|| format!("{f_type:#x}"), |(_, n)| (*n).to_string())
}

/// The `statfs` type of the file system `fd` is on.
fn fs_type(fd: impl AsFd) -> Option<u64> {
    // f_type is signed on some targets: its bits are the magic.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::fstatfs(fd)
        .ok()
        .map(|s| s.f_type as u64 as u32 as u64)
}

/// The barrier every one of `fds`' file systems allows: [`Barrier::Syncfs`]
/// only where all of them are in [`SYNCFS_WRITES_BACK`] (and the kernel
/// reports errors through it); an fd whose file system cannot be read gets
/// the fsyncs.
pub fn barrier(fds: &[std::os::fd::BorrowedFd<'_>]) -> Barrier {
    let reports = kernel_reports_syncfs_errors();
    let all = fds
        .iter()
        .all(|fd| fs_type(fd).is_some_and(|t| barrier_for_type(t, reports) == Barrier::Syncfs));
    if all { Barrier::Syncfs } else { Barrier::Fsync }
}

/// What a generation records of its durability: the file system of the
/// venv (and of the state folder, when another) and the barrier chosen.
pub fn durability(venv: impl AsFd, state: impl AsFd) -> crate::model::Durability {
    let (v, s) = (fs_type(&venv), fs_type(&state));
    let name = |t: Option<u64>| t.map_or_else(|| "unknown".to_string(), fs_type_name);
    let fs = if v == s || device(&venv) == device(&state) {
        name(v)
    } else {
        format!("{}, state folder {}", name(v), name(s))
    };
    crate::model::Durability {
        fs,
        barrier: barrier(&[venv.as_fd(), state.as_fd()]),
    }
}

/// Whether a kernel release string (`6.8.0-49-generic`) is `want` or later.
fn kernel_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= want,
        _ => false,
    }
}

/// Write back and wait for everything of the file system `fd` is on;
/// fails if any of it failed to reach the disk since `fd` was opened.
pub fn sync_fs(fd: impl AsFd) -> std::io::Result<()> {
    rustix::fs::syncfs(fd).map_err(Into::into)
}

/// Start writing `file`'s dirty pages back, without waiting for them (so
/// that the closing [`sync_fs`] finds little left to write).
pub fn start_writeback(file: &impl AsFd) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain syscall on a valid fd; it reads no memory of ours.
    unsafe {
        libc::sync_file_range(file.as_fd().as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// The device of `fd`'s file system, to tell whether two fds share one.
pub fn device(fd: impl AsFd) -> Option<u64> {
    rustix::fs::fstat(fd).ok().map(|s| s.st_dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(kernel_at_least("6.8.0-49-generic", (5, 8)));
        assert!(kernel_at_least("5.8.0", (5, 8)));
        assert!(kernel_at_least("5.10.226+", (5, 8)));
        assert!(!kernel_at_least("5.4.0-150-generic", (5, 8)));
        assert!(!kernel_at_least("4.19.0", (5, 8)));
        assert!(!kernel_at_least("garbage", (5, 8)));
    }

    #[test]
    fn syncfs_only_where_the_file_system_writes_data_back_through_it() {
        for (magic, name) in SYNCFS_WRITES_BACK {
            assert_eq!(barrier_for_type(*magic, true), Barrier::Syncfs, "{name}");
            // An old kernel does not report writeback errors through it.
            assert_eq!(barrier_for_type(*magic, false), Barrier::Fsync, "{name}");
        }
        for (magic, name) in FSYNC_ONLY {
            assert_eq!(barrier_for_type(*magic, true), Barrier::Fsync, "{name}");
        }
        // Unknown: the fsyncs.
        assert_eq!(barrier_for_type(0x1234_5678, true), Barrier::Fsync);
        assert_eq!(fs_type_name(0xEF53), "ext4");
        assert_eq!(fs_type_name(0x6573_5546), "fuse");
        assert_eq!(fs_type_name(0x1234_5678), "0x12345678");
    }

    #[test]
    fn the_barrier_of_a_real_directory_follows_its_file_system() {
        let t = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(t.path()).unwrap();
        let t = fs_type(&dir).unwrap();
        let want = barrier_for_type(t, kernel_reports_syncfs_errors());
        assert_eq!(barrier(&[dir.as_fd()]), want);
        let d = durability(&dir, &dir);
        assert_eq!((d.fs, d.barrier), (fs_type_name(t), want));
    }

    #[test]
    fn a_file_written_and_synced_through_its_file_system_is_there() {
        let t = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(t.path()).unwrap();
        std::fs::write(t.path().join("f"), b"x").unwrap();
        let f = std::fs::File::open(t.path().join("f")).unwrap();
        start_writeback(&f);
        sync_fs(&dir).unwrap();
        assert_eq!(device(&dir), device(&f));
    }
}
