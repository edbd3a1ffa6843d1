//! The local route's tests: a copy staged exactly, a symlink or a changed
//! file in the source refused.

use super::kernel::COPY_STEP;
use super::*;
use crate::journal::State;
use crate::model::{GenChange, PrepareRequest, StageCount};
use std::fs;

const SITE: &str = "lib/python3.11/site-packages";

fn hex(d: &[u8]) -> String {
    content_hex(ContentHasher::new().update(d))
}

fn planned(d: &[u8], mode: u32) -> Kind {
    Kind::File {
        size: d.len() as u64,
        mode,
        blake3: Some(hex(d)),
        stamp: None,
    }
}

fn venv(dir: &Path) {
    fs::create_dir_all(dir.join(SITE)).unwrap();
    fs::create_dir_all(dir.join("bin")).unwrap();
    fs::write(dir.join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
}

/// A source venv and a target venv with a generation opened to carry
/// a big file (several copy steps, not a multiple of anything), a
/// small one, a symlink pointing out of the venv, and a script whose
/// shebang names the source venv.
struct Pair {
    _dir: tempfile::TempDir,
    src: std::path::PathBuf,
    dst: std::path::PathBuf,
    _state: State,
    g: Generation,
    big: Vec<u8>,
}

impl Pair {
    fn new() -> Pair {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        venv(&src);
        venv(&dst);
        let big: Vec<u8> = (0..COPY_STEP + 3 * READ_BUF + 777)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
            .collect();
        fs::write(src.join(SITE).join("big.so"), &big).unwrap();
        fs::write(src.join(SITE).join("small.py"), b"x = 1\n").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.join(SITE).join("out")).unwrap();
        let script = format!("#!{}/bin/python\nprint(1)\n", src.display());
        fs::write(src.join("bin/tool"), script).unwrap();
        let rewritten = format!("#!{}/bin/python\nprint(1)\n", dst.display());
        let v = dst.to_str().unwrap().to_string();
        let state = State::open(&v).unwrap();
        let req = PrepareRequest {
            venv: v,
            source: "s".into(),
            target: "t".into(),
            plan_created: 0,
            changes: vec![
                GenChange::add("big.so", planned(&big, 0o755)),
                GenChange::add("small.py", planned(b"x = 1\n", 0o4644)),
                GenChange::add(
                    "out",
                    Kind::Symlink {
                        target: "/etc/passwd".into(),
                    },
                ),
                GenChange::add("../../../bin/tool", planned(rewritten.as_bytes(), 0o755)),
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
        let g = state.prepare(&req, &Counters::default()).unwrap();
        Pair {
            _dir: dir,
            src,
            dst,
            _state: state,
            g,
            big,
        }
    }

    fn copy(&self) -> Result<Copied> {
        let shebang = ShebangRewrite {
            from: self.src.to_str().unwrap().into(),
            to: self.dst.to_str().unwrap().into(),
        };
        copy_local(
            &self.g,
            &self.dst,
            self.src.to_str().unwrap(),
            Some(&shebang),
            &Counters::default(),
            &|| false,
        )
    }

    fn staging(&self) -> std::path::PathBuf {
        self.g.dir.join("staging")
    }
}

/// Where the filesystem has no reflinks (ext4, tmpfs: where the tests
/// run), a big file is copied past the page cache where staging takes
/// `O_DIRECT` (ext4), the rest by `copy_file_range`, and staged exactly: the
/// symlink that points out of the venv as a symlink, the script with
/// its shebang rewritten, modes masked, every digest the plan's.
#[test]
fn without_reflinks_the_kernel_copies_by_copy_file_range_and_stages_exactly() {
    let p = Pair::new();
    let c = p.copy().unwrap();
    let st = p.staging();
    assert!(fs::read(st.join("0")).unwrap() == p.big);
    assert_eq!(fs::read(st.join("1")).unwrap(), b"x = 1\n");
    assert_eq!(
        fs::read_link(st.join("2")).unwrap(),
        Path::new("/etc/passwd")
    );
    let script = fs::read_to_string(st.join("3")).unwrap();
    assert!(script.starts_with(&format!("#!{}/bin/python", p.dst.display())));
    let mode = |n: &str| fs::metadata(st.join(n)).unwrap().permissions().mode() & 0o7777;
    assert_eq!((mode("0"), mode("1")), (0o755, 0o644));
    assert_eq!(
        c.count,
        StageCount {
            files: 4,
            bytes: p.big.len() as u64 + 6 + script.len() as u64
        }
    );
    assert_eq!(c.copies.rewritten, 1);
    assert_eq!(
        c.copies.reflink + c.copies.direct + c.copies.copy_range + c.copies.read_write,
        2
    );
    let reflinks = matches!(
        rustix::fs::statfs(&p.dst).map(|s| s.f_type as u64),
        Ok(0x9123_683E | 0x5846_5342)
    );
    if !reflinks {
        // The big file past the page cache where staging takes O_DIRECT.
        let want = if direct_io_fs(&p.staging()) {
            (1, 1)
        } else {
            (0, 2)
        };
        let got = (c.copies.direct, c.copies.copy_range);
        assert_eq!(got, want, "{:?}", c.copies);
    }
    let mut digests: Vec<(usize, String)> = c
        .written
        .iter()
        .map(|w| (w.index, w.blake3.clone()))
        .collect();
    digests.sort();
    assert_eq!(digests[0], (0, hex(&p.big)));
    assert_eq!(digests[2], (3, hex(script.as_bytes())));
}

/// A symlink swapped in for a source file (pointing at a file with the
/// very content the plan expects) is refused, not followed.
#[test]
fn a_symlink_swapped_in_for_a_source_file_is_refused() {
    let p = Pair::new();
    let outside = p.src.parent().unwrap().join("outside.py");
    fs::write(&outside, b"x = 1\n").unwrap();
    let small = p.src.join(SITE).join("small.py");
    fs::remove_file(&small).unwrap();
    std::os::unix::fs::symlink(&outside, &small).unwrap();
    let e = p.copy().unwrap_err();
    assert_eq!(e.kind, crate::error::ErrorKind::Drift, "{}", e.message);
    assert!(
        e.message.contains("changed since the plan"),
        "{}",
        e.message
    );
    assert!(!p.staging().join("1").exists());
    // Its parent swapped for a symlink: refused as well.
    let p = Pair::new();
    let site = p.src.join(SITE);
    let real = p.src.join("real-site");
    fs::rename(&site, &real).unwrap();
    std::os::unix::fs::symlink(&real, &site).unwrap();
    let e = p.copy().unwrap_err();
    assert!(e.message.contains("symlink"), "{}", e.message);
}

/// A file changed since the plan (same size, other bytes) is refused
/// with the stream's error, and so is one cut shorter.
#[test]
fn a_file_changed_since_the_plan_is_refused() {
    let p = Pair::new();
    let mut big = p.big.clone();
    big[COPY_STEP + 5] ^= 1;
    fs::write(p.src.join(SITE).join("big.so"), &big).unwrap();
    let e = p.copy().unwrap_err();
    assert_eq!(e.kind, crate::error::ErrorKind::Drift);
    assert!(
        e.message.contains("big.so changed since the plan"),
        "{}",
        e.message
    );
    assert!(e.hint.unwrap().contains("overlay plan"));
    let p = Pair::new();
    fs::write(p.src.join(SITE).join("small.py"), b"x = 12\n").unwrap();
    let e = p.copy().unwrap_err();
    assert!(
        e.message.contains("small.py changed since the plan"),
        "{}",
        e.message
    );
}
