//! `overlay plan` end to end on real sshd test hosts: the plan matches an
//! independent computation from the RECORD files, and bad input gets a clear
//! error that names the host or the path, with a hint, and changes nothing.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use common::{Testbed, assert_same, snapshot};

/// The fixture scenario's four sets (see tests/common).
const SETS: &str = common::SCENARIO_SETS;

type Changes = BTreeMap<String, (String, u64)>;

fn changes_of(doc: &serde_json::Value, set: &str, skip_keep: bool) -> (Changes, u64) {
    let s = doc["sets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == set)
        .unwrap_or_else(|| panic!("no set {set}: {doc}"));
    let changes = s["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !(skip_keep && c["action"] == "keep"))
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                (
                    c["action"].as_str().unwrap().to_string(),
                    c["size"].as_u64().unwrap(),
                ),
            )
        })
        .collect();
    (changes, s["unchanged"].as_u64().unwrap())
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn plan_over_ssh_matches_an_independent_computation_from_record_files() {
    let tb = Testbed::new(2);
    tb.write_manifest(SETS);
    let before = (snapshot(tb.host_venv_dir(0)), snapshot(tb.host_venv_dir(1)));
    let plan = tb.plan_json();
    let reference = tb.record_plan(0, 1);
    assert_eq!(plan["source"], "src");
    assert_eq!(plan["target"], "dst");
    for set in ["torch", "torchvision", "nvidia-cu13", "sglang-patches"] {
        let (mut ours, unchanged) = changes_of(&plan, set, false);
        let (theirs, ref_unchanged) = changes_of(&reference, set, true);
        // The reference decides RECORD members; overlay also carries the
        // source's bytecode of each .py it carries as pip installed it
        // (tests/bytecode.rs): each such .pyc belongs to a carried .py.
        let carried_py: Vec<String> = ours
            .iter()
            .filter(|(p, (a, _))| p.ends_with(".py") && a != "delete")
            .map(|(p, _)| p.clone())
            .collect();
        ours.retain(|p, (a, _)| {
            if !p.contains("/__pycache__/") || a == "delete" {
                return true;
            }
            let (dir, name) = p.rsplit_once("/__pycache__/").unwrap();
            let py = format!("{dir}/{}.py", name.split('.').next().unwrap());
            assert!(
                carried_py.contains(&py),
                "{p}: bytecode of a .py the plan does not carry"
            );
            false
        });
        assert_eq!(
            ours, theirs,
            "set {set}: overlay's plan differs from the RECORD-based reference"
        );
        assert_eq!(unchanged, ref_unchanged, "set {set}: unchanged count");
    }
    // The keep decision shows up as a warning naming the owner.
    let warnings = plan["warnings"].to_string();
    assert!(
        warnings.contains("eagle_utils.py") && warnings.contains("minisglang"),
        "{warnings}"
    );
    // Versions show the true build from version.py.
    let torch = &plan["sets"][0]["versions"][0];
    assert_eq!(torch["from"], "2.9.1+cu128");
    assert_eq!(torch["to"], "2.11.0+cu130");
    // plan never modifies either venv.
    assert_same(
        &before.0,
        &snapshot(tb.host_venv_dir(0)),
        "source after plan",
    );
    assert_same(
        &before.1,
        &snapshot(tb.host_venv_dir(1)),
        "target after plan",
    );
    // --check: exit 1 when there are changes; text output lists paths with -v.
    let out = tb
        .overlay(&["plan", "src", "dst", "--check", "-v"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("minitorch 2.9.1+cu128 -> 2.11.0+cu130"),
        "{text}"
    );
    assert!(
        text.contains("+ minisglang/srt/speculative/ddtree_utils.py"),
        "{text}"
    );
    assert!(tb.work.join(".overlay/plan.json").exists());

    // The agent is started as the copy of this build the host already has;
    // a damaged copy (or none) is found out by its silence, and uploaded
    // again before the plan goes on.
    let agent_on = |i: usize| -> PathBuf {
        let dir = tb.host_dir(i).join("root/.cache/overlay");
        common::file_starting_with(&dir, "overlay-")
            .unwrap_or_else(|| panic!("no agent in {}", dir.display()))
    };
    let size = std::fs::metadata(env!("CARGO_BIN_EXE_overlay"))
        .unwrap()
        .len();
    let (on_src, on_dst) = (agent_on(0), agent_on(1));
    std::fs::write(&on_dst, b"#!/bin/sh\nexit 3\n").unwrap();
    std::fs::remove_file(&on_src).unwrap();
    let again = tb.plan_json();
    assert_eq!(
        again["sets"], plan["sets"],
        "the same plan after re-uploads"
    );
    assert_eq!(std::fs::metadata(&on_src).unwrap().len(), size);
    assert_eq!(std::fs::metadata(&on_dst).unwrap().len(), size);
}

/// Run a plan that must fail: exit `code`, every needle in stderr, a hint, and no venv changed.
fn fails(tb: &Testbed, args: &[&str], code: i32, needles: &[&str]) {
    let before = snapshot(tb.host_venv_dir(1));
    let out = tb.overlay(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr lacks {n:?}:\n{err}");
    }
    assert!(err.contains("hint:"), "{args:?}: no hint:\n{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(1)),
        &format!("target after {args:?}"),
    );
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let tb = Testbed::new(2);
    let (ip, port) = tb.hosts[1].addr.clone().unwrap();
    tb.write_manifest(&format!(
        r#"
[hosts.closed]
ssh = "root@127.0.0.1:1"
venv = "/root/venv"
[hosts.stranger]
ssh = "nobody@{ip}:{port}"
venv = "/root/venv"
[hosts.novenv]
ssh = "dst"
venv = "/root/no-such-venv"
{SETS}
[sets.absent]
dists = ["no-such-dist"]
"#
    ));
    fails(
        &tb,
        &["plan", "src", "ct404"],
        2,
        &["Unknown host \"ct404\"", "known hosts"],
    );
    fails(
        &tb,
        &["plan", "src", "closed", "--connect-timeout", "2"],
        4,
        &["closed", "127.0.0.1:1"],
    );
    fails(
        &tb,
        &["plan", "src", "stranger"],
        4,
        &["stranger", "authenticate"],
    );
    fails(
        &tb,
        &["plan", "src", "novenv"],
        2,
        &["novenv", "/root/no-such-venv"],
    );
    fails(
        &tb,
        &["plan", "src", "dst", "--set", "absent"],
        2,
        &["Set absent matches nothing", "src"],
    );

    // A damaged RECORD with a path that escapes the venv.
    let site = tb.site_packages(1);
    let info = fs::read_dir(&site)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("minitorch-2.9.1.dist-info"))
        .unwrap();
    let record = info.join("RECORD");
    let good = fs::read(&record).unwrap();
    let mut bad = good.clone();
    bad.extend_from_slice(b"../../../../etc/passwd,sha256=AAAA,10\n");
    fs::write(&record, &bad).unwrap();
    fails(
        &tb,
        &["plan", "src", "dst", "--set", "torch"],
        8,
        &["dst", "minitorch", "RECORD", "escapes the venv"],
    );
    // A METADATA without a version.
    fs::write(&record, &good).unwrap();
    let meta = info.join("METADATA");
    let good_meta = fs::read_to_string(&meta).unwrap();
    fs::write(
        &meta,
        good_meta
            .lines()
            .filter(|l| !l.starts_with("Version:"))
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .unwrap();
    fails(
        &tb,
        &["plan", "src", "dst", "--set", "torch"],
        8,
        &["dst", "METADATA"],
    );
    fs::write(&meta, good_meta).unwrap();

    // A changed host key is refused, even with --accept-new-host-key.
    let kh = tb.client.join(".ssh/known_hosts");
    let good_kh = fs::read_to_string(&kh).unwrap();
    let other = tb.dir().join("otherkey");
    common::run(
        std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", ""])
            .arg("-f")
            .arg(&other),
    );
    let other_pub = fs::read_to_string(other.with_extension("pub")).unwrap();
    let other_key: Vec<&str> = other_pub.split_whitespace().collect();
    let tampered: String = good_kh
        .lines()
        .map(|l| {
            if l.starts_with(&format!("[{ip}]:{port}")) {
                format!("[{ip}]:{port} {} {}\n", other_key[0], other_key[1])
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    fs::write(&kh, tampered).unwrap();
    fails(
        &tb,
        &["plan", "src", "dst", "--accept-new-host-key"],
        5,
        &["dst", "CHANGED"],
    );
    // An unknown host key is refused without --accept-new-host-key, and trusted with it.
    let without: String = good_kh
        .lines()
        .filter(|l| !l.starts_with(&format!("[{ip}]:{port}")))
        .map(|l| format!("{l}\n"))
        .collect();
    fs::write(&kh, without).unwrap();
    fails(
        &tb,
        &["plan", "src", "dst", "--set", "torch"],
        5,
        &["dst", "accept-new-host-key"],
    );
    let out = tb
        .overlay(&[
            "plan",
            "src",
            "dst",
            "--set",
            "torch",
            "--accept-new-host-key",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        fs::read_to_string(&kh)
            .unwrap()
            .contains(&format!("[{ip}]:{port}"))
    );
}

#[test]
fn a_glob_that_escapes_the_venv_is_a_manifest_error_with_line_and_column() {
    let tb = Testbed::local(2);
    tb.write_manifest("[sets.evil]\nfiles = [\"../../../../etc/passwd\"]\n");
    let out = tb.overlay(&["plan", "src", "dst"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("overlay.toml:")
            && err.contains("escapes site-packages")
            && err.contains("hint:"),
        "{err}"
    );
}

/// File names, versions and messages carry terminal control characters
/// (ESC, newline) from RECORD and METADATA: the human plan and every
/// message show them escaped, git style, and `--json` carries them exactly.
/// RECORD is CSV, so a quoted field may hold a newline.
#[test]
fn control_characters_are_escaped_for_people_and_exact_in_json() {
    let tb = Testbed::local(2);
    let site = tb.site_packages(0);
    let name = "evil/\x1b[31mred\nline.py";
    let version = "1.0\x1b[2J";
    fs::create_dir_all(site.join("evil")).unwrap();
    fs::create_dir_all(site.join("evil-1.0.dist-info")).unwrap();
    fs::write(site.join(name), "x = 1\n").unwrap();
    fs::write(
        site.join("evil-1.0.dist-info/METADATA"),
        format!("Metadata-Version: 2.1\nName: evil\nVersion: {version}\n"),
    )
    .unwrap();
    fs::write(
        site.join("evil-1.0.dist-info/RECORD"),
        format!("\"{name}\",,\nevil-1.0.dist-info/METADATA,,\nevil-1.0.dist-info/RECORD,,\n"),
    )
    .unwrap();
    tb.write_manifest("[sets.evil]\ndists = [\"evil\"]\n");

    let out = tb.overlay(&["plan", "src", "dst", "-v"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    eprintln!("--- human plan:\n{stdout}");
    for (what, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(
            !text.contains('\x1b') && !text.contains('\r'),
            "raw control characters on {what}: {text:?}"
        );
    }
    assert!(
        stdout.contains(r#"+ "evil/\033[31mred\nline.py" (6 B)"#),
        "{stdout}"
    );
    assert!(
        stdout.contains(r#"evil (absent) -> "1.0\033[2J""#),
        "{stdout}"
    );

    let out = tb
        .overlay(&["plan", "src", "dst", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let set = &doc["sets"][0];
    let paths: Vec<&str> = set["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&name), "{paths:?}");
    assert_eq!(set["versions"][0]["to"], version, "{}", set["versions"]);

    // A warning that quotes such a name stays on one line, escaped.
    fs::remove_file(site.join(name)).unwrap();
    let out = tb.overlay(&["plan", "src", "dst"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- with the file gone:\n{stderr}");
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
    assert!(stderr.contains(r"\033[31mred\nline.py"), "{stderr}");
}

/// The plan warns of what only the new generation's backup would keep: a
/// target file edited by hand that the overlay replaces, named with its
/// distribution; and a distribution with two dist-infos on the target,
/// both named, whose files the overlay removes. An untouched target warns
/// of neither. (The real-wheel version of these traps: benches/traps.py.)
#[test]
fn plan_warns_of_an_edited_target_file_and_a_second_dist_info() {
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    let plan = |tb: &Testbed| {
        let out = common::ok(
            tb.overlay(&["plan", "src", "dst", "--set", "torch", "--json"])
                .output()
                .unwrap(),
            "plan",
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (doc, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (doc, stderr) = plan(&tb);
    assert_eq!(doc["warnings"], serde_json::json!([]), "{stderr}");
    // A `.py` of the target's minitorch that the overlay replaces.
    let (changes, _) = changes_of(&doc, "torch", true);
    let victim = changes
        .iter()
        .find(|(p, (a, _))| a == "replace" && p.ends_with(".py") && !p.contains("__pycache__"))
        .map(|(p, _)| p.clone())
        .expect("the torch set replaces a .py file");
    let site = tb.site_packages(1);
    let mut text = fs::read(site.join(&victim)).unwrap();
    text.extend_from_slice(b"# edited on dst by hand\n");
    fs::write(site.join(&victim), text).unwrap();

    // A leftover dist-info of an older minitorch beside the current one.
    let current = common::file_starting_with(&site, "minitorch-").unwrap();
    let current_name = current.file_name().unwrap().to_str().unwrap().to_string();
    let leftover = site.join("minitorch-0.0.1.dist-info");
    fs::create_dir(&leftover).unwrap();
    for f in ["METADATA", "RECORD"] {
        fs::copy(current.join(f), leftover.join(f)).unwrap();
    }

    let (doc, stderr) = plan(&tb);
    let warnings: Vec<String> = doc["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["message"].as_str().unwrap().to_string())
        .collect();
    let edited = format!(
        "1 file of minitorch on dst differs from its RECORD, changed since pip installed it: {victim} (size "
    );
    assert!(
        warnings.iter().any(|w| w.starts_with(&edited)
            && w.contains(
                "the overlay replaces it, so the new generation's backup will hold the only copy"
            )),
        "{warnings:#?}"
    );
    let edited_json = doc["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["message"].as_str().unwrap().starts_with(&edited))
        .unwrap();
    assert_eq!(
        (&edited_json["path"], &edited_json["set"]),
        (&serde_json::json!(victim), &serde_json::json!("torch"))
    );
    let second = format!(
        "dst has 2 dist-infos of minitorch (minitorch-0.0.1.dist-info, {current_name}): pip sees only one of them; \
         the overlay removes every file their RECORDs list and brings src's minitorch in their place"
    );
    assert!(warnings.contains(&second), "{warnings:#?}");
    assert!(
        stderr.contains(&format!("warning: [torch] {second}\n")),
        "{stderr}"
    );
}
