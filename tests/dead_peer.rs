//! No dead peer goes unnoticed: a real `overlay apply --backup` between two
//! SSH test hosts, during which one agent (target or source) or one host's
//! sshd session is killed with SIGKILL, on the relay route and on
//! `--direct`. Each run must end by itself (a watchdog of 120 s kills it
//! and fails the test), exit 2 with a message that names the host and what
//! died, and leave the target so that `overlay history`/`rollback` work and
//! it is byte for byte as before (or fully applied and rolled back).
//!
//! The moments are made deterministic without timing: the stream carries a
//! 96 MiB incompressible file, and the test waits until the target writes it
//! into staging, then freezes one agent with SIGSTOP (the stream cannot
//! finish while any agent on its path is stopped) before it kills another.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Testbed, assert_same, ok, snapshot};

const SETS: &str = common::SCENARIO_SETS;
/// Longer than any run may take: a run still going then hangs.
const WATCHDOG: Duration = Duration::from_secs(120);
/// Bigger than every buffer between the source's disk and the target's
/// staging (pipes, SSH windows, socket buffers, queues), so a stream with a
/// stopped agent on its path cannot be complete.
const BIG: usize = 96 << 20;

/// Add a 96 MiB file of xorshift bytes to the source's patched set.
fn add_big_file(tb: &Testbed) {
    let rel = "minisglang/srt/speculative/huge_table.bin";
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut data = Vec::with_capacity(BIG + 77);
    while data.len() < BIG + 77 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    fs::write(tb.host_venv_dir(0).join(common::SITE).join(rel), data).unwrap();
}

/// `overlay plan src dst`, which must succeed.
fn plan(tb: &Testbed) {
    ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
}

/// The pid of host `i`'s sshd listener.
fn listener(tb: &Testbed, i: usize) -> i32 {
    fs::read_to_string(tb.host_dir(i).join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// (pid, parent pid, start time) of every process.
fn processes() -> Vec<(i32, i32, u64)> {
    let mut v = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // After the ")" that ends the command name: state, ppid, ... starttime (field 22).
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 19 {
            v.push((pid, f[1].parse().unwrap_or(0), f[19].parse().unwrap_or(0)));
        }
    }
    v
}

fn descendants(root: i32) -> Vec<(i32, u64)> {
    let all = processes();
    let mut found = vec![root];
    let mut out = Vec::new();
    let mut i = 0;
    while i < found.len() {
        for &(pid, ppid, start) in &all {
            if ppid == found[i] && !found.contains(&pid) {
                found.push(pid);
                out.push((pid, start));
            }
        }
        i += 1;
    }
    out
}

/// overlay agents running on host `i` (descendants of its sshd listener
/// whose command line is `[~/].cache/overlay/overlay-<hash> agent`),
/// oldest first.
fn agents(tb: &Testbed, i: usize) -> Vec<i32> {
    let mut v: Vec<(u64, i32)> = descendants(listener(tb, i))
        .into_iter()
        .filter(|&(pid, _)| {
            let argv = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv: Vec<&[u8]> = argv.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
            argv.len() == 2
                && argv[1] == b"agent"
                && String::from_utf8_lossy(argv[0]).contains(".cache/overlay/overlay-")
        })
        .map(|(pid, start)| (start, pid))
        .collect();
    v.sort();
    v.into_iter().map(|(_, pid)| pid).collect()
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) on a pid this test found.
    unsafe { libc::kill(pid, sig) };
}

/// Wait for `cond`, failing the test after the watchdog.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < WATCHDOG, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The one agent on host `i` (the controller's), once it runs.
fn the_agent(tb: &Testbed, i: usize) -> i32 {
    let mut pid = 0;
    wait_for(&format!("the agent on host {i}"), || {
        pid = agents(tb, i).first().copied().unwrap_or(0);
        pid != 0
    });
    pid
}

/// The open generation's directory on the target, if any.
fn generation(tb: &Testbed) -> Option<std::path::PathBuf> {
    fs::read_dir(tb.host_venv_dir(1).join(".overlay/generations"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            fs::read_to_string(p.join("journal"))
                .map(|j| !j.contains("\"complete\"") && !j.contains("\"rolled-back\""))
                .unwrap_or(true)
        })
}

