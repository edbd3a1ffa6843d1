//! A hostile or damaged source, target or plan, end to end on real venvs
//! (the local transport; the agents are the same binary): RECORD rows into
//! overlay's own state, rows naming directories, setuid bits, paths behind
//! symlinked parent directories, and plan files edited to do what `plan`
//! never would. Each is left out with a warning by `plan`, or refused by the
//! target's agent before anything is written.

mod common;

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use common::{SITE, Testbed, assert_same, ok, snapshot};

const TORCH: &str = "[sets.torch]\ndists = [\"minitorch\"]\n";
const SRC_INFO: &str = "minitorch-2.11.0.dist-info";
const DST_INFO: &str = "minitorch-2.9.1.dist-info";

fn site(tb: &Testbed, i: usize) -> PathBuf {
    tb.host_venv_dir(i).join(SITE)
}

/// Append RECORD rows (paths, no hash) to a distribution of host `i`.
fn add_record_rows(tb: &Testbed, i: usize, dist_info: &str, rows: &[&str]) {
    let record = site(tb, i).join(dist_info).join("RECORD");
    let mut text = fs::read_to_string(&record).unwrap();
    for r in rows {
        text.push_str(&format!("{r},,\n"));
    }
    fs::write(&record, text).unwrap();
}

/// Every change of the plan: (path, action, change).
fn changes(plan: &serde_json::Value) -> Vec<(String, String, serde_json::Value)> {
    plan["sets"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["changes"].as_array().unwrap().clone())
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["action"].as_str().unwrap().to_string(),
                c,
            )
        })
        .collect()
}

