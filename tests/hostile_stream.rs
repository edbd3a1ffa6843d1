//! A hostile source against a real `overlay agent`: crafted frames on its
//! stdin after a real `Prepare` and `Stage`. Each stream is refused with a
//! clear error, nothing is written outside staging (the venv is unchanged,
//! the generation discarded), and the agent's peak memory stays bounded.
//!
//! The peak is the agent's `ru_maxrss` as `wait4` reports it at exit, taken
//! by a small Python parent ([`RSS_WRAPPER`]): a child spawned straight
//! from this test process would inherit the test's own high-water mark
//! through `exec` (Linux keeps the larger of the two), and the test builds
//! buffers of hundreds of MiB. The figure is thus an upper bound that
//! includes the wrapper's own ~10 MB.

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use overlay::model::Kind;
use overlay::model::{GenChange, PrepareRequest, SourceHash, StreamEntry};
use overlay::protocol::{
    DATA_BIT, PROTOCOL_VERSION, Request, Response, read_frame, write_data, write_frame,
};

const SITE: &str = "lib/python3.11/site-packages";

/// Peak RSS allowed to the agent, whatever it is sent (generous: measured
/// figures are printed by each test).
const MAX_RSS_KB: i64 = 200 * 1024;

struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

/// Runs its arguments as a child and reports the child's peak RSS on
/// stderr when it exits.
const RSS_WRAPPER: &str = r#"
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
_, status, ru = os.wait4(pid, 0)
sys.stderr.write("\nmaxrss_kb=%d\n" % ru.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status))
"#;

