//! Processes running from the target's venv (issue 42, item 4), on real
//! sshd test hosts: a python process that imported the venv's package is
//! named by `plan`; `apply` and `rollback` refuse while it runs (exit 8)
//! and change nothing; with `--allow-running` they go on and name it as
//! still running the old files. Found by device and inode, also from
//! another mount namespace that sees the venv at another path; an agent
//! that is not root reports another user's process as unknown.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use common::{SCENARIO_SETS, Testbed, assert_same, ensure_user, ok, snapshot};

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A process started on a test host (in its mount namespace), killed when
/// dropped.
struct Bg {
    pid: u32,
}

impl Bg {
    /// Run `shell` (which must end by exec'ing the process, writing
    /// `/tmp/NAME` once ready) in the background on host `i`, and wait for
    /// it to be ready.
    fn start(tb: &Testbed, i: usize, name: &str, shell: &str) -> Bg {
        let cmd = format!(
            "cd /tmp; nohup sh -c {} >/dev/null 2>&1 </dev/null & echo $!",
            sh_quote(shell)
        );
        let out = ok(tb.ssh(i, &cmd).output().unwrap(), "start a process");
        let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(pid > 1, "{out:?}");
        let bg = Bg { pid };
        let ready = tb.host_dir(i).join("tmp").join(name);
        let t0 = Instant::now();
        while !ready.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the process on host {i} did not get ready ({})",
                ready.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        bg
    }

    /// Stop it and wait until it is gone (or a zombie).
    fn stop(self) {
        drop(self);
    }

