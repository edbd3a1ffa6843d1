//! A stream over several SSH connections (issue 45): `apply --connections
//! N` on the relay and on `--direct` leaves the target exactly as one
//! connection does, in one generation that `rollback` undoes byte for
//! byte; each connection's figures at `-vv`; a bad count is a usage error.
//! Real sshd test hosts (root).

mod common;

use std::fs;

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
