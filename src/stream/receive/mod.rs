//! The target's side of the stream: decode each packed block
//! ([`unpack_block`]), and unpack the tar stream into the generation's
//! staging folder ([`unpack`]), checking every entry's header against the
//! plan before a byte of the entry is written. [`check_staged`] checks a
//! staging folder that another agent filled (the direct route).
//!
//! Each entry's header is read by `head`; its name is a change index, its
//! type and size must be the plan's (`stager`'s `planned_size`) before anything is
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

mod stager;

use std::fs;
use std::io::Read;
use std::path::Path;
use std::sync::mpsc;

use self::stager::Stager;
use super::write::{
    AlignedBuf, WRITE_BUFFERS, WRITE_CHUNK, WriteJob, direct_io_fs, staged_durably, write_staged,
};
use super::{TAG_STORED, TAG_ZSTD};
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::Counters;
use crate::journal::Generation;
use crate::model::{
    Action, BLOCK, FileStamp, Kind, StageCount, StageWaits, StreamEntry, Unpacked, Written,
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

/// What a stream into a generation holds.
#[derive(Debug, Clone, Copy)]
pub enum Holds<'a> {
    /// Every file the generation stages: one missing is an error.
    All,
    /// A stream several targets share: its entries map onto this
    /// generation's changes through the list (the others' files are read
    /// and dropped).
    Shared(&'a [StreamEntry]),
    /// One lane's part of a stream over several connections: the other
    /// files come on the others, and what all staged is checked together
    /// afterwards ([`check_staged`]).
    Part,
    /// One lane's part of a stream several targets share: both of the
    /// above (the list maps the part's entries).
    SharedPart(&'a [StreamEntry]),
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
    holds: Holds<'_>,
) -> Result<Unpacked> {
    let (job_tx, job_rx) = mpsc::sync_channel::<WriteJob>(WRITE_BUFFERS);
    let (free_tx, free_rx) = mpsc::sync_channel::<AlignedBuf>(WRITE_BUFFERS);
    for _ in 0..WRITE_BUFFERS {
        let _ = free_tx.send(AlignedBuf::new(WRITE_CHUNK));
    }
    let disk = std::cell::Cell::new(std::time::Duration::ZERO);
    let mut last_byte = None;
    let unpacked = staged_durably(g, host_dir, |sync_tx| {
        std::thread::scope(|scope| {
            let writer = scope.spawn(move || write_staged(g, host_dir, job_rx, free_tx, sync_tx));
            let direct = direct_io_fs(&g.dir.join("staging"));
            let r = Stager::new(g, host_dir, counters, direct, job_tx, free_rx, &disk)
                .and_then(|s| s.unpack(input, holds));
            let written = writer
                .join()
                .unwrap_or_else(|_| Err(err!(kind = Internal, "the staging writer panicked")));
            last_byte = Some(std::time::Instant::now());
            // The writer's own error explains a stream that stopped because of it.
            let written = written?;
            let count = r?;
            Ok(Unpacked {
                count,
                written,
                waits: StageWaits::default(),
            })
        })
    });
    unpacked.map(|mut u| {
        u.waits.disk_secs = disk.get().as_secs_f64();
        u.waits.durable_secs = last_byte.map_or(0.0, |t| t.elapsed().as_secs_f64());
        u
    })
}

/// Read exactly `buf.len()` bytes of the stream.
pub(super) fn read_exact_stream(input: &mut dyn Read, buf: &mut [u8], what: &str) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{ContentHasher, content_hex};
    use crate::stream::head::parse_head;
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
            Holds::All,
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
            provenance: None,
            machine: None,
            allow_running: false,
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
        let Unpacked { count, written, .. } =
            unpack(&g, t.path(), ChannelReader::new(rx), &counters, Holds::All).unwrap();
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
