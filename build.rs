//! Tells the tests whether they are built as root: the tests that need SSH
//! test hosts (mount namespaces, sshd) or chown are marked
//! `#[cfg_attr(not(overlay_test_root), ignore = "needs root: ...")]`, so
//! that without root `cargo test` reports them as ignored, not passed.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(overlay_test_root)");
    println!("cargo::rerun-if-changed=build.rs");
    // The effective uid is no environment variable, but `sudo`, `su -` and
    // a login as another user change these: then ask again (a target dir
    // built as a user and then tested with `sudo cargo test` must not keep
    // the user's answer).
    for var in ["USER", "HOME", "SUDO_UID"] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    let euid_is_root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false);
    if euid_is_root {
        println!("cargo::rustc-cfg=overlay_test_root");
    }
}
