//! `[hosts.X] sudo = true`: logging in as an ordinary user and running the
//! agent through `sudo -n` (docs/sudo.md), on real sshd test hosts with two
//! ordinary users made once on this machine (the hosts share /etc and
//! /home with it): `ovsudo`, whose sudoers line is exactly the one overlay
//! names in its hint, and `ovplain`, who may not sudo.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Output;

use common::{Testbed, assert_same, ensure_user, ok, snapshot, uid_of};

const SETS: &str = common::SCENARIO_SETS;

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The testbed's manifest with the target reached four ways.
fn manifest(tb: &Testbed) {
    let mut s = String::from("[hosts.src]\nssh = \"src\"\nvenv = \"/root/venv\"\n");
    for (name, ssh, sudo) in [
        ("dst", "ovsudo@dst", "sudo = true\n"),
        ("dst-plain-sudo", "ovplain@dst", "sudo = true\n"),
        ("dst-plain", "ovplain@dst", ""),
    ] {
        s.push_str(&format!(
            "[hosts.{name}]\nssh = \"{ssh}\"\nvenv = \"/root/venv\"\n{sudo}"
        ));
    }
    s.push_str(SETS);
    fs::write(tb.manifest_path(), s).unwrap();
}

/// Every file and folder under `dir` (but those named in `except`) belongs to `uid`.
fn owned_by(dir: &std::path::Path, uid: u32) -> Vec<String> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter(|e| e.metadata().map(|m| m.uid() != uid).unwrap_or(false))
        .map(|e| {
            format!(
                "{} (uid {})",
                e.path().display(),
                e.metadata().unwrap().uid()
            )
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces, sshd, users"
)]
fn sudo_runs_the_agent_as_root_and_a_user_without_it_is_told_what_to_do() {
    ensure_user(
        "ovsudo",
        Some("ovsudo ALL=(root) NOPASSWD: /home/ovsudo/.cache/overlay/overlay-*"),
    );
    ensure_user("ovplain", None);
    let tb = Testbed::new(2);
    // sshd reads a user's keys as that user: the hosts' shared
    // AuthorizedKeysFile is root's 0600 file.
    let keys = tb.host_dir(1).join("authorized_keys");
    fs::set_permissions(&keys, fs::Permissions::from_mode(0o644)).unwrap();
    manifest(&tb);
    let venv = tb.host_venv_dir(1).to_path_buf();
    let before = snapshot(&venv);

    // A user who may not sudo, with `sudo = true`: the sudoers line it needs.
    let out = tb.overlay(&["history", "dst-plain-sudo"]).output().unwrap();
    let (_, err) = text(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("dst-plain-sudo") && err.contains("sudo needs a password for user ovplain"),
        "{err}"
    );
    assert!(
        err.contains("ovplain ALL=(root) NOPASSWD: /home/ovplain/.cache/overlay/overlay-*"),
        "{err}"
    );

    // The same user without sudo, the venv's home closed to it: the path,
    // the host and `sudo = true`.
    let out = tb.overlay(&["history", "dst-plain"]).output().unwrap();
    let (_, err) = text(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("dst-plain")
            && err.contains("/root/venv")
            && err.contains("permission denied"),
        "{err}"
    );
    assert!(err.contains("sudo = true"), "{err}");

    // The venv readable but not writable: the plan works, the apply stops
    // at the state folder with the same advice.
    let home = tb.host_dir(1).join("root");
    fs::set_permissions(&home, fs::Permissions::from_mode(0o755)).unwrap();
    let plain_plan = tb.work.join("plain.json");
    ok(
        tb.overlay(&[
            "plan",
            "src",
            "dst-plain",
            "-o",
            plain_plan.to_str().unwrap(),
        ])
        .output()
        .unwrap(),
        "plan as ovplain",
    );
    let out = tb
        .overlay(&["apply", plain_plan.to_str().unwrap()])
        .output()
        .unwrap();
    let (_, err) = text(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("dst-plain")
            && err.contains("/root/venv/.overlay")
            && err.contains("permission denied"),
        "{err}"
    );
    assert!(err.contains("sudo = true"), "{err}");
    assert_same(&before, &snapshot(&venv), "after the refused runs");

    // The user with sudo: plan, apply and rollback as root. The venvs were
    // copied just now: past the hash cache's racy window (3 s) the plan
    // caches the target's hashes, which shows where the root agent keeps
    // its caches (below). On a fast machine with the agent uploaded by an
    // earlier run, the plan came within the window and cached nothing.
    std::thread::sleep(std::time::Duration::from_secs(4));
    let plan = tb.work.join("sudo.json");
    ok(
        tb.overlay(&["plan", "src", "dst", "-o", plan.to_str().unwrap()])
            .output()
            .unwrap(),
        "plan through sudo",
    );
    ok(
        tb.overlay(&["apply", plan.to_str().unwrap(), "--backup"])
            .output()
            .unwrap(),
        "apply through sudo",
    );
    let changed = snapshot(&venv);
    assert_ne!(before, changed, "the apply changed nothing");
    let wrong = owned_by(&venv, 0);
    assert!(wrong.is_empty(), "not root's after the apply: {wrong:?}");
    // The agent is the login user's file; the caches of the agent that ran
    // as root are root's, in root's home on that host.
    let cache = fs::metadata("/home/ovsudo/.cache/overlay").unwrap();
    assert_eq!(cache.uid(), uid_of("ovsudo"));
    let root_owned = owned_by(std::path::Path::new("/home/ovsudo"), uid_of("ovsudo"));
    assert!(root_owned.is_empty(), "{root_owned:?}");
    assert!(
        home.join(".cache/overlay/hashes").is_dir(),
        "no hash cache in the host's /root"
    );

    // History as the user without sudo: the state folder is closed to it
    // (path and advice); once readable, history works without the lock.
    let out = tb.overlay(&["history", "dst-plain"]).output().unwrap();
    let (_, err) = text(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("dst-plain")
            && err.contains("/root/venv/.overlay")
            && err.contains("sudo = true"),
        "{err}"
    );
    ok(
        std::process::Command::new("chmod")
            .args(["-R", "go+rX"])
            .arg(venv.join(".overlay"))
            .output()
            .unwrap(),
        "chmod",
    );
    let out = ok(
        tb.overlay(&["history", "dst-plain"]).output().unwrap(),
        "history as a reader",
    );
    let (hist, _) = text(&out);
    assert!(hist.contains("complete"), "{hist}");

    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback through sudo",
    );
    assert_same(&before, &snapshot(&venv), "after the rollback");
    let wrong = owned_by(&venv, 0);
    assert!(wrong.is_empty(), "not root's after the rollback: {wrong:?}");
}
