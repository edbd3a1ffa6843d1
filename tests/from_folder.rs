//! End-to-end tests of sets whose files come from a folder laid out like
//! site-packages (`[sets.X] from = "./snapshot"` on the controller, or
//! `from = "host:/path"` on a manifest host), over real sshd test hosts:
//! planned, applied with a backup and rolled back exactly; and a bad
//! `from` refused with nothing changed.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::{SITE, Testbed, assert_same, ok, snapshot};

/// The file globs of the patched set.
const GLOBS: &str = r#"files = ["minisglang/srt/speculative/**", "minisglang/srt/server_args.py"]"#;
/// The file the snapshot changes, and the one it adds (site-packages relative).
const CHANGED: &str = "minisglang/srt/server_args.py";
const ADDED: &str = "minisglang/srt/speculative/ddtree_new.py";

/// Make `dir` a snapshot of the target's files the set's globs name
/// (no `__pycache__`), then patch it: one file changed, one added.
fn make_snapshot(tb: &Testbed, dir: &Path) {
    let site = tb.site_packages(1);
    let mut copied = 0;
    for e in walkdir::WalkDir::new(site.join("minisglang/srt/speculative"))
        .into_iter()
        .filter_entry(|e| e.file_name() != "__pycache__")
    {
        let e = e.unwrap();
        let rel = e.path().strip_prefix(&site).unwrap();
        if e.file_type().is_file() {
            let to = dir.join(rel);
            fs::create_dir_all(to.parent().unwrap()).unwrap();
            fs::copy(e.path(), &to).unwrap();
            copied += 1;
        }
    }
    assert!(copied > 0, "the fixture has files under speculative/");
    fs::copy(site.join(CHANGED), dir.join(CHANGED)).unwrap();
    let mut text = fs::read_to_string(dir.join(CHANGED)).unwrap();
    text.push_str("\nDDTREE_PATCHED = True\n");
    fs::write(dir.join(CHANGED), text).unwrap();
    fs::write(dir.join(ADDED), "def ddtree():\n    return 'patched'\n").unwrap();
}

/// The changes of set `name` in a plan: (path, action), sorted.
fn changes_of(plan: &serde_json::Value, name: &str) -> Vec<(String, String)> {
    let set = plan["sets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no set {name} in {plan}"));
    let mut v: Vec<(String, String)> = set["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["action"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

fn patched_changes() -> Vec<(String, String)> {
    vec![
        (CHANGED.to_string(), "replace".to_string()),
        (ADDED.to_string(), "add".to_string()),
    ]
}

/// Plan, apply with a backup, check the target's files against the
/// snapshot (and, for `torch`, against the source), roll back and check
/// the target is as before, byte for byte.
fn plan_apply_rollback(tb: &Testbed, snap: &Path, from_name: &str) {
    let before = snapshot(tb.host_venv_dir(1));
    let text = ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("set patches (from {from_name})")),
        "{text}"
    );
    let plan = tb.plan_json();
    assert_eq!(changes_of(&plan, "patches"), patched_changes(), "{plan}");
    let set = plan["sets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "patches")
        .unwrap();
    assert_eq!(set["from"], from_name, "{plan}");
    let torch = changes_of(&plan, "torch");
    assert!(!torch.is_empty(), "the live set is planned too: {plan}");
    assert!(plan["sets"][0]["from"].is_null(), "{plan}");

    // The direct route cannot carry a folder's files: refused, nothing changed.
    let out = tb.overlay(&["apply", "--direct"]).output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("--direct cannot send"),
        "{e}"
    );
    assert_same(&before, &snapshot(tb.host_venv_dir(1)), "after --direct");

    let out = ok(
        tb.overlay(&["apply", "--backup", "--json"])
            .output()
            .unwrap(),
        "apply",
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(result["generation"].is_string(), "{result}");
    assert_eq!(result["route"], "relay", "{result}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!(
            "sent from src and {from_name} through this machine"
        )),
        "{said}"
    );
    let site = tb.site_packages(1);
    for rel in [CHANGED, ADDED] {
        assert_eq!(
            fs::read(site.join(rel)).unwrap(),
            fs::read(snap.join(rel)).unwrap(),
            "{rel} on the target is the snapshot's"
        );
    }
    let src_site = tb.site_packages(0);
    for (p, action) in &torch {
        if action != "delete" && !p.starts_with("..") {
            assert_eq!(
                fs::read(site.join(p)).unwrap(),
                fs::read(src_site.join(p)).unwrap(),
                "{p} on the target is the source's"
            );
        }
    }
    // The generation records its sources: the host and the folder.
    let out = ok(
        tb.overlay(&["history", "dst", "--json"]).output().unwrap(),
        "history --json",
    );
    let gens: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &gens.as_array().unwrap().last().unwrap()["provenance"];
    assert_eq!(p["host"], "src", "{gens}");
    let name = snap.file_name().unwrap().to_string_lossy();
    let folders = p["folders"].as_array().unwrap();
    assert!(
        folders.len() == 1 && folders[0].as_str().unwrap().ends_with(&*name),
        "{gens}"
    );
    // Planned again: nothing left to do.
    let again = tb.plan_json();
    assert!(changes_of(&again, "patches").is_empty(), "{again}");

    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
    assert_same(&before, &snapshot(tb.host_venv_dir(1)), "after rollback");
}

