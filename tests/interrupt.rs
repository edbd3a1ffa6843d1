//! Ctrl-C during `overlay apply`: the controller gets SIGINT (from
//! `kill(2)`, as a terminal sends it) while the files stream and while the
//! target switches; it must stop by itself with exit 130, say where the
//! target stands and what to run next, and leave the target fully old,
//! with no generation left over, so that the next apply and rollback work.
//!
//! The moments are made deterministic with two test hooks, no timing:
//! `OVERLAY_TEST_PAUSE_AT=stream` makes the controller wait at the first
//! event of the stream, `switch:N` makes the target's agent wait after the
//! N-th step of its switch (over SSH through `~/.ssh/environment`, which
//! the test hosts' sshd reads for `OVERLAY_TEST_*`); each creates the file
//! `OVERLAY_TEST_PAUSE_MARK` when it waits, and waits until the interrupt.

mod common;

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Testbed, assert_same, ok, snapshot};

const SETS: &str = common::SCENARIO_SETS;
/// Longer than any run may take: a run still going then hangs.
const WATCHDOG: Duration = Duration::from_secs(120);

/// Run `cmd` (its own process group), wait until `mark` appears, then send
/// SIGINT to the whole group, as a terminal's Ctrl-C does (local agents
/// run in a group of their own and must not get it); return its output.
fn interrupt_when(mut cmd: Command, mark: &Path, what: &str) -> Output {
    let _ = fs::remove_file(mark);
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !mark.exists() {
        if child.try_wait().unwrap().is_some() || t.elapsed() > WATCHDOG {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: never paused ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: kill(2) of the process group this test started.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) };
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > WATCHDOG {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: hangs after Ctrl-C:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = child.wait_with_output().unwrap();
    eprintln!(
        "{what}: ended {:?} after Ctrl-C, saying:\n{}",
        t.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Exit 130, and stderr says `state` and names the command to run next.
fn assert_interrupted(out: &Output, state: &str, next: &str, what: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{what}: {err}");
    assert!(err.contains(state), "{what}: {state:?} not said: {err}");
    assert!(err.contains(next), "{what}: {next:?} not named: {err}");
    assert!(!err.contains("error:"), "{what}: {err}");
}

/// The target is as before, and keeps no generation of the stopped apply.
fn untouched(tb: &Testbed, before: &std::collections::BTreeMap<String, String>, what: &str) {
    assert_same(before, &snapshot(tb.host_venv_dir(1)), what);
    let gens = tb.host_venv_dir(1).join(".overlay/generations");
    let left: Vec<_> = fs::read_dir(&gens)
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "{what}: generations left: {left:?}");
}

/// After the interruptions: a plain apply works, and its rollback brings
/// the target back.
fn apply_and_roll_back(tb: &Testbed, before: &std::collections::BTreeMap<String, String>) {
    ok(
        tb.overlay(&["apply", "--backup"]).output().unwrap(),
        "apply after the interruptions",
    );
    assert_ne!(&snapshot(tb.host_venv_dir(1)), before, "nothing applied");
    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
    assert_same(before, &snapshot(tb.host_venv_dir(1)), "after the rollback");
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn ctrl_c_over_ssh_leaves_the_target_fully_old() {
    let t = Instant::now();
    let tb = Testbed::new(2);
    tb.write_manifest(SETS);
    // The source reaches the target with its own ssh, for --direct.
    let manifest = tb.manifest_path();
    let text = fs::read_to_string(&manifest).unwrap().replacen(
        "[hosts.dst]\n",
        "[hosts.dst]\ndirect_ssh = \"dst-direct\"\n",
        1,
    );
    fs::write(&manifest, text).unwrap();
    common::let_host_reach(&tb, 0, 1, "dst-direct", true);
    let before = snapshot(tb.host_venv_dir(1));
    ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    eprintln!("planned: {:?}", t.elapsed());
    let mark = tb.dir().join("paused");

    // While the files stream through this machine.
    let what = "Ctrl-C while streaming";
    let mut cmd = tb.overlay(&["apply", "--backup"]);
    cmd.env("OVERLAY_TEST_PAUSE_AT", "stream")
        .env("OVERLAY_TEST_PAUSE_MARK", &mark);
    let out = interrupt_when(cmd, &mark, what);
    assert_interrupted(
        &out,
        "interrupted: nothing changed on dst (staging discarded)",
        "overlay apply",
        what,
    );
    untouched(&tb, &before, what);
    eprintln!("{what}: {:?}", t.elapsed());

    // In the middle of the switch: the target's agent waits after step 3.
    let what = "Ctrl-C in the switch";
    let ssh_dir = tb.host_dir(1).join("root/.ssh");
    fs::create_dir_all(&ssh_dir).unwrap();
    fs::write(
        ssh_dir.join("environment"),
        "OVERLAY_TEST_PAUSE_AT=switch:3\nOVERLAY_TEST_PAUSE_MARK=/tmp/paused\n",
    )
    .unwrap();
    let out = interrupt_when(
        tb.overlay(&["apply", "--backup"]),
        &tb.host_dir(1).join("tmp/paused"),
        what,
    );
    fs::remove_file(ssh_dir.join("environment")).unwrap();
    assert_interrupted(
        &out,
        "interrupted: dst is back to its state before this apply",
        "overlay apply",
        what,
    );
    untouched(&tb, &before, what);
    eprintln!("{what}: {:?}", t.elapsed());

    // On the direct route: the source is cut off, the target discards the
    // staging (or, if the source's own stream to it is still being torn
    // down, its next command does).
    let what = "Ctrl-C on the direct route";
    let mut cmd = tb.overlay(&["apply", "--backup", "--direct"]);
    cmd.env("OVERLAY_TEST_PAUSE_AT", "stream")
        .env("OVERLAY_TEST_PAUSE_MARK", &mark);
    let out = interrupt_when(cmd, &mark, what);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_interrupted(
        &out,
        "interrupted: nothing changed on dst",
        "overlay apply",
        what,
    );
    if !err.contains("(staging discarded)") {
        assert!(
            err.contains("the next overlay command there discards"),
            "{err}"
        );
        ok(tb.overlay(&["history", "dst"]).output().unwrap(), "history");
    }
    untouched(&tb, &before, what);
    eprintln!("{what}: {:?}", t.elapsed());

    // Over several connections (issue 45): every lane stops, the target
    // discards the one generation they stage into (or, if a lane's
    // receiving agent is still being torn down, its next command does).
    let what = "Ctrl-C while streaming over 3 connections";
    let mut cmd = tb.overlay(&["apply", "--backup", "--connections", "3"]);
    cmd.env("OVERLAY_TEST_PAUSE_AT", "stream")
        .env("OVERLAY_TEST_PAUSE_MARK", &mark);
    let out = interrupt_when(cmd, &mark, what);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_interrupted(
        &out,
        "interrupted: nothing changed on dst",
        "overlay apply",
        what,
    );
    if !err.contains("(staging discarded)") {
        ok(tb.overlay(&["history", "dst"]).output().unwrap(), "history");
    }
    untouched(&tb, &before, what);
    eprintln!("{what}: {:?}", t.elapsed());

    apply_and_roll_back(&tb, &before);
    eprintln!("over SSH: {:?}", t.elapsed());
}

#[test]
fn ctrl_c_on_local_hosts_reaches_only_the_controller() {
    let t = Instant::now();
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    let before = snapshot(tb.host_venv_dir(1));
    ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    let mark = tb.dir().join("paused");

    // The local agents are children of the controller: the group's SIGINT
    // must not kill the target's in the middle of its switch.
    for (at, state) in [
        (
            "stream",
            "interrupted: nothing changed on dst (staging discarded)",
        ),
        (
            "switch:3",
            "interrupted: dst is back to its state before this apply",
        ),
    ] {
        let what = format!("Ctrl-C at {at} (local)");
        let mut cmd = tb.overlay(&["apply", "--backup"]);
        cmd.env("OVERLAY_TEST_PAUSE_AT", at)
            .env("OVERLAY_TEST_PAUSE_MARK", &mark);
        let out = interrupt_when(cmd, &mark, &what);
        assert_interrupted(&out, state, "overlay apply", &what);
        untouched(&tb, &before, &what);
    }
    // The next apply works (and its rollback): the SSH test shows it.
    eprintln!("local: {:?}", t.elapsed());
}
