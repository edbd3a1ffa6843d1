//! Space: free bytes on a file system (what an unprivileged user may
//! write; root may use reserved blocks, but overlay does not count on it),
//! and the disk usage of a generation's backup folders.

use std::path::Path;

use crate::beneath::Beneath;
use crate::err;
use crate::error::Result;

/// Bytes free for an unprivileged user on the file system holding `p`;
/// `None` where the file system reports no size at all ([`free_of`]).
pub fn free_bytes(p: &Path) -> Result<Option<u64>> {
    let s = rustix::fs::statvfs(p)
        .map_err(|e| err!("Failed to read free space of {}: {e}", p.display()))?;
    Ok(free_of(s.f_blocks, s.f_bavail, s.f_frsize))
}

/// Bytes free for an unprivileged user on the file system holding the
/// opened directory `dir` (shown as `shown`); `None` where unknown.
pub(super) fn free_bytes_at(dir: &Beneath, shown: &Path) -> Result<Option<u64>> {
    let s = rustix::fs::fstatvfs(dir)
        .map_err(|e| err!("Failed to read free space of {}: {e}", shown.display()))?;
    Ok(free_of(s.f_blocks, s.f_bavail, s.f_frsize))
}

/// The free bytes a `statvfs` answer gives, or `None` for a file system
/// that reports no size (`f_blocks` 0: some FUSE file systems, pseudo file
/// systems): its "0 free" means "not known", not "full".
pub(super) fn free_of(blocks: u64, bavail: u64, frsize: u64) -> Option<u64> {
    (blocks > 0).then(|| bavail.saturating_mul(frsize))
}

/// The bytes of the files below `p` (reads only; symlinks are not followed).
pub(super) fn du(p: &Path) -> u64 {
    walkdir::WalkDir::new(p)
        .into_iter()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_system_without_a_size_has_unknown_free_space() {
        assert_eq!(super::free_of(0, 0, 4096), None);
        assert_eq!(super::free_of(100, 0, 4096), Some(0));
        assert_eq!(super::free_of(100, 10, 4096), Some(40960));
    }
}
