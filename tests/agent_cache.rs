//! The agent cached on each SSH host (`~/.cache/overlay/overlay-<hash>`) is
//! used only while no other user could have replaced it: the file and every
//! folder from the home directory down to it belong to the login user (or
//! root) and are not writable by group or others. A file that fails this is
//! replaced; a folder that fails it stops the run with the folder's name
//! and a hint. Real sshd hosts (tests/common).

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use common::{Testbed, ok};

const SETS: &str = "[sets.torch]\ndists = [\"minitorch\"]\n";

/// The one cached agent on host `i`, seen from the test process.
fn cached_agent(tb: &Testbed, i: usize) -> PathBuf {
    let dir = tb.host_dir(i).join("root/.cache/overlay");
    let agents: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("overlay-")
        })
        .collect();
    assert_eq!(agents.len(), 1, "{agents:?}");
    agents[0].clone()
}

fn chmod(p: &std::path::Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn plan(tb: &Testbed) -> std::process::Output {
    tb.overlay(&["plan", "src", "dst"]).output().unwrap()
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn an_unsafe_cache_is_replaced_or_refused() {
    let tb = Testbed::new(2);
    tb.write_manifest(SETS);
    ok(plan(&tb), "the first plan");
    let agent = cached_agent(&tb, 1);
    let dir = agent.parent().unwrap().to_path_buf();
    let ino = || fs::symlink_metadata(&agent).unwrap().ino();
    let first = ino();

    // A group-writable folder: refused, naming host, folder and the fix;
    // the file in it is neither used nor replaced.
    chmod(&dir, 0o770);
    let out = plan(&tb);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("Refusing to run the agent on dst")
            && err.contains("/root/.cache/overlay is writable by its group or others (mode 0770)"),
        "{err}"
    );
    assert!(
        err.contains("hint: on that host, run `chmod go-w /root/.cache/overlay`"),
        "{err}"
    );
    eprintln!("--- refused:\n{err}");
    assert_eq!(ino(), first, "not replaced in an unsafe folder");
    // The same for a folder above it, up to the home directory.
    chmod(&dir, 0o700);
    let home = tb.host_dir(1).join("root");
    chmod(&home, 0o707);
    let out = plan(&tb);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("`chmod go-w /root`"), "{err}");
    chmod(&home, 0o700);

    // A group-writable file in a safe folder: replaced by a fresh upload.
    chmod(&agent, 0o775);
    ok(plan(&tb), "a plan with a group-writable agent file");
    let m = fs::symlink_metadata(&agent).unwrap();
    assert_ne!(m.ino(), first, "replaced");
    assert_eq!(m.mode() & 0o7777, 0o755);

    // A file of another user: replaced.
    std::os::unix::fs::lchown(&agent, Some(4242), None).unwrap();
    let before = ino();
    ok(plan(&tb), "a plan with an agent file of another user");
    let m = fs::symlink_metadata(&agent).unwrap();
    assert_ne!(m.ino(), before, "replaced");
    assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o755));

    // A symlink in its place (even to a genuine build): replaced by the file.
    let elsewhere = tb.host_dir(1).join("root/overlay-copy");
    fs::copy(&agent, &elsewhere).unwrap();
    fs::remove_file(&agent).unwrap();
    std::os::unix::fs::symlink("/root/overlay-copy", &agent).unwrap();
    ok(plan(&tb), "a plan with a symlink for the agent");
    assert!(fs::symlink_metadata(&agent).unwrap().is_file());

    // The source host was never touched and still runs its cached agent.
    assert_eq!(
        fs::metadata(cached_agent(&tb, 0)).unwrap().mode() & 0o7777,
        0o755
    );
}
