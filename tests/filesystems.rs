//! overlay on a file system other than ext4: a real FUSE file system,
//! Debian's `bindfs` (scripts/setup installs it), mounted over the target
//! venv in a mount namespace of this test's own thread.
//!
//! What FUSE changes (docs/design.md, "File systems beyond ext4"): `syncfs`
//! never reaches the daemon, so the barrier must be an fsync per file and
//! per directory; bindfs refuses `RENAME_NOREPLACE` (`EINVAL`), so every
//! move to the backup and into place takes the link-then-unlink fallback;
//! a remount gives the file system a new device number, which rollback's
//! check must not mistake for changed files.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Testbed, assert_same, ok, snapshot};

/// The FUSE mounts this test made, unmounted (newest first) when it ends,
/// passed or not.
struct Mounts(Vec<PathBuf>);

impl Mounts {
    /// `bindfs from at`.
    fn bind(&mut self, from: &Path, at: &Path) {
        ok(
            Command::new("bindfs").arg(from).arg(at).output().unwrap(),
            "bindfs",
        );
        self.0.push(at.to_path_buf());
    }

    /// Unmount `at` (the newest mount there).
    fn unmount(&mut self, at: &Path) {
        ok(Command::new("umount").arg(at).output().unwrap(), "umount");
        if let Some(i) = self.0.iter().rposition(|p| p == at) {
            self.0.remove(i);
        }
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for at in self.0.drain(..).rev() {
            let out = Command::new("umount").arg(&at).output();
            if !out.is_ok_and(|o| o.status.success()) {
                // Busy: detach it, the daemon exits once it is unused.
                let _ = Command::new("umount").arg("-l").arg(&at).status();
            }
        }
    }
}

/// Move this test's thread (and every process it starts) into a mount
/// namespace of its own, nothing of it propagating to the host's.
fn private_mount_namespace() {
    // SAFETY: a plain syscall; it changes only this thread's namespace.
    let r = unsafe { libc::unshare(libc::CLONE_NEWNS) };
    assert_eq!(
        r,
        0,
        "unshare(CLONE_NEWNS): {}",
        std::io::Error::last_os_error()
    );
    ok(
        Command::new("mount")
            .args(["--make-rprivate", "/"])
            .output()
            .unwrap(),
        "mount --make-rprivate /",
    );
}

/// The `statfs` type of `p`'s file system, in hex.
fn fs_type(p: &Path) -> String {
    let out = ok(
        Command::new("stat")
            .args(["-f", "-c", "%t"])
            .arg(p)
            .output()
            .unwrap(),
        "stat -f",
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The newest generation's `durability` as `history --json` shows it.
fn durability(tb: &Testbed) -> serde_json::Value {
    let h = ok(
        tb.overlay(&["history", "dst", "--json"]).output().unwrap(),
        "history",
    );
    let gens: serde_json::Value = serde_json::from_slice(&h.stdout).unwrap();
    gens.as_array()
        .and_then(|g| g.iter().max_by_key(|g| g["id"].as_str().map(String::from)))
        .map(|g| g["durability"].clone())
        .unwrap_or_else(|| panic!("no generation: {gens}"))
}

fn plan_and_apply(tb: &Testbed) -> String {
    ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    let out = ok(tb.overlay(&["apply", "-v"]).output().unwrap(), "apply");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: FUSE mounts in a mount namespace"
)]
fn on_bindfs_apply_rollback_and_rollback_after_a_remount_succeed_with_fsyncs() {
    assert!(
        Path::new("/usr/bin/bindfs").exists() && Path::new("/dev/fuse").exists(),
        "needs bindfs and /dev/fuse (run scripts/setup)"
    );
    let tb = Testbed::local(2);
    tb.write_manifest(common::SCENARIO_SETS);
    private_mount_namespace();
    let mut mounts = Mounts(Vec::new());
    // The target venv at its own path, served by bindfs from beside it.
    let venv = tb.host_venv_dir(1).to_path_buf();
    let real = venv.with_extension("real");
    fs::rename(&venv, &real).unwrap();
    fs::create_dir(&venv).unwrap();
    mounts.bind(&real, &venv);
    assert_eq!(
        fs_type(&venv),
        "65735546",
        "bindfs is FUSE (FUSE_SUPER_MAGIC)"
    );
    let before = snapshot(&venv);

    // Apply: the barrier there is an fsync per file and per directory.
    let err = plan_and_apply(&tb);
    assert!(
        err.contains("the venv is on fuse") && err.contains("(barrier: fsync)"),
        "apply -v names the barrier:\n{err}"
    );
    let d = durability(&tb);
    assert_eq!(d["fs"], "fuse", "{d}");
    assert_eq!(d["barrier"], "fsync", "{d}");
    assert_ne!(snapshot(&venv), before, "the apply changed the venv");

    // Rollback.
    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
    assert_same(&before, &snapshot(&venv), "after the rollback");

    // Apply again, then mount the file system again with a new device
    // number (another FUSE mount takes the number it had), then roll back.
    plan_and_apply(&tb);
    let applied = snapshot(&venv);
    let dev = fs::metadata(&venv).unwrap().dev();
    mounts.unmount(&venv);
    let other = tb.dir().join("holds-the-old-device-number");
    fs::create_dir(&other).unwrap();
    mounts.bind(&real, &other);
    mounts.bind(&real, &venv);
    let new_dev = fs::metadata(&venv).unwrap().dev();
    assert_ne!(
        dev, new_dev,
        "the remount gave the venv a new device number"
    );
    assert_same(&applied, &snapshot(&venv), "after the remount");
    let out = ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback after the remount",
    );
    assert_same(
        &before,
        &snapshot(&venv),
        "after the rollback after the remount",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("differ"), "{err}");
}
