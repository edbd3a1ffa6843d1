//! `bundle`'s unit tests: writing, reading and refusing bundles.

use super::*;
use crate::model::ShebangRewrite;

const SITE: &str = "lib/python3.11/site-packages";

fn file(path: &str, bytes: &[u8], mode: u32) -> BundleEntry {
    BundleEntry {
        path: path.into(),
        kind: BundleKind::File {
            size: bytes.len() as u64,
            mode,
            blake3: blake3::hash(bytes).to_hex().to_string(),
        },
        owner: Some("pkg".into()),
    }
}

fn dir(path: &str) -> BundleEntry {
    BundleEntry {
        path: path.into(),
        kind: BundleKind::Dir { mode: 0o755 },
        owner: None,
    }
}

/// A staged folder and its index: a module, a script, a symlink.
fn staged(root: &Path) -> BundleIndex {
    let script = b"#!/src/venv/bin/python\nprint(1)\n";
    std::fs::create_dir_all(root.join(SITE).join("pkg")).unwrap();
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::write(root.join(SITE).join("pkg/__init__.py"), b"x = 1\n").unwrap();
    std::fs::write(root.join("bin/tool"), script).unwrap();
    std::os::unix::fs::symlink("tool", root.join("bin/tool2")).unwrap();
    let mut entries = vec![
        dir("bin"),
        file("bin/tool", script, 0o755),
        BundleEntry {
            path: "bin/tool2".into(),
            kind: BundleKind::Symlink {
                target: "tool".into(),
            },
            owner: None,
        },
        dir("lib"),
        dir("lib/python3.11"),
        dir(SITE),
        dir(&format!("{SITE}/pkg")),
        file(&format!("{SITE}/pkg/__init__.py"), b"x = 1\n", 0o644),
    ];
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    BundleIndex {
        format: BUNDLE_FORMAT,
        python: "3.11".into(),
        site_packages: SITE.into(),
        source_host: "src".into(),
        source_venv: "/src/venv".into(),
        manifest: "[sets.pkg]\ndists = [\"pkg\"]\n".into(),
        sets: vec!["pkg".into()],
        dists: Vec::new(),
        entries,
        facts: Default::default(),
    }
}

