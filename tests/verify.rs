//! Predicted breakage on the fixture scenario, confirmed by `overlay verify`
//! and `apply --verify --rollback-on-failure` on real venvs.

mod common;

use std::fs;

use common::{Testbed, VERIFY, assert_same, snapshot};

/// The fixture scenario's four sets (see tests/common).
const ALL: &str = common::SCENARIO_SETS;

fn plan(tb: &Testbed, args: &[&str]) -> serde_json::Value {
    let mut a = vec!["plan", "src", "dst", "--json"];
    a.extend_from_slice(args);
    let out = tb.overlay(&a).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_consistent_overlay_predicts_nothing_and_verifies() {
    let tb = Testbed::local(2);
    tb.write_manifest(&format!("{ALL}{VERIFY}"));
    // Before: the target is the CUDA 12.8 build; the check fails and says why, whole.
    let out = tb.overlay(&["verify", "dst"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Traceback (most recent call last)"), "{err}");
    assert!(
        err.contains("verify failed on dst: AssertionError: 12.8"),
        "{err}"
    );
    assert!(tb.work.join(".overlay/verify-dst.log").exists());
    let logs = fs::read_dir(tb.host_venv_dir(1).join(".overlay/verify"))
        .unwrap()
        .count();
    assert_eq!(logs, 1, "a log on the target");

    let p = plan(&tb, &[]);
    assert_eq!(
        p["problems"].as_array().unwrap().len(),
        0,
        "{}",
        p["problems"]
    );
    let out = tb
        .overlay(&["apply", "--backup", "--verify"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("build: minitorch 2.11.0+cu130"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(err.contains("verify passed on dst"), "{err}");
}

#[test]
fn torch_without_its_cuda_libraries_is_predicted_and_rolled_back_on_failure() {
    let tb = Testbed::local(2);
    tb.write_manifest(&format!("{ALL}{VERIFY}"));
    let before = snapshot(tb.host_venv_dir(1));
    let p = plan(&tb, &["--set", "torch"]);
    let problems = p["problems"].as_array().unwrap();
    let text = p["problems"].to_string();
    // ELF: the new _C cannot find the CUDA 13 runtime the nvidia set would bring.
    assert!(
        problems
            .iter()
            .any(|x| x["check"] == "elf"
                && x["reason"].as_str().unwrap().contains("libcudart.so.13")),
        "{text}"
    );
    // CUDA: torchvision stays on 12.8 while torch moves to 13.0.
    assert!(
        problems.iter().any(|x| x["check"] == "cuda"
            && x["dist"] == "minitorchvision"
            && x["reason"].as_str().unwrap().contains("CUDA 12")),
        "{text}"
    );
    // --strict makes them errors; apply refuses that plan without --force.
    let out = tb
        .overlay(&["plan", "src", "dst", "--set", "torch", "--strict"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(8));
    let out = tb.overlay(&["apply", "--backup"]).output().unwrap();
    assert_eq!(out.status.code(), Some(8));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(1)),
        "after a refused strict plan",
    );

    // The prediction holds: with --force, the check fails on import, and the generation is rolled back.
    let out = tb
        .overlay(&[
            "apply",
            "--backup",
            "--force",
            "--verify",
            "--rollback-on-failure",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("libcudart.so.13"),
        "the real import error is shown whole:\n{err}"
    );
    assert!(err.contains("rolled back generation"), "{err}");
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(1)),
        "after the automatic rollback",
    );
}

/// The verify log holds the manifest's env values: on the target it is
/// 0600 in 0700 folders, and so is the controller's copy, even when the
/// agent and the controller run with umask 022.
#[test]
fn verify_logs_are_private_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let tb = Testbed::local(2);
    tb.write_manifest(&format!("{ALL}{VERIFY}"));
    let mut cmd = tb.overlay(&["verify", "dst"]);
    // SAFETY: umask is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let state = tb.host_venv_dir(1).join(".overlay");
    assert_eq!(mode(&state), 0o700, "{}", state.display());
    assert_eq!(mode(&state.join("verify")), 0o700);
    let logs: Vec<_> = fs::read_dir(state.join("verify"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(logs.len(), 1);
    assert_eq!(mode(&logs[0]), 0o600, "{}", logs[0].display());
    assert!(
        fs::read_to_string(&logs[0])
            .unwrap()
            .contains("MINITORCH_CHECK")
    );
    assert_eq!(mode(&tb.work.join(".overlay")), 0o700);
    assert_eq!(mode(&tb.work.join(".overlay/verify-dst.log")), 0o600);
}

/// A shared object that an import maps, truncated after its first page (a
/// half-finished copy): the ELF and program headers are intact, so the
/// loader maps every PT_LOAD segment, and its first touch of a page past
/// the end of the file (relocating the data segment) raises SIGBUS. The
/// check dies with nothing but faulthandler's dump on stderr; `verify`
/// names the signal and the frame of the venv's code that was loading it.
/// Over real sshd: the report travels through the agent.
#[test]
fn a_truncated_shared_object_is_named_as_a_sigbus_with_its_python_frame() {
    let tb = Testbed::new(2);
    tb.write_manifest(&format!("{ALL}{VERIFY}"));
    // minitorchvision/__init__.py loads _C.so with ctypes.CDLL, as torch
    // does its libraries.
    let pkg = tb.site_packages(1).join("minitorchvision");
    let so = pkg.join("_C.so");
    let len = fs::metadata(&so).unwrap().len();
    assert!(len > 4096, "{} is {len} bytes", so.display());
    fs::OpenOptions::new()
        .write(true)
        .open(&so)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let init = fs::read_to_string(pkg.join("__init__.py")).unwrap();
    let line = 1 + init
        .lines()
        .position(|l| l.contains("ctypes.CDLL("))
        .unwrap();

    let out = tb.overlay(&["verify", "dst"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains(&format!(
            "verify failed on dst: killed by SIGBUS (signal 7) in minitorchvision/__init__.py:{line}\n"
        )),
        "{err}"
    );
    // The whole dump is shown, the innermost frame first.
    assert!(err.contains("Fatal Python error: Bus error"), "{err}");
    assert!(err.contains("in __init__\n"), "{err}");
    assert!(
        err.contains(&format!(
            "minitorchvision/__init__.py\", line {line} in <module>"
        )),
        "{err}"
    );
    let logs: Vec<_> = fs::read_dir(tb.host_venv_dir(1).join(".overlay/verify"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(logs.len(), 1);
    let log = fs::read_to_string(&logs[0]).unwrap();
    assert!(log.contains("\n# signal: SIGBUS (7)\n"), "{log}");
    assert!(
        log.contains(&format!(
            "\n# location: minitorchvision/__init__.py:{line}\n"
        )),
        "{log}"
    );
    assert!(!log.contains("# exit"), "{log}");
    // No core file left in the venv by the crash.
    assert!(!tb.host_venv_dir(1).join("core").exists());

    // --json carries the signal and the frame.
    let out = tb.overlay(&["verify", "dst", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["signal"], 7, "{r}");
    assert_eq!(r["exit_code"], serde_json::Value::Null, "{r}");
    assert_eq!(
        r["location"],
        format!("minitorchvision/__init__.py:{line}").as_str()
    );
}

/// A check that hangs (in a function, with a child process of its own) is
/// stopped at the manifest's `[verify] timeout`: SIGABRT makes
/// faulthandler print where it was, then its whole process group is
/// killed, the child with it.
#[test]
fn a_check_that_hangs_is_killed_at_the_timeout_with_its_stack_and_its_children() {
    let tb = Testbed::local(2);
    tb.write_manifest(&format!(
        "{ALL}{}",
        r#"
[verify]
timeout = 3
python = '''
import subprocess, time
def wait_for_the_gpu():
    child = subprocess.Popen(["sleep", "1000"])
    print("child", child.pid, flush=True)
    time.sleep(1000)
wait_for_the_gpu()
'''
"#
    ));
    let out = tb.overlay(&["verify", "dst"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("verify failed on dst: timed out after 3 s in <string>:5\n"),
        "{err}"
    );
    assert!(
        err.contains("File \"<string>\", line 5 in wait_for_the_gpu"),
        "the stack is shown:\n{err}"
    );
    assert!(err.contains("did not finish within 3 s"), "{err}");
    // The child `sleep` is gone (or a zombie waiting for init to reap it).
    let pid: u32 = stdout
        .trim()
        .strip_prefix("child ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    if let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) {
        let state = stat.rsplit_once(") ").map(|(_, r)| &r[..1]);
        let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            state == Some("Z") || cmd != b"sleep\x001000\x00",
            "the check's child {pid} is still running: {stat}"
        );
    }
    let logs: Vec<_> = fs::read_dir(tb.host_venv_dir(1).join(".overlay/verify"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    let log = fs::read_to_string(&logs[0]).unwrap();
    assert!(log.contains("\n# timed out: after 3 s\n"), "{log}");
    assert!(log.contains("\n# signal: SIGABRT (6)\n"), "{log}");
    assert!(log.contains("in wait_for_the_gpu"), "{log}");

    // --timeout overrides the manifest.
    let out = tb
        .overlay(&["verify", "dst", "--timeout", "4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("timed out after 4 s in <string>:5"), "{err}");
}
