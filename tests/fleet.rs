//! Many targets from one controller, end to end on real sshd test hosts:
//! `overlay plan SRC T1 T2 ...` (and a `[groups.NAME]`) gives every target
//! exactly the plan `overlay plan SRC T` gives it alone, from one scan of
//! the source, and shows identical targets together.

mod common;

use std::fs;

use common::needs::{apply_parts_first, nothing_left_to_plan};
use common::{Testbed, ok, snapshot};
use serde_json::{Value, json};

/// A source and four targets: dst and dst2 identical, dst3 with the torch
/// set already overlaid, dst4 with an extra nvidia dist the source lacks.
/// The manifest names them all as the group `fleet`, and ends with `more`.
fn four_targets(more: &str) -> Testbed {
    let tb = Testbed::new(5);
    tb.write_manifest(&format!(
        "{}\n[groups.fleet]\nhosts = [\"dst\", \"dst2\", \"dst3\", \"dst4\"]\n{more}",
        common::SCENARIO_SETS
    ));
    ok(
        tb.overlay(&[
            "plan",
            "src",
            "dst3",
            "--set",
            "torch",
            "-o",
            "dst3-torch.json",
        ])
        .output()
        .unwrap(),
        "plan dst3's torch",
    );
    ok(
        tb.overlay(&["apply", "dst3-torch.json"]).output().unwrap(),
        "apply dst3's torch",
    );
    let site = tb.site_packages(4);
    let info = site.join("nvidia_extra_cu13-1.0.dist-info");
    fs::create_dir_all(site.join("nvidia/extra")).unwrap();
    fs::create_dir_all(&info).unwrap();
    fs::write(site.join("nvidia/extra/lib.py"), "x = 1\n").unwrap();
    fs::write(
        info.join("METADATA"),
        "Metadata-Version: 2.1\nName: nvidia-extra-cu13\nVersion: 1.0\n",
    )
    .unwrap();
    fs::write(
        info.join("RECORD"),
        "nvidia/extra/lib.py,,\nnvidia_extra_cu13-1.0.dist-info/METADATA,,\nnvidia_extra_cu13-1.0.dist-info/RECORD,,\n",
    )
    .unwrap();
    tb
}