/// Wait until the target writes the big file into staging: a file there
/// has passed 1 MiB (every other file of the scenario is smaller).
fn wait_big_file_staging(tb: &Testbed) {
    wait_for("the big file in staging", || {
        generation(tb)
            .and_then(|g| fs::read_dir(g.join("staging")).ok())
            .is_some_and(|rd| {
                rd.flatten()
                    .any(|e| e.metadata().is_ok_and(|m| m.len() > 1 << 20))
            })
    });
}

/// The target's open generation has recorded `staged`.
fn staged(tb: &Testbed) -> bool {
    generation(tb)
        .and_then(|g| fs::read_to_string(g.join("journal")).ok())
        .is_some_and(|j| j.contains("\"staged\""))
}

/// The target's open generation has a record after `staged`: the switch began.
fn switching(tb: &Testbed) -> bool {
    generation(tb)
        .and_then(|g| fs::read_to_string(g.join("journal")).ok())
        .is_some_and(|j| {
            j.lines()
                .position(|l| l.contains("\"staged\""))
                .is_some_and(|i| j.lines().count() > i + 1)
        })
}

fn start_apply(tb: &Testbed, args: &[&str]) -> Child {
    let mut all = vec!["apply", "--backup"];
    all.extend_from_slice(args);
    tb.overlay(&all)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Wait for the apply to end by itself; after the watchdog, kill it and fail.
fn finish_apply(mut child: Child, what: &str) -> Output {
    let t = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if t.elapsed() > WATCHDOG {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: the controller hangs (killed after {WATCHDOG:?}):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The apply failed (exit 4, a connection error) and said which host and what died, what the
/// target is left with and what to run next.
fn assert_reported(out: &Output, host: &str, died: &[&str], what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("{what}: the apply said:\n{err}");
    assert_eq!(out.status.code(), Some(4), "{what}: {err}");
    assert!(
        err.contains(&format!("on {host}")),
        "{what}: {host} not named: {err}"
    );
    assert!(
        died.iter().any(|d| err.contains(d)),
        "{what}: none of {died:?} in: {err}"
    );
    assert!(err.contains("hint: "), "{what}: no hint: {err}");
    assert!(err.contains("overlay "), "{what}: no command to run: {err}");
    err
}

thread_local! {
    /// Agents seen when the last run's kill happened: an orphaned one (its
    /// sshd session gone) is no longer below the listener, but must end too.
    static SEEN: std::cell::RefCell<Vec<i32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether process `pid` still runs (a zombie does not).
fn running(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rfind(')').is_some_and(|i| !s[i + 2..].starts_with('Z')))
}

/// No overlay agent is left on either host (an orphaned one would still
/// be working on the target).
fn wait_no_agents(tb: &Testbed, what: &str) {
    let seen = SEEN.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let t = Instant::now();
    let show = || {
        let mut pids: Vec<i32> = descendants(listener(tb, 0))
            .into_iter()
            .chain(descendants(listener(tb, 1)))
            .map(|(p, _)| p)
            .collect();
        pids.sort();
        let list: Vec<String> = pids.iter().map(|p| p.to_string()).collect();
        let ps = Command::new("ps")
            .args(["-o", "pid,ppid,stat,wchan:32,args", "-p", &list.join(",")])
            .output()
            .unwrap();
        let all = Command::new("ps")
            .args(["-eo", "pid,ppid,stat,wchan:32,args"])
            .output()
            .unwrap();
        let all = String::from_utf8_lossy(&all.stdout);
        let related: Vec<&str> = all
            .lines()
            .filter(|l| l.contains("dst-direct") || l.contains("overlay-"))
            .collect();
        format!(
            "{}\nand:\n{}",
            String::from_utf8_lossy(&ps.stdout),
            related.join("\n")
        )
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(&format!("{what}: the agents to exit"), || {
            agents(tb, 0).is_empty()
                && agents(tb, 1).is_empty()
                && !seen.iter().any(|&p| running(p))
        })
    }));
    if let Err(e) = r {
        eprintln!("{what}: still running:\n{}", show());
        std::panic::resume_unwind(e);
    }
    eprintln!(
        "{what}: the agents were gone {:?} after the controller",
        t.elapsed()
    );
}

/// `overlay history dst` recovers what the run left; the target is then as
/// `before`, or, if the apply had completed, `overlay rollback dst` makes it so.
fn recovers(tb: &Testbed, before: &BTreeMap<String, String>, what: &str) {
    let t = Instant::now();
    let h = ok(
        tb.overlay(&["history", "dst", "--json"]).output().unwrap(),
        &format!("{what}: history"),
    );
    let gens: serde_json::Value = serde_json::from_slice(&h.stdout).unwrap();
    let complete = gens
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["status"] == "complete");
    if complete {
        ok(
            tb.overlay(&["rollback", "dst"]).output().unwrap(),
            &format!("{what}: rollback"),
        );
    }
    assert_same(before, &snapshot(tb.host_venv_dir(1)), what);
    eprintln!("{what}: recovered and checked in {:?}", t.elapsed());
}