impl Agent {
    fn start() -> Agent {
        let mut child = Command::new("python3")
            .args(["-c", RSS_WRAPPER, env!("CARGO_BIN_EXE_overlay"), "agent"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the agent");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut a = Agent {
            child,
            stdin,
            stdout,
        };
        a.send(&Request::Hello {
            protocol: PROTOCOL_VERSION,
        });
        assert!(matches!(a.recv(), Some(Response::Hello { .. })));
        a
    }

    fn input(&mut self) -> &mut ChildStdin {
        self.stdin.as_mut().expect("stdin open")
    }

    fn send(&mut self, r: &Request) {
        write_frame(self.input(), r).expect("write a request");
    }

    /// The next answer that is not progress; `None` once the agent is gone.
    fn recv(&mut self) -> Option<Response> {
        loop {
            match read_frame::<Response>(&mut self.stdout) {
                Ok(Some(Response::Progress(_))) => continue,
                Ok(r) => return r,
                Err(_) => return None,
            }
        }
    }

    /// End the conversation and return the agent's peak RSS in KiB.
    fn finish(mut self) -> i64 {
        if let Some(mut w) = self.stdin.take() {
            let _ = write_frame(&mut w, &Request::Bye);
        }
        let out = self.child.wait_with_output().expect("the agent ends");
        let err = String::from_utf8_lossy(&out.stderr);
        err.lines()
            .find_map(|l| l.strip_prefix("maxrss_kb="))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no peak RSS reported; stderr: {err}"))
    }
}

/// A venv with `a.py`, and a generation for it: `new.py` (10 bytes, in
/// the plan with mode 755: the target refuses a plan with setuid bits) and `link` (a symlink with a 300-byte target).
struct Target {
    dir: tempfile::TempDir,
}

impl Target {
    fn new() -> Target {
        let dir = tempfile::tempdir().expect("tempdir");
        let site = dir.path().join(SITE);
        std::fs::create_dir_all(&site).unwrap();
        std::fs::write(dir.path().join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
        std::fs::write(site.join("a.py"), "a = 1\n").unwrap();
        Target { dir }
    }

    fn venv(&self) -> String {
        self.dir.path().to_str().unwrap().to_string()
    }

    fn prepare(&self, agent: &mut Agent) {
        let change = GenChange::add;
        agent.send(&Request::Prepare(Box::new(PrepareRequest {
            venv: self.venv(),
            source: "hostile".into(),
            target: "t".into(),
            plan_created: 0,
            changes: vec![
                change(
                    "new.py",
                    Kind::File {
                        size: 10,
                        mode: 0o755,
                        blake3: None,
                        stamp: None,
                    },
                ),
                change(
                    "link",
                    Kind::Symlink {
                        target: LONG_TARGET.to_string(),
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
        })));
        match agent.recv() {
            Some(Response::Prepared { .. }) => {}
            other => panic!("Prepare: {other:?}"),
        }
    }

    /// Every path of the venv but its `.overlay` state, with type, size,
    /// mode and owner.
    fn snapshot(&self) -> BTreeMap<String, (u32, u64, u32, u32)> {
        let mut out = BTreeMap::new();
        for e in walkdir::WalkDir::new(self.dir.path()) {
            let e = e.unwrap();
            let rel = e.path().strip_prefix(self.dir.path()).unwrap();
            if rel.starts_with(".overlay") {
                continue;
            }
            let m = e.path().symlink_metadata().unwrap();
            out.insert(
                rel.display().to_string(),
                (
                    m.mode(),
                    if m.is_dir() { 0 } else { m.len() },
                    m.uid(),
                    m.gid(),
                ),
            );
        }
        out
    }

    /// Whatever staging folders exist, and what they hold.
    fn staged(&self) -> Vec<String> {
        let gens = self.dir.path().join(".overlay/generations");
        let mut out = Vec::new();
        for g in std::fs::read_dir(&gens).into_iter().flatten() {
            let staging = g.unwrap().path().join("staging");
            for e in std::fs::read_dir(&staging).into_iter().flatten() {
                out.push(e.unwrap().path().display().to_string());
            }
        }
        out
    }
}

const LONG_TARGET: &str = concat!(
    "../../../../some/where/quite/far/away/in/a/directory/tree/that/is/deep/",
    "and/has/long/names/for/every/one/of/its/levels/so/that/the/target/is/",
    "longer/than/the/hundred/bytes/a/tar/header/holds/for/a/link/name/which/",
    "used/to/need/a/gnu/long/link/record/before/protocol/seven/came/along/",
    "and/now/travels/as/the/entry/data/x.so"
);

/// A 512-byte tar header for entry `name`, of type `kind`, declaring `size`.
fn header(name: &str, kind: u8, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(4242);
    h.set_gid(4242);
    h.set_cksum();
    h.as_bytes().to_vec()
}

/// `bytes` as stored data frames of at most one block.
fn stored_frames(w: &mut dyn Write, bytes: &[u8]) {
    for block in bytes.chunks(1 << 20) {
        let mut f = vec![0u8];
        f.extend_from_slice(block);
        write_data(w, &f).unwrap();
    }
}

/// What came of a crafted stage: the agent's answer (`None` if it left
/// without one), whether the venv is as before, what staging still holds,
/// and the agent's peak RSS.
struct Outcome {
    answer: Option<Response>,
    unchanged: bool,
    staged_left: Vec<String>,
    rss_kb: i64,
}

/// Prepare, send `frames` after `Stage`, then `EndData` (with `end`) or
/// close the agent's input.
fn stage(frames: impl FnOnce(&mut dyn Write), end: bool) -> Outcome {
    stage_shared(None, frames, end)
}

/// [`stage`] of a stream several targets share, entries mapped by `shared`.
fn stage_shared(
    shared: Option<Vec<StreamEntry>>,
    frames: impl FnOnce(&mut dyn Write),
    end: bool,
) -> Outcome {
    let target = Target::new();
    let before = target.snapshot();
    let mut agent = Agent::start();
    target.prepare(&mut agent);
    agent.send(&Request::Stage { shared });
    frames(agent.input());
    if end {
        agent.send(&Request::EndData { hashes: vec![] });
        agent.input().flush().unwrap();
    } else {
        drop(agent.stdin.take());
    }
    let answer = agent.recv();
    let staged_left = target.staged();
    let rss_kb = agent.finish();
    Outcome {
        answer,
        unchanged: target.snapshot() == before,
        staged_left,
        rss_kb,
    }
}

/// The outcome is an error naming `says`, with nothing left behind.
fn assert_refused(o: &Outcome, says: &str, what: &str) {
    match &o.answer {
        Some(Response::Error(e)) => {
            assert!(e.message.contains(says), "{what}: {}", e.message);
        }
        other => panic!("{what}: expected an error, got {other:?}"),
    }
    assert!(o.unchanged, "{what}: the venv changed");
    assert!(o.staged_left.is_empty(), "{what}: left {:?}", o.staged_left);
    eprintln!("{what}: peak RSS {} KiB", o.rss_kb);
    assert!(o.rss_kb < MAX_RSS_KB, "{what}: peak RSS {} KiB", o.rss_kb);
}

#[test]
fn a_well_formed_stream_with_a_300_byte_symlink_target_is_staged() {
    let target = Target::new();
    let mut agent = Agent::start();
    target.prepare(&mut agent);
    agent.send(&Request::Stage { shared: None });
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(10);
    // The header's mode counts for nothing: the plan's, masked, is written.
    h.set_mode(0o4777);
    tar.append_data(&mut h, "0", &b"0123456789"[..]).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(LONG_TARGET.len() as u64);
    tar.append_data(&mut h, "1", LONG_TARGET.as_bytes())
        .unwrap();
    stored_frames(agent.input(), &tar.into_inner().unwrap());
    // What the source read, for the file the plan had not hashed.
    let hashes = vec![SourceHash {
        index: 0,
        blake3: blake3::hash(b"0123456789").to_hex().to_string(),
    }];
    agent.send(&Request::EndData { hashes });
    match agent.recv() {
        Some(Response::Staged {
            files: 2,
            bytes: 10,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let staged = target.staged();
    let link = staged.iter().find(|p| p.ends_with("/staging/1")).unwrap();
    assert_eq!(
        std::fs::read_link(link).unwrap().to_str().unwrap(),
        LONG_TARGET
    );
    let file = staged.iter().find(|p| p.ends_with("/staging/0")).unwrap();
    let m = std::fs::metadata(file).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o755, "no setuid bit");
    if rustix::process::geteuid().is_root() {
        // Not the stream's 0/0 (or whatever it said): site-packages' owner.
        let site = std::fs::metadata(target.dir.path().join(SITE)).unwrap();
        assert_eq!((m.uid(), m.gid()), (site.uid(), site.gid()));
    }
    agent.send(&Request::Abort);
    assert!(matches!(agent.recv(), Some(Response::Aborted)));
    eprintln!("well-formed: peak RSS {} KiB", agent.finish());
}

#[test]
fn an_entry_larger_than_the_plan_is_refused_before_a_byte_is_written() {
    // new.py is 10 bytes in the plan; the header says 64 MiB, and 64 MiB follow.
    let o = stage(
        |w| {
            let mut bytes = header("0", b'0', 64 << 20);
            bytes.resize(512 + (64 << 20), b'A');
            stored_frames(w, &bytes);
        },
        true,
    );
    assert_refused(
        &o,
        "new.py arrived declaring 67108864 bytes, the plan says 10; refused before writing",
        "oversize entry",
    );
}

#[test]
fn tar_extensions_links_and_special_files_are_refused_from_the_header() {
    for (kind, what) in [
        (b'L', "GNU long name claiming 512 MiB"),
        (b'K', "GNU long link claiming 512 MiB"),
        (b'x', "PAX header"),
        (b'g', "PAX global header"),
        (b'1', "hard link"),
        (b'3', "character device"),
        (b'4', "block device"),
        (b'5', "directory"),
        (b'6', "FIFO"),
    ] {
        let size: u64 = if matches!(kind, b'L' | b'K') {
            512 << 20
        } else {
            0
        };
        let o = stage(
            |w| {
                let mut bytes = header("0", kind, size);
                if kind == b'x' || kind == b'g' {
                    // A PAX record naming a path outside the venv.
                    let rec = b"30 path=../../../../etc/passwd\n";
                    bytes = header("0", kind, rec.len() as u64);
                    bytes.extend_from_slice(rec);
                    bytes.resize(1024, 0);
                    bytes.extend(header("0", b'0', 10));
                    bytes.extend_from_slice(b"0123456789");
                    bytes.resize(2048, 0);
                } else if size > 0 {
                    // 4 MiB of the "name" follow.
                    bytes.resize(512 + (4 << 20), b'n');
                }
                stored_frames(w, &bytes);
            },
            true,
        );
        assert_refused(&o, "is not a regular file or a symlink", what);
    }
}

#[test]
fn a_data_frame_claiming_512_mib_is_refused_unread() {
    let o = stage(
        |w| {
            w.write_all(&((512u32 << 20) | DATA_BIT).to_le_bytes())
                .unwrap();
            w.write_all(&[0u8; 4096]).unwrap();
        },
        false,
    );
    assert_refused(
        &o,
        "data frame of 536870912 bytes is larger than",
        "512 MiB data frame",
    );
}

#[test]
fn a_zstd_bomb_is_refused_at_one_block() {
    // 256 MiB of zeros in a frame of a few KiB.
    let bomb = zstd::bulk::compress(&vec![0u8; 256 << 20], 19).unwrap();
    assert!(bomb.len() < 64 << 10, "{}", bomb.len());
    let o = stage(
        |w| {
            let mut f = vec![1u8];
            f.extend_from_slice(&bomb);
            for _ in 0..4 {
                write_data(w, &f).unwrap();
            }
        },
        true,
    );
    assert_refused(
        &o,
        "does not decompress to at most 1048576 bytes",
        "zstd bomb",
    );
}

/// The venv's files are where the test expects them (a guard against a
/// snapshot that sees nothing).
#[test]
fn the_snapshot_sees_the_venv() {
    assert!(LONG_TARGET.len() >= 300, "{}", LONG_TARGET.len());
    let t = Target::new();
    assert!(t.snapshot().contains_key(&format!("{SITE}/a.py")));
    assert!(Path::new(&t.venv()).join("pyvenv.cfg").exists());
}

/// A map of a shared stream: entry 0 is another target's 10-byte file,
/// entries 1 and 2 are this target's new.py and link.
fn shared_map() -> Option<Vec<StreamEntry>> {
    Some(vec![
        StreamEntry::Skip { size: 10 },
        StreamEntry::Take(0),
        StreamEntry::Take(1),
    ])
}

#[test]
fn a_shared_stream_stages_only_this_target_s_entries() {
    let target = Target::new();
    let mut agent = Agent::start();
    target.prepare(&mut agent);
    agent.send(&Request::Stage {
        shared: shared_map(),
    });
    let mut tar = tar::Builder::new(Vec::new());
    for (name, data) in [("0", &b"other-data"[..]), ("1", &b"0123456789"[..])] {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        tar.append_data(&mut h, name, data).unwrap();
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(LONG_TARGET.len() as u64);
    tar.append_data(&mut h, "2", LONG_TARGET.as_bytes())
        .unwrap();
    stored_frames(agent.input(), &tar.into_inner().unwrap());
    // The controller hands over the source's hashes as this target's changes.
    let hashes = vec![SourceHash {
        index: 0,
        blake3: blake3::hash(b"0123456789").to_hex().to_string(),
    }];
    agent.send(&Request::EndData { hashes });
    match agent.recv() {
        Some(Response::Staged {
            files: 2,
            bytes: 10,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let staged = target.staged();
    assert_eq!(staged.len(), 2, "{staged:?}");
    let file = staged.iter().find(|p| p.ends_with("/staging/0")).unwrap();
    assert_eq!(std::fs::read(file).unwrap(), b"0123456789");
    agent.send(&Request::Abort);
    assert!(matches!(agent.recv(), Some(Response::Aborted)));
    agent.finish();
}

#[test]
fn a_shared_stream_s_skipped_entry_larger_than_the_map_says_is_refused() {
    let o = stage_shared(
        shared_map(),
        |w| {
            let mut bytes = header("0", b'0', 64 << 20);
            bytes.resize(512 + (64 << 20), b'A');
            stored_frames(w, &bytes);
        },
        true,
    );
    assert_refused(
        &o,
        "entry 0 of the shared stream declares 67108864 bytes, the plan says 10",
        "oversize skipped entry",
    );
}

#[test]
fn a_shared_stream_s_entry_outside_the_map_or_twice_is_refused() {
    let o = stage_shared(
        shared_map(),
        |w| {
            let mut bytes = header("7", b'0', 10);
            bytes.resize(1024, b'A');
            stored_frames(w, &bytes);
        },
        true,
    );
    assert_refused(&o, "unexpected entry 7 in the shared stream", "entry 7");
    let o = stage_shared(
        shared_map(),
        |w| {
            let mut bytes = header("0", b'0', 10);
            bytes.resize(1024, b'A');
            bytes.extend(header("0", b'0', 10));
            bytes.resize(2048, b'A');
            stored_frames(w, &bytes);
        },
        true,
    );
    assert_refused(
        &o,
        "entry 0 appears twice in the shared stream",
        "entry 0 twice",
    );
}
