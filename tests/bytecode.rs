//! The venv as pip would leave it: after `overlay apply`, every `.py` the
//! generation placed has the bytecode pip left beside it on the source,
//! valid for the target's interpreter; every hashed RECORD row of the
//! applied distributions matches the disk (scripts whose shebang was
//! rewritten included); `pip check` and `overlay doctor` agree; and a
//! rollback brings the target's own old bytecode back byte for byte. Real
//! venvs made by pip from the fixture wheels; real sshd hosts (as root), and
//! the local transport for venvs at different paths (rewritten scripts).
//! Issue 43: a target that is a copy of the source's venv at another path,
//! its RECORDs the source's: the scripts the apply places are described by
//! their RECORD rows on every route (relay, `--direct`, local, a bundle).

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

// ---------------------------------------------------------------------------
// Issue 43: a RECORD the plan would leave unchanged, listing a script it
// places. The target is a copy of the source's venv at another path (as
// operators clone environments): every RECORD is byte-identical to the
// source's, its scripts still name the source's venv, and it lacks one
// console script. The apply places the scripts with their shebang for the
// target, so the RECORDs that list them are part of the generation and
// their rows describe the placed scripts, as pip would have written them.

/// Every distribution: the scripts of minitorch and pip are placed.
const ALL: &str = "[sets.all]\ndists = [\"*\"]\n";

/// The script the clone lacks (minitorch's console script).
const MISSING: &str = "bin/minitorchrun";
/// A script the source edited by hand: its row describes no file on the
/// source, and keeps describing none on the target.
const EDITED: &str = "bin/minitorchfrtrace";
/// The dist-infos (by name) whose RECORDs list the placed scripts.
const RECORDS: [&str; 2] = ["minitorch-2.11.0.", "pip-"];

/// The target's venv: a copy of the source's.
struct Clone {
    /// Its path on the target (the manifest's).
    venv: String,
    /// The same folder, seen from here.
    dir: std::path::PathBuf,
}

impl Clone {
    fn site(&self) -> std::path::PathBuf {
        self.dir.join(common::SITE)
    }

    /// The RECORD of the site-relative dist-info whose name starts with `prefix`.
    fn record(&self, prefix: &str) -> std::path::PathBuf {
        let info = std::fs::read_dir(self.site())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with(prefix) && n.ends_with(".dist-info"))
            .unwrap_or_else(|| panic!("no {prefix}*.dist-info in {}", self.dir.display()));
        self.site().join(info).join("RECORD")
    }

    /// The RECORD row (CSV fields) of the venv-relative `script`.
    fn row(&self, prefix: &str, script: &str) -> Vec<String> {
        let want = format!("../../../{script}");
        let text = std::fs::read_to_string(self.record(prefix)).unwrap();
        text.lines()
            .map(|l| l.split(',').map(String::from).collect::<Vec<_>>())
            .find(|r| r[0] == want)
            .unwrap_or_else(|| panic!("no row for {want}"))
    }
}

/// RECORD's `sha256=...` of `data`.
fn record_hash(data: &[u8]) -> String {
    use base64::Engine as _;
    use sha2::Digest as _;
    format!(
        "sha256={}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(data))
    )
}

