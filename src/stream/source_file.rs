//! A file of the source venv as the plan saw it, for the two routes that
//! read the source: the stream's sender ([`send`](super::send)) and the
//! local route's copy ([`copy_local`](super::copy_local)).
//!
//! Every file is reached from the venv root's fd without following a
//! symlink ([`Walker`]); one that changed since the plan (type, size,
//! symlink target, hash or stamp) is refused with an error that says to
//! plan again ([`Source::changed`], exit Drift).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use rustix::fs::FileType;

use crate::err;
use crate::error::{Error, Result, io_cause};
use crate::inventory::{Blocked, Venv, Walker, rewrite_shebang, stamp_of};
use crate::model::{Kind, ShebangRewrite};

/// A file of the source being sent: where it is, for the errors.
pub(super) struct Source<'a> {
    pub(super) venv: &'a Venv,
    pub(super) abs: &'a Path,
    /// Relative to the venv root.
    pub(super) rel: &'a str,
}

impl Source<'_> {
    /// The file's `lstat`, reached from the venv root without following a
    /// symlink; gone: changed since the plan.
    pub(super) fn lstat(&self, walker: &mut Walker<'_>) -> Result<rustix::fs::Stat> {
        walker
            .lstat(self.rel)
            .map_err(|b| self.blocked(b))?
            .ok_or_else(|| self.changed())
    }

    /// A symlink must still point where the plan saw it point.
    pub(super) fn check_link(&self, walker: &mut Walker<'_>, target: &str) -> Result<()> {
        let now = walker.read_link(self.rel).map_err(|_| self.changed())?;
        if now != *target {
            return Err(self.changed());
        }
        Ok(())
    }

    pub(super) fn changed(&self) -> Error {
        err!(
            kind = Drift,
            hint = "the source changed since the plan; run `overlay plan` again",
            "Source file {} changed since the plan; nothing was applied",
            self.abs.display()
        )
    }

    pub(super) fn blocked(&self, b: Blocked) -> Error {
        match b {
            Blocked::Link(link) => err!(
                kind = Drift,
                hint = "the source changed since the plan; run `overlay plan` again",
                "Source file {}: its parent {} is a symlink; overlay never reads through one; nothing was applied",
                self.abs.display(),
                self.venv.root.join(link).display()
            ),
            Blocked::Missing => self.changed(),
            Blocked::Error(m) => err!("Failed to read {}: {m}", self.abs.display()),
        }
    }

    pub(super) fn stream_error(&self, e: impl std::fmt::Display) -> Error {
        err!("Failed to stream {}: {e}", self.abs.display())
    }
}

/// A regular file to append to the stream, as the plan and `lstat` saw it.
pub(super) struct FileToSend<'a> {
    pub(super) src: &'a Source<'a>,
    /// The plan's `Kind::File`.
    pub(super) kind: &'a Kind,
    pub(super) meta: &'a rustix::fs::Stat,
    /// The tar entry's name: the change index.
    pub(super) name: &'a str,
}

impl FileToSend<'_> {
    /// The source file's modification time, which its staged copy takes
    /// (the local route; the stream carries it in the tar header).
    pub(super) fn mtime(&self) -> Option<std::time::SystemTime> {
        let secs = u64::try_from(self.meta.st_mtime).ok()?;
        let nanos = u32::try_from(self.meta.st_mtime_nsec).ok()?;
        Some(std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos))
    }

    /// The file opened for reading, once its `lstat` says it is still the
    /// plan's: a regular file, and unhashed in the plan, the stamp the plan
    /// saw.
    pub(super) fn open_checked(&self, walker: &mut Walker<'_>) -> Result<File> {
        let Kind::File { blake3, stamp, .. } = self.kind else {
            unreachable!("called for regular files only");
        };
        let src = self.src;
        let is_file = FileType::from_raw_mode(self.meta.st_mode) == FileType::RegularFile;
        // Unhashed in the plan (or hashed by the receiver): the stamp must
        // be as the plan saw it.
        let by_stamp = blake3.as_deref().is_none_or(str::is_empty);
        // Not the device number: a remount since the plan keeps every file.
        if !is_file || (by_stamp && !stamp.is_some_and(|s| s.same(&stamp_of(self.meta)))) {
            return Err(src.changed());
        }
        walker.open(src.rel).map_err(|b| src.blocked(b))
    }

    /// Whether the file goes with its shebang rewritten (a small script
    /// under `bin/`, when the plan rewrites).
    pub(super) fn rewrites(&self, shebang: Option<&ShebangRewrite>) -> bool {
        self.src.rel.starts_with("bin/")
            && (self.meta.st_size as u64) < (1 << 20)
            && shebang.is_some()
    }

    /// After the file was read: what was read (`digest`, when it was
    /// hashed) is the plan's hash, or unhashed in the plan, its stamp did
    /// not move meanwhile.
    pub(super) fn check_read(&self, file: &File, digest: Option<&str>) -> Result<()> {
        let Kind::File { blake3, stamp, .. } = self.kind else {
            unreachable!("called for regular files only");
        };
        let moved = || rustix::fs::fstat(file).map(|m| stamp_of(&m)).ok() != *stamp;
        match blake3.as_deref() {
            // Read while something wrote to it: the stamp moved.
            None | Some("") if moved() => Err(self.src.changed()),
            Some(want) if !want.is_empty() && digest.is_some_and(|d| d != want) => {
                Err(self.src.changed())
            }
            _ => Ok(()),
        }
    }

    /// A script's content with its shebang rewritten for the target; it
    /// must then be as long as the plan says.
    pub(super) fn read_rewritten(
        &self,
        file: &File,
        shebang: Option<&ShebangRewrite>,
        size: u64,
    ) -> Result<Vec<u8>> {
        let src = self.src;
        let mut content = Vec::new();
        (&*file)
            .read_to_end(&mut content)
            .map_err(|e| err!("Failed to read {}: {}", src.abs.display(), io_cause(&e)))?;
        let content = shebang
            .and_then(|rw| rewrite_shebang(&content, rw))
            .unwrap_or(content);
        if content.len() as u64 != size {
            return Err(src.changed());
        }
        Ok(content)
    }
}
