//! Tests of `beneath`.

use super::*;
use std::os::unix::fs::symlink;

fn tree() -> (tempfile::TempDir, Beneath, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("venv");
    let outside = t.path().join("outside");
    std::fs::create_dir_all(root.join("pkg/sub")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("x"), b"outside").unwrap();
    symlink(&outside, root.join("pkg/evil")).unwrap();
    symlink("../../outside", root.join("pkg/rel")).unwrap();
    std::fs::write(root.join("pkg/sub/a"), b"a").unwrap();
    let b = Beneath::open(&root).unwrap();
    (t, b, outside)
}

#[test]
fn paths_are_normal_or_refused() {
    for bad in ["", "/a", "a//b", "a/./b", "a/../b", "..", ".", "a/", "a\0b"] {
        assert_eq!(normalize(bad), None, "{bad:?}");
    }
    for good in ["a", "a/b", ".overlay/x", "a/..b/c", "...", "a b/c\nd"] {
        assert_eq!(normalize(good), Some(good));
    }
}

#[test]
fn nothing_goes_through_a_symlinked_parent() {
    let (_t, b, outside) = tree();
    for link in ["pkg/evil", "pkg/rel"] {
        let x = format!("{link}/x");
        let y = format!("{link}/y");
        let e = b.create_new(&y, 0o600).unwrap_err();
        assert!(is_refused(&e), "{e:?}");
        assert!(is_refused(&b.open_read(&x).unwrap_err()));
        assert!(is_refused(&b.remove_file(&x).unwrap_err()));
        assert!(is_refused(&b.create_dir(&y, 0o700).unwrap_err()));
        assert!(is_refused(
            &b.create_dir_all(&format!("{y}/z"), 0o700).unwrap_err()
        ));
        assert!(is_refused(&b.rename("pkg/sub/a", &b, &y).unwrap_err()));
        assert!(is_refused(&b.symlink("t", &y).unwrap_err()));
        assert!(is_refused(&b.write_atomic(&y, b"no", 0o600).unwrap_err()));
        assert!(b.lstat(&x).is_err());
        assert!(!b.exists(&x));
    }
    // A symlink at the end is an entry of its own: read as such, moved as such.
    assert!(is_refused(&b.open_read("pkg/evil").unwrap_err()));
    assert!(b.kind("pkg/evil").unwrap().unwrap().is_symlink());
    b.rename("pkg/evil", &b, "pkg/moved").unwrap();
    assert_eq!(std::fs::read(outside.join("x")).unwrap(), b"outside");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
}

#[test]
fn a_dir_cache_refuses_the_same_and_follows_its_own_renames() {
    let (_t, b, outside) = tree();
    let c = DirCache::new(&b);
    for link in ["pkg/evil", "pkg/rel"] {
        let y = format!("{link}/y");
        assert!(is_refused(&c.create_dir(&y, 0o700).unwrap_err()));
        assert!(is_refused(
            &c.create_dir_all(&format!("{y}/z"), 0o700).unwrap_err()
        ));
        assert!(is_refused(
            &c.rename_noreplace("pkg/sub/a", &c, &y).unwrap_err()
        ));
        assert!(!c.exists(&format!("{link}/x")));
    }
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
    // Cache "pkg/sub", move it away, put another directory at its
    // path: what follows goes to the new one.
    assert!(c.exists("pkg/sub/a"));
    c.create_dir_all("pkg/sub/deep/er", 0o700).unwrap();
    c.create_dir("moved", 0o700).unwrap();
    c.rename_noreplace("pkg/sub", &c, "moved/sub").unwrap();
    assert!(!c.exists("pkg/sub/a"));
    assert!(c.exists("moved/sub/a") && c.exists("moved/sub/deep/er"));
    c.create_dir_all("pkg/sub/deep/er", 0o700).unwrap();
    c.rename_noreplace("moved/sub/a", &c, "pkg/sub/deep/er/a")
        .unwrap();
    assert_eq!(std::fs::read(b.shown("pkg/sub/deep/er/a")).unwrap(), b"a");
    c.remove_dir("moved/sub/deep/er").unwrap();
    assert!(!c.exists("moved/sub/deep/er") && c.exists("moved/sub/deep"));
    assert_eq!(
        c.rename_noreplace("pkg/sub/deep", &c, "moved/sub/deep")
            .unwrap_err()
            .raw_os_error(),
        Some(Errno::EXIST.raw_os_error())
    );
    // Past its size, the cache starts over and still works.
    for k in 0..2 * CACHED_DIRS {
        c.create_dir_all(&format!("many/{k}/x"), 0o700).unwrap();
    }
    assert!(c.dirs.borrow().len() <= CACHED_DIRS);
    assert!(c.exists("many/0/x") && c.exists(&format!("many/{}/x", 2 * CACHED_DIRS - 1)));
}

#[test]
fn the_component_walk_refuses_the_same() {
    let (_t, b, _) = tree();
    let saved = OPENAT2.swap(2, Ordering::Relaxed);
    let r = b.create_new("pkg/evil/y", 0o600).unwrap_err();
    let r2 = b.create_new("pkg/sub/a/y", 0o600).unwrap_err();
    let ok = b.create_new("pkg/sub/new", 0o600);
    OPENAT2.store(saved, Ordering::Relaxed);
    assert!(is_refused(&r), "{r}");
    assert!(!is_refused(&r2), "a file in the chain is ENOTDIR: {r2}");
    ok.unwrap();
}

