//! Space: free bytes on a file system (what an unprivileged user may
//! write; root may use reserved blocks, but overlay does not count on it),
//! and the disk usage of a generation's backup folders.

use std::path::Path;

use crate::beneath::Beneath;
use crate::err;
use crate::error::Result;

/// Bytes free for an unprivileged user on the file system holding `p`.
pub fn free_bytes(p: &Path) -> Result<u64> {
    let s = rustix::fs::statvfs(p)
        .map_err(|e| err!("Failed to read free space of {}: {e}", p.display()))?;
    Ok(s.f_bavail * s.f_frsize)
}

/// Bytes free for an unprivileged user on the file system holding the
/// opened directory `dir` (shown as `shown`).
pub(super) fn free_bytes_at(dir: &Beneath, shown: &Path) -> Result<u64> {
    let s = rustix::fs::fstatvfs(dir)
        .map_err(|e| err!("Failed to read free space of {}: {e}", shown.display()))?;
    Ok(s.f_bavail * s.f_frsize)
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
