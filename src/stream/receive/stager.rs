//! The unpacking thread of [`unpack`](super::unpack): [`Stager`] reads
//! each entry's header, maps it onto the generation's changes (through
//! the list of a shared stream, whose other targets' entries it reads and
//! drops: [`SharedEntries`]), checks its type and size against the plan
//! ([`planned_size`]) before anything is created, and stages it: a symlink
//! whose target must be the plan's, or a regular file hashed into chunk
//! buffers for the writer thread, the last chunk handed over once the hash
//! is the plan's.

use std::cell::Cell;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::{Holds, read_exact_stream};
use crate::beneath::Beneath;
use crate::err;
use crate::error::{Error, Result};
use crate::inventory::{ContentHasher, Counters, content_hex};
use crate::journal::Generation;
use crate::model::{Action, GenChange, Kind, StageCount, StreamEntry};
use crate::stream::head::{EntryHead, TAR_BLOCK, parse_head};
use crate::stream::write::{
    AlignedBuf, DIRECT_MIN, Finish, Owners, WRITE_CHUNK, WriteJob, mtime_of_secs, set_direct,
    stage_error, writer_stopped,
};

/// The unpacking thread's state: where entries go, and the writer's queues.
pub(super) struct Stager<'a> {
    g: &'a Generation,
    host_dir: &'a Path,
    counters: &'a Counters,
    /// Big files are written with `O_DIRECT`.
    direct: bool,
    staging_path: PathBuf,
    /// Every staged file is made relative to this fd, with
    /// `O_EXCL|O_NOFOLLOW`: whatever appears in staging meanwhile, a write
    /// never leaves it.
    staging: Beneath,
    /// Who staged files belong to, as root without `--same-owner`.
    owners: Option<Owners>,
    is_root: bool,
    jobs: mpsc::SyncSender<WriteJob>,
    free: mpsc::Receiver<AlignedBuf>,
    /// The chunk buffer being filled.
    buf: AlignedBuf,
    /// How long the hand-overs waited for the writer (the disk).
    disk: &'a Cell<Duration>,
}