/// Edit one of the source's console scripts by hand, copy the source's
/// venv to the target's home (SSH) or beside it (local), drop one console
/// script from the copy, and make the copy the manifest's target venv with
/// the set [`ALL`].
fn clone_source_as_target(tb: &Testbed) -> Clone {
    let edited = tb.host_venv_dir(0).join(EDITED);
    let mut text = std::fs::read(&edited).unwrap();
    text.extend_from_slice(b"# edited by hand\n");
    std::fs::write(&edited, text).unwrap();
    let clone = if tb.hosts[1].addr.is_some() {
        Clone {
            venv: "/root/clone".into(),
            dir: tb.host_dir(1).join("root/clone"),
        }
    } else {
        let dir = tb.dir().join("clone");
        Clone {
            venv: dir.to_str().unwrap().into(),
            dir,
        }
    };
    common::run(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(tb.host_venv_dir(0))
            .arg(&clone.dir),
    );
    std::fs::remove_file(clone.dir.join(MISSING)).unwrap();
    let manifest = tb.write_manifest(ALL);
    let text = std::fs::read_to_string(&manifest).unwrap();
    let at = text.find("[hosts.dst]\n").unwrap();
    let old = format!("venv = \"{}\"\n", tb.hosts[1].venv);
    let end = at + text[at..].find(&old).unwrap();
    let text = format!(
        "{}venv = \"{}\"\n{}",
        &text[..end],
        clone.venv,
        &text[end + old.len()..]
    );
    std::fs::write(&manifest, text).unwrap();
    for prefix in RECORDS {
        let src = std::fs::read_dir(tb.site_packages(0))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                n.starts_with(prefix) && n.ends_with(".dist-info")
            })
            .unwrap()
            .join("RECORD");
        assert_eq!(
            std::fs::read(&src).unwrap(),
            std::fs::read(clone.record(prefix)).unwrap(),
            "the clone's RECORD is the source's"
        );
    }
    clone
}

/// The site-relative paths the plan replaces, and those it adds.
fn replaced_and_added(plan: &serde_json::Value) -> (Vec<String>, Vec<String>) {
    let (mut replaced, mut added) = (Vec::new(), Vec::new());
    for set in plan["sets"].as_array().unwrap() {
        for c in set["changes"].as_array().unwrap() {
            let p = c["path"].as_str().unwrap().to_string();
            match c["action"].as_str().unwrap() {
                "replace" => replaced.push(p),
                "add" => added.push(p),
                _ => {}
            }
        }
    }
    (replaced, added)
}

/// Plan (`plan_args`), check that it replaces the RECORDs of the placed
/// scripts, apply (`apply_args`, `--json`), and check the target: the rows
/// of the placed scripts describe them (the hand-edited one's stays),
/// doctor finds nothing the source lacks; then roll back and check that
/// the clone is as before, its RECORDs byte for byte. `route`: the route
/// the apply must report, if any.
fn apply_places_scripts_as_pip_would(
    tb: &Testbed,
    clone: &Clone,
    plan_args: &[&str],
    apply_args: &[&str],
    route: Option<&str>,
) {
    let before = snapshot(&clone.dir);
    let records_before: Vec<Vec<u8>> = RECORDS
        .iter()
        .map(|p| std::fs::read(clone.record(p)).unwrap())
        .collect();
    let edited_row = clone.row(RECORDS[0], EDITED);
    let doctor_src = findings(tb, "src");
    assert!(
        doctor_src.iter().any(|(_, p)| p.ends_with(EDITED)),
        "doctor names the source's hand-edited script: {doctor_src:?}"
    );

    let mut args = vec!["plan"];
    args.extend_from_slice(plan_args);
    args.push("--json");
    let out = ok(tb.overlay(&args).output().unwrap(), "plan");
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (replaced, added) = replaced_and_added(&plan);
    assert!(added.contains(&format!("../../../{MISSING}")), "{added:?}");
    for prefix in RECORDS {
        assert!(
            replaced
                .iter()
                .any(|p| p.starts_with(prefix) && p.ends_with(".dist-info/RECORD")),
            "the plan replaces the {prefix}* RECORD: {replaced:?}"
        );
    }
    assert!(
        !replaced.iter().any(|p| p.starts_with("minib64")),
        "a RECORD that lists no placed script stays: {replaced:?}"
    );

    let mut args = vec!["apply"];
    args.extend_from_slice(apply_args);
    args.push("--json");
    let out = ok(tb.overlay(&args).output().unwrap(), "apply");
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    if let Some(route) = route {
        assert_eq!(result["route"], route, "{result}");
    }

    // The rows of the scripts the apply placed describe them; the
    // hand-edited script keeps its row.
    for script in [MISSING, "bin/pip"] {
        let prefix = if script == MISSING {
            RECORDS[0]
        } else {
            RECORDS[1]
        };
        let data = std::fs::read(clone.dir.join(script)).unwrap();
        assert!(
            data.starts_with(format!("#!{}/bin/", clone.venv).as_bytes()),
            "{script}"
        );
        let row = clone.row(prefix, script);
        assert_eq!(
            (row[1].as_str(), row[2].as_str()),
            (record_hash(&data).as_str(), data.len().to_string().as_str()),
            "{script}'s row"
        );
    }
    assert_eq!(clone.row(RECORDS[0], EDITED), edited_row);
    let edited = std::fs::read(clone.dir.join(EDITED)).unwrap();
    assert!(edited.starts_with(format!("#!{}/bin/", clone.venv).as_bytes()));
    // doctor finds nothing the source lacks.
    let after = findings(tb, "dst");
    for f in &after {
        assert!(
            doctor_src.contains(f),
            "doctor after the apply: {f:?}\nsource: {doctor_src:?}\nafter: {after:?}"
        );
    }

    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
    assert_same(&before, &snapshot(&clone.dir), "after rollback");
    for (p, old) in RECORDS.iter().zip(&records_before) {
        assert!(
            std::fs::read(clone.record(p)).unwrap() == *old,
            "{p}* RECORD after rollback"
        );
    }
}

