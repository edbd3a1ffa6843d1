//! Making many changes durable at once. A staging of 15,000 files and a
//! switch that touches 2,000 directories cost one journal commit of the
//! file system each per fsync (ext4, XFS: a commit and a cache flush of the
//! disk); one `syncfs(2)` of the file system instead writes back every
//! dirty page and all metadata (inodes, directory entries, renames) of it
//! and waits for that, in one commit.
//!
//! `syncfs` reports a writeback error of any file of the file system that
//! happened since the fd it is given was opened only from Linux 5.8 on
//! ([`batched`]); before that it says nothing of them, so there the callers
//! keep an fsync per file and per directory. An fd for [`sync_fs`] is
//! opened before the writes it vouches for.

use std::os::fd::AsFd;

/// Whether one `syncfs` may stand for an fsync per file: the kernel reports
/// writeback errors through it (Linux 5.8 and later).
pub fn batched() -> bool {
    static BATCHED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BATCHED.get_or_init(|| {
        let u = rustix::system::uname();
        kernel_at_least(&u.release().to_string_lossy(), (5, 8))
    })
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