const TARGETS: [&str; 4] = ["dst", "dst2", "dst3", "dst4"];

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).expect("--json prints JSON")
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn each_target_s_plan_in_a_plan_of_many_is_its_own_single_plan() {
    let tb = four_targets("");
    let before: Vec<_> = (0..5).map(|i| snapshot(tb.host_venv_dir(i))).collect();

    let t = std::time::Instant::now();
    let many = json_of(&ok(
        tb.overlay(&["plan", "src", "fleet", "--json"])
            .output()
            .unwrap(),
        "plan src fleet",
    ));
    let many_took = t.elapsed();
    assert_eq!(many["source"], "src");
    assert_eq!(
        many["groups"],
        json!([["dst", "dst2"], ["dst3"], ["dst4"]]),
        "identical targets are grouped, the others apart"
    );
    // The fleet file lists each target's own plan file.
    let fleet: Value =
        serde_json::from_slice(&fs::read(tb.work.join(".overlay/plan.json")).unwrap()).unwrap();
    assert_eq!(fleet["source"], "src");
    for (i, name) in TARGETS.iter().enumerate() {
        assert_eq!(fleet["targets"][i]["name"], *name);
        assert_eq!(fleet["targets"][i]["plan"], format!("plan.d/{name}.json"));
    }
    let saved: Vec<Value> = TARGETS
        .iter()
        .map(|name| {
            let path = tb.work.join(format!(".overlay/plan.d/{name}.json"));
            serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
        })
        .collect();

    let mut alone_took = std::time::Duration::ZERO;
    for (i, name) in TARGETS.iter().enumerate() {
        let t = std::time::Instant::now();
        let one = json_of(&ok(
            tb.overlay(&["plan", "src", name, "--json", "-o", &format!("{name}.json")])
                .output()
                .unwrap(),
            "plan src TARGET",
        ));
        alone_took += t.elapsed();
        let mine = &many["targets"][i];
        assert_eq!(mine["target"], *name);
        assert_eq!(mine["sets"], one["sets"], "{name}: changes differ");
        assert_eq!(mine["problems"], one["problems"], "{name}: problems differ");
        assert_eq!(mine["warnings"], one["warnings"], "{name}: warnings differ");
        // The saved plan is the single plan, down to the changes' kinds.
        let alone: Value =
            serde_json::from_slice(&fs::read(tb.work.join(format!("{name}.json"))).unwrap())
                .unwrap();
        assert_eq!(saved[i]["target"], alone["target"], "{name}");
        assert_eq!(saved[i]["source"], alone["source"], "{name}");
        let paths = |p: &Value| -> Vec<(Value, Value, Value)> {
            p["sets"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|s| s["changes"].as_array().unwrap().iter())
                .map(|c| (c["path"].clone(), c["action"].clone(), c["size"].clone()))
                .collect()
        };
        assert_eq!(paths(&saved[i]), paths(&alone), "{name}: saved changes");
    }
    // For the record (no threshold): one plan of four against four plans,
    // both warm (the first plan of four uploaded the agents, filled the
    // hash caches).
    let t = std::time::Instant::now();
    ok(
        tb.overlay(&["plan", "src", "fleet", "-o", "warm.json"])
            .output()
            .unwrap(),
        "plan src fleet, warm",
    );
    eprintln!(
        "plan of 4 targets: {many_took:?} cold, {:?} warm; 4 plans of one, warm: {alone_took:?}",
        t.elapsed()
    );
    assert!(
        many["targets"][3]["sets"]
            .to_string()
            .contains("nvidia/extra/lib.py"),
        "dst4's extra dist is in its plan"
    );

    // Planning changed no venv.
    for (i, b) in before.iter().enumerate() {
        common::assert_same(b, &snapshot(tb.host_venv_dir(i)), "a venv after plan");
    }

    // The text groups identical targets.
    let out = ok(
        tb.overlay(&["plan", "src", "dst", "dst2", "dst3", "dst4"])
            .output()
            .unwrap(),
        "plan src dst dst2 dst3 dst4",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "--- the plans:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("\ndst, dst2: same plan, "), "{text}");
    assert!(text.contains("4 targets, 3 distinct plans"), "{text}");
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_bad_group_or_the_source_among_the_targets_is_refused() {
    let tb = Testbed::new(2);
    let manifest = tb.write_manifest(common::SCENARIO_SETS);
    let text = fs::read_to_string(&manifest).unwrap();
    fs::write(
        &manifest,
        format!("{text}[groups.g]\nhosts = [\"dst\", \"ct999\"]\n"),
    )
    .unwrap();
    let out = tb.overlay(&["plan", "src", "g"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("overlay.toml:") && err.contains("unknown host \"ct999\""),
        "{err}"
    );

    fs::write(
        &manifest,
        format!("{text}[groups.g]\nhosts = [\"dst\", \"src\"]\n"),
    )
    .unwrap();
    let out = tb.overlay(&["plan", "src", "g"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("The source src is also among the targets"),
        "{err}"
    );
    assert!(!tb.work.join(".overlay/plan.json").exists());
}

/// A `[verify]` check that fails on a host with a file /root/fail-verify.
const VERIFY_UNLESS_MARKED: &str = r#"
[verify]
python = '''
import os, sys
sys.exit(1 if os.path.exists("/root/fail-verify") else 0)
'''
"#;

/// `overlay apply ARGS --json` of the saved plan of many: the exit code and
/// each target's row by name.
fn roll_out(tb: &Testbed, args: &[&str]) -> (Option<i32>, Vec<Value>, String) {
    let mut all = vec!["apply", "--json"];
    all.extend_from_slice(args);
    let out = tb.overlay(&all).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("apply --json: {e}\n{stderr}"));
    let rows = doc["targets"].as_array().unwrap().clone();
    (out.status.code(), rows, stderr)
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_failing_canary_is_rolled_back_and_the_others_are_untouched() {
    let tb = four_targets(VERIFY_UNLESS_MARKED);
    ok(
        tb.overlay(&["plan", "src", "fleet"]).output().unwrap(),
        "plan src fleet",
    );
    fs::write(tb.host_dir(1).join("root/fail-verify"), "").unwrap();
    let before: Vec<_> = (0..5).map(|i| snapshot(tb.host_venv_dir(i))).collect();
    let (code, rows, stderr) =
        roll_out(&tb, &["--canary", "1", "--verify", "--rollback-on-failure"]);
    assert_eq!(code, Some(11), "{stderr}");
    assert_eq!(rows[0]["target"], "dst");
    assert_eq!(rows[0]["result"], "verify-failed", "{stderr}");
    assert_eq!(rows[0]["rolled_back"], true);
    assert_eq!(rows[0]["canary"], true);
    assert!(rows[0]["changes"].as_u64().unwrap() > 0);
    for r in &rows[1..] {
        assert_eq!(r["result"], "skipped", "{r}");
        assert_eq!(r["generation"], Value::Null);
    }
    assert!(
        stderr.contains("4 of 4 targets did not succeed") && stderr.contains("dst ("),
        "{stderr}"
    );
    for (i, b) in before.iter().enumerate() {
        common::assert_same(
            b,
            &snapshot(tb.host_venv_dir(i)),
            "a venv after the rollout",
        );
    }

    // Without the mark every target passes its check: exit 0, all applied
    // (planned again: the rollback put dst's files back as new files).
    fs::remove_file(tb.host_dir(1).join("root/fail-verify")).unwrap();
    ok(
        tb.overlay(&["plan", "src", "fleet"]).output().unwrap(),
        "plan src fleet again",
    );
    let (code, rows, stderr) = roll_out(
        &tb,
        &[
            "--canary",
            "1",
            "--parallel",
            "2",
            "--verify",
            "--rollback-on-failure",
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    for r in &rows {
        assert_eq!(r["result"], "applied", "{r}");
        assert!(r["generation"].is_string(), "{r}");
    }
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn max_fail_stops_the_rollout_and_the_failed_target_is_not_half_applied() {
    let tb = four_targets("");
    ok(
        tb.overlay(&["plan", "src", "fleet"]).output().unwrap(),
        "plan src fleet",
    );
    let before: Vec<_> = (0..5).map(|i| snapshot(tb.host_venv_dir(i))).collect();
    // dst3's agent exits abruptly in the middle of the stream, once it has
    // staged its first file.
    let ssh_dir = tb.host_dir(3).join("root/.ssh");
    fs::create_dir_all(&ssh_dir).unwrap();
    fs::write(
        ssh_dir.join("environment"),
        "OVERLAY_TEST_DIE_MID_STREAM=1\n",
    )
    .unwrap();
    let (code, rows, stderr) = roll_out(&tb, &["--parallel", "1", "--max-fail", "1"]);
    fs::remove_file(ssh_dir.join("environment")).unwrap();
    assert_eq!(code, Some(11), "{stderr}");
    let results: Vec<&str> = rows.iter().map(|r| r["result"].as_str().unwrap()).collect();
    assert_eq!(
        results,
        ["applied", "applied", "failed", "skipped"],
        "{stderr}"
    );
    assert!(
        rows[2]["error"]
            .as_str()
            .unwrap()
            .contains("still streaming"),
        "{stderr}"
    );
    assert!(rows[3]["error"].as_str().unwrap().contains("--max-fail 1"));
    // The next command on dst3 finds the unfinished generation and rolls it
    // back: dst3 is as before, and dst4 was never touched.
    ok(
        tb.overlay(&["history", "dst3"]).output().unwrap(),
        "history dst3",
    );
    common::assert_same(
        &before[3],
        &snapshot(tb.host_venv_dir(3)),
        "dst3 after its failure",
    );
    common::assert_same(
        &before[4],
        &snapshot(tb.host_venv_dir(4)),
        "dst4, not started",
    );
    common::assert_same(&before[0], &snapshot(tb.host_venv_dir(0)), "the source");
    // history, rollback and verify take several hosts, a group, or the
    // targets of the last plan of many.
    let out = ok(tb.overlay(&["history"]).output().unwrap(), "history");
    let text = String::from_utf8_lossy(&out.stdout);
    for name in TARGETS {
        assert!(text.contains(&format!("== {name} ==")), "{text}");
    }
    let out = ok(
        tb.overlay(&["history", "fleet", "--json"])
            .output()
            .unwrap(),
        "history fleet --json",
    );
    let docs: Vec<Value> = serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(docs.len(), 4, "one document per host");
    assert_eq!(docs[0].as_array().unwrap().len(), 1, "dst: one generation");
    assert_eq!(docs[3], json!([]), "dst4: none");
    let again = json_of(&ok(
        tb.overlay(&["plan", "src", "dst", "dst2", "--json", "-o", "again.json"])
            .output()
            .unwrap(),
        "plan again",
    ));
    for t in again["targets"].as_array().unwrap() {
        for s in t["sets"].as_array().unwrap() {
            assert_eq!(s["changes"], json!([]), "{}", t["target"]);
        }
    }
    ok(
        tb.overlay(&["rollback", "dst", "dst2"]).output().unwrap(),
        "rollback dst dst2",
    );
    common::assert_same(
        &before[1],
        &snapshot(tb.host_venv_dir(1)),
        "dst rolled back",
    );
    common::assert_same(
        &before[2],
        &snapshot(tb.host_venv_dir(2)),
        "dst2 rolled back",
    );
    // dst4 has nothing to roll back: the others are still done, exit 11.
    let out = tb.overlay(&["rollback", "dst3", "dst4"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{err}");
    assert!(
        err.contains("1 of 2 hosts did not succeed: dst4 (exit 7)"),
        "{err}"
    );
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn one_read_of_the_source_feeds_every_target_and_one_dying_in_the_stream_stops_only_itself() {
    let tb = four_targets("");
    ok(
        tb.overlay(&["plan", "src", "fleet"]).output().unwrap(),
        "plan src fleet",
    );
    let before: Vec<_> = (0..5).map(|i| snapshot(tb.host_venv_dir(i))).collect();
    // dst3's agent exits abruptly once it has staged its first file of the
    // shared stream.
    let ssh_dir = tb.host_dir(3).join("root/.ssh");
    fs::create_dir_all(&ssh_dir).unwrap();
    fs::write(
        ssh_dir.join("environment"),
        "OVERLAY_TEST_DIE_MID_STREAM=1\n",
    )
    .unwrap();
    let out = tb.overlay(&["apply", "--json"]).output().unwrap();
    fs::remove_file(ssh_dir.join("environment")).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("--- apply:\n{stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("apply --json");
    assert_eq!(out.status.code(), Some(11), "{stderr}");
    let rows = doc["targets"].as_array().unwrap();
    let results: Vec<&str> = rows.iter().map(|r| r["result"].as_str().unwrap()).collect();
    assert_eq!(
        results,
        ["applied", "applied", "failed", "applied"],
        "{stderr}"
    );
    // One read of the source for all four: what the source read is one
    // target's worth (dst's plan, which holds every other's files), not
    // the sum of the four.
    let bytes: Vec<u64> = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    let read = doc["source_bytes_read"].as_u64().unwrap();
    assert!(bytes[0] > 0);
    assert_eq!(read, bytes[0], "the source read one target's worth: {doc}");
    assert_eq!(bytes[1], bytes[0], "dst2 is dst's twin");
    assert!(
        stderr.contains("in one stream with 3 other targets"),
        "{stderr}"
    );
    // dst3 is left as before: its next command rolls back the unfinished
    // generation.
    ok(
        tb.overlay(&["history", "dst3"]).output().unwrap(),
        "history dst3",
    );
    common::assert_same(
        &before[3],
        &snapshot(tb.host_venv_dir(3)),
        "dst3 after dying in the stream",
    );
    // The others each got exactly their own plan: planning again finds
    // nothing to change, as after an apply of each alone.
    nothing_left_to_plan(&tb, &["dst", "dst2", "dst4"]);
    common::assert_same(
        &snapshot(tb.host_venv_dir(1)),
        &snapshot(tb.host_venv_dir(2)),
        "the twins after the shared stream",
    );
    // And each rolls back exactly.
    ok(
        tb.overlay(&["rollback", "dst", "dst2", "dst4"])
            .output()
            .unwrap(),
        "rollback dst dst2 dst4",
    );
    for i in [1, 2, 4] {
        common::assert_same(&before[i], &snapshot(tb.host_venv_dir(i)), "rolled back");
    }
    common::assert_same(&before[0], &snapshot(tb.host_venv_dir(0)), "the source");
}

/// The bytes of the tar stream that carry a target's changes, as its plan
/// file lists them (`sets[].changes`): each file or symlink
/// sent is a 512-byte header and its data padded to 512; and the count.
fn own_stream_bytes(target: &Value) -> (u64, u64) {
    let (mut bytes, mut files) = (0u64, 0u64);
    for set in target["sets"].as_array().unwrap() {
        for c in set["changes"].as_array().unwrap() {
            if !matches!(c["action"].as_str(), Some("add" | "replace")) {
                continue;
            }
            let src = &c["source"];
            let size = match src["kind"].as_str() {
                Some("symlink") => src["target"].as_str().unwrap().len() as u64,
                _ => src["size"].as_u64().unwrap(),
            };
            bytes += 512 + size.div_ceil(512) * 512;
            files += 1;
        }
    }
    (bytes, files)
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn targets_that_need_different_files_each_receive_only_their_own_bytes() {
    let tb = Testbed::new(4);
    tb.write_manifest(common::SCENARIO_SETS);
    // dst has torch already; dst2 the nvidia wheels and the patches; dst3
    // nothing: three different needs, one stream of the source.
    apply_parts_first(
        &tb,
        &[
            ("dst", &["torch"]),
            ("dst2", &["nvidia-cu13", "sglang-patches"]),
        ],
    );
    ok(
        tb.overlay(&["plan", "src", "dst", "dst2", "dst3", "-o", "many.json"])
            .output()
            .unwrap(),
        "plan src dst dst2 dst3",
    );
    // Each target's own plan file, beside the plan of many.
    let work = tb.manifest_path().parent().unwrap().to_path_buf();
    let many: Value =
        serde_json::from_str(&fs::read_to_string(work.join("many.json")).unwrap()).unwrap();
    let own: Vec<(u64, u64)> = many["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let file = work.join(t["plan"].as_str().unwrap());
            own_stream_bytes(&serde_json::from_str(&fs::read_to_string(file).unwrap()).unwrap())
        })
        .collect();
    // Stored, not compressed: the bytes each target receives are its tar
    // stream's, plus 5 bytes a frame (length and packing tag).
    let out = tb
        .overlay(&["apply", "many.json", "--compress", "none", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("--- apply:\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("in one stream with 2 other targets"),
        "{stderr}"
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("apply --json");
    let rows = doc["targets"].as_array().unwrap();
    let received: Vec<u64> = rows
        .iter()
        .map(|r| r["sent_bytes"].as_u64().unwrap())
        .collect();
    eprintln!("own (tar bytes, files): {own:?}; received: {received:?}");
    for (k, ((bytes, files), got)) in own.iter().zip(&received).enumerate() {
        // The end-of-archive blocks (1024 bytes, one segment of their own);
        // a frame per MiB and per segment at most, of 7 segments at most.
        let frames = bytes.div_ceil(1 << 20) + 8;
        let (low, high) = (bytes + 1024, bytes + 1024 + 5 * frames);
        assert!(
            (low..=high).contains(got),
            "{}: received {got} bytes; its own {files} files are {bytes} bytes of stream, so between {low} and {high}",
            TARGETS[k]
        );
    }
    // dst3 needs everything the others need: the others got less.
    assert!(received[0] < received[2] && received[1] < received[2]);
    let read = doc["source_bytes_read"].as_u64().unwrap();
    assert_eq!(
        read,
        rows[2]["bytes"].as_u64().unwrap(),
        "one read of the source: dst3's files, which hold the others'"
    );
    // Each got exactly its own plan: planning again finds nothing to do.
    nothing_left_to_plan(&tb, &["dst", "dst2", "dst3"]);
    for i in 1..4 {
        common::assert_same(
            &snapshot(tb.host_venv_dir(3)),
            &snapshot(tb.host_venv_dir(i)),
            "every target ends as dst3",
        );
    }
}