impl<'a> Stager<'a> {
    pub(super) fn new(
        g: &'a Generation,
        host_dir: &'a Path,
        counters: &'a Counters,
        direct: bool,
        jobs: mpsc::SyncSender<WriteJob>,
        free: mpsc::Receiver<AlignedBuf>,
        disk: &'a Cell<Duration>,
    ) -> Result<Stager<'a>> {
        let staging_path = g.dir.join("staging");
        let staging =
            Beneath::open(&staging_path).map_err(|e| stage_error(&staging_path, e, host_dir, g))?;
        let buf = free.recv().map_err(|_| writer_stopped())?;
        let is_root = rustix::process::geteuid().is_root();
        let owners = (is_root && !g.meta.same_owner).then(|| Owners::new(host_dir));
        Ok(Stager {
            g,
            host_dir,
            counters,
            direct,
            staging_path,
            staging,
            owners,
            is_root,
            jobs,
            free,
            buf,
            disk,
        })
    }

    fn next_buf(&self) -> Result<AlignedBuf> {
        self.free.recv().map_err(|_| writer_stopped())
    }

    fn error(&self, name: &str, e: std::io::Error) -> Error {
        stage_error(&self.staging_path.join(name), e, self.host_dir, self.g)
    }

    /// Unpack every entry of `input`, then check that none is missing
    /// (unless the stream holds only a part, see [`Holds`]).
    pub(super) fn unpack(mut self, mut input: impl Read, holds: Holds<'_>) -> Result<StageCount> {
        let input: &mut dyn Read = &mut input;
        let mut seen = vec![false; self.g.meta.changes.len()];
        let mut shared = match holds {
            Holds::Shared(list) | Holds::SharedPart(list) => Some(SharedEntries::new(list)),
            Holds::All | Holds::Part => None,
        };
        let mut count = StageCount::default();
        let mut block = [0u8; TAR_BLOCK];
        loop {
            // A stream that stops at an entry's boundary ends like one with
            // the end-of-archive block; what is missing is named below.
            match input.read(&mut block[..1]) {
                Ok(0) => break,
                Ok(_) => read_exact_stream(input, &mut block[1..], "a header")?,
                Err(e) => return Err(err!(kind = Connection, "Failed to read the stream: {e}")),
            }
            // A zero block ends one sender's stream; another sender's may
            // follow in the same stage (sets from several sources), so
            // only the end of the input ends the stage.
            let Some(head) = parse_head(&block)? else {
                continue;
            };
            let i = match &mut shared {
                None => head.index,
                Some(map) => match map.take(input, &head)? {
                    Some(i) => i,
                    None => continue,
                },
            };
            let c = self
                .g
                .meta
                .changes
                .get(i)
                .filter(|c| c.action != Action::Delete)
                .ok_or_else(|| err!(kind = Protocol, "unexpected entry {i} in the stream"))?;
            if std::mem::replace(&mut seen[i], true) {
                return Err(err!(
                    kind = Protocol,
                    "entry {i} appears twice in the stream"
                ));
            }
            let want = planned_size(c, &head)?;
            let owner = match &self.owners {
                _ if !self.is_root => None,
                Some(o) => o.of(&c.path),
                None => head.uid.zip(head.gid),
            };
            match &c.source {
                Some(Kind::Symlink { target }) => self.symlink(input, i, c, target, owner)?,
                Some(Kind::File { mode, blake3, .. }) => {
                    let file = PlannedFile {
                        size: want,
                        mode: *mode,
                        blake3: blake3.as_deref(),
                        owner,
                        mtime: head.mtime,
                    };
                    self.file(input, i, c, &file)?;
                    count.bytes += want;
                }
                _ => unreachable!("checked against the header by planned_size"),
            }
            let pad = (TAR_BLOCK - (want % TAR_BLOCK as u64) as usize) % TAR_BLOCK;
            let mut skip = [0u8; TAR_BLOCK];
            read_exact_stream(input, &mut skip[..pad], &c.path)?;
            count.files += 1;
            self.counters.files.fetch_add(1, Ordering::Relaxed);
            die_hook(count.files);
        }
        if !matches!(holds, Holds::Part | Holds::SharedPart(_)) {
            self.check_none_missing(&seen)?;
        }
        Ok(count)
    }

    /// Every entry of the plan arrived (`seen`).
    fn check_none_missing(&self, seen: &[bool]) -> Result<()> {
        let missing: Vec<&str> = self
            .g
            .meta
            .changes
            .iter()
            .enumerate()
            .filter(|(i, c)| c.action != Action::Delete && !seen[*i])
            .map(|(_, c)| c.path.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(err!(
                kind = Protocol,
                "The stream ended without {} file(s), e.g. {}",
                missing.len(),
                missing[0]
            ));
        }
        Ok(())
    }

    /// Stage symlink `i`: its target is the entry's data, and must be the plan's.
    fn symlink(
        &self,
        input: &mut dyn Read,
        i: usize,
        c: &GenChange,
        target: &str,
        owner: Option<(u32, u32)>,
    ) -> Result<()> {
        let name = i.to_string();
        let mut link = vec![0u8; target.len()];
        read_exact_stream(input, &mut link, &c.path)?;
        if link != target.as_bytes() {
            return Err(err!(
                kind = Protocol,
                "{} arrived with link target {:?}, the plan says {target:?}",
                c.path,
                String::from_utf8_lossy(&link)
            ));
        }
        self.staging
            .symlink(target, &name)
            .map_err(|e| self.error(&name, e))?;
        if let Some((uid, gid)) = owner {
            let _ = rustix::fs::chownat(
                &self.staging,
                name.as_str(),
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            );
        }
        Ok(())
    }

    /// Stage regular file `i`: read and hash it into chunk buffers for the
    /// writer; the last chunk goes once its hash is the plan's (if the plan
    /// has one).
    fn file(
        &mut self,
        input: &mut dyn Read,
        i: usize,
        c: &GenChange,
        f: &PlannedFile<'_>,
    ) -> Result<()> {
        let size = f.size;
        let name = i.to_string();
        let out = self
            .staging
            .create_new(&name, 0o600)
            .map_err(|e| self.error(&name, e))?;
        if self.direct && size >= DIRECT_MIN {
            set_direct(&out, true);
        }
        let out = Arc::new(out);
        let mut hasher = ContentHasher::new();
        let (mut left, mut fill) = (size, 0usize);
        while left > 0 {
            if fill == WRITE_CHUNK {
                self.hand_over(i, &out, fill, None)?;
                fill = 0;
            }
            let room = (WRITE_CHUNK - fill).min(usize::try_from(left).unwrap_or(usize::MAX));
            let space = &mut self.buf.get()[fill..fill + room];
            let n = input
                .read(space)
                .map_err(|e| err!(kind = Connection, "Failed to read the stream: {e}"))?;
            if n == 0 {
                return Err(err!(
                    kind = Connection,
                    hint = "run `overlay apply` again; if it repeats, check the source host and the network",
                    "The stream ended in the middle of {} ({} of {size} bytes)",
                    c.path,
                    size - left
                ));
            }
            hasher.update(&space[..n]);
            fill += n;
            left -= n as u64;
            self.counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
        }
        let digest = content_hex(&hasher);
        if f.blake3.is_some_and(|want| want != digest) {
            // The source does not hash what the plan hashed (it trusts
            // this check): most likely the file changed since the plan;
            // SSH's MAC leaves damage on the way the unlikely cause.
            return Err(err!(
                kind = Drift,
                hint = "run `overlay plan` again, then apply the new plan; if it repeats with the source unchanged, check the source disk and the network",
                "{} changed since the plan (or was damaged on the way): it arrived with blake3 {digest}, {size} bytes; the plan says {}; nothing was applied",
                c.path,
                f.blake3.unwrap_or_default()
            ));
        }
        let finish = Finish {
            digest,
            mode: f.mode,
            owner: f.owner,
            mtime: mtime_of_secs(f.mtime),
        };
        self.hand_over(i, &out, fill, Some(finish))
    }

    /// Give the first `len` bytes of the chunk buffer to the writer, and
    /// take a free buffer to fill next.
    fn hand_over(
        &mut self,
        index: usize,
        file: &Arc<File>,
        len: usize,
        last: Option<Finish>,
    ) -> Result<()> {
        let t0 = Instant::now();
        let next = self.next_buf()?;
        let buf = std::mem::replace(&mut self.buf, next);
        let job = WriteJob {
            index,
            file: file.clone(),
            buf,
            len,
            last,
        };
        let sent = self.jobs.send(job).map_err(|_| writer_stopped());
        self.disk.set(self.disk.get() + t0.elapsed());
        sent
    }
}

