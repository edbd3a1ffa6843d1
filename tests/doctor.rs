//! `overlay doctor HOST`: the host's venv checked as it stands, over real
//! sshd test hosts (as root). The target venv of the fixture scenario is
//! damaged by hand in each test, and doctor must name every kind of damage
//! with its distribution and path; a clean venv is exit 0.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::Testbed;

/// `overlay doctor ARGS` on the testbed: (exit code, stdout, stderr).
fn doctor(tb: &Testbed, args: &[&str]) -> (i32, String, String) {
    let out = tb.overlay(&[&["doctor"], args].concat()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The stray file testbed.py leaves on the target (no dist owns it), and
/// any bytecode of it: gone, the target venv is clean.
fn remove_target_stray(site: &Path) {
    let spec = site.join("minisglang/srt/speculative");
    fs::remove_file(spec.join("dflash_utils.py")).unwrap();
    for e in fs::read_dir(spec.join("__pycache__"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with("dflash_utils.") {
            fs::remove_file(e.path()).unwrap();
        }
    }
}

/// The lines of `kind`'s section of a text report.
fn section<'a>(stdout: &'a str, heading: &str) -> Vec<&'a str> {
    let mut lines = stdout.lines().skip_while(|l| !l.starts_with(heading));
    lines.next();
    lines.take_while(|l| l.starts_with("  ")).collect()
}

fn has(lines: &[&str], needle: &str) -> bool {
    lines.iter().any(|l| l.contains(needle))
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_clean_venv_is_clean_and_the_second_run_hashes_nothing() {
    let tb = Testbed::new(2);
    tb.write_manifest(common::SCENARIO_SETS);
    // As built, the target has one stray file: doctor names it.
    let (code, stdout, stderr) = doctor(&tb, &["dst"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let extra = section(&stdout, "extra");
    assert_eq!(extra.len(), 1, "{stdout}");
    assert!(
        has(
            &extra,
            "minisglang minisglang/srt/speculative/dflash_utils.py"
        ),
        "{stdout}"
    );

    remove_target_stray(&tb.site_packages(1));
    let (code, stdout, stderr) = doctor(&tb, &["dst"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(stdout, "no problems\n");
    assert!(
        stderr.contains("dst: ") && stderr.contains(": no problems"),
        "{stderr}"
    );

    // A run remembers each sha256 by the file's stamp, except for files
    // changed in the last 3 s (the cache's racy window; the venv was
    // copied just now): after that, a second run reads no file.
    std::thread::sleep(std::time::Duration::from_secs(4));
    let (_, first, _) = doctor(&tb, &["dst", "--json"]);
    let (code, json, _) = doctor(&tb, &["dst", "--json"]);
    assert_eq!(code, 0);
    let first: serde_json::Value = serde_json::from_str(&first).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let files = v["report"]["files"].as_u64().unwrap();
    assert!(files > 50, "{v}");
    assert_eq!(first["report"]["files"], files);
    assert_eq!(v["report"]["hashed"], 0, "{v}");
    assert!(v["report"]["cached"].as_u64().unwrap() > 50, "{v}");
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn every_kind_of_damage_is_named() {
    let tb = Testbed::new(2);
    tb.write_manifest(common::SCENARIO_SETS);
    let site = tb.site_packages(1);
    remove_target_stray(&site);

    // A truncated shared object (a half-finished copy).
    let cuda = site.join("minitorch/lib/libminitorch_cuda.so");
    let bytes = fs::read(&cuda).unwrap();
    fs::write(&cuda, &bytes[..bytes.len() / 3]).unwrap();
    // A changed .py (its bytecode goes stale with it).
    let run_py = site.join("minitorch/distributed/run.py");
    let mut text = fs::read_to_string(&run_py).unwrap();
    text.push_str("# patched by hand\n");
    fs::write(&run_py, text).unwrap();
    // A deleted file.
    fs::remove_file(site.join("minitorch/_old_in_291.py")).unwrap();
    // An extra file.
    fs::write(site.join("minitorch/nn/by_hand.py"), "x = 1\n").unwrap();
    // A second dist-info of minitorch.
    common::run(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(site.join("minitorch-2.9.1.dist-info"))
            .arg(site.join("minitorch-9.9.9.dist-info")),
    );
    // Stale bytecode: the source's mtime moves, its content stays.
    let init = site.join("minitorch/utils/__init__.py");
    let f = fs::File::options().write(true).open(&init).unwrap();
    f.set_modified(
        std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000),
    )
    .unwrap();
    drop(f);
    // A broken shebang (its hash changes too).
    let script = tb.host_venv_dir(1).join("bin/minitorchrun");
    let body = fs::read_to_string(&script).unwrap();
    let rest = body.split_once('\n').unwrap().1;
    fs::write(&script, format!("#!/nonexistent/venv/bin/python\n{rest}")).unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();

    let (code, stdout, stderr) = doctor(&tb, &["dst"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let damaged = section(&stdout, "damaged");
    assert!(
        has(
            &damaged,
            "minitorch minitorch/lib/libminitorch_cuda.so: cut short"
        ),
        "{stdout}"
    );
    let changed = section(&stdout, "changed");
    for p in [
        "minitorch minitorch/lib/libminitorch_cuda.so: size",
        "minitorch minitorch/distributed/run.py: size",
        "minitorch ../../../bin/minitorchrun:",
    ] {
        assert!(has(&changed, p), "{p} not in\n{stdout}");
    }
    assert!(
        has(
            &section(&stdout, "missing"),
            "minitorch minitorch/_old_in_291.py: listed in RECORD"
        ),
        "{stdout}"
    );
    assert!(
        has(
            &section(&stdout, "extra"),
            "minitorch minitorch/nn/by_hand.py"
        ),
        "{stdout}"
    );
    let dup = section(&stdout, "duplicate dist-info");
    assert!(has(&dup, "minitorch-2.9.1.dist-info: "), "{stdout}");
    assert!(has(&dup, "minitorch-9.9.9.dist-info: "), "{stdout}");
    let stale = section(&stdout, "stale bytecode");
    assert!(
        has(
            &stale,
            "minitorch minitorch/utils/__pycache__/__init__.cpython-311.pyc: compiled from another __init__.py"
        ),
        "{stdout}"
    );
    assert!(
        has(
            &stale,
            "minitorch/distributed/__pycache__/run.cpython-311.pyc"
        ),
        "{stdout}"
    );
    assert!(
        has(
            &section(&stdout, "broken shebang"),
            "minitorch ../../../bin/minitorchrun: its interpreter /nonexistent/venv/bin/python does not exist"
        ),
        "{stdout}"
    );
    assert!(
        stderr.contains("dst: ") && stderr.contains("problems ("),
        "{stderr}"
    );

    // --json: the same findings, each with kind, dist, path and reason.
    let (code, json, _) = doctor(&tb, &["dst", "--json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["host"], "dst");
    assert_eq!(v["ok"], false);
    assert_eq!(v["report"]["venv"], common::VENV);
    let findings = v["report"]["findings"].as_array().unwrap();
    let kinds: std::collections::BTreeSet<&str> = findings
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    for k in [
        "damaged",
        "changed",
        "missing",
        "extra",
        "duplicate-dist-info",
        "stale-bytecode",
        "broken-shebang",
    ] {
        assert!(kinds.contains(k), "{k} not in {kinds:?}");
    }
    let damaged = findings.iter().find(|f| f["kind"] == "damaged").unwrap();
    assert_eq!(damaged["dist"], "minitorch");
    assert_eq!(damaged["path"], "minitorch/lib/libminitorch_cuda.so");
    assert!(
        damaged["reason"]
            .as_str()
            .unwrap()
            .contains("truncated copy")
    );
}

/// The preflight's ELF check on the venv as it stands: an extension whose
/// needed library is deleted.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_deleted_needed_library_is_named() {
    let tb = Testbed::new(2);
    tb.write_manifest(common::SCENARIO_SETS);
    let site = tb.site_packages(1);
    remove_target_stray(&site);
    fs::remove_file(site.join("minitorch/lib/libminitorch_cpu.so")).unwrap();
    let (code, stdout, stderr) = doctor(&tb, &["dst"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        has(
            &section(&stdout, "missing"),
            "minitorch minitorch/lib/libminitorch_cpu.so"
        ),
        "{stdout}"
    );
    // The ELF check of the venv as it stands names the extension that
    // needs the deleted library.
    let elf = section(&stdout, "elf");
    assert!(
        has(
            &elf,
            "minitorch minitorch/_C.cpython-311-x86_64-linux-gnu.so"
        ) && has(&elf, "libminitorch_cpu.so"),
        "{stdout}"
    );
}

/// `plan` notes the source's carried files that differ from their own
/// RECORD: the fixture's hand-patched minisglang files by name, and a
/// truncated shared object as a warning.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn plan_notes_carried_files_that_differ_from_their_record() {
    let tb = Testbed::new(2);
    tb.write_manifest(common::SCENARIO_SETS);
    let out = common::ok(
        tb.overlay(&["plan", "src", "dst", "--set", "sglang-patches"])
            .output()
            .unwrap(),
        "plan",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "note: 3 files of minisglang on src differ from their RECORD (hand-patched): \
             minisglang/srt/server_args.py, minisglang/srt/speculative/dflash_worker.py, \
             minisglang/srt/speculative/spec_info.py\n"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("differs from its RECORD"), "{stderr}");

    // A truncated library in a carried dist is a warning, in the plan too.
    let cuda = tb
        .site_packages(0)
        .join("minitorch/lib/libminitorch_cuda.so");
    let bytes = fs::read(&cuda).unwrap();
    fs::write(&cuda, &bytes[..bytes.len() / 3]).unwrap();
    let out = common::ok(
        tb.overlay(&["plan", "src", "dst", "--set", "torch", "--json"])
            .output()
            .unwrap(),
        "plan",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "warning: [torch] minitorch/lib/libminitorch_cuda.so of minitorch on src differs from its RECORD: cut short"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("note:"), "{stderr}");
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let warned = plan["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w["path"] == "minitorch/lib/libminitorch_cuda.so");
    assert!(warned, "{plan}");
}

/// The same command on a host of the local transport (no ssh).
#[test]
fn doctor_runs_on_a_local_host() {
    let tb = Testbed::local(2);
    tb.write_manifest(common::SCENARIO_SETS);
    let (code, stdout, stderr) = doctor(&tb, &["dst"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert_eq!(
        stdout,
        "extra (in no RECORD) (1):\n  minisglang minisglang/srt/speculative/dflash_utils.py: in minisglang/, listed in no RECORD\n"
    );
    remove_target_stray(&tb.site_packages(1));
    let (code, stdout, stderr) = doctor(&tb, &["dst"]);
    assert_eq!((code, stdout.as_str()), (0, "no problems\n"), "{stderr}");
    // A host the manifest does not name is a usage error.
    let (code, _, stderr) = doctor(&tb, &["nowhere"]);
    assert_eq!(code, 2, "{stderr}");
}
