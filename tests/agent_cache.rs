//! The agent cached on each SSH host (`~/.cache/overlay/overlay-<hash>`) is
//! used only while no other user could have replaced it: the file and every
//! folder from the home directory down to it belong to the login user (or
//! root) and are not writable by group or others. A file that fails this is
//! replaced; a folder that fails it stops the run with the folder's name
//! and a hint. Hosts that share a home directory share the file, and their
//! agents start at once without ever finding it gone. Real sshd hosts
//! (tests/common).

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

/// Hosts that share a home directory (an NFS `/home` or `/root`) share the
/// cached agent, and their agents start at once. Each round removes the
/// copy first, so both starts find it missing and upload it at the same
/// moment: one upload's rename must never take away the file the other
/// host is starting (once, remove-then-rename did, and that agent failed
/// with "status 127: ... No such file or directory"). Plan and apply of
/// both targets, 20 rounds.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn hosts_sharing_a_home_start_their_agents_at_once() {
    let mut tb = Testbed::new(3);
    tb.share_home(2, 1);
    tb.write_manifest(SETS);
    // One /root on both, each with its own /root/venv.
    fs::write(tb.host_venv_dir(1).join("only-on-dst"), "").unwrap();
    let seen = ok(
        tb.ssh(2, "echo from dst2 > /root/shared; ls /root/venv")
            .output()
            .unwrap(),
        "ssh dst2",
    );
    assert!(!String::from_utf8_lossy(&seen.stdout).contains("only-on-dst"));
    let seen = ok(tb.ssh(1, "cat /root/shared").output().unwrap(), "ssh dst");
    assert_eq!(String::from_utf8_lossy(&seen.stdout), "from dst2\n");
    fs::remove_file(tb.host_venv_dir(1).join("only-on-dst")).unwrap();
    // The agent stripped (36 MB instead of 120): the same code, uploaded
    // by both hosts for the plan and again for the apply of every round.
    let agent = tb.dir().join("overlay-agent");
    common::run(
        std::process::Command::new("strip")
            .arg("-o")
            .arg(&agent)
            .arg(env!("CARGO_BIN_EXE_overlay")),
    );
    let overlay = |args: &[&str]| {
        let mut c = tb.overlay(args);
        c.env("OVERLAY_AGENT_BINARY", &agent);
        c.output().unwrap()
    };
    let shared = tb.host_dir(1).join("root/.cache/overlay");
    let remove_copies = || {
        for e in fs::read_dir(&shared).into_iter().flatten() {
            let p = e.unwrap().path();
            if p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("overlay-")
            {
                fs::remove_file(p).unwrap();
            }
        }
    };
    let t = std::time::Instant::now();
    const ROUNDS: usize = 20;
    for round in 0..ROUNDS {
        if round > 0 {
            // Something to apply on both targets again.
            for i in [1, 2] {
                fs::remove_file(tb.site_packages(i).join("minitorch/_new_in_211.py")).unwrap();
            }
        }
        remove_copies();
        let out = overlay(&["plan", "src", "dst", "dst2"]);
        ok(out, &format!("round {round}: plan src dst dst2"));
        remove_copies();
        let out = overlay(&["apply"]);
        ok(out, &format!("round {round}: apply to dst and dst2"));
        for i in [1, 2] {
            assert!(
                tb.site_packages(i)
                    .join("minitorch/_new_in_211.py")
                    .is_file()
            );
        }
    }
    eprintln!(
        "--- {ROUNDS} rounds of plan and apply on two hosts sharing /root: {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // One copy, this build, and no upload left behind.
    let left: Vec<String> = fs::read_dir(&shared)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("overlay-"))
        .collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(
        fs::metadata(shared.join(&left[0])).unwrap().len(),
        fs::metadata(&agent).unwrap().len()
    );
}