/// A body (zstd tar) sealed with a correct trailer: valid to
/// [`Bundle::open`]'s whole-file check, whatever it holds.
fn sealed(t: &Path, name: &str, build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> PathBuf {
    let mut b = tar::Builder::new(Vec::new());
    build(&mut b);
    let tar = b.into_inner().unwrap();
    let mut body = zstd::encode_all(tar.as_slice(), 3).unwrap();
    let t_bytes = trailer(&blake3::hash(&body), body.len() as u64);
    body.extend_from_slice(&t_bytes);
    let p = t.join(name);
    std::fs::write(&p, body).unwrap();
    p
}

fn add_index(b: &mut tar::Builder<Vec<u8>>, index: &BundleIndex) {
    let json = serde_json::to_vec(index).unwrap();
    let mut h = header(tar::EntryType::Regular, 0o644, json.len() as u64);
    b.append_data(&mut h, INDEX_NAME, json.as_slice()).unwrap();
}

#[test]
fn the_same_files_give_the_same_bytes_and_unpack_exactly() {
    let t = tempfile::tempdir().unwrap();
    let index = staged(&t.path().join("stage"));
    let a = write(
        &mut index.clone(),
        &mut Folder(t.path().join("stage")),
        &t.path().join("a.ovl"),
    )
    .unwrap();
    let b = write(
        &mut index.clone(),
        &mut Folder(t.path().join("stage")),
        &t.path().join("b.ovl"),
    )
    .unwrap();
    assert_eq!(a.blake3, b.blake3);
    assert_eq!(
        std::fs::read(t.path().join("a.ovl")).unwrap(),
        std::fs::read(t.path().join("b.ovl")).unwrap()
    );
    // Files whose hashes the index leaves empty are hashed as they are
    // written (one read): the index records them, and the bundle is
    // the same file.
    let mut blank = index.clone();
    for e in &mut blank.entries {
        if let BundleKind::File { blake3, .. } = &mut e.kind {
            blake3.clear();
        }
    }
    let c = write(
        &mut blank,
        &mut Folder(t.path().join("stage")),
        &t.path().join("c.ovl"),
    )
    .unwrap();
    assert_eq!(blank, index, "the writer filled in the hashes");
    assert_eq!(c.blake3, a.blake3);
    // zstd reads it as one stream of one tar (the index's frame, its
    // room's skippable frame, the entries' frame, the trailer).
    let listed = std::process::Command::new("sh")
        .arg("-c")
        .arg("zstd -dcq a.ovl | tar -t")
        .current_dir(t.path())
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(listed.lines().next(), Some(INDEX_NAME), "{listed}");
    for e in index
        .entries
        .iter()
        .filter(|e| !matches!(e.kind, BundleKind::Dir { .. }))
    {
        let name = format!("venv/{}", e.path);
        assert!(listed.lines().any(|l| l == name), "{name} in {listed}");
    }
    let opened = Bundle::open(&t.path().join("a.ovl")).unwrap();
    assert_eq!(opened.index, index);
    // Read in place: the script as packed, rewritten for a target.
    let venv = crate::model::bundle_venv(t.path().join("a.ovl").to_str().unwrap());
    let src = BundleSource::open(&venv).unwrap();
    let rw = ShebangRewrite {
        from: venv.clone(),
        to: "/here".into(),
    };
    let got = src
        .stat(&["../../../bin/tool".into()], Some(&rw), false)
        .unwrap();
    let placed = b"#!/here/bin/python\nprint(1)\n";
    assert_eq!(
        got[0].kind,
        crate::model::Kind::File {
            size: placed.len() as u64,
            mode: 0o755,
            blake3: Some(blake3::hash(placed).to_hex().to_string()),
            stamp: None,
        }
    );
}

#[test]
fn a_pinned_bundle_venv_refuses_a_file_that_holds_another_bundle() {
    let t = tempfile::tempdir().unwrap();
    let index = staged(&t.path().join("stage"));
    let p = t.path().join("a.ovl");
    let packed = write(&mut index.clone(), &mut Folder(t.path().join("stage")), &p).unwrap();
    let abs = p.to_str().unwrap();
    let venv = crate::model::bundle_venv_pinned(abs, &packed.blake3);
    assert_eq!(crate::model::bundle_of(&venv), Some(abs));
    assert_eq!(
        crate::model::bundle_pin(&venv),
        Some(packed.blake3.as_str())
    );
    assert_eq!(
        crate::model::bundle_pin(&crate::model::bundle_venv(abs)),
        None
    );
    assert_eq!(BundleSource::open(&venv).unwrap().blake3(), packed.blake3);
    let other = crate::model::bundle_venv_pinned(abs, &"0".repeat(64));
    let e = BundleSource::open(&other).err().unwrap();
    assert_eq!(e.kind, crate::error::ErrorKind::Drift, "{e:?}");
    assert!(e.message.contains("holds another bundle"), "{e:?}");
}

#[test]
fn a_cut_or_altered_bundle_is_refused_before_it_is_read() {
    let t = tempfile::tempdir().unwrap();
    let index = staged(&t.path().join("stage"));
    let p = t.path().join("a.ovl");
    write(&mut index.clone(), &mut Folder(t.path().join("stage")), &p).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let e = Bundle::open(&p).unwrap_err();
        assert!(e.message.contains("truncated or damaged"), "{cut}: {e:?}");
    }
    for at in [0, bytes.len() / 3, bytes.len() - 30, bytes.len() - 3] {
        let mut bad = bytes.clone();
        bad[at] ^= 1;
        std::fs::write(&p, &bad).unwrap();
        let e = Bundle::open(&p).unwrap_err();
        assert!(e.message.contains("truncated or damaged"), "{at}: {e:?}");
    }
}

