//! The venv as pip would leave it: after `overlay apply`, every `.py` the
//! generation placed has the bytecode pip left beside it on the source,
//! valid for the target's interpreter; every hashed RECORD row of the
//! applied distributions matches the disk (scripts whose shebang was
//! rewritten included); `pip check` and `overlay doctor` agree; and a
//! rollback brings the target's own old bytecode back byte for byte. Real
//! venvs made by pip from the fixture wheels; real sshd hosts (as root), and
//! the local transport for venvs at different paths (rewritten scripts).

mod common;

use std::process::Output;

use common::{Testbed, assert_same, ok, snapshot};

const SETS: &str = common::SCENARIO_SETS;

/// Python that prints a JSON report of host's venv: for each `.py` path
/// (relative to site-packages) given on stdin, whether its timestamp-based
/// bytecode for this interpreter is there and matches the source file
/// (flags 0, mtime and size as the header records them, as Python checks);
/// and every RECORD row with a sha256 in the named dist-infos that does not
/// match the disk.
const CHECK: &str = r#"
import base64, hashlib, importlib.util, json, os, sys, sysconfig, csv, io
site = sysconfig.get_paths()["purelib"]
req = json.loads(sys.stdin.read())
def b64(data):
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
recorded = {}
for di in os.listdir(site):
    if di.endswith(".dist-info") and os.path.exists(os.path.join(site, di, "RECORD")):
        for row in csv.reader(open(os.path.join(site, di, "RECORD"), newline="")):
            if len(row) >= 2:
                recorded[row[0]] = row[1]
patched = [rel for rel in req["py"]
           if recorded.get(rel, "") != "sha256=" + b64(open(os.path.join(site, rel), "rb").read())]
valid, invalid = [], []
for rel in req["py"]:
    src = os.path.join(site, rel)
    pyc = importlib.util.cache_from_source(src)
    ok = False
    try:
        with open(pyc, "rb") as f:
            head = f.read(16)
        st = os.stat(src)
        ok = (head[:4] == importlib.util.MAGIC_NUMBER
              and int.from_bytes(head[4:8], "little") == 0
              and int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
              and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF)
    except OSError:
        pass
    (valid if ok else invalid).append(rel)
bad_rows, rows = [], 0
for di in req["dist_infos"]:
    with open(os.path.join(site, di, "RECORD"), newline="") as f:
        for row in csv.reader(f):
            if len(row) < 3 or not row[1].startswith("sha256="):
                continue
            rows += 1
            p = os.path.normpath(os.path.join(site, row[0]))
            try:
                data = open(p, "rb").read()
            except OSError as e:
                bad_rows.append(f"{row[0]}: {e}")
                continue
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if "sha256=" + digest != row[1] or str(len(data)) != row[2]:
                bad_rows.append(f"{row[0]}: size {len(data)}, RECORD says {row[2]}")
print(json.dumps({"valid": valid, "invalid": invalid, "patched": patched, "rows": rows, "bad_rows": bad_rows}))
"#;

struct Checked {
    valid: Vec<String>,
    /// `.py` files that differ from their RECORD (hand patches).
    patched: Vec<String>,
    rows: u64,
    bad_rows: Vec<String>,
}

