//! The kernel's copies of one file for the local route, tried in this
//! order: a clone of the whole file ([`clone_whole`], `FICLONE`), then
//! `copy_file_range` ([`copy_range`], a short copy continued where it
//! stopped), then reads and writes ([`read_write`], hashed as they go).
//! [`Kernel`] learns which of them this source and staging allow, so a
//! refusal is not asked again; [`CopyError`] says why a copy stopped.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::inventory::{ContentHasher, content_hex};

/// Bytes per `copy_file_range` call (and per read of the fallback's): a big
/// file's progress moves, and a stop is seen, within it.
pub(super) const COPY_STEP: usize = 16 << 20;

/// How one file's bytes were copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum How {
    Reflink,
    CopyRange,
    ReadWrite,
}

/// Which of the kernel's copies this source and staging allow, as learnt
/// from the files copied so far (a refusal is not asked again).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Kernel {
    pub(super) no_reflink: bool,
    pub(super) no_direct: bool,
    pub(super) no_copy_range: bool,
}

impl Kernel {
    /// With `OVERLAY_TEST_LOCAL_COPY` (tests and the benchmark):
    /// `read-write`, reads and writes through the page cache only;
    /// `copy-range`, no big file past the page cache.
    pub(super) fn new() -> Kernel {
        let mode = std::env::var("OVERLAY_TEST_LOCAL_COPY").unwrap_or_default();
        let rw = mode == "read-write";
        Kernel {
            no_reflink: rw,
            no_direct: rw || mode == "copy-range",
            no_copy_range: rw,
        }
    }
}

/// Why a file's copy stopped.
#[derive(Debug)]
pub(super) enum CopyError {
    /// The source is shorter or longer than the plan says.
    Changed,
    /// Stopped on request.
    Stopped,
    /// Reading the source failed.
    Read(std::io::Error),
    /// Copying or writing into staging failed.
    Write(std::io::Error),
}

/// An errno after which the kernel's copy is not tried again: it does not
/// do this pair of files (or this kernel has none).
fn refused(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EXDEV | libc::EINVAL | libc::EOPNOTSUPP | libc::ENOSYS | libc::ENOTTY)
    )
}

/// Copy the first `size` bytes of `src` into the empty `dst`: a clone of
/// the whole file, else `copy_file_range`, else reads and writes (`kernel`
/// learns which work). Returns how, and the blake3 when the copy read the
/// bytes (reads and writes from the start); else the caller reads back.
pub(super) fn copy_file(
    src: &File,
    dst: &File,
    size: u64,
    kernel: &mut Kernel,
    buf: &mut [u8],
    progress: &dyn Fn(u64),
    stop: &dyn Fn() -> bool,
) -> std::result::Result<(How, Option<String>), CopyError> {
    if clone_whole(src, dst, size, kernel)? {
        progress(size);
        return Ok((How::Reflink, None));
    }
    let mut from = 0;
    if !kernel.no_copy_range {
        let step = |at: u64, len: usize| {
            let (mut off_in, mut off_out) = (at, at);
            rustix::fs::copy_file_range(src, Some(&mut off_in), dst, Some(&mut off_out), len)
                .map_err(std::io::Error::from)
        };
        match copy_range(size, step, progress, stop)? {
            Ranged::Done => return Ok((How::CopyRange, None)),
            Ranged::Refused { at } => {
                kernel.no_copy_range = true;
                from = at;
            }
        }
    }
    let mut hasher = (from == 0).then(ContentHasher::new);
    read_write(src, dst, from, size, buf, hasher.as_mut(), progress, stop)?;
    match hasher {
        Some(h) => Ok((How::ReadWrite, Some(content_hex(&h)))),
        // Part was copied by the kernel before it refused: read it all back.
        None => Ok((How::CopyRange, None)),
    }
}

/// Clone all of `src` into the empty `dst` (`FICLONE`: shared extents, no
/// bytes copied) where the filesystem has reflinks. False where it has none
/// (`kernel` learns not to ask again) or when there is nothing to clone.
pub(super) fn clone_whole(
    src: &File,
    dst: &File,
    size: u64,
    kernel: &mut Kernel,
) -> std::result::Result<bool, CopyError> {
    if kernel.no_reflink || size == 0 {
        return Ok(false);
    }
    match rustix::fs::ioctl_ficlone(dst, src) {
        Ok(()) => {
            // The clone is of the whole file: as long as the plan says.
            let len = rustix::fs::fstat(dst)
                .map_err(|e| CopyError::Write(e.into()))?
                .st_size as u64;
            if len != size {
                return Err(CopyError::Changed);
            }
            Ok(true)
        }
        Err(e) if refused(&e.into()) => {
            kernel.no_reflink = true;
            Ok(false)
        }
        Err(e) => Err(CopyError::Write(e.into())),
    }
}

/// How a `copy_file_range` loop ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ranged {
    /// All `size` bytes were copied.
    Done,
    /// The kernel refused at this offset; the rest is the caller's.
    Refused { at: u64 },
}

