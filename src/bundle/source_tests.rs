//! A bundle read in place answers as the live venv it was packed from:
//! stat, globs, bytecode, paths behind a symlink, rewritten scripts and the
//! stream's entries, compared with the live readers over the same files.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use super::*;
use crate::bundle::{Folder, write};
use crate::model::{BUNDLE_FORMAT, BundleIndex, HashMode, SourceFacts};

const SITE: &str = "lib/python3.11/site-packages";

/// A venv at `root` with a distribution, bytecode, a script naming the
/// venv, a symlinked directory and a symlink; and a bundle of all of it.
fn venv_and_bundle(t: &Path) -> (String, String) {
    let root = t.join("venv");
    let site = root.join(SITE);
    let r = root.to_str().unwrap().to_string();
    std::fs::create_dir_all(site.join("pkg/__pycache__")).unwrap();
    std::fs::create_dir_all(site.join("pkg/sub")).unwrap();
    std::fs::create_dir_all(site.join("a-1.0.dist-info")).unwrap();
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::write(root.join("pyvenv.cfg"), "version = 3.11.7\n").unwrap();
    let files: &[(&str, &[u8])] = &[
        ("pkg/__init__.py", b"x = 1\n"),
        ("pkg/__pycache__/__init__.cpython-311.pyc", b"\x00pyc\n"),
        ("pkg/__pycache__/__init__.other.txt", b"no\n"),
        ("pkg/sub/m.py", b"y = 2\n"),
        ("pkg/lib.so", b"\x7fELF not really\n"),
        (
            "a-1.0.dist-info/METADATA",
            b"Metadata-Version: 2.1\nName: a\nVersion: 1.0\n",
        ),
        (
            "a-1.0.dist-info/RECORD",
            b"pkg/__init__.py,,\npkg/sub/m.py,,\npkg/lib.so,,\n../../../bin/tool,,\na-1.0.dist-info/METADATA,,\na-1.0.dist-info/RECORD,,\n",
        ),
    ];
    for (p, b) in files {
        std::fs::write(site.join(p), b).unwrap();
    }
    std::fs::write(
        root.join("bin/tool"),
        format!("#!{r}/bin/python\nprint(1)\n"),
    )
    .unwrap();
    std::fs::set_permissions(
        root.join("bin/tool"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("sub", site.join("pkg/linked")).unwrap();
    std::os::unix::fs::symlink("tool", root.join("bin/tool2")).unwrap();
    let mut entries = Vec::new();
    for e in walkdir::WalkDir::new(&root).min_depth(1) {
        let e = e.unwrap();
        let rel = e.path().strip_prefix(&root).unwrap().to_str().unwrap();
        let meta = e.path().symlink_metadata().unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777;
        let kind = if meta.file_type().is_symlink() {
            BundleKind::Symlink {
                target: std::fs::read_link(e.path())
                    .unwrap()
                    .to_string_lossy()
                    .into(),
            }
        } else if meta.is_dir() {
            BundleKind::Dir { mode }
        } else {
            let bytes = std::fs::read(e.path()).unwrap();
            BundleKind::File {
                size: bytes.len() as u64,
                mode,
                blake3: blake3::hash(&bytes).to_hex().to_string(),
            }
        };
        entries.push(BundleEntry {
            path: rel.into(),
            kind,
            owner: None,
        });
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    let scan = crate::inventory::scan(&r, &[]).unwrap();
    let mut index = BundleIndex {
        format: BUNDLE_FORMAT,
        python: "3.11".into(),
        site_packages: SITE.into(),
        source_host: "src".into(),
        source_venv: r.clone(),
        manifest: String::new(),
        sets: vec!["a".into()],
        dists: Vec::new(),
        entries,
        facts: SourceFacts {
            python_full: scan.facts.python_full.clone(),
            dists: scan.dists.clone(),
            ..Default::default()
        },
    };
    let file = t.join("b.ovl");
    write(&mut index, &mut Folder(root.clone()), &file).unwrap();
    (r, crate::model::bundle_venv(file.to_str().unwrap()))
}

/// An entry without the live stat's stamp (a bundle has none).
fn unstamped(mut e: Entry) -> Entry {
    if let Kind::File { stamp, .. } = &mut e.kind {
        *stamp = None;
    }
    e
}

#[test]
fn stat_and_scan_answer_as_the_live_venv() {
    let t = tempfile::tempdir().unwrap();
    let (live, venv) = venv_and_bundle(t.path());
    let b = BundleSource::open(&venv).unwrap();
    let paths: Vec<String> = [
        "pkg/__init__.py",
        "pkg/sub/m.py",
        "pkg/linked/m.py",
        "pkg/linked",
        "pkg/lib.so",
        "pkg/gone.py",
        "pkg",
        "../../../bin/tool",
        "../../../bin/tool2",
        "a-1.0.dist-info/RECORD",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    let rw = ShebangRewrite {
        from: venv.clone(),
        to: "/target/venv".into(),
    };
    let live_rw = ShebangRewrite {
        from: live.clone(),
        to: "/target/venv".into(),
    };
    let got = b.stat(&paths, Some(&rw), true).unwrap();
    let want: Vec<Entry> = crate::inventory::stat(
        &live,
        &paths,
        HashMode::All,
        Some(&live_rw),
        true,
        &Counters::default(),
    )
    .unwrap()
    .into_iter()
    .map(unstamped)
    .collect();
    assert_eq!(got, want);
    assert!(
        matches!(got[2].kind, Kind::ThroughSymlink { .. }),
        "{got:?}"
    );
    assert_eq!(got[0].pyc, ["pkg/__pycache__/__init__.cpython-311.pyc"]);
    // A path that leaves the venv is refused, as by the live stat.
    assert!(b.stat(&["../../../../etc".into()], None, false).is_err());

    let globs = vec!["pkg/**/*.py".to_string(), "pkg/*".to_string()];
    let got = b.scan(&globs).unwrap();
    let want = crate::inventory::scan(&live, &globs).unwrap();
    assert_eq!(got.globs, want.globs);
    assert_eq!(got.dists, want.dists);
    assert_eq!(got.facts, want.facts);
    assert_eq!(got.venv, venv);
    assert!(b.scan(&["../../x".into()]).is_err());
}

/// Collects a stored stream's bytes.
#[derive(Default)]
struct Tar(Vec<u8>);

impl BlockSink for Tar {
    fn block(&mut self, tag: u8, payload: &[u8]) -> std::io::Result<()> {
        assert_eq!(tag, crate::stream::TAG_STORED);
        self.0.extend_from_slice(payload);
        Ok(())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Each entry of a tar stream: type, mode, size, mtime (files only), bytes.
fn entries_of(tar: &[u8]) -> BTreeMap<String, (u8, u32, u64, u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut a = tar::Archive::new(tar);
    for e in a.entries().unwrap().raw(true) {
        let mut e = e.unwrap();
        let h = e.header().clone();
        let mut bytes = Vec::new();
        e.read_to_end(&mut bytes).unwrap();
        let ty = h.entry_type();
        let mtime = if ty.is_file() { h.mtime().unwrap() } else { 0 };
        out.insert(
            String::from_utf8(e.path_bytes().into_owned()).unwrap(),
            (
                ty.as_byte(),
                h.mode().unwrap(),
                h.size().unwrap(),
                mtime,
                bytes,
            ),
        );
    }
    out
}

#[test]
fn the_stream_from_a_bundle_is_the_live_stream_in_another_order() {
    let t = tempfile::tempdir().unwrap();
    let (live, venv) = venv_and_bundle(t.path());
    let b = BundleSource::open(&venv).unwrap();
    let paths: Vec<String> = [
        "pkg/sub/m.py",
        "../../../bin/tool",
        "pkg/__init__.py",
        "../../../bin/tool2",
        "pkg/__pycache__/__init__.cpython-311.pyc",
        "pkg/lib.so",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    let rw = ShebangRewrite {
        from: venv.clone(),
        to: "/target/venv".into(),
    };
    let entries = b.stat(&paths, Some(&rw), false).unwrap();
    let files: Vec<SendFile> = entries
        .into_iter()
        .enumerate()
        .map(|(index, e)| SendFile {
            index,
            path: e.path,
            kind: e.kind,
        })
        .collect();
    let live_rw = ShebangRewrite {
        from: live.clone(),
        to: "/target/venv".into(),
    };
    for cuts in [vec![], vec![0, 2, 5]] {
        let counters = Counters::default();
        let mut got = Tar::default();
        let sent = b
            .send(
                &files,
                &cuts,
                Some(&rw),
                Compression::None,
                &mut got,
                &counters,
            )
            .unwrap();
        let mut want = Tar::default();
        let live_sent = crate::stream::send(
            &live,
            &files,
            &cuts,
            Some(&live_rw),
            Compression::None,
            &mut want,
            &counters,
        )
        .unwrap();
        assert_eq!(entries_of(&got.0), entries_of(&want.0), "cuts {cuts:?}");
        assert_eq!(sent.raw_bytes, live_sent.raw_bytes);
        let script = &entries_of(&got.0)["1"].4;
        assert!(script.starts_with(b"#!/target/venv/bin/python\n"));
        // The rewritten script's hash, as the live source gives it.
        assert_eq!(sent.hashes, live_sent.hashes);
    }
    // A file the bundle holds otherwise than the plan says: refused.
    let mut wrong = files.clone();
    if let Kind::File { size, .. } = &mut wrong[0].kind {
        *size += 1;
    }
    let e = b
        .send(
            &wrong,
            &[],
            None,
            Compression::None,
            &mut Tar::default(),
            &Counters::default(),
        )
        .unwrap_err();
    assert!(e.message.contains("not what the plan saw"), "{e:?}");
}
