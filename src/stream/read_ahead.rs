//! The source's read-ahead: the disk is kept busy ahead of the reader
//! ([`read_ahead`], a thread of its own, for the stream's sender and the
//! local route's copy): it opens the files the reader comes to next, in
//! the plan's order and the same way (from the root's fd, never through a
//! symlink), and asks the kernel to read them into the page cache
//! (`posix_fadvise(WILLNEED)`), in pieces of at most [`ADVICE`] bytes and
//! never more than [`READ_AHEAD`] bytes past where the reader is, so a venv
//! larger than the page cache does not evict what is about to be read. The
//! advice is only a hint: what is sent, checked and hashed is what the
//! reader itself reads.

use std::fs::File;
use std::sync::{Condvar, Mutex};

use crate::inventory::{Venv, Walker};
use crate::model::{Kind, SendFile};

/// How far past the reader [`read_ahead`] asks the kernel to read.
pub(super) const READ_AHEAD: u64 = 64 << 20;
/// The most one read-ahead advice covers.
pub(super) const ADVICE: u64 = 8 << 20;

/// Where the reader is, for the read-ahead: bytes of files (as the plan
/// sizes them, in the plan's order) read so far, and whether it is done.
pub(super) struct ReadAhead {
    at: Mutex<(u64, bool)>,
    moved: Condvar,
    /// How far past the reader to read ([`READ_AHEAD`]).
    window: u64,
    /// The most one advice covers ([`ADVICE`]).
    piece: u64,
}

/// Tells the read-ahead that the reader is done when dropped, whether the
/// reader returned or panicked.
pub(super) struct ReaderDone<'a>(pub(super) &'a ReadAhead);

impl Drop for ReaderDone<'_> {
    fn drop(&mut self) {
        self.0.finish();
    }
}

impl ReadAhead {
    pub(super) fn new(window: u64, piece: u64) -> ReadAhead {
        ReadAhead {
            at: Mutex::new((0, false)),
            moved: Condvar::new(),
            window,
            piece,
        }
    }

    /// The reader has read `bytes` of the files (the furthest of several
    /// readers: the local route's lanes tell it each their own).
    pub(super) fn reader_at(&self, bytes: u64) {
        if let Ok(mut at) = self.at.lock() {
            at.0 = at.0.max(bytes);
        }
        self.moved.notify_one();
    }

    /// The reader is done (or failed): stop reading ahead.
    fn finish(&self) {
        if let Ok(mut at) = self.at.lock() {
            at.1 = true;
        }
        self.moved.notify_one();
    }

    /// Wait until `end` (a position in the files' bytes) is at most the
    /// window past the reader. False once the reader is done.
    fn wait_within(&self, end: u64) -> bool {
        let Ok(mut at) = self.at.lock() else {
            return false;
        };
        while !at.1 && end > at.0 + self.window {
            at = match self.moved.wait(at) {
                Ok(a) => a,
                Err(_) => return false,
            };
        }
        !at.1
    }
}

/// Ask the kernel to read `len` bytes of `file` from `offset` into the page
/// cache, without waiting for them.
pub(super) fn advise_willneed(file: &File, offset: u64, len: u64) {
    let _ = rustix::fs::fadvise(
        file,
        offset,
        std::num::NonZeroU64::new(len),
        rustix::fs::Advice::WillNeed,
    );
}