    /// The python that imports the target's torch and waits.
    fn python(tb: &Testbed, i: usize, python: &str, name: &str) -> Bg {
        Bg::start(
            tb,
            i,
            name,
            &format!(
                "exec {python} -c \"import minitorch, time, pathlib; pathlib.Path('/tmp/{name}').touch(); time.sleep(600)\""
            ),
        )
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &self.pid.to_string()])
            .status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            match fs::read_to_string(format!("/proc/{}/stat", self.pid)) {
                Ok(s)
                    if !s
                        .rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z') =>
                {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => return,
            }
        }
    }
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The generations in the venv's state folder.
fn generations(venv: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(venv.join(".overlay/generations"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn pids(doc: &serde_json::Value, key: &str) -> Vec<u64> {
    doc[key]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["pid"].as_u64()).collect())
        .unwrap_or_default()
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_process_running_from_the_venv_is_named_and_stops_apply_and_rollback() {
    let tb = Testbed::new(2);
    tb.write_manifest(SCENARIO_SETS);
    let venv = tb.host_venv_dir(1).to_path_buf();
    let p = Bg::python(&tb, 1, "/root/venv/bin/python", "ready");
    let pid = p.pid as u64;

    // The plan names it, on stdout near the host line and as a warning.
    let out = ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.contains("Running from dst's venv")
            && stdout.contains(&format!("pid {pid} root started ")),
        "{stdout}"
    );
    assert!(
        stdout.contains("[interpreter, maps]")
            && stdout.contains("/root/venv/bin/python -c import minitorch"),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "warning: 1 process runs from dst's venv: pid {pid} (root) /root/venv/bin/python -c import minitorch"
        )) && stderr.contains("--allow-running"),
        "{stderr}"
    );
    let out = ok(
        tb.overlay(&["plan", "src", "dst", "--json"])
            .output()
            .unwrap(),
        "plan --json",
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let procs = &doc["running"]["processes"];
    assert_eq!(pids(&doc["running"], "processes"), [pid], "{doc:#}");
    assert_eq!(procs[0]["user"], "root");
    assert_eq!(procs[0]["uid"], 0);
    assert_eq!(procs[0]["how"], serde_json::json!(["interpreter", "maps"]));
    assert!(procs[0]["started"].as_u64().unwrap() > 1_700_000_000);
    // Saved with the plan.
    let saved: serde_json::Value =
        serde_json::from_slice(&fs::read(tb.work.join(".overlay/plan.json")).unwrap()).unwrap();
    assert_eq!(pids(&saved["running"], "processes"), [pid]);

    // apply refuses before anything is written.
    let before = snapshot(&venv);
    let gens = generations(&venv);
    let out = tb.overlay(&["apply"]).output().unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "pid {pid} (root) /root/venv/bin/python -c import minitorch"
        )) && stderr.contains("the apply was refused and nothing was changed")
            && stderr.contains("--allow-running"),
        "{stderr}"
    );
    assert_same(&before, &snapshot(&venv), "after the refused apply");
    assert_eq!(generations(&venv), gens);

    // --allow-running: applied, and the process named as running the old files.
    let out = ok(
        tb.overlay(&["apply", "--allow-running", "--json"])
            .output()
            .unwrap(),
        "apply --allow-running",
    );
    let (stdout, stderr) = text(&out);
    assert!(
        stderr.contains(&format!(
            "1 process on dst still runs the old files: pid {pid} (root) /root/venv/bin/python"
        )) && stderr.contains("restart it"),
        "{stderr}"
    );
    let applied: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(pids(&applied, "still_running"), [pid], "{applied:#}");
    let after = snapshot(&venv);
    assert_ne!(before, after, "the apply changed the venv");
    assert_eq!(generations(&venv).len(), gens.len() + 1);

    // rollback refuses too, and changes nothing.
    let out = tb.overlay(&["rollback", "dst"]).output().unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(
        stderr.contains(&format!("pid {pid} (root)"))
            && stderr.contains("the rollback was refused"),
        "{stderr}"
    );
    assert_same(&after, &snapshot(&venv), "after the refused rollback");
    let out = ok(
        tb.overlay(&["rollback", "dst", "--allow-running", "--json"])
            .output()
            .unwrap(),
        "rollback --allow-running",
    );
    let (stdout, stderr) = text(&out);
    assert!(
        stderr.contains(&format!(
            "1 process on dst still runs the old files: pid {pid}"
        )),
        "{stderr}"
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(pids(&report, "running"), [pid], "{report:#}");
    assert_same(&before, &snapshot(&venv), "after the rollback");

    // Once it is gone, nothing is named and apply goes on.
    p.stop();
    let out = ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    let (stdout, stderr) = text(&out);
    assert!(!stdout.contains("Running from"), "{stdout}");
    assert!(!stderr.contains("runs from"), "{stderr}");
    let out = ok(tb.overlay(&["apply", "--json"]).output().unwrap(), "apply");
    let applied: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(applied["still_running"], serde_json::json!([]));
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_process_that_sees_the_venv_at_another_path_is_found_by_device_and_inode() {
    let tb = Testbed::new(2);
    tb.write_manifest(SCENARIO_SETS);
    // Its own mount namespace, the venv bound at /tmp/elsewhere: the
    // agent's namespace has no such path.
    let p = Bg::start(
        &tb,
        1,
        "ready-ns",
        "exec unshare --mount sh -c \"mkdir -p /tmp/elsewhere && mount --bind /root/venv /tmp/elsewhere && exec /tmp/elsewhere/bin/python -c \\\"import minitorch, time, pathlib; pathlib.Path('/tmp/ready-ns').touch(); time.sleep(600)\\\"\"",
    );
    let pid = p.pid as u64;
    let out = ok(
        tb.overlay(&["plan", "src", "dst", "--json"])
            .output()
            .unwrap(),
        "plan --json",
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(pids(&doc["running"], "processes"), [pid], "{doc:#}");
    let p0 = &doc["running"]["processes"][0];
    assert_eq!(
        p0["how"],
        serde_json::json!(["interpreter", "maps"]),
        "{doc:#}"
    );
    assert!(
        p0["command"]
            .as_str()
            .unwrap()
            .starts_with("/tmp/elsewhere/bin/python -c import minitorch"),
        "{doc:#}"
    );
    // The agent's own namespace does not see that path.
    let out = tb
        .ssh(1, "test -e /tmp/elsewhere/bin/python")
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the bind is private to its namespace"
    );
    let venv = tb.host_venv_dir(1).to_path_buf();
    let before = snapshot(&venv);
    let out = tb.overlay(&["apply"]).output().unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(
        stderr.contains(&format!("pid {pid} (root) /tmp/elsewhere/bin/python")),
        "{stderr}"
    );
    assert_same(&before, &snapshot(&venv), "after the refused apply");
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces, sshd, users"
)]
fn an_agent_that_is_not_root_reports_another_users_process_as_unknown() {
    ensure_user("ovplain", None);
    let tb = Testbed::new(2);
    // sshd reads a user's keys as that user; the venv's home open to it.
    fs::set_permissions(
        tb.host_dir(1).join("authorized_keys"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    fs::set_permissions(
        tb.host_dir(1).join("root"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let mut manifest = String::from("[hosts.src]\nssh = \"src\"\nvenv = \"/root/venv\"\n");
    manifest.push_str("[hosts.dst]\nssh = \"dst\"\nvenv = \"/root/venv\"\n");
    manifest.push_str("[hosts.dst-plain]\nssh = \"ovplain@dst\"\nvenv = \"/root/venv\"\n");
    manifest.push_str(SCENARIO_SETS);
    fs::write(tb.manifest_path(), manifest).unwrap();
    let p = Bg::python(&tb, 1, "/root/venv/bin/python", "ready-root");
    let pid = p.pid as u64;

    // As ovplain: root's process cannot be inspected, so it is unknown, not
    // guessed either way; nothing is refused for it.
    let out = ok(
        tb.overlay(&["plan", "src", "dst-plain", "--json", "-o", "plain.json"])
            .output()
            .unwrap(),
        "plan as ovplain",
    );
    let (stdout, stderr) = text(&out);
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        pids(&doc["running"], "processes"),
        Vec::<u64>::new(),
        "{doc:#}"
    );
    let unknown = doc["running"]["unknown"].as_array().unwrap();
    let mine = unknown
        .iter()
        .find(|u| u["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("pid {pid} is not among the unknown: {doc:#}"));
    assert_eq!(mine["user"], "root");
    assert_eq!(mine["how"], serde_json::json!([]));
    assert!(
        stderr.contains("on dst-plain could not be inspected") && stderr.contains("root"),
        "{stderr}"
    );

    // As root: the same process is known.
    let out = ok(
        tb.overlay(&["plan", "src", "dst", "--json"])
            .output()
            .unwrap(),
        "plan as root",
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(pids(&doc["running"], "processes"), [pid], "{doc:#}");
    assert_eq!(doc["running"]["unknown"], serde_json::json!([]), "{doc:#}");
}

/// A child process killed and reaped when dropped.
struct Child(std::process::Child);

/// A python of host 1's venv (local transport) that imported minitorch
/// and sleeps, once it has touched the file `ready` in the testbed.
fn local_python(tb: &Testbed, ready: &str) -> Child {
    let ready = tb.dir().join(ready);
    let mut c = tb.python(
        1,
        &format!(
            "import minitorch, time, pathlib; pathlib.Path({:?}).touch(); time.sleep(600)",
            ready.to_str().unwrap()
        ),
    );
    let p = Child(c.stdout(std::process::Stdio::null()).spawn().unwrap());
    let t0 = Instant::now();
    while !ready.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "python did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    p
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_local_route_and_a_bundle_applied_on_the_host_refuse_too() {
    let tb = Testbed::local(2);
    tb.write_manifest(SCENARIO_SETS);
    let venv = tb.host_venv_dir(1).to_path_buf();
    let p = local_python(&tb, "ready-local");
    let pid = p.0.id() as u64;
    let doc = tb.plan_json();
    assert_eq!(pids(&doc["running"], "processes"), [pid], "{doc:#}");
    let before = snapshot(&venv);
    let out = tb.overlay(&["apply"]).output().unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(stderr.contains(&format!("pid {pid} (")), "{stderr}");
    assert_same(&before, &snapshot(&venv), "after the refused apply");

    // A bundle applied on the host itself (`apply --bundle --venv`).
    let bundle = tb.work.join("torch.ovl");
    ok(
        tb.overlay(&[
            "pack",
            "src",
            "-o",
            bundle.to_str().unwrap(),
            "--set",
            "torch",
        ])
        .output()
        .unwrap(),
        "pack",
    );
    let out = tb
        .overlay(&[
            "apply",
            "--bundle",
            bundle.to_str().unwrap(),
            "--venv",
            venv.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(stderr.contains(&format!("pid {pid} (")), "{stderr}");
    assert_same(&before, &snapshot(&venv), "after the refused bundle");

    let out = ok(
        tb.overlay(&["apply", "--allow-running", "--json"])
            .output()
            .unwrap(),
        "apply --allow-running",
    );
    let applied: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(applied["route"], "local");
    assert_eq!(pids(&applied, "still_running"), [pid], "{applied:#}");
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_plan_of_several_targets_refuses_only_the_one_in_use() {
    let tb = Testbed::new(3);
    tb.write_manifest(SCENARIO_SETS);
    let p = Bg::python(&tb, 2, "/root/venv/bin/python", "ready-fleet");
    let pid = p.pid;
    let out = ok(
        tb.overlay(&["plan", "src", "dst", "dst2"])
            .output()
            .unwrap(),
        "plan src dst dst2",
    );
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains(&format!(
            "1 process runs from dst2's venv: pid {pid} (root)"
        )),
        "{stderr}"
    );
    let before = snapshot(tb.host_venv_dir(2));
    // One read of the source for both (the fan-out): dst2 refuses at its
    // prepare, dst is applied.
    let out = tb.overlay(&["apply", "--json"]).output().unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(11), "{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let rows = doc["targets"].as_array().unwrap();
    let row = |name: &str| rows.iter().find(|r| r["target"] == name).unwrap();
    assert_eq!(row("dst")["result"], "applied", "{doc:#}");
    assert_eq!(row("dst2")["result"], "failed", "{doc:#}");
    assert_eq!(row("dst2")["exit_code"], 8, "{doc:#}");
    assert!(
        row("dst2")["error"]
            .as_str()
            .unwrap()
            .contains(&format!("pid {pid} (root)")),
        "{doc:#}"
    );
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(2)),
        "dst2 after the refusal",
    );
    let out = ok(
        tb.overlay(&["apply", ".overlay/plan.d/dst2.json", "--allow-running"])
            .output()
            .unwrap(),
        "apply dst2 --allow-running",
    );
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains(&format!(
            "1 process on dst2 still runs the old files: pid {pid}"
        )),
        "{stderr}"
    );
}

/// `apply --resume` completes an interrupted generation, so it refuses
/// while a process runs from the venv too, and goes on with
/// `--allow-running`.
#[test]
fn resuming_an_interrupted_apply_refuses_too() {
    let tb = Testbed::local(2);
    tb.write_manifest(SCENARIO_SETS);
    let venv = tb.host_venv_dir(1).to_path_buf();
    tb.plan_json();
    // Step 2 is "staged", so stopping at 6 is in the middle of the switch.
    let out = tb
        .overlay(&["apply", "--backup"])
        .env("OVERLAY_TEST_STOP_AFTER", "6")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out).1);
    let p = local_python(&tb, "ready-resume");
    let pid = p.0.id();
    let before = snapshot(&venv);
    let out = tb.overlay(&["apply", "--resume"]).output().unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(8), "{stderr}");
    assert!(stderr.contains(&format!("pid {pid} (")), "{stderr}");
    assert_same(&before, &snapshot(&venv), "after the refused resume");
    ok(
        tb.overlay(&["apply", "--resume", "--allow-running"])
            .output()
            .unwrap(),
        "apply --resume --allow-running",
    );
    let h = ok(
        tb.overlay(&["history", "dst", "--json"]).output().unwrap(),
        "history",
    );
    let gens: serde_json::Value = serde_json::from_slice(&h.stdout).unwrap();
    assert_eq!(gens[0]["status"], "complete", "{gens}");
}