/// The list of a stream several targets take: which of its entries are
/// this generation's changes, and which were seen.
struct SharedEntries<'a> {
    entries: &'a [StreamEntry],
    seen: Vec<bool>,
}

impl<'a> SharedEntries<'a> {
    fn new(entries: &'a [StreamEntry]) -> SharedEntries<'a> {
        SharedEntries {
            entries,
            seen: vec![false; entries.len()],
        }
    }

    /// The change the entry `head` announces, or `None` when it is another
    /// target's, read and dropped here.
    fn take(&mut self, input: &mut dyn Read, head: &EntryHead) -> Result<Option<usize>> {
        let entry = self.entries.get(head.index).ok_or_else(|| {
            err!(
                kind = Protocol,
                "unexpected entry {} in the shared stream",
                head.index
            )
        })?;
        if std::mem::replace(&mut self.seen[head.index], true) {
            return Err(err!(
                kind = Protocol,
                "entry {} appears twice in the shared stream",
                head.index
            ));
        }
        match *entry {
            StreamEntry::Take(i) => Ok(Some(i)),
            StreamEntry::Skip { size } => {
                skip_entry(input, head, size)?;
                Ok(None)
            }
        }
    }
}

/// A regular file as the plan has it, and who it will belong to.
struct PlannedFile<'a> {
    size: u64,
    mode: u32,
    blake3: Option<&'a str>,
    owner: Option<(u32, u32)>,
    /// The header's mtime, which the staged file takes.
    mtime: Option<u64>,
}

/// A test hook: `OVERLAY_TEST_DIE_MID_STREAM=N` makes the agent exit
/// abruptly once it has staged N files of a stream (a target that dies in
/// the middle of it).
fn die_hook(staged: u64) {
    static AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| {
        std::env::var("OVERLAY_TEST_DIE_MID_STREAM")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    if *at == Some(staged) {
        std::process::exit(137);
    }
}

/// Read and drop another target's entry of a shared stream: its declared
/// size must be the one this target was told, and nothing is written.
fn skip_entry(input: &mut dyn Read, head: &EntryHead, size: u64) -> Result<()> {
    if head.size != size {
        return Err(err!(
            kind = Protocol,
            hint = "the source sent something other than the plan; nothing was switched, run `overlay plan` and `overlay apply` again",
            "entry {} of the shared stream declares {} bytes, the plan says {size}; refused",
            head.index,
            head.size
        ));
    }
    let padded = size.div_ceil(TAR_BLOCK as u64) * TAR_BLOCK as u64;
    let dropped = std::io::copy(&mut Read::take(&mut *input, padded), &mut std::io::sink())
        .map_err(|e| err!(kind = Connection, "Failed to read the stream: {e}"))?;
    if dropped != padded {
        return Err(err!(
            kind = Connection,
            hint =
                "run `overlay apply` again; if it repeats, check the source host and the network",
            "The stream ended in the middle of entry {} (another target's file)",
            head.index
        ));
    }
    Ok(())
}

/// The entry's size as the plan has it, when the header's type and size
/// agree with the plan; otherwise nothing of the entry is read.
fn planned_size(c: &GenChange, head: &EntryHead) -> Result<u64> {
    let want = match &c.source {
        Some(Kind::Symlink { target }) if head.symlink => target.len() as u64,
        Some(Kind::File { size, .. }) if !head.symlink => *size,
        expected => {
            return Err(err!(
                kind = Protocol,
                "{} arrived as a {}, the plan expects {expected:?}",
                c.path,
                if head.symlink {
                    "symlink"
                } else {
                    "regular file"
                }
            ));
        }
    };
    if head.size != want {
        return Err(err!(
            kind = Protocol,
            hint = "the source sent something other than the plan; nothing was switched, run `overlay plan` and `overlay apply` again",
            "{} arrived declaring {} bytes, the plan says {want}; refused before writing",
            c.path,
            head.size
        ));
    }
    Ok(want)
}
