//! A stream over several SSH connections (issue 45): `apply --connections
//! N` on the relay and on `--direct` leaves the target exactly as one
//! connection does, in one generation that `rollback` undoes byte for
//! byte; each connection's figures at `-vv`; a bad count is a usage error;
//! a shared stream to several targets (a plan of many) goes over several
//! connections too, and a target dying in it drops out alone.
//! Real sshd test hosts (root).

mod common;

use std::fs;

use common::needs::{apply_parts_first, nothing_left_to_plan};
use common::{Testbed, assert_same, ok, snapshot};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Roll the target back, check it is as before, and plan again.
fn roll_back(tb: &Testbed, before: &std::collections::BTreeMap<String, String>, what: &str) {
    ok(tb.overlay(&["rollback", "dst"]).output().unwrap(), what);
    assert_same(before, &snapshot(tb.host_venv_dir(1)), what);
    ok(
        tb.overlay(&["plan", "src", "dst", "-q"]).output().unwrap(),
        what,
    );
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn several_connections_stage_one_generation_on_both_routes() {
    let tb = Testbed::new(2);
    let manifest = tb.write_manifest(common::SCENARIO_SETS);
    let text = fs::read_to_string(&manifest).unwrap().replacen(
        "[hosts.dst]\n",
        "[hosts.dst]\ndirect_ssh = \"dst-direct\"\n",
        1,
    );
    fs::write(&manifest, &text).unwrap();
    common::let_host_reach(&tb, 0, 1, "dst-direct", true);
    let before = snapshot(tb.host_venv_dir(1));
    ok(
        tb.overlay(&["plan", "src", "dst", "-q"]).output().unwrap(),
        "plan",
    );

    // One connection: what the target must look like.
    ok(
        tb.overlay(&["apply", "--connections", "1"])
            .output()
            .unwrap(),
        "apply over one connection",
    );
    let one = snapshot(tb.host_venv_dir(1));
    assert_ne!(before, one, "the apply changed the target");
    roll_back(&tb, &before, "rollback after one connection");

    for (n, route) in ["--relay", "--direct"].into_iter().enumerate() {
        let out = ok(
            tb.overlay(&["apply", route, "--connections", "3", "-vv"])
                .output()
                .unwrap(),
            &format!("apply {route} over 3 connections"),
        );
        let said = stderr(&out);
        assert!(
            said.contains("the stream takes up to 3 connections (--connections)")
                && said.contains("connection 1: ")
                && said.contains("the stream took "),
            "{route}: {said}"
        );
        assert_same(
            &one,
            &snapshot(tb.host_venv_dir(1)),
            &format!("after {route} over 3 connections"),
        );
        // One generation: history shows one apply more, and one rollback
        // undoes it all.
        let out = ok(
            tb.overlay(&["history", "dst", "--json"]).output().unwrap(),
            "history",
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let gens = doc.as_array().cloned().unwrap_or_default();
        assert_eq!(gens.len(), n + 2, "{doc}");
        let complete: Vec<_> = gens.iter().filter(|g| g["status"] == "complete").collect();
        assert_eq!(complete.len(), 1, "{doc}");
        assert_eq!(complete[0]["adds"], gens[0]["adds"], "{doc}");
        roll_back(&tb, &before, &format!("rollback after {route}"));
    }

    // Not a count: a usage error that names the flag; nothing changed.
    for bad in ["0", "33", "many"] {
        let out = tb
            .overlay(&["apply", "--connections", bad])
            .output()
            .unwrap();
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{said}");
        assert!(said.contains("--connections"), "{said}");
    }
    assert_same(&before, &snapshot(tb.host_venv_dir(1)), "after bad counts");
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_shared_stream_to_several_targets_goes_over_several_connections() {
    let tb = Testbed::new(4);
    tb.write_manifest(common::SCENARIO_SETS);
    // dst has torch already, dst2 the nvidia wheels and the patches, dst3
    // nothing: three different needs, one stream of the source.
    apply_parts_first(
        &tb,
        &[
            ("dst", &["torch"]),
            ("dst2", &["nvidia-cu13", "sglang-patches"]),
        ],
    );
    let before: Vec<_> = (0..4).map(|i| snapshot(tb.host_venv_dir(i))).collect();
    ok(
        tb.overlay(&["plan", "src", "dst", "dst2", "dst3", "-o", "many.json"])
            .output()
            .unwrap(),
        "plan src dst dst2 dst3",
    );
    let out = tb
        .overlay(&["apply", "many.json", "--connections", "3", "-vv", "--json"])
        .output()
        .unwrap();
    let said = stderr(&out);
    eprintln!("--- apply:\n{said}");
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains("in one stream with 2 other targets")
            && said.contains("the stream takes up to 3 connections (--connections)")
            && said.contains("the stream took 3 connections")
            && said.contains("connection 3: "),
        "{said}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = doc["targets"].as_array().unwrap();
    // One read of the source: dst3's files, which hold the others'.
    assert_eq!(
        doc["source_bytes_read"].as_u64(),
        rows[2]["bytes"].as_u64(),
        "{doc}"
    );
    let received: Vec<u64> = rows
        .iter()
        .map(|r| r["sent_bytes"].as_u64().unwrap())
        .collect();
    assert!(
        received[0] < received[2] && received[1] < received[2],
        "each target receives only its own files' bytes: {received:?}"
    );
    nothing_left_to_plan(&tb, &["dst", "dst2", "dst3"]);
    let after = snapshot(tb.host_venv_dir(3));
    for i in 1..3 {
        assert_same(
            &after,
            &snapshot(tb.host_venv_dir(i)),
            "every target ends as dst3",
        );
    }
    ok(
        tb.overlay(&["rollback", "dst", "dst2", "dst3"])
            .output()
            .unwrap(),
        "rollback of the three",
    );
    for (i, b) in before.iter().enumerate().skip(1) {
        assert_same(b, &snapshot(tb.host_venv_dir(i)), "rolled back");
    }

    // dst2's receiving agents exit abruptly once one has staged a file:
    // dst2 drops out, the others go on over their connections.
    let ssh_dir = tb.host_dir(2).join("root/.ssh");
    fs::create_dir_all(&ssh_dir).unwrap();
    fs::write(
        ssh_dir.join("environment"),
        "OVERLAY_TEST_DIE_MID_STREAM=1\n",
    )
    .unwrap();
    ok(
        tb.overlay(&["plan", "src", "dst", "dst2", "dst3", "-o", "many.json"])
            .output()
            .unwrap(),
        "plan again",
    );
    let out = tb
        .overlay(&["apply", "many.json", "--connections", "3", "--json"])
        .output()
        .unwrap();
    fs::remove_file(ssh_dir.join("environment")).unwrap();
    let said = stderr(&out);
    eprintln!("--- apply with dst2 dying:\n{said}");
    assert_eq!(out.status.code(), Some(11), "{said}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results: Vec<&str> = doc["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["result"].as_str().unwrap())
        .collect();
    assert_eq!(results, ["applied", "failed", "applied"], "{said}");
    ok(
        tb.overlay(&["history", "dst2"]).output().unwrap(),
        "history dst2",
    );
    assert_same(
        &before[2],
        &snapshot(tb.host_venv_dir(2)),
        "dst2 after dying",
    );
    nothing_left_to_plan(&tb, &["dst", "dst3"]);
    assert_same(&before[0], &snapshot(tb.host_venv_dir(0)), "the source");
}