/// After an apply, `pip uninstall` in the clone removes every script of
/// the distribution, the placed one included.
fn pip_uninstall_removes_the_scripts(tb: &Testbed, clone: &Clone) {
    tb.plan_json();
    ok(tb.overlay(&["apply"]).output().unwrap(), "apply");
    assert!(clone.dir.join(MISSING).exists());
    let uninstall = format!(
        "{}/bin/python -m pip uninstall -y -q --disable-pip-version-check minitorch",
        clone.venv
    );
    let out = if tb.hosts[1].addr.is_some() {
        tb.ssh(1, &uninstall).output().unwrap()
    } else {
        std::process::Command::new("sh")
            .args(["-c", &uninstall])
            .output()
            .unwrap()
    };
    ok(out, "pip uninstall");
    for script in [MISSING, EDITED] {
        assert!(
            !clone.dir.join(script).exists(),
            "{script} after pip uninstall"
        );
    }
}

/// Relay and `--direct`, over SSH.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn over_ssh_a_record_left_alike_describes_the_scripts_placed() {
    let tb = Testbed::new(2);
    let clone = clone_source_as_target(&tb);
    apply_places_scripts_as_pip_would(&tb, &clone, &["src", "dst"], &[], Some("relay"));

    let manifest = tb.manifest_path();
    let text = std::fs::read_to_string(&manifest).unwrap();
    let text = text.replacen(
        "[hosts.dst]\n",
        "[hosts.dst]\ndirect_ssh = \"dst-direct\"\n",
        1,
    );
    std::fs::write(&manifest, text).unwrap();
    common::let_host_reach(&tb, 0, 1, "dst-direct", true);
    apply_places_scripts_as_pip_would(&tb, &clone, &["src", "dst"], &["--direct"], Some("direct"));
    pip_uninstall_removes_the_scripts(&tb, &clone);
}

/// The local route, and a bundle (`plan --bundle`, then `apply`).
#[test]
fn on_the_local_route_and_from_a_bundle_a_record_left_alike_describes_the_scripts_placed() {
    let tb = Testbed::local(2);
    let clone = clone_source_as_target(&tb);
    apply_places_scripts_as_pip_would(&tb, &clone, &["src", "dst"], &[], Some("local"));

    ok(
        tb.overlay(&["pack", "src", "-o", "stack.ovl"])
            .output()
            .unwrap(),
        "pack",
    );
    apply_places_scripts_as_pip_would(&tb, &clone, &["--bundle", "stack.ovl", "dst"], &[], None);
    pip_uninstall_removes_the_scripts(&tb, &clone);
}