fn manifest(from: &str) -> String {
    format!("[sets.torch]\ndists = [\"minitorch\"]\n[sets.patches]\nfrom = \"{from}\"\n{GLOBS}\n")
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_set_from_a_local_folder_is_planned_applied_and_rolled_back_exactly() {
    let tb = Testbed::new(2);
    let snap = tb.work.join("snapshots/ddtree");
    make_snapshot(&tb, &snap);
    tb.write_manifest(&manifest("./snapshots/ddtree"));
    plan_apply_rollback(&tb, &snap, "./snapshots/ddtree");
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_set_from_a_folder_on_a_host_is_planned_applied_and_rolled_back_exactly() {
    let tb = Testbed::new(2);
    // The source host's /root/snap, read by its agent over ssh.
    let snap = tb.host_dir(0).join("root/snap");
    make_snapshot(&tb, &snap);
    tb.write_manifest(&manifest("src:/root/snap"));
    plan_apply_rollback(&tb, &snap, "src:/root/snap");
}

/// `overlay plan src dst` fails; its stderr.
fn plan_fails(tb: &Testbed) -> String {
    let out = tb.overlay(&["plan", "src", "dst"]).output().unwrap();
    assert!(!out.status.success(), "plan succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_bad_from_is_refused_with_its_line_and_nothing_changes() {
    let tb = Testbed::new(2);
    let before_dst = snapshot(tb.host_venv_dir(1));
    let plan_file: PathBuf = tb.work.join(".overlay/plan.json");
    let line = |m: &str| {
        // The `from` line of the manifest written below (hosts come first).
        let text = fs::read_to_string(tb.manifest_path()).unwrap();
        let n = text.lines().position(|l| l.starts_with("from =")).unwrap() + 1;
        let _ = m;
        format!("overlay.toml:{n}:")
    };

    // Missing.
    tb.write_manifest(&manifest("./snapshots/missing"));
    let e = plan_fails(&tb);
    assert!(e.contains(&line("missing")), "{e}");
    assert!(
        e.contains("cannot be read") && e.contains("snapshots/missing"),
        "{e}"
    );
    assert!(e.contains("relative to the manifest's directory"), "{e}");

    // A file.
    fs::write(tb.work.join("afile"), "x").unwrap();
    tb.write_manifest(&manifest("./afile"));
    let e = plan_fails(&tb);
    assert!(
        e.contains(&line("file")) && e.contains("is not a directory"),
        "{e}"
    );

    // Missing on a host: the agent there says so, naming the folder.
    tb.write_manifest(&manifest("src:/root/nowhere"));
    let e = plan_fails(&tb);
    assert!(
        e.contains("/root/nowhere") && e.contains("src:/root/nowhere"),
        "{e}"
    );
    assert!(e.contains(&line("nowhere")), "{e}");

    // An unknown host.
    tb.write_manifest(&manifest("gpu9:/root/snap"));
    let e = plan_fails(&tb);
    assert!(e.contains(&line("host")) && e.contains("gpu9"), "{e}");

    // A symlink that leaves the folder.
    let snap = tb.work.join("snapshots/ddtree");
    make_snapshot(&tb, &snap);
    fs::remove_file(snap.join(CHANGED)).unwrap();
    std::os::unix::fs::symlink("../../../../../etc/passwd", snap.join(CHANGED)).unwrap();
    tb.write_manifest(&manifest("./snapshots/ddtree"));
    let e = plan_fails(&tb);
    assert!(
        e.contains(&line("link")) && e.contains("leaves the folder"),
        "{e}"
    );
    assert!(e.contains(CHANGED), "{e}");

    assert!(!plan_file.exists(), "no plan was saved");
    assert_same(&before_dst, &snapshot(tb.host_venv_dir(1)), "the target");
    assert!(
        fs::symlink_metadata(tb.site_packages(1).join(CHANGED))
            .unwrap()
            .is_file()
    );
    let _ = SITE;
}

/// Copy `rel` (a file or directory of the source's site-packages, without
/// `__pycache__`) into `dir`.
fn copy_from_source(tb: &Testbed, rel: &str, dir: &Path) {
    let site = tb.site_packages(0);
    for e in walkdir::WalkDir::new(site.join(rel))
        .into_iter()
        .filter_entry(|e| e.file_name() != "__pycache__")
    {
        let e = e.unwrap();
        if e.file_type().is_file() {
            let to = dir.join(e.path().strip_prefix(&site).unwrap());
            fs::create_dir_all(to.parent().unwrap()).unwrap();
            fs::copy(e.path(), &to).unwrap();
        }
    }
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_distribution_in_a_folder_plans_as_from_the_live_source_which_may_be_gone() {
    let mut tb = Testbed::new(2);
    tb.write_manifest("[sets.torchvision]\ndists = [\"minitorchvision\"]\n");
    let live = tb.plan_json();
    let snap = tb.work.join("snap");
    let info = fs::read_dir(tb.site_packages(0))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.starts_with("minitorchvision-") && n.ends_with(".dist-info"))
        .unwrap();
    copy_from_source(&tb, &info, &snap);
    copy_from_source(&tb, "minitorchvision", &snap);
    tb.write_manifest("[sets.torchvision]\nfrom = \"snap\"\ndists = [\"minitorchvision\"]\n");
    // The source host is gone: a plan whose sets all come from folders
    // does not need it.
    tb.stop(0);
    let before = snapshot(tb.host_venv_dir(1));
    let folder = tb.plan_json();
    // The live source carries its bytecode with the changed .py files; the
    // folder has none (copied without __pycache__).
    let mut live_files = changes_of(&live, "torchvision");
    live_files.retain(|(p, _)| !p.contains("/__pycache__/"));
    assert_eq!(
        changes_of(&folder, "torchvision"),
        live_files,
        "the folder's RECORD decides as the venv's does"
    );
    assert!(!changes_of(&live, "torchvision").is_empty(), "{live}");
    assert_eq!(folder["sets"][0]["versions"], live["sets"][0]["versions"]);
    ok(tb.overlay(&["apply"]).output().unwrap(), "apply");
    let again = tb.plan_json();
    assert!(changes_of(&again, "torchvision").is_empty(), "{again}");
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
fn a_folder_changed_after_the_plan_fails_the_apply_after_the_other_source_and_nothing_changes() {
    let tb = Testbed::new(2);
    let snap = tb.work.join("snapshots/ddtree");
    make_snapshot(&tb, &snap);
    tb.write_manifest(&manifest("./snapshots/ddtree"));
    let before = snapshot(tb.host_venv_dir(1));
    let plan = tb.plan_json();
    assert!(!changes_of(&plan, "torch").is_empty(), "{plan}");
    // The folder's stream comes second (the sets' order), after the
    // source host's has been staged: the folder's file changed since.
    fs::write(snap.join(ADDED), "def ddtree():\n    return 'changed'\n").unwrap();
    let out = tb.overlay(&["apply"]).output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "apply succeeded: {e}");
    assert!(e.contains("./snapshots/ddtree"), "the folder is named: {e}");
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(1)),
        "after the failed apply",
    );
    // Planned again, it applies.
    tb.plan_json();
    ok(tb.overlay(&["apply"]).output().unwrap(), "apply");
    assert_eq!(
        fs::read(tb.site_packages(1).join(ADDED)).unwrap(),
        fs::read(snap.join(ADDED)).unwrap()
    );
}

/// A set from a folder in a plan of three targets: every target's plan
/// takes the set from the folder (its `from`) and the live set from the
/// source, as a plan of one target does; the rollout applies each target
/// (a folder set cannot share the fan-out's one stream), and every target
/// then holds the snapshot's files.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_set_from_a_folder_in_a_plan_of_three_targets() {
    let tb = Testbed::new(4);
    let snap = tb.work.join("snapshots/ddtree");
    make_snapshot(&tb, &snap);
    tb.write_manifest(&format!(
        "{}[groups.fleet]\nhosts = [\"dst\", \"dst2\", \"dst3\"]\n",
        manifest("./snapshots/ddtree")
    ));
    let out = ok(
        tb.overlay(&["plan", "src", "fleet", "--json"])
            .output()
            .unwrap(),
        "plan of three targets",
    );
    let many: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let targets = many["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 3, "{many}");
    for plan in targets {
        assert_eq!(changes_of(plan, "patches"), patched_changes(), "{plan}");
        let sets = plan["sets"].as_array().unwrap();
        let patches = sets.iter().find(|s| s["name"] == "patches").unwrap();
        assert_eq!(patches["from"], "./snapshots/ddtree", "{plan}");
        assert!(sets[0]["from"].is_null(), "{plan}");
        assert!(!changes_of(plan, "torch").is_empty(), "{plan}");
    }
    let out = ok(
        tb.overlay(&["apply", "--json"]).output().unwrap(),
        "apply of three targets",
    );
    let said = String::from_utf8_lossy(&out.stderr);
    for i in 1..4 {
        let site = tb.site_packages(i);
        for rel in [CHANGED, ADDED] {
            assert_eq!(
                fs::read(site.join(rel)).unwrap(),
                fs::read(snap.join(rel)).unwrap(),
                "{rel} on target {i} is the snapshot's: {said}"
            );
        }
    }
}

/// `pack` reads a set from a folder beside the source's sets: the bundle
/// holds the folder's files under site-packages, and applying the bundle
/// leaves a target exactly as a live apply of the same manifest leaves its
/// twin. A folder's symlink that leaves the folder is refused by `pack`
/// too, with its line, and nothing is written.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_set_from_a_folder_in_pack() {
    let tb = Testbed::new(3);
    let snap = tb.work.join("snapshots/ddtree");
    make_snapshot(&tb, &snap);
    tb.write_manifest(&manifest("./snapshots/ddtree"));
    let out = ok(
        tb.overlay(&["pack", "src", "-o", "stack.ovl", "--json"])
            .output()
            .unwrap(),
        "pack with a set from a folder",
    );
    let packed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(packed["sets"], serde_json::json!(["torch", "patches"]));
    // The bundle names the folder's files where the target has them.
    let listing = std::process::Command::new("sh")
        .arg("-c")
        .arg("zstd -dcq stack.ovl | tar -t")
        .current_dir(&tb.work)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    for rel in [CHANGED, ADDED] {
        assert!(
            listing.lines().any(|l| l == format!("venv/{SITE}/{rel}")),
            "venv/{SITE}/{rel} in the bundle:\n{listing}"
        );
    }
    // dst from the bundle, dst2 live: the same result.
    ok(
        tb.overlay(&["plan", "--bundle", "stack.ovl", "dst", "-o", "b.json"])
            .output()
            .unwrap(),
        "plan --bundle",
    );
    ok(
        tb.overlay(&["apply", "b.json"]).output().unwrap(),
        "apply the bundle's plan",
    );
    ok(
        tb.overlay(&["plan", "src", "dst2", "-o", "live.json"])
            .output()
            .unwrap(),
        "plan live",
    );
    ok(
        tb.overlay(&["apply", "live.json"]).output().unwrap(),
        "apply live",
    );
    for rel in [CHANGED, ADDED] {
        assert_eq!(
            fs::read(tb.site_packages(1).join(rel)).unwrap(),
            fs::read(snap.join(rel)).unwrap(),
            "{rel} from the bundle is the snapshot's"
        );
    }
    assert_same(
        &snapshot(tb.host_venv_dir(2)),
        &snapshot(tb.host_venv_dir(1)),
        "the bundle's target against the live one",
    );
    // A symlink out of the folder: refused, no bundle written.
    std::os::unix::fs::symlink(
        "/etc/passwd",
        snap.join("minisglang/srt/speculative/out.py"),
    )
    .unwrap();
    let out = tb
        .overlay(&["pack", "src", "-o", "bad.ovl"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("overlay.toml:") && err.contains("leaves the folder"),
        "{err}"
    );
    assert!(!tb.work.join("bad.ovl").exists());
}

/// A slow target holds only its own slot: with `--parallel 2`, the third
/// target starts as soon as the second is done, while the first is still
/// verifying. (Sets from a folder make each target a unit of its own; the
/// first target's `[verify]` waits for a file the third's writes, so with
/// batches of two it would wait in vain and fail.)
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_slow_target_does_not_hold_back_the_next_one() {
    let tb = Testbed::new(4);
    let snap = tb.work.join("snapshots/ddtree");
    make_snapshot(&tb, &snap);
    // Where the hosts meet: not under the testbed's folder, which a host
    // does not see when it lies under /tmp (each host has its own /tmp).
    let meet_dir = tempfile::Builder::new()
        .prefix("overlay-rendezvous-")
        .tempdir_in("/dev/shm")
        .unwrap();
    let meet = meet_dir.path().to_path_buf();
    for (i, name) in [(1, "dst"), (2, "dst2"), (3, "dst3")] {
        fs::write(tb.host_dir(i).join("root/name"), name).unwrap();
    }
    tb.write_manifest(&format!(
        "{}[groups.fleet]\nhosts = [\"dst\", \"dst2\", \"dst3\"]\n[verify]\npython = '''\n\
import os, sys, time\n\
me = open('/root/name').read().strip()\n\
meet = {meet:?}\n\
if me == 'dst3':\n    open(os.path.join(meet, 'dst3'), 'w').close()\n\
if me == 'dst':\n    for _ in range(1200):\n        if os.path.exists(os.path.join(meet, 'dst3')):\n            sys.exit(0)\n        time.sleep(0.1)\n    sys.exit('dst3 did not start while dst was verifying')\n\
'''\n",
        manifest("./snapshots/ddtree"),
        meet = meet.display().to_string()
    ));
    ok(
        tb.overlay(&["plan", "src", "fleet"]).output().unwrap(),
        "plan of three targets",
    );
    let out = tb
        .overlay(&["apply", "--parallel", "2", "--verify", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let rolled: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results: Vec<&str> = rolled["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["result"].as_str().unwrap())
        .collect();
    assert_eq!(
        results,
        ["applied", "applied", "applied"],
        "{stdout}\n{stderr}"
    );
    assert!(meet.join("dst3").exists());
}
