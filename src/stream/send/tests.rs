//! The sender's tests: progress within a file, and a file changed since
//! the plan with the read-ahead on.

use std::path::Path;
use std::sync::Mutex;

use super::*;
use crate::inventory::stamp_of;
use crate::stream::read_ahead::{ADVICE, READ_AHEAD, ReadAhead, read_ahead};
use crate::stream::testing::{send_file as file, venv_with};

/// Records the progress reports between blocks.
#[derive(Default)]
struct Recorder {
    blocks: usize,
    reports: Vec<(usize, Progress)>,
}

impl BlockSink for Recorder {
    fn block(&mut self, _: u8, _: &[u8]) -> std::io::Result<()> {
        self.blocks += 1;
        Ok(())
    }
    fn progress(&mut self, p: &Progress) -> std::io::Result<()> {
        self.reports.push((self.blocks, *p));
        Ok(())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A file of several blocks is counted as its blocks go out, not when
/// it ends: a report after every block, the bytes growing while the
/// file count still waits for it, and the last report is everything.
#[test]
fn bytes_move_within_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("lib/python3.11/site-packages");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(dir.path().join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
    let small = b"a = 1\n".to_vec();
    let big: Vec<u8> = (0..5 * BLOCK + 123).map(|i| (i % 251) as u8).collect();
    std::fs::write(site.join("a.py"), &small).unwrap();
    std::fs::write(site.join("big.bin"), &big).unwrap();
    let files = vec![file(0, "a.py", &small), file(1, "big.bin", &big)];
    let total = (small.len() + big.len()) as u64;
    let mut sink = Recorder::default();
    let counters = Counters::default();
    let root = dir.path().to_str().unwrap();
    let sent = send(
        root,
        &files,
        &[],
        None,
        Compression::None,
        &mut sink,
        &counters,
    )
    .unwrap();
    assert_eq!(sent.raw_bytes, total);
    // One report after each block, in order, never going back.
    assert_eq!(sink.reports.len(), sink.blocks);
    assert!(sink.blocks >= 6, "{} blocks", sink.blocks);
    for (i, (after, _)) in sink.reports.iter().enumerate() {
        assert_eq!(*after, i + 1);
    }
    for w in sink.reports.windows(2) {
        assert!(w[0].1.bytes <= w[1].1.bytes && w[0].1.files <= w[1].1.files);
    }
    // The big file's bytes count before it is done.
    let within: Vec<u64> = sink
        .reports
        .iter()
        .filter(|(_, p)| p.files < 2)
        .map(|(_, p)| p.bytes)
        .collect();
    assert!(
        within
            .iter()
            .any(|b| *b > small.len() as u64 + BLOCK as u64),
        "{within:?}"
    );
    let last = sink.reports.last().unwrap().1;
    assert_eq!((last.files, last.bytes), (2, total));
    assert_eq!((last.total_files, last.total_bytes), (2, total));
}

/// With the read-ahead on, a file that changed since the plan still
/// stops the stream, and a parent swapped for a symlink is neither
/// read nor advised through.
#[test]
fn a_changed_file_stops_the_stream_with_read_ahead() {
    let big: Vec<u8> = (0..3 * BLOCK + 7).map(|i| (i % 253) as u8).collect();
    let contents: [(&str, &[u8]); 3] = [
        ("a.py", b"a = 1\n"),
        ("big.bin", &big),
        ("pkg/m.py", b"m = 2\n"),
    ];
    let files: Vec<SendFile> = contents
        .iter()
        .enumerate()
        .map(|(i, (p, c))| file(i, p, c))
        .collect();
    // Unchanged: all of it arrives, in order.
    let dir = venv_with(&contents);
    let root = dir.path().to_str().unwrap();
    let mut sink = Recorder::default();
    let sent = send(
        root,
        &files,
        &[],
        None,
        Compression::None,
        &mut sink,
        &Counters::default(),
    )
    .unwrap();
    // The plan hashed every file: the source leaves the hashing to
    // the target, which checks each against the plan.
    assert!(sent.hashes.is_empty(), "{:?}", sent.hashes);
    // The plan did not hash the big file (its stamp vouched for it):
    // the source hashes it, and only it.
    let site = dir.path().join("lib/python3.11/site-packages");
    let stat = |p: &Path| rustix::fs::lstat(p).unwrap();
    let send_all = |files: &[SendFile]| {
        send(
            root,
            files,
            &[],
            None,
            Compression::None,
            &mut Recorder::default(),
            &Counters::default(),
        )
    };
    let mut unhashed = files.clone();
    unhashed[1].kind = Kind::File {
        size: big.len() as u64,
        mode: 0o644,
        blake3: None,
        stamp: Some(stamp_of(&stat(&site.join("big.bin")))),
    };
    let sent = send_all(&unhashed).unwrap();
    let hashed: Vec<(usize, &str)> = sent
        .hashes
        .iter()
        .map(|h| (h.index, h.blake3.as_str()))
        .collect();
    let want = content_hex(ContentHasher::new().update(&big));
    assert_eq!(hashed, [(1, want.as_str())]);
    // The big file changed in its last byte: same size, other hash.
    // Unhashed in the plan, its stamp moved: the source stops.
    let mut changed = big.clone();
    *changed.last_mut().unwrap() ^= 1;
    std::fs::write(site.join("big.bin"), &changed).unwrap();
    let e = send_all(&unhashed).unwrap_err();
    assert!(e.to_string().contains("big.bin"), "{e}");
    assert!(e.to_string().contains("changed since the plan"), "{e}");
    assert_eq!(e.kind, crate::error::ErrorKind::Drift);
    // A parent swapped for a symlink to a look-alike outside the venv.
    std::fs::write(site.join("big.bin"), &big).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("m.py"), b"m = 2\n").unwrap();
    std::fs::remove_dir_all(site.join("pkg")).unwrap();
    std::os::unix::fs::symlink(outside.path(), site.join("pkg")).unwrap();
    let venv = Venv::open(root).unwrap();
    // The files are well within the window: it never waits.
    let ahead = ReadAhead::new(READ_AHEAD, ADVICE);
    let advised = Mutex::new(0usize);
    read_ahead(&venv, &files, &ahead, |_, _, _| {
        *advised.lock().unwrap() += 1
    });
    assert_eq!(
        *advised.lock().unwrap(),
        2,
        "a.py and big.bin, not pkg/m.py"
    );
    let e = send(
        root,
        &files,
        &[],
        None,
        Compression::None,
        &mut Recorder::default(),
        &Counters::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("symlink"), "{e}");
}

/// Records each block's bytes under the segment it belongs to.
#[derive(Default)]
struct Segments {
    marks: Vec<usize>,
    /// Per segment (before any mark: one for the unmarked start), the
    /// stream bytes of its blocks.
    bytes: Vec<Vec<u8>>,
}

impl BlockSink for Segments {
    fn block(&mut self, tag: u8, payload: &[u8]) -> std::io::Result<()> {
        assert_eq!(tag, crate::stream::TAG_STORED);
        if self.bytes.is_empty() {
            self.bytes.push(Vec::new());
        }
        self.bytes.last_mut().unwrap().extend_from_slice(payload);
        Ok(())
    }
    fn segment(&mut self, index: usize) -> std::io::Result<()> {
        self.marks.push(index);
        self.bytes.push(Vec::new());
        Ok(())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The entry names of a stretch of the tar stream, to its end or its zero
/// blocks.
fn entry_names(mut stream: &[u8]) -> Vec<usize> {
    let mut names = Vec::new();
    while stream.len() >= 512 {
        let Some(h) = crate::stream::parse_head(stream[..512].try_into().unwrap()).unwrap() else {
            break;
        };
        names.push(h.index);
        let at = 512 + (h.size as usize).div_ceil(512) * 512;
        stream = &stream[at..];
    }
    names
}

/// Cuts make segments: each starts a block of its own (a block never
/// holds two segments' entries), the sink hears each start in order, and
/// the end-of-archive blocks are a last segment of their own. Without
/// cuts the sink hears none.
#[test]
fn cuts_split_the_stream_into_segments_of_whole_entries() {
    let contents: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| (format!("f{i}.py"), vec![b'a' + i as u8; 700 + i * 300]))
        .collect();
    let refs: Vec<(&str, &[u8])> = contents
        .iter()
        .map(|(n, c)| (n.as_str(), c.as_slice()))
        .collect();
    let dir = venv_with(&refs);
    let root = dir.path().to_str().unwrap();
    let files: Vec<SendFile> = contents
        .iter()
        .enumerate()
        .map(|(i, (n, c))| file(i, n, c))
        .collect();
    let mut sink = Segments::default();
    let counters = Counters::default();
    send(
        root,
        &files,
        &[0, 2, 3],
        None,
        Compression::None,
        &mut sink,
        &counters,
    )
    .unwrap();
    assert_eq!(sink.marks, [0, 1, 2, 3]);
    let names: Vec<Vec<usize>> = sink.bytes.iter().map(|b| entry_names(b)).collect();
    assert_eq!(names, [vec![0, 1], vec![2], vec![3, 4], vec![]]);
    assert!(sink.bytes[3].len() >= 1024 && sink.bytes[3].iter().all(|b| *b == 0));
    let mut whole = Segments::default();
    send(
        root,
        &files,
        &[],
        None,
        Compression::None,
        &mut whole,
        &counters,
    )
    .unwrap();
    assert!(whole.marks.is_empty());
    assert_eq!(entry_names(&whole.bytes[0]), [0, 1, 2, 3, 4]);
}

/// A file the receiver hashes (an empty hash: `pack`'s bundle writer): the
/// source does not hash it, but checks its stamp before and after all the
/// same.
#[test]
fn a_file_the_receiver_hashes_is_not_hashed_but_its_stamp_is_checked() {
    let dir = venv_with(&[("a.py", b"a = 1\n")]);
    let root = dir.path().to_str().unwrap();
    let site = dir.path().join("lib/python3.11/site-packages");
    let send_one = |stamp| {
        let f = SendFile {
            index: 0,
            path: "a.py".into(),
            kind: Kind::File {
                size: 6,
                mode: 0o644,
                blake3: Some(String::new()),
                stamp,
            },
        };
        send(
            root,
            &[f],
            &[],
            None,
            Compression::None,
            &mut Recorder::default(),
            &Counters::default(),
        )
    };
    let e = send_one(None).unwrap_err();
    assert!(e.to_string().contains("changed since the plan"), "{e}");
    let stamp = stamp_of(&rustix::fs::lstat(site.join("a.py")).unwrap());
    let sent = send_one(Some(stamp)).unwrap();
    assert!(sent.hashes.is_empty(), "not hashed: {:?}", sent.hashes);
    assert_eq!(sent.raw_bytes, 6);
}
