//! A bindfs mount over the target venv, in a mount namespace of the test's
//! own thread (as tests/filesystems.rs does it).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Move this thread (and what it starts) into a mount namespace of its own.
pub fn private_mount_namespace() {
    // SAFETY: a plain syscall; it changes only this thread's namespace.
    let r = unsafe { libc::unshare(libc::CLONE_NEWNS) };
    assert_eq!(
        r,
        0,
        "unshare(CLONE_NEWNS): {}",
        std::io::Error::last_os_error()
    );
    let out = Command::new("mount")
        .args(["--make-rprivate", "/"])
        .output()
        .unwrap();
    assert!(out.status.success(), "mount --make-rprivate /");
}

/// `bindfs from at`, unmounted when dropped.
pub struct Bindfs(PathBuf);

impl Bindfs {
    pub fn mount(from: &Path, at: &Path) -> Bindfs {
        // No kernel caching of entries or attributes: states are put in
        // place behind the daemon's back, in the folder it serves.
        let out = Command::new("bindfs")
            .args(["-o", "entry_timeout=0,attr_timeout=0,negative_timeout=0"])
            .arg(from)
            .arg(at)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "bindfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Bindfs(at.to_path_buf())
    }
}

impl Drop for Bindfs {
    fn drop(&mut self) {
        let out = Command::new("umount").arg(&self.0).output();
        if !out.is_ok_and(|o| o.status.success()) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}
