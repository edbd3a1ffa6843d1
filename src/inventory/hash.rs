//! Content hashes as every agent takes them (BLAKE3, lowercase hex), with
//! a script's shebang rewritten for the venv it is going to; and the stamp
//! (device, inode, times) that tells a file has not changed since.

use std::io::Read;
use std::path::Path;
use std::sync::atomic::Ordering;

use crate::inventory::Counters;
use crate::model::{FileStamp, ShebangRewrite};

/// A file's content hash and its size, as hashed (after a shebang rewrite).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashed {
    pub size: u64,
    /// Lowercase hex ([`content_hex`]).
    pub blake3: String,
}

/// Rewrite a script's shebang if it names the `from` venv's `bin/`.
pub fn rewrite_shebang(content: &[u8], rw: &ShebangRewrite) -> Option<Vec<u8>> {
    let prefix = format!("#!{}/bin/", rw.from);
    if rw.from == rw.to || !content.starts_with(prefix.as_bytes()) {
        return None;
    }
    let mut out = format!("#!{}/bin/", rw.to).into_bytes();
    out.extend_from_slice(&content[prefix.len()..]);
    Some(out)
}

/// The content hash every agent takes, wherever it hashes file contents
/// (plan, stream, checks): BLAKE3 (see docs/design.md).
pub type ContentHasher = blake3::Hasher;

/// A finished content hash as the plan and journal carry it: lowercase hex.
pub fn content_hex(h: &ContentHasher) -> String {
    h.finalize().to_hex().to_string()
}

/// Hash a file, optionally with its shebang rewritten.
pub fn hash_file(
    path: &Path,
    shebang: Option<&ShebangRewrite>,
    counters: &Counters,
) -> std::io::Result<Hashed> {
    hash_open(std::fs::File::open(path)?, shebang, counters)
}

/// [`hash_file`] of a file already open (opened beneath the venv by a
/// [`Walker`](crate::inventory::Walker)).
pub fn hash_open(
    f: std::fs::File,
    shebang: Option<&ShebangRewrite>,
    counters: &Counters,
) -> std::io::Result<Hashed> {
    thread_local! {
        // One read buffer per worker thread, not one allocation per file.
        static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; 1 << 20]);
    }
    BUF.with(|buf| hash_file_with(f, shebang, counters, &mut buf.borrow_mut()))
}

fn hash_file_with(
    mut f: std::fs::File,
    shebang: Option<&ShebangRewrite>,
    counters: &Counters,
    buf: &mut [u8],
) -> std::io::Result<Hashed> {
    let mut hasher = ContentHasher::new();
    let mut size = 0u64;
    let mut first = true;
    loop {
        let n = f.read(buf)?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        if first && let Some(rw) = shebang {
            first = false;
            // Scripts are small; a shebang always sits in the first read.
            if let Some(new) = rewrite_shebang(chunk, rw) {
                hasher.update(&new);
                size += new.len() as u64;
                counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
                continue;
            }
        }
        first = false;
        hasher.update(chunk);
        size += n as u64;
        counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok(Hashed {
        size,
        blake3: content_hex(&hasher),
    })
}

/// A file's stamp from an `lstat`/`fstat` (the same numbers as [`FileStamp::of`]).
pub fn stamp_of(st: &rustix::fs::Stat) -> FileStamp {
    FileStamp {
        dev: st.st_dev,
        ino: st.st_ino,
        mtime_ns: st
            .st_mtime
            .saturating_mul(1_000_000_000)
            .saturating_add(st.st_mtime_nsec as i64),
        ctime_ns: st
            .st_ctime
            .saturating_mul(1_000_000_000)
            .saturating_add(st.st_ctime_nsec as i64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shebangs() {
        let rw = ShebangRewrite {
            from: "/a/venv".into(),
            to: "/b/v".into(),
        };
        assert_eq!(
            rewrite_shebang(b"#!/a/venv/bin/python3\nx", &rw).unwrap(),
            b"#!/b/v/bin/python3\nx"
        );
        assert!(rewrite_shebang(b"#!/usr/bin/python3\n", &rw).is_none());
        assert!(rewrite_shebang(b"#!/a/venv2/bin/python3\n", &rw).is_none());
    }
}