/// Every file and symlink of the bundle at `p`, sent from it read in
/// place (as a plan from its own index would ask): the error.
fn send_all(p: &Path) -> Result<crate::model::Sent> {
    let venv = crate::model::bundle_venv(p.to_str().unwrap());
    let src = BundleSource::open(&venv)?;
    let files: Vec<crate::model::SendFile> = src
        .bundle
        .index
        .entries
        .iter()
        .filter_map(|e| {
            let kind = match &e.kind {
                BundleKind::File { size, mode, blake3 } => crate::model::Kind::File {
                    size: *size,
                    mode: *mode,
                    blake3: Some(blake3.clone()),
                    stamp: None,
                },
                BundleKind::Symlink { target } => crate::model::Kind::Symlink {
                    target: target.clone(),
                },
                BundleKind::Dir { .. } => return None,
            };
            Some((e.path.clone(), kind))
        })
        .enumerate()
        .map(|(index, (path, kind))| crate::model::SendFile {
            index,
            path: format!("../../../{path}"),
            kind,
        })
        .collect();
    struct Null;
    impl crate::stream::BlockSink for Null {
        fn block(&mut self, _: u8, _: &[u8]) -> io::Result<()> {
            Ok(())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let counters = crate::inventory::Counters::default();
    src.send(
        &files,
        &[],
        None,
        crate::model::Compression::None,
        &mut Null,
        &counters,
    )
}

#[test]
fn a_sealed_but_hostile_bundle_is_refused_when_it_is_read() {
    let t = tempfile::tempdir().unwrap();
    let mut index = staged(&t.path().join("stage"));
    let unpack = |p: &Path| send_all(p).unwrap_err();
    // A member the index does not name, where it names another.
    let script = b"#!/src/venv/bin/python\nprint(1)\n";
    index.entries = vec![dir("bin"), file("bin/tool", script, 0o755)];
    let p = sealed(t.path(), "extra.ovl", |b| {
        add_index(b, &index);
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        b.append_data(&mut h, "venv/bin/", io::empty()).unwrap();
        let mut h = header(tar::EntryType::Regular, 0o644, 3);
        b.append_data(&mut h, "venv/etc/x", &b"bad"[..]).unwrap();
    });
    assert!(
        unpack(&p).message.contains("where the index has"),
        "{:?}",
        unpack(&p)
    );
    // A file longer than the index says.
    let p = sealed(t.path(), "size.ovl", |b| {
        add_index(b, &index);
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        b.append_data(&mut h, "venv/bin/", io::empty()).unwrap();
        let mut h = header(tar::EntryType::Regular, 0o755, 4096);
        b.append_data(&mut h, "venv/bin/tool", &[0u8; 4096][..])
            .unwrap();
    });
    assert!(
        unpack(&p).message.contains("is not the index's entry"),
        "{:?}",
        unpack(&p)
    );
    // The right size, other bytes.
    let p = sealed(t.path(), "bytes.ovl", |b| {
        add_index(b, &index);
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        b.append_data(&mut h, "venv/bin/", io::empty()).unwrap();
        let mut h = header(tar::EntryType::Regular, 0o755, script.len() as u64);
        b.append_data(&mut h, "venv/bin/tool", &[b'#'; 32][..])
            .unwrap();
    });
    // Sent as the index has it: the target hashes what it writes and
    // refuses bytes that are not the plan's (the index's) hash.
    assert!(send_all(&p).is_ok());
    // A long name past the limit is refused, not read into memory.
    let p = sealed(t.path(), "long.ovl", |b| {
        add_index(b, &index);
        let mut h = header(tar::EntryType::Regular, 0o644, 0);
        b.append_data(
            &mut h,
            "venv/".to_string() + &"a/".repeat(3000),
            io::empty(),
        )
        .unwrap();
    });
    assert!(unpack(&p).message.contains("a name of"));
    // An index path that leaves the venv, or names overlay's state.
    for bad in ["../etc/passwd", "/etc/passwd", ".overlay/journal", "a//b"] {
        index.entries = vec![file(bad, b"x", 0o644)];
        let p = sealed(t.path(), "path.ovl", |b| add_index(b, &index));
        assert!(unpack(&p).message.contains("its index: path"), "{bad}");
    }
    // Not the first member.
    let p = sealed(t.path(), "noindex.ovl", |b| {
        let mut h = header(tar::EntryType::Regular, 0o644, 1);
        b.append_data(&mut h, "venv/x", &b"x"[..]).unwrap();
    });
    assert!(unpack(&p).message.contains("first member"));
}