fn warnings(plan: &serde_json::Value) -> Vec<String> {
    plan["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["message"].as_str().unwrap().to_string())
        .collect()
}

fn assert_warned(plan: &serde_json::Value, parts: &[&str]) {
    let w = warnings(plan);
    assert!(
        w.iter().any(|m| parts.iter().all(|p| m.contains(p))),
        "no warning with {parts:?}: {w:#?}"
    );
}

/// The plan as `plan` saved it (with what each side has), not the `--json` report.
fn saved_plan(tb: &Testbed) -> serde_json::Value {
    let text = fs::read_to_string(tb.manifest_path().with_file_name(".overlay/plan.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn apply(tb: &Testbed) {
    ok(
        tb.overlay(&["apply", "--backup"]).output().unwrap(),
        "apply",
    );
}

/// Every regular file below `dir` (symlinks not followed) whose content is `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    walkdir::WalkDir::new(dir)
        .follow_links(false)
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .filter(|e| fs::read(e.path()).is_ok_and(|c| c == needle))
        .map(|e| e.path().to_path_buf())
        .collect()
}

#[test]
fn record_rows_into_overlays_state_are_left_out_on_both_sides() {
    let tb = Testbed::local(2);
    tb.write_manifest(TORCH);
    // The source plants a fake unfinished generation.
    let fake = ".overlay/generations/20000101T000000Z-0000";
    fs::create_dir_all(tb.host_venv_dir(0).join(fake)).unwrap();
    fs::write(tb.host_venv_dir(0).join(fake).join("journal"), "{}\n").unwrap();
    let row = format!("../../../{fake}/journal");
    add_record_rows(&tb, 0, SRC_INFO, &[&row]);
    // The target's RECORD names a file of the target's own state.
    fs::create_dir_all(tb.host_venv_dir(1).join(".overlay")).unwrap();
    fs::write(tb.host_venv_dir(1).join(".overlay/mine"), "mine").unwrap();
    add_record_rows(&tb, 1, DST_INFO, &["../../../.overlay/mine"]);

    let plan = tb.plan_json();
    for (p, _, _) in changes(&plan) {
        assert!(!p.contains(".overlay"), "{p} is planned");
    }
    assert_warned(
        &plan,
        &[&row, "points into overlay's state folder", "left out"],
    );
    assert_warned(
        &plan,
        &[
            "../../../.overlay/mine",
            "points into overlay's state folder",
        ],
    );
    apply(&tb);
    assert!(!tb.host_venv_dir(1).join(fake).exists());
    assert_eq!(
        fs::read_to_string(tb.host_venv_dir(1).join(".overlay/mine")).unwrap(),
        "mine"
    );
}

#[test]
fn a_record_row_naming_a_directory_never_deletes_it() {
    let tb = Testbed::local(2);
    tb.write_manifest(TORCH);
    // On the target, a directory named by the set's RECORD, holding a file
    // another distribution (outside the set) owns.
    let shared = site(&tb, 1).join("shared");
    fs::create_dir_all(&shared).unwrap();
    fs::write(shared.join("other_module.py"), "x = 1\n").unwrap();
    add_record_rows(&tb, 1, DST_INFO, &["shared/"]);
    let other = fs::read_dir(site(&tb, 1))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().into_string().unwrap())
        .find(|n| n.starts_with("minib64-") && n.ends_with(".dist-info"))
        .expect("minib64 is installed on the target");
    add_record_rows(&tb, 1, &other, &["shared/other_module.py"]);
    // On the source, a RECORD row naming a directory is not carried either.
    fs::create_dir_all(site(&tb, 0).join("srcdir")).unwrap();
    fs::write(site(&tb, 0).join("srcdir/inside.py"), "y = 2\n").unwrap();
    add_record_rows(&tb, 0, SRC_INFO, &["srcdir"]);

    let plan = tb.plan_json();
    for (p, _, _) in changes(&plan) {
        assert!(
            !p.starts_with("shared") && !p.starts_with("srcdir"),
            "{p} is planned"
        );
    }
    assert_warned(&plan, &["shared/", "is a directory", "it is kept"]);
    assert_warned(&plan, &["srcdir", "is a directory", "left out"]);
    apply(&tb);
    assert_eq!(
        fs::read_to_string(shared.join("other_module.py")).unwrap(),
        "x = 1\n"
    );
    assert!(!site(&tb, 1).join("srcdir").exists());
}

#[test]
fn setuid_setgid_and_sticky_bits_never_travel() {
    let tb = Testbed::local(2);
    tb.write_manifest(TORCH);
    let rel = "minitorch/_new_in_211.py";
    fs::set_permissions(site(&tb, 0).join(rel), fs::Permissions::from_mode(0o6755)).unwrap();
    let plan = tb.plan_json();
    let (_, action, c) = changes(&saved_plan(&tb))
        .into_iter()
        .find(|(p, _, _)| p == rel)
        .unwrap();
    assert_eq!(action, "add");
    assert_eq!(c["source"]["mode"], 0o755, "{c}");
    assert_warned(&plan, &["setuid", rel]);
    apply(&tb);
    let mode = fs::metadata(site(&tb, 1).join(rel))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o755);
}

#[test]
fn nothing_is_read_written_or_deleted_through_a_symlinked_parent() {
    let tb = Testbed::local(2);
    tb.write_manifest(TORCH);
    // Source: site-packages/evil_data -> a directory outside the venv.
    let outside = tb.dir().join("outside-src");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("secret"), "top secret\n").unwrap();
    symlink(&outside, site(&tb, 0).join("evil_data")).unwrap();
    add_record_rows(&tb, 0, SRC_INFO, &["evil_data", "evil_data/secret"]);
    // Target: a file of the set behind a symlinked directory.
    let outside_dst = tb.dir().join("outside-dst");
    fs::create_dir_all(&outside_dst).unwrap();
    fs::write(outside_dst.join("x"), "keep me\n").unwrap();
    symlink(&outside_dst, site(&tb, 1).join("tdata")).unwrap();
    add_record_rows(&tb, 1, DST_INFO, &["tdata/x"]);

    let plan = tb.plan_json();
    let planned = changes(&saved_plan(&tb));
    let link = planned
        .iter()
        .find(|(p, _, _)| p == "evil_data")
        .expect("the symlink itself is carried");
    assert_eq!(link.2["source"]["kind"], "symlink", "{}", link.2);
    for (p, _, _) in &planned {
        assert!(p != "evil_data/secret" && !p.starts_with("tdata"), "{p}");
    }
    assert_warned(
        &plan,
        &[
            "evil_data/secret: its parent evil_data is a symlink",
            "never reads through one",
        ],
    );
    assert_warned(&plan, &["tdata/x: its parent tdata is a symlink", "kept"]);
    apply(&tb);
    let landed = fs::symlink_metadata(site(&tb, 1).join("evil_data")).unwrap();
    assert!(landed.file_type().is_symlink());
    assert_eq!(
        files_containing(tb.host_venv_dir(1), b"top secret\n"),
        Vec::<PathBuf>::new()
    );
    assert_eq!(
        fs::read_to_string(outside_dst.join("x")).unwrap(),
        "keep me\n"
    );
}