/// A relay or direct run in which `act` kills something once the big file
/// streams; returns the apply's output and how long after the kill it ended.
fn run(tb: &Testbed, args: &[&str], what: &str, act: impl FnOnce(&Testbed)) -> (Output, Duration) {
    let t = Instant::now();
    let mut child = start_apply(tb, args);
    if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| act(tb))) {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        eprintln!(
            "{what}: the apply said ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        std::panic::resume_unwind(e);
    }
    let killed = Instant::now();
    eprintln!("{what}: killed {:?} after the start", t.elapsed());
    let seen: Vec<i32> = agents(tb, 0).into_iter().chain(agents(tb, 1)).collect();
    SEEN.with(|s| s.borrow_mut().extend(seen));
    let out = finish_apply(child, what);
    let took = killed.elapsed();
    eprintln!("{what}: the controller ended {took:?} after the kill");
    (out, took)
}

/// Two SSH hosts, the big file on the source, and a plan; with `direct`,
/// the source can reach the target with its own ssh (`apply --direct`).
fn testbed(direct: bool) -> (Testbed, BTreeMap<String, String>) {
    let tb = Testbed::new(2);
    tb.write_manifest(SETS);
    if direct {
        let_source_reach_target(&tb);
    }
    let t = Instant::now();
    add_big_file(&tb);
    let before = snapshot(tb.host_venv_dir(1));
    plan(&tb);
    eprintln!("testbed: big file and plan in {:?}", t.elapsed());
    (tb, before)
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_killed_agent_is_noticed_on_the_relay_route() {
    let (tb, before) = testbed(false);

    // The target's agent, mid-stream (the controller waits to write to it).
    let what = "target agent killed mid-stream";
    let (out, _) = run(&tb, &[], what, |tb| {
        let dst = the_agent(tb, 1);
        wait_big_file_staging(tb);
        signal(dst, libc::SIGSTOP);
        assert!(!staged(tb), "{what}: the stream was already complete");
        signal(dst, libc::SIGKILL);
    });
    let err = assert_reported(&out, "dst", &["killed by signal 9 (KILL)"], what);
    assert!(err.contains("nothing on dst was changed"), "{err}");
    assert!(err.contains("overlay apply"), "{err}");
    wait_no_agents(&tb, what);
    recovers(&tb, &before, what);

    // The source's agent, mid-stream: the target is told to abort.
    let what = "source agent killed mid-stream";
    let (out, _) = run(&tb, &[], what, |tb| {
        let dst = the_agent(tb, 1);
        wait_big_file_staging(tb);
        signal(dst, libc::SIGSTOP);
        assert!(!staged(tb), "{what}: the stream was already complete");
        signal(the_agent(tb, 0), libc::SIGKILL);
        signal(dst, libc::SIGCONT);
    });
    let err = assert_reported(&out, "src", &["killed by signal 9 (KILL)"], what);
    assert!(err.contains("it discarded generation"), "{err}");
    wait_no_agents(&tb, what);
    recovers(&tb, &before, what);

    // The target's agent once the switch began (or later: it may be past
    // the commit when the signal lands).
    let what = "target agent killed in the switch";
    let child = start_apply(&tb, &[]);
    let dst = the_agent(&tb, 1);
    wait_for("the switch", || switching(&tb));
    signal(dst, libc::SIGKILL);
    let killed = Instant::now();
    let out = finish_apply(child, what);
    eprintln!(
        "{what}: the controller ended {:?} after the kill",
        killed.elapsed()
    );
    if !out.status.success() {
        let err = assert_reported(&out, "dst", &["killed by signal 9 (KILL)"], what);
        assert!(
            err.contains("overlay history dst") || err.contains("overlay rollback dst"),
            "{what}: {err}"
        );
    }
    wait_no_agents(&tb, what);
    recovers(&tb, &before, what);
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_killed_sshd_session_is_noticed_on_the_relay_route() {
    let (tb, before) = testbed(false);
    for (host, i) in [("dst", 1), ("src", 0)] {
        let what = format!("{host}'s sshd sessions killed mid-stream");
        let (out, _) = run(&tb, &[], &what, |tb| {
            let dst = the_agent(tb, 1);
            the_agent(tb, 0);
            wait_big_file_staging(tb);
            signal(dst, libc::SIGSTOP);
            assert!(!staged(tb), "{what}: the stream was already complete");
            // The session processes, children of the listener: the connection drops.
            let l = listener(tb, i);
            for (pid, ppid, _) in processes() {
                if ppid == l {
                    signal(pid, libc::SIGKILL);
                }
            }
            signal(dst, libc::SIGCONT);
        });
        assert_reported(&out, host, &["connection", "killed by signal"], &what);
        wait_no_agents(&tb, &what);
        recovers(&tb, &before, &what);
    }
}

/// Let the source reach the target with its own ssh as "dst-direct" (as
/// tests/apply.rs does for the direct route).
fn let_source_reach_target(tb: &Testbed) {
    let manifest = tb.manifest_path();
    let text = fs::read_to_string(&manifest).unwrap().replacen(
        "[hosts.dst]\n",
        "[hosts.dst]\ndirect_ssh = \"dst-direct\"\n",
        1,
    );
    fs::write(&manifest, text).unwrap();
    common::let_host_reach(tb, 0, 1, "dst-direct", true);
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_killed_agent_is_noticed_on_the_direct_route() {
    let (tb, before) = testbed(true);

    // The target's own agent (the one holding the lock, which the
    // controller is not reading from while the source streams): the
    // controller must notice, stop waiting on the source, and the source
    // must stop sending.
    let what = "target agent killed during a direct stream";
    let mut src = 0;
    let (out, _) = run(&tb, &["--direct"], what, |tb| {
        let dst = the_agent(tb, 1);
        wait_big_file_staging(tb);
        src = the_agent(tb, 0);
        signal(src, libc::SIGSTOP);
        assert!(!staged(tb), "{what}: the stream was already complete");
        signal(dst, libc::SIGKILL);
    });
    let err = assert_reported(&out, "dst", &["killed by signal 9 (KILL)"], what);
    assert!(err.contains("nothing on dst was changed"), "{err}");
    // The source, frozen until now, finds its controller gone and stops.
    signal(src, libc::SIGCONT);
    wait_no_agents(&tb, what);
    recovers(&tb, &before, what);

    // The source's agent: its own stream to the target ends with it, and
    // the target is told to abort.
    let what = "source agent killed during a direct stream";
    let (out, _) = run(&tb, &["--direct"], what, |tb| {
        the_agent(tb, 1);
        wait_big_file_staging(tb);
        let receiver = *agents(tb, 1).last().unwrap();
        signal(receiver, libc::SIGSTOP);
        assert!(!staged(tb), "{what}: the stream was already complete");
        signal(the_agent(tb, 0), libc::SIGKILL);
        signal(receiver, libc::SIGCONT);
    });
    assert_reported(&out, "src", &["killed by signal 9 (KILL)"], what);
    wait_no_agents(&tb, what);
    recovers(&tb, &before, what);
}
