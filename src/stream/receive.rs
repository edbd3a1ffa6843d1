//! The target's side of the stream: decode each packed block
//! ([`unpack_block`]), and unpack the tar stream into the generation's
//! staging folder ([`unpack`]), checking every entry's header against the
//! plan before a byte of the entry is written. [`check_staged`] checks a
//! staging folder that another agent filled (the direct route).
//!
//! Each entry's header is read by `head`; its name is a change index, its
//! type and size must be the plan's ([`planned_size`]) before anything is
//! created, and reading stops at that size. A symlink's target is its
//! entry's data and must equal the plan's. A regular file is hashed as it
//! arrives; one whose blake3 differs from the plan's fails the stage before
//! its last chunk is written (kind Drift: the source sends such a file
//! unhashed, so a change since the plan is caught here). Zero blocks end a
//! sender's tar stream, not the stage: the streams of several sources (sets
//! with `from`) may follow one another, and only the end of the input ends
//! the stage, with every entry of the plan there exactly once. Every staged
//! file is created through a [`Beneath`] of the staging directory
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`); `write` does the rest (chunks, owners,
//! modes, fsync).

use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};

use super::head::{EntryHead, TAR_BLOCK, parse_head};
use super::write::{
    AlignedBuf, DIRECT_MIN, Finish, Owners, WRITE_BUFFERS, WRITE_CHUNK, WriteJob, direct_io_fs,
    mtime_of_secs, set_direct, stage_error, staged_durably, write_staged, writer_stopped,
};
use super::{TAG_STORED, TAG_ZSTD};
use crate::beneath::Beneath;
use crate::err;
use crate::error::{Error, Result, io_cause};
use crate::inventory::{ContentHasher, Counters, content_hex};
use crate::journal::Generation;
use crate::model::{
    Action, BLOCK, FileStamp, GenChange, Kind, StageCount, StreamEntry, Unpacked, Written,
};

/// Decode one data frame of the stream back into bytes of the tar stream.
/// Returns the bytes and where they start in the vector.
pub fn unpack_block(
    frame: Vec<u8>,
    z: &mut zstd::bulk::Decompressor<'static>,
) -> Result<(Vec<u8>, usize)> {
    match frame.first() {
        Some(&TAG_STORED) => Ok((frame, 1)),
        Some(&TAG_ZSTD) => z
            .decompress(&frame[1..], BLOCK)
            .map(|v| (v, 0))
            .map_err(|e| {
                err!(
kind = Protocol,
                    hint = "the source is not a compatible overlay agent (or is hostile); nothing was switched",
                    "a block of the stream does not decompress to at most {BLOCK} bytes: {e}"
                )
            }),
        _ => Err(err!(kind = Protocol, "a block of the stream has an unknown packing")),
    }
}

/// After a direct stream: every file the generation adds or replaces is in
/// staging, and each regular file is the very inode the receiving agent
/// reported writing (unchanged since). Returns what staging holds.
pub fn check_staged(g: &Generation, written: &[Written]) -> Result<StageCount> {
    let by_index: std::collections::HashMap<usize, &FileStamp> =
        written.iter().map(|w| (w.index, &w.stamp)).collect();
    let staging = g.dir.join("staging");
    let mut count = StageCount::default();
    for (i, c) in g.meta.changes.iter().enumerate() {
        if c.action == Action::Delete {
            continue;
        }
        let p = staging.join(i.to_string());
        let meta = fs::symlink_metadata(&p).map_err(|e| {
            err!(
                kind = Protocol,
                "After the direct stream, {} is missing from staging: {}",
                c.path,
                io_cause(&e)
            )
        })?;
        match (&c.source, by_index.get(&i)) {
            (Some(Kind::File { size, .. }), Some(st))
                if meta.is_file()
                    && meta.len() == *size
                    && st.same_inode_unchanged(&FileStamp::of(&meta)) => {}
            (Some(Kind::Symlink { .. }), None) if meta.file_type().is_symlink() => {}
            _ => {
                return Err(err!(
                    kind = Protocol,
                    "After the direct stream, staging/{i} ({}) is not what the receiving agent reported",
                    c.path
                ));
            }
        }
        count.files += 1;
        count.bytes += c.source.as_ref().map_or(0, Kind::size);
    }
    Ok(count)
}

/// A `Read` over chunks arriving on a channel.
pub struct ChannelReader {
    rx: mpsc::Receiver<(Vec<u8>, usize)>,
    cur: Vec<u8>,
    pos: usize,
}

impl ChannelReader {
    pub fn new(rx: mpsc::Receiver<(Vec<u8>, usize)>) -> Self {
        ChannelReader {
            rx,
            cur: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos >= self.cur.len() {
            match self.rx.recv() {
                Ok((v, start)) => {
                    self.cur = v;
                    self.pos = start;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Target side: unpack the stream read from `input` into `staging/<index>`,
/// checking each file against the plan. Runs on its own thread (the agent
/// feeds it a [`ChannelReader`] of decoded blocks).
///
/// Three kinds of thread share the work: this one parses the tar stream and
/// hashes each file into a chunk buffer, one writer writes the chunks out
/// (so that a wait on the disk does not stall the stream), and two fsync
/// each staged file beside both (or, where one `syncfs` can vouch for them
/// all, only start its writeback: see `write`'s module doc). The stage is
/// done when every staged file is durable.
pub fn unpack(
    g: &Generation,
    host_dir: &Path,
    input: impl Read,
    counters: &Counters,
    shared: Option<&[StreamEntry]>,
) -> Result<Unpacked> {
    let (job_tx, job_rx) = mpsc::sync_channel::<WriteJob>(WRITE_BUFFERS);
    let (free_tx, free_rx) = mpsc::sync_channel::<AlignedBuf>(WRITE_BUFFERS);
    for _ in 0..WRITE_BUFFERS {
        let _ = free_tx.send(AlignedBuf::new(WRITE_CHUNK));
    }
    staged_durably(g, host_dir, |sync_tx| {
        std::thread::scope(|scope| {
            let writer = scope.spawn(move || write_staged(g, host_dir, job_rx, free_tx, sync_tx));
            let direct = direct_io_fs(&g.dir.join("staging"));
            let r = Stager::new(g, host_dir, counters, direct, job_tx, free_rx)
                .and_then(|s| s.unpack(input, shared));
            let written = writer
                .join()
                .unwrap_or_else(|_| Err(err!(kind = Internal, "the staging writer panicked")));
            // The writer's own error explains a stream that stopped because of it.
            let written = written?;
            let count = r?;
            Ok(Unpacked { count, written })
        })
    })
}

/// Read exactly `buf.len()` bytes of the stream.
fn read_exact_stream(input: &mut dyn Read, buf: &mut [u8], what: &str) -> Result<()> {
    input.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            err!(
kind = Connection,
                hint = "run `overlay apply` again; if it repeats, check the source host and the network",
                "The stream ended in the middle of {what}"
            )
        } else {
            err!(kind = Connection, "Failed to read the stream: {e}")
        }
    })
}

/// The unpacking thread's state: where entries go, and the writer's queues.
struct Stager<'a> {
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
}

impl<'a> Stager<'a> {
    fn new(
        g: &'a Generation,
        host_dir: &'a Path,
        counters: &'a Counters,
        direct: bool,
        jobs: mpsc::SyncSender<WriteJob>,
        free: mpsc::Receiver<AlignedBuf>,
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
        })
    }

    fn next_buf(&self) -> Result<AlignedBuf> {
        self.free.recv().map_err(|_| writer_stopped())
    }

    fn error(&self, name: &str, e: std::io::Error) -> Error {
        stage_error(&self.staging_path.join(name), e, self.host_dir, self.g)
    }

    /// Unpack every entry of `input`, then check that none is missing.
    /// `shared`: the stream is one several targets take; its entries map
    /// onto this generation's changes through the list (the others' files
    /// are read and dropped).
    fn unpack(
        mut self,
        mut input: impl Read,
        shared: Option<&[StreamEntry]>,
    ) -> Result<StageCount> {
        let input: &mut dyn Read = &mut input;
        let mut seen = vec![false; self.g.meta.changes.len()];
        let mut seen_shared = vec![false; shared.map_or(0, <[_]>::len)];
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
            let i = match shared {
                None => head.index,
                Some(map) => {
                    let entry = map.get(head.index).ok_or_else(|| {
                        err!(
                            kind = Protocol,
                            "unexpected entry {} in the shared stream",
                            head.index
                        )
                    })?;
                    if std::mem::replace(&mut seen_shared[head.index], true) {
                        return Err(err!(
                            kind = Protocol,
                            "entry {} appears twice in the shared stream",
                            head.index
                        ));
                    }
                    match *entry {
                        StreamEntry::Take(i) => i,
                        StreamEntry::Skip { size } => {
                            skip_entry(input, &head, size)?;
                            continue;
                        }
                    }
                }
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
        Ok(count)
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
        let next = self.next_buf()?;
        let buf = std::mem::replace(&mut self.buf, next);
        let job = WriteJob {
            index,
            file: file.clone(),
            buf,
            len,
            last,
        };
        self.jobs.send(job).map_err(|_| writer_stopped())
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

/// The entry's size as the plan has it, when the header's type and size
/// agree with the plan; otherwise nothing of the entry is read.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::testing::{Intake, LONG_TARGET_LEN, raw_header, staged_names};
    use crate::stream::write::DIRECT_ALIGN;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_valid_stream_stages_everything_and_a_long_symlink_target_needs_no_extension() {
        let intake = Intake::new(&std::env::temp_dir(), false);
        let stream = intake.valid_stream();
        // No GNU long-link ('K') or PAX record: every header is a file or a symlink.
        let mut at = 0;
        while let Some(h) = parse_head(stream[at..at + 512].try_into().unwrap()).unwrap() {
            at += 512 + (h.size as usize).div_ceil(512) * 512;
        }
        assert_eq!(stream.len() - at, 1024, "four entries, then the end");
        for piece in [1, 511, 512, 4096, stream.len()] {
            let r = intake.run_with(&stream, piece, |staging| {
                assert_eq!(staged_names(staging), ["0", "1", "2", "3"]);
                let long = fs::read_link(staging.join("2")).unwrap();
                assert_eq!(long.as_os_str().len(), LONG_TARGET_LEN);
                assert_eq!(fs::read(staging.join("0")).unwrap(), b"0123456789");
                // The plan's 4755 arrives as 755.
                let mode = fs::metadata(staging.join("0"))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o7777, 0o755);
            });
            assert_eq!(
                r.unwrap(),
                StageCount {
                    files: 4,
                    bytes: 17
                },
                "in pieces of {piece}"
            );
        }
        let Some(Kind::File { mode, .. }) = &intake.g.meta.changes[0].source else {
            panic!()
        };
        assert_eq!(*mode, 0o755, "the generation keeps the masked mode");
    }

    /// Sets from several sources: their streams, each ended by its zero
    /// blocks, arrive one after another in one stage.
    #[test]
    fn streams_one_after_another_stage_as_one_and_an_entry_twice_is_refused() {
        let intake = Intake::new(&std::env::temp_dir(), false);
        let stream = intake.valid_stream();
        let mut at = 0;
        for _ in 0..2 {
            let h = parse_head(stream[at..at + 512].try_into().unwrap())
                .unwrap()
                .unwrap();
            at += 512 + (h.size as usize).div_ceil(512) * 512;
        }
        let mut two = stream[..at].to_vec();
        two.extend([0u8; 1024]);
        two.extend_from_slice(&stream[at..]);
        let r = intake.run_with(&two, 4096, |staging| {
            assert_eq!(staged_names(staging), ["0", "1", "2", "3"]);
        });
        assert_eq!(r.unwrap().files, 4);
        let mut twice = stream[..at].to_vec();
        twice.extend([0u8; 1024]);
        twice.extend_from_slice(&stream);
        let e = intake.run(&twice).unwrap_err();
        assert!(e.message.contains("appears twice"), "{}", e.message);
    }

    /// The source sends a file the plan hashed without hashing it: one
    /// that arrives other than the plan hashed it is refused here, as a
    /// change since the plan; the same bytes as planned stage.
    #[test]
    fn a_file_other_than_the_plan_hashed_is_refused_as_a_change_since_the_plan() {
        use crate::inventory::{ContentHasher, content_hex};
        let want = content_hex(ContentHasher::new().update(b"0123456789"));
        let intake = Intake::with_hash(&std::env::temp_dir(), &want);
        let mut stream = intake.valid_stream();
        assert_eq!(intake.run(&stream).unwrap().files, 4);
        let intake = Intake::with_hash(&std::env::temp_dir(), &want);
        // Entry 0's data ("0123456789") follows its header.
        stream[512 + 9] ^= 1;
        let e = intake.run(&stream).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::Drift, "{}", e.message);
        assert!(
            e.message.contains("new.py changed since the plan"),
            "{}",
            e.message
        );
        assert!(e.hint.is_some_and(|h| h.contains("overlay plan")));
    }

    #[test]
    fn a_header_declaring_more_than_the_plan_is_refused_before_writing() {
        let intake = Intake::new(&std::env::temp_dir(), false);
        // Entry 0 is 10 bytes in the plan; the header claims 64 MiB and
        // 64 KiB follow.
        let mut stream = raw_header("0", b'0', 64 << 20);
        stream.extend(vec![7u8; 64 << 10]);
        let e = intake
            .run_with(&stream, 4096, |staging| {
                assert!(staged_names(staging).is_empty(), "nothing was written");
            })
            .unwrap_err();
        assert!(
            e.message
                .contains("declaring 67108864 bytes, the plan says 10"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("refused before writing"),
            "{}",
            e.message
        );
        assert!(e.hint.is_some());
        // A symlink whose target would be longer than the plan's.
        let stream = raw_header("1", b'2', 1 << 30);
        let e = intake.run(&stream).unwrap_err();
        assert!(e.message.contains("the plan says 4"), "{}", e.message);
    }
    /// `--same-owner` asks for them.
    #[test]
    #[cfg_attr(not(overlay_test_root), ignore = "needs root: chown")]
    fn staged_files_take_the_targets_owners_unless_same_owner() {
        use std::os::unix::fs::MetadataExt;
        for same_owner in [false, true] {
            let intake = Intake::new(&std::env::temp_dir(), same_owner);
            let site = intake.dir.path().join("lib/python3.11/site-packages");
            std::os::unix::fs::chown(&site, Some(4242), Some(4243)).unwrap();
            std::os::unix::fs::lchown(site.join("a.py"), Some(4343), Some(4344)).unwrap();
            // A stream whose headers say uid/gid 1234/1235.
            let mut stream = intake.valid_stream();
            let mut at = 0;
            while let Some(head) = parse_head(stream[at..at + 512].try_into().unwrap()).unwrap() {
                let mut h = tar::Header::from_byte_slice(&stream[at..at + 512]).clone();
                h.set_uid(1234);
                h.set_gid(1235);
                h.set_cksum();
                stream[at..at + 512].copy_from_slice(h.as_bytes());
                at += 512 + (head.size as usize).div_ceil(512) * 512;
            }
            intake
                .run_with(&stream, 4096, |staging| {
                    let owner = |n: &str| {
                        let m = fs::symlink_metadata(staging.join(n)).unwrap();
                        (m.uid(), m.gid())
                    };
                    if same_owner {
                        for n in ["0", "1", "3"] {
                            assert_eq!(owner(n), (1234, 1235), "{n}");
                        }
                    } else {
                        assert_eq!(owner("0"), (4242, 4243), "new.py: the directory's");
                        assert_eq!(owner("1"), (4242, 4243), "link: the directory's");
                        assert_eq!(owner("3"), (4343, 4344), "a.py: the replaced file's");
                        // pkg/ is root's.
                        assert_eq!(owner("2"), (0, 0));
                    }
                })
                .unwrap();
        }
    }

    /// A symlink planted in staging (where `staging/0` will be written)
    /// does not redirect the write.
    #[test]
    fn a_symlink_planted_in_staging_is_not_followed() {
        let intake = Intake::new(&std::env::temp_dir(), false);
        let outside = intake.dir.path().join("outside");
        let staging = intake.g.dir.join("staging");
        std::os::unix::fs::symlink(&outside, staging.join("0")).unwrap();
        let (tx, rx) = mpsc::sync_channel(1);
        tx.send((intake.valid_stream(), 0)).unwrap();
        drop(tx);
        let e = unpack(
            &intake.g,
            intake.dir.path(),
            ChannelReader::new(rx),
            &Counters::default(),
            None,
        )
        .unwrap_err();
        assert!(e.message.contains("staging/0"), "{}", e.message);
        assert!(!outside.exists());
        for e in fs::read_dir(&staging).unwrap() {
            fs::remove_file(e.unwrap().path()).unwrap();
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// One generation for all cases (the tests take turns with it).
        fn intake() -> std::sync::MutexGuard<'static, Intake> {
            static I: std::sync::OnceLock<std::sync::Mutex<Intake>> = std::sync::OnceLock::new();
            I.get_or_init(|| std::sync::Mutex::new(Intake::new(&std::env::temp_dir(), false)))
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

            /// Whatever the bytes: no panic, nothing written outside staging
            /// (`run` checks the tree), only indexed entries in staging.
            #[test]
            fn arbitrary_bytes_never_escape_staging(
                data in proptest::collection::vec(any::<u8>(), 0..4096),
                piece in 1usize..1500,
            ) {
                let _ = intake().run_in_pieces(&data, piece);
            }

            /// A valid stream with bytes changed or cut: an error or the
            /// right files, never anything else.
            #[test]
            fn a_damaged_valid_stream_never_escapes_staging(
                flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
                cut in any::<usize>(),
                piece in 1usize..3000,
            ) {
                let i = intake();
                let mut s = i.valid_stream();
                for (at, b) in flips {
                    let n = s.len();
                    s[at % n] = b;
                }
                let n = s.len();
                s.truncate(cut % (n + 1));
                if let Ok(c) = i.run_in_pieces(&s, piece) {
                    prop_assert_eq!(c, StageCount { files: 4, bytes: 17 });
                }
            }
        }
    }

    /// The target's side of a stream: a file bigger than two write chunks
    /// (written around the page cache, with an unaligned tail), a small one
    /// and a symlink arrive intact in staging, with their modes, and the
    /// digests the writer reports are what arrived.
    #[test]
    fn unpack_stages_big_and_small_files_exactly() {
        use crate::journal::State;
        use crate::model::{GenChange, PrepareRequest};
        let t = tempfile::tempdir().unwrap();
        let site = t.path().join("lib/python3.11/site-packages");
        fs::create_dir_all(&site).unwrap();
        let v = t.path().to_str().unwrap();
        // Not a multiple of anything: 2 chunks, then 777 bytes past a block.
        let big: Vec<u8> = (0..2 * WRITE_CHUNK + 3 * DIRECT_ALIGN + 777)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
            .collect();
        let small = b"print('hi')\n".to_vec();
        let hex = |d: &[u8]| content_hex(ContentHasher::new().update(d));
        let file = |d: &[u8], mode| Kind::File {
            size: d.len() as u64,
            mode,
            blake3: Some(hex(d)),
            stamp: None,
        };
        let change = GenChange::add;
        let state = State::open(v).unwrap();
        let counters = Counters::default();
        let req = PrepareRequest {
            venv: v.into(),
            source: "s".into(),
            target: "t".into(),
            plan_created: 0,
            changes: vec![
                change("big.so", file(&big, 0o755)),
                change("small.py", file(&small, 0o644)),
                change(
                    "link.so",
                    Kind::Symlink {
                        target: "big.so".into(),
                    },
                ),
            ],
            backup: false,
            resume: false,
            same_owner: false,
            versions: Vec::new(),
            shebang: None,
        };
        let g = state.prepare(&req, &counters).unwrap();
        let mut tar = tar::Builder::new(Vec::new());
        for (name, data, mode) in [("0", &big, 0o755), ("1", &small, 0o644)] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(mode);
            tar.append_data(&mut h, name, &data[..]).unwrap();
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(6);
        tar.append_data(&mut h, "2", &b"big.so"[..]).unwrap();
        let stream = tar.into_inner().unwrap();
        // Blocks of odd sizes, as frames would cut it.
        let (tx, rx) = mpsc::sync_channel(stream.len() / 100_000 + 2);
        for piece in stream.chunks(100_003) {
            tx.send((piece.to_vec(), 0)).unwrap();
        }
        drop(tx);
        let Unpacked { count, written } =
            unpack(&g, t.path(), ChannelReader::new(rx), &counters, None).unwrap();
        assert_eq!(
            count,
            StageCount {
                files: 3,
                bytes: (big.len() + small.len()) as u64
            }
        );
        let staging = g.dir.join("staging");
        assert!(fs::read(staging.join("0")).unwrap() == big);
        assert_eq!(fs::read(staging.join("1")).unwrap(), small);
        assert_eq!(
            fs::read_link(staging.join("2")).unwrap(),
            Path::new("big.so")
        );
        let mode = |p: &str| fs::metadata(staging.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!((mode("0"), mode("1")), (0o755, 0o644));
        let mut digests: Vec<(usize, String)> =
            written.into_iter().map(|w| (w.index, w.blake3)).collect();
        digests.sort();
        assert_eq!(digests, vec![(0, hex(&big)), (1, hex(&small))]);
    }
}