/// Copy `size` bytes by `step(offset, len)` (one `copy_file_range`, which
/// may copy fewer than `len`: the loop goes on from where it stopped).
pub(super) fn copy_range(
    size: u64,
    mut step: impl FnMut(u64, usize) -> std::io::Result<usize>,
    progress: &dyn Fn(u64),
    stop: &dyn Fn() -> bool,
) -> std::result::Result<Ranged, CopyError> {
    let mut at = 0u64;
    while at < size {
        if stop() {
            return Err(CopyError::Stopped);
        }
        let len = usize::try_from(size - at)
            .unwrap_or(usize::MAX)
            .min(COPY_STEP);
        match step(at, len) {
            // The source ends before the plan's size.
            Ok(0) => return Err(CopyError::Changed),
            Ok(n) if n > len => return Err(CopyError::Changed),
            Ok(n) => {
                at += n as u64;
                progress(n as u64);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if refused(&e) => return Ok(Ranged::Refused { at }),
            Err(e) => return Err(CopyError::Write(e)),
        }
    }
    Ok(Ranged::Done)
}

/// Copy bytes `from..size` of `src` into `dst` at the same offsets through
/// `buf`, hashing them into `hasher` if given.
#[allow(clippy::too_many_arguments)]
pub(super) fn read_write(
    src: &File,
    dst: &File,
    from: u64,
    size: u64,
    buf: &mut [u8],
    mut hasher: Option<&mut ContentHasher>,
    progress: &dyn Fn(u64),
    stop: &dyn Fn() -> bool,
) -> std::result::Result<(), CopyError> {
    let mut at = from;
    while at < size {
        if stop() {
            return Err(CopyError::Stopped);
        }
        let want = usize::try_from(size - at)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = match src.read_at(&mut buf[..want], at) {
            Ok(0) => return Err(CopyError::Changed),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        if let Some(h) = hasher.as_deref_mut() {
            h.update(&buf[..n]);
        }
        dst.write_all_at(&buf[..n], at).map_err(CopyError::Write)?;
        at += n as u64;
        progress(n as u64);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn hex(d: &[u8]) -> String {
        content_hex(ContentHasher::new().update(d))
    }

    /// A `copy_file_range` that copies less than asked is continued from
    /// where it stopped; a refusal part way hands the rest to reads and
    /// writes, and the staged file is then read back whole.
    #[test]
    fn a_short_copy_file_range_is_continued() {
        let t = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..100_003u32).map(|i| (i % 253) as u8).collect();
        fs::write(t.path().join("a"), &data).unwrap();
        let src = File::open(t.path().join("a")).unwrap();
        let dst = File::create(t.path().join("b")).unwrap();
        let mut calls = 0;
        let step = |at: u64, len: usize| {
            calls += 1;
            let (mut i, mut o) = (at, at);
            // At most 999 bytes a call.
            rustix::fs::copy_file_range(&src, Some(&mut i), &dst, Some(&mut o), len.min(999))
                .map_err(std::io::Error::from)
        };
        let r = copy_range(data.len() as u64, step, &|_| {}, &|| false).unwrap();
        assert_eq!(r, Ranged::Done);
        assert_eq!(calls, data.len().div_ceil(999));
        assert!(fs::read(t.path().join("b")).unwrap() == data);
        // Refused after two short copies: the rest is read and written.
        let dst = File::create(t.path().join("c")).unwrap();
        let mut n = 0;
        let step = |at: u64, len: usize| {
            n += 1;
            if n > 2 {
                return Err(std::io::Error::from_raw_os_error(libc::EXDEV));
            }
            let (mut i, mut o) = (at, at);
            rustix::fs::copy_file_range(&src, Some(&mut i), &dst, Some(&mut o), len.min(1000))
                .map_err(std::io::Error::from)
        };
        let r = copy_range(data.len() as u64, step, &|_| {}, &|| false).unwrap();
        assert_eq!(r, Ranged::Refused { at: 2000 });
        let mut buf = vec![0u8; 4096];
        read_write(
            &src,
            &dst,
            2000,
            data.len() as u64,
            &mut buf,
            None,
            &|_| {},
            &|| false,
        )
        .unwrap();
        assert!(fs::read(t.path().join("c")).unwrap() == data);
        // A source that ends early is a change.
        let step = |_: u64, _: usize| Ok(0);
        assert!(matches!(
            copy_range(10, step, &|_| {}, &|| false),
            Err(CopyError::Changed)
        ));
        // Reads and writes from the start hash as they go.
        let dst = File::create(t.path().join("d")).unwrap();
        let mut k = Kernel {
            no_reflink: true,
            no_direct: true,
            no_copy_range: true,
        };
        let (how, digest) = copy_file(
            &src,
            &dst,
            data.len() as u64,
            &mut k,
            &mut buf,
            &|_| {},
            &|| false,
        )
        .unwrap();
        assert_eq!((how, digest), (How::ReadWrite, Some(hex(&data))));
        assert!(fs::read(t.path().join("d")).unwrap() == data);
    }
}