#[test]
fn remove_all_never_follows_a_link_and_append_creates() {
    let (_t, b, outside) = tree();
    b.create_dir_all("g/s/t", 0o700).unwrap();
    b.symlink(outside.to_str().unwrap(), "g/s/out").unwrap();
    b.symlink("../../../outside", "g/s/t/rel").unwrap();
    {
        use std::io::Write;
        let mut f = b.open_append("g/s/t/j", 0o600).unwrap();
        f.write_all(b"one\n").unwrap();
        let mut f = b.open_append("g/s/t/j", 0o600).unwrap();
        f.write_all(b"two\n").unwrap();
    }
    assert_eq!(b.read("g/s/t/j", 100).unwrap(), b"one\ntwo\n");
    assert!(is_refused(&b.open_append("pkg/evil/j", 0o600).unwrap_err()));
    assert!(b.open_append("pkg/evil", 0o600).is_err());
    b.set_dir_mode("g/s", 0o750).unwrap();
    assert_eq!(b.lstat("g/s").unwrap().unwrap().st_mode & 0o7777, 0o750);
    assert!(is_refused(&b.set_dir_mode("pkg/evil", 0o777).unwrap_err()));
    b.remove_all("g").unwrap();
    b.remove_all("g").unwrap();
    assert!(!b.exists("g"));
    assert!(is_refused(&b.remove_all("pkg/evil/x").unwrap_err()));
    b.remove_all("pkg/evil").unwrap();
    assert_eq!(std::fs::read(outside.join("x")).unwrap(), b"outside");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
}

#[test]
fn atomic_writes_replace_whole_files() {
    let (_t, b, _) = tree();
    b.create_dir_all("s/t", 0o700).unwrap();
    b.write_atomic("s/t/meta.json", b"one", 0o600).unwrap();
    b.write_atomic("s/t/meta.json", b"two", 0o600).unwrap();
    assert_eq!(b.read("s/t/meta.json", 10).unwrap(), b"two");
    assert_eq!(b.list("s/t").unwrap(), vec!["meta.json".to_string()]);
    assert!(b.read("s/t/meta.json", 2).is_err());
    let st = b.lstat("s/t/meta.json").unwrap().unwrap();
    assert_eq!(st.st_mode & 0o777, 0o600);
    assert!(!b.is_empty_dir("s").unwrap());
    b.remove_file("s/t/meta.json").unwrap();
    assert!(b.is_empty_dir("s/t").unwrap());
    b.remove_dir("s/t").unwrap();
    assert!(b.lstat("s/t").unwrap().is_none());
}

/// Where the file system refuses `RENAME_NOREPLACE`: a file or symlink
/// is linked then unlinked, a directory renamed after checking the
/// destination; nothing at the destination is ever replaced.
#[test]
fn the_no_replace_fallback_never_replaces() {
    let (_t, b, _outside) = tree();
    let root = b.path().to_path_buf();
    let fallback = |from: &str, to: &str| {
        let (ff, fname) = b.parent(from).unwrap();
        let (tf, tname) = b.parent(to).unwrap();
        noreplace_fallback(ff.as_fd(), fname, tf.as_fd(), tname)
    };
    std::fs::write(root.join("f"), b"new").unwrap();
    std::fs::write(root.join("g"), b"old").unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("d/in"), b"x").unwrap();
    std::fs::create_dir(root.join("e")).unwrap();
    symlink("f", root.join("l")).unwrap();
    // Onto something: EEXIST, both untouched.
    for (from, to) in [("f", "g"), ("d", "e"), ("d", "g"), ("l", "g"), ("f", "e")] {
        let e = fallback(from, to).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{from} -> {to}");
    }
    assert_eq!(std::fs::read(root.join("g")).unwrap(), b"old");
    assert_eq!(std::fs::read(root.join("f")).unwrap(), b"new");
    // Onto nothing: moved.
    fallback("f", "f2").unwrap();
    fallback("d", "d2").unwrap();
    fallback("l", "l2").unwrap();
    assert!(!root.join("f").exists() && !root.join("d").exists());
    assert_eq!(std::fs::read(root.join("f2")).unwrap(), b"new");
    assert_eq!(std::fs::read(root.join("d2/in")).unwrap(), b"x");
    assert_eq!(std::fs::read_link(root.join("l2")).unwrap(), Path::new("f"));
    // A link-then-unlink cut short between the two: the next move finishes it.
    std::fs::hard_link(root.join("f2"), root.join("f3")).unwrap();
    fallback("f2", "f3").unwrap();
    assert!(!root.join("f2").exists());
    assert_eq!(std::fs::read(root.join("f3")).unwrap(), b"new");
    // And through the cache, with the flag (this file system takes it).
    let cache = DirCache::new(&b);
    cache.rename_noreplace("f3", &cache, "f4").unwrap();
    let e = cache.rename_noreplace("f4", &cache, "g").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
}