/// The read-ahead thread: open the regular files the reader comes to next
/// (from the root's fd, through no symlink, as the reader does) and
/// `advise` each piece of at most `ahead.piece` bytes once it is within
/// `ahead.window` of the reader. A file that cannot be opened is left to
/// the reader, which says what is wrong with it.
pub(super) fn read_ahead(
    venv: &Venv,
    files: &[SendFile],
    ahead: &ReadAhead,
    advise: impl Fn(&File, u64, u64),
) {
    let Ok(root) = venv.beneath() else { return };
    let mut walker = Walker::new(std::os::fd::AsFd::as_fd(&root));
    // Where the file starts among the files' bytes, as the reader counts.
    let mut at = 0u64;
    for f in files {
        let size = f.kind.size();
        let file = match (&f.kind, venv.resolve(&f.path)) {
            (Kind::File { .. }, Ok((_, rel))) if size > 0 => walker.open(&rel).ok(),
            _ => None,
        };
        if let Some(file) = file {
            let mut off = 0;
            while off < size {
                let len = ahead.piece.min(size - off);
                if !ahead.wait_within(at + off + len) {
                    return;
                }
                advise(&file, off, len);
                off += len;
            }
        }
        at += size;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::stream::testing::{send_file as file, venv_with};

    /// The read-ahead advises the plan's files in the plan's order, each
    /// whole in pieces, never further past the reader than its window, and
    /// stops when the reader is done.
    #[test]
    fn read_ahead_follows_the_plan_within_its_window() {
        use std::os::unix::fs::MetadataExt;
        let piece = 4096u64;
        let big: Vec<u8> = vec![7u8; 3 * piece as usize + 5];
        let exact: Vec<u8> = vec![1u8; piece as usize];
        let contents: [(&str, &[u8]); 4] = [
            ("a.py", b"a = 1\n"),
            ("pkg/big.bin", &big),
            ("pkg/empty", b""),
            ("z.bin", &exact),
        ];
        let dir = venv_with(&contents);
        let venv = Venv::open(dir.path().to_str().unwrap()).unwrap();
        let site = dir.path().join("lib/python3.11/site-packages");
        let files: Vec<SendFile> = contents
            .iter()
            .enumerate()
            .map(|(i, (p, c))| file(i, p, c))
            .collect();
        let inode = |p: &str| std::fs::metadata(site.join(p)).unwrap().ino();
        let names: std::collections::HashMap<u64, &str> =
            contents.iter().map(|(p, _)| (inode(p), *p)).collect();
        let ahead = ReadAhead::new(2 * piece, piece);
        let seen: Mutex<Vec<(&str, u64, u64, u64)>> = Mutex::new(Vec::new());
        let total: u64 = files.iter().map(|f| f.kind.size()).sum();
        std::thread::scope(|scope| {
            let t = scope.spawn(|| {
                read_ahead(&venv, &files, &ahead, |f, off, len| {
                    let name = names[&f.metadata().unwrap().ino()];
                    let reader = ahead.at.lock().unwrap().0;
                    seen.lock().unwrap().push((name, off, len, reader));
                })
            });
            // The reader moves on a piece at a time, as the read-ahead waits;
            // with the reader at the end, it advises the rest and returns.
            let mut at = 0;
            while at < total {
                at = (at + piece).min(total);
                ahead.reader_at(at);
            }
            t.join().unwrap();
        });
        let seen = seen.into_inner().unwrap();
        let (mut start, mut want) = (0u64, Vec::new());
        let starts: std::collections::HashMap<&str, u64> = contents
            .iter()
            .map(|(p, c)| {
                let s = start;
                start += c.len() as u64;
                (*p, s)
            })
            .collect();
        for (p, c) in &contents {
            let mut off = 0;
            while off < c.len() as u64 {
                let len = piece.min(c.len() as u64 - off);
                want.push((*p, off, len));
                off += len;
            }
        }
        // Every piece, in the plan's order.
        let got: Vec<(&str, u64, u64)> = seen.iter().map(|s| (s.0, s.1, s.2)).collect();
        assert_eq!(got, want);
        for (name, off, len, reader) in &seen {
            assert!(
                starts[name] + off + len <= reader + 2 * piece,
                "{name} at {off}: reader at {reader}"
            );
        }
        // A reader that is done stops the read-ahead.
        let done = ReadAhead::new(2 * piece, piece);
        done.finish();
        let advised = Mutex::new(0usize);
        read_ahead(&venv, &files, &done, |_, _, _| {
            *advised.lock().unwrap() += 1
        });
        assert_eq!(*advised.lock().unwrap(), 0);
    }
}