fn check(tb: &Testbed, host: usize, py: &[String], dist_infos: &[String]) -> Checked {
    let req = serde_json::json!({"py": py, "dist_infos": dist_infos}).to_string();
    let mut cmd = tb.python(host, CHECK);
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    {
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(req.as_bytes())
            .unwrap();
    }
    let out = ok(
        child.wait_with_output().unwrap(),
        "the bytecode and RECORD check",
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let list = |k: &str| -> Vec<String> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    Checked {
        valid: list("valid"),
        patched: list("patched"),
        rows: v["rows"].as_u64().unwrap(),
        bad_rows: list("bad_rows"),
    }
}

/// The plan's added or replaced paths.
fn placed(plan: &serde_json::Value) -> Vec<String> {
    let mut v = Vec::new();
    for set in plan["sets"].as_array().unwrap() {
        for c in set["changes"].as_array().unwrap() {
            if c["action"] != "delete" {
                v.push(c["path"].as_str().unwrap().to_string());
            }
        }
    }
    v
}

/// The `.py` files and the dist-infos (by their RECORD) a plan places.
fn py_and_dist_infos(plan: &serde_json::Value) -> (Vec<String>, Vec<String>) {
    let placed = placed(plan);
    let py = placed
        .iter()
        .filter(|p| p.ends_with(".py") && !p.starts_with("../"))
        .cloned()
        .collect();
    let dist_infos = placed
        .iter()
        .filter_map(|p| p.strip_suffix("/RECORD"))
        .filter(|d| d.ends_with(".dist-info"))
        .map(String::from)
        .collect();
    (py, dist_infos)
}

/// `overlay doctor HOST --json`'s problems (not its notes), as (kind, path).
fn findings(tb: &Testbed, host: &str) -> Vec<(String, String)> {
    let out = tb.overlay(&["doctor", host, "--json"]).output().unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor {host} --json: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    doc["report"]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["class"] != "note")
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_string(),
                f["path"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn pip_check(tb: &Testbed, host: usize) -> Output {
    tb.python(
        host,
        "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-m', 'pip', 'check', '--disable-pip-version-check']))",
    )
    .output()
    .unwrap()
}

/// The whole check of an apply between hosts 0 and 1, then its rollback.
fn apply_is_what_pip_would_leave(tb: &Testbed) {
    tb.write_manifest(SETS);
    let before = snapshot(tb.host_venv_dir(1));
    let pip_before = pip_check(tb, 1).status.success();
    let plan = tb.plan_json();
    let (py, dist_infos) = py_and_dist_infos(&plan);
    assert!(py.len() >= 5, "the fixture's plan places .py files: {py:?}");
    let pyc_carried = placed(&plan)
        .iter()
        .filter(|p| p.contains("/__pycache__/") && p.ends_with(".pyc"))
        .count();
    assert!(pyc_carried > 0, "the plan carries bytecode");
    let src = check(tb, 0, &py, &dist_infos);
    let doctor_before = findings(tb, "dst");
    let doctor_src = findings(tb, "src");

    ok(tb.overlay(&["apply"]).output().unwrap(), "apply");

    let dst = check(tb, 1, &py, &dist_infos);
    // Every .py as pip installed it on the source (its RECORD hash) that
    // has valid bytecode there has it on the target. A hand-patched one
    // takes none (its `.pyc` may be the old code's, with a header that
    // still matches): the target compiles it on import.
    assert!(
        !src.patched.is_empty(),
        "the fixture hand-patches .py files"
    );
    let pip_left: Vec<&String> = src
        .valid
        .iter()
        .filter(|p| !src.patched.contains(p))
        .collect();
    assert!(!pip_left.is_empty());
    for p in &pip_left {
        assert!(
            dst.valid.contains(p),
            "{p}: valid bytecode on the source, not on the target"
        );
    }
    for p in &src.patched {
        assert!(
            !dst.valid.contains(p),
            "{p}: hand-patched on the source, yet bytecode that looks valid on the target"
        );
    }
    assert!(dst.rows > 0);
    let new_bad: Vec<&String> = dst
        .bad_rows
        .iter()
        .filter(|r| !src.bad_rows.contains(r))
        .collect();
    assert!(
        new_bad.is_empty(),
        "RECORD rows that disagree with the disk (and agree on the source): {new_bad:?}"
    );
    // pip agrees: as clean as before.
    if pip_before {
        let out = pip_check(tb, 1);
        assert!(
            out.status.success(),
            "pip check after the apply: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // doctor finds nothing the apply introduced: each finding after it
    // was there on the target before or is the source's own.
    let after = findings(tb, "dst");
    for f in &after {
        assert!(
            doctor_before.contains(f) || doctor_src.contains(f),
            "doctor after the apply: {f:?}\nbefore: {doctor_before:?}\nsource: {doctor_src:?}"
        );
    }

    // Rollback: the target's own old bytecode back, byte for byte.
    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
    assert_same(&before, &snapshot(tb.host_venv_dir(1)), "after rollback");
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn over_ssh_the_bytecode_travels_with_its_py_and_rollback_restores_the_old() {
    let tb = Testbed::new(2);
    apply_is_what_pip_would_leave(&tb);
}

/// Venvs at different paths: the source rewrites its scripts' shebangs,
/// and the target's RECORD lists the scripts it placed.
#[test]
fn rewritten_scripts_are_recorded_as_placed() {
    let tb = Testbed::local(2);
    assert_ne!(tb.hosts[0].venv, tb.hosts[1].venv);
    apply_is_what_pip_would_leave(&tb);
}

/// `apply --no-compile`, as `pip install --no-compile`: no bytecode is
/// carried, and the target's stale bytecode of the changed `.py` files is
/// still removed.
#[test]
fn no_compile_carries_no_bytecode() {
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    let plan = tb.plan_json();
    let (py, _) = py_and_dist_infos(&plan);
    ok(
        tb.overlay(&["apply", "--no-compile"]).output().unwrap(),
        "apply --no-compile",
    );
    let dst = check(&tb, 1, &py, &[]);
    assert!(
        dst.valid.is_empty(),
        "no bytecode after --no-compile: {:?}",
        dst.valid
    );
}