#[test]
fn a_damaged_or_hostile_plan_is_refused_by_the_target_before_anything_is_written() {
    let tb = Testbed::local(2);
    tb.write_manifest(TORCH);
    ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    let saved = tb.manifest_path().with_file_name(".overlay/plan.json");
    let good: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&saved).unwrap()).unwrap();
    let before = snapshot(tb.host_venv_dir(1));
    let gens = tb.host_venv_dir(1).join(".overlay/generations");
    let count = || fs::read_dir(&gens).map_or(0, |d| d.count());
    let gens_before = count();

    fn add(path: &str, mode: u32) -> serde_json::Value {
        serde_json::json!({"path": path, "action": "add", "size": 3, "source":
            {"kind": "file", "size": 3, "mode": mode, "blake3": "0".repeat(64)}})
    }
    type Edit = Box<dyn Fn(&mut Vec<serde_json::Value>)>;
    let edits: Vec<(&str, &str, Edit)> = vec![
        (
            "a fake generation",
            "../../../.overlay/generations/20000101T000000Z-0000/journal",
            Box::new(|c| {
                c.push(add(
                    "../../../.overlay/generations/20000101T000000Z-0000/journal",
                    0o644,
                ))
            }),
        ),
        (
            "a directory deleted",
            "minitorch",
            Box::new(|c| {
                c.push(
                    serde_json::json!({"path": "minitorch", "action": "delete", "size": 0,
                    "target": {"kind": "dir", "mode": 0o755}}),
                )
            }),
        ),
        (
            "a setuid file",
            "minitorch/evil_suid",
            Box::new(|c| c.push(add("minitorch/evil_suid", 0o4755))),
        ),
        (
            "a path escaping the venv",
            "../../../../evil",
            Box::new(|c| c.push(add("../../../../evil", 0o644))),
        ),
        (
            "an odd spelling",
            "minitorch//evil.py",
            Box::new(|c| c.push(add("minitorch//evil.py", 0o644))),
        ),
        (
            "a path twice",
            "minitorch/_new_in_211.py",
            Box::new(|c| {
                let dup = c
                    .iter()
                    .find(|x| x["path"] == "minitorch/_new_in_211.py")
                    .unwrap()
                    .clone();
                c.push(dup);
            }),
        ),
        (
            "a change below a new file",
            "minitorch/_new_in_211.py/evil",
            Box::new(|c| c.push(add("minitorch/_new_in_211.py/evil", 0o644))),
        ),
    ];
    for (what, path, edit) in edits {
        let mut plan = good.clone();
        let changes = plan["sets"][0]["changes"].as_array_mut().unwrap();
        edit(changes);
        let evil = saved.with_file_name("evil.json");
        fs::write(&evil, serde_json::to_vec(&plan).unwrap()).unwrap();
        let out = tb
            .overlay(&["apply", "--backup", evil.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: the apply went through");
        assert!(
            stderr.contains("Refusing the plan")
                && stderr.contains(&format!("{path:?}"))
                && stderr.contains("hostile source; run `overlay plan` again"),
            "{what}: {stderr}"
        );
        assert_same(&before, &snapshot(tb.host_venv_dir(1)), what);
        assert_eq!(count(), gens_before, "{what}: a generation was opened");
        assert!(
            !tb.host_venv_dir(1)
                .join(".overlay/generations/20000101T000000Z-0000")
                .exists()
        );
    }
}
