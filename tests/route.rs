//! The default route (issue 16): a manifest that says `route = "direct"`
//! has the source stream straight to the target with its own ssh; `--relay`
//! sends through this machine; a source that cannot reach the target falls
//! back to the relay with a warning (nothing is staged twice), while an
//! explicit `--direct` fails as before; a bad `route` is a manifest error
//! naming its line. Real sshd test hosts (root).

mod common;

use std::fs;
use std::process::Output;

use common::{Testbed, assert_same, ok, snapshot};

/// `apply ARGS --json` that must succeed: its document and stderr.
fn apply_json(tb: &Testbed, args: &[&str], what: &str) -> (serde_json::Value, String) {
    let mut all = vec!["apply", "--json"];
    all.extend_from_slice(args);
    let out = ok(tb.overlay(&all).output().unwrap(), what);
    let doc = serde_json::from_slice(&out.stdout).unwrap();
    (doc, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Roll the target back, and plan again (the restored files are new
/// inodes: the old plan would see drift).
fn rollback(tb: &Testbed, what: &str) {
    ok(tb.overlay(&["rollback", "dst"]).output().unwrap(), what);
    ok(
        tb.overlay(&["plan", "src", "dst", "-q"]).output().unwrap(),
        what,
    );
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn the_manifest_route_goes_direct_and_falls_back_to_the_relay() {
    let tb = Testbed::new(2);
    let manifest = tb.write_manifest(common::SCENARIO_SETS);
    let text = fs::read_to_string(&manifest).unwrap();
    let text = format!("[apply]\nroute = \"direct\"\n\n{text}").replacen(
        "[hosts.dst]\n",
        "[hosts.dst]\ndirect_ssh = \"dst-direct\"\n",
        1,
    );
    fs::write(&manifest, &text).unwrap();
    common::let_host_reach(&tb, 0, 1, "dst-direct", true);
    let before = snapshot(tb.host_venv_dir(1));

    // The plan records the route and says it.
    let out = ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    let said = stderr(&out);
    assert!(
        said.contains("Route: src sends the files straight to dst"),
        "{said}"
    );
    let plan: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(manifest.with_file_name(".overlay/plan.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(plan["target"]["route"], "direct", "{}", plan["target"]);

    // The manifest's route: direct.
    let (doc, _) = apply_json(&tb, &[], "apply by the manifest's route");
    assert_eq!(doc["route"], "direct", "{doc}");
    assert_eq!(
        doc["fell_back_from_direct"],
        serde_json::Value::Null,
        "{doc}"
    );
    let after = snapshot(tb.host_venv_dir(1));
    assert_ne!(before, after, "the apply changed the target");
    rollback(&tb, "rollback after the direct apply");

    // --relay: through this machine.
    let (doc, said) = apply_json(&tb, &["--relay"], "apply --relay");
    assert_eq!(doc["route"], "relay", "{doc}");
    assert_eq!(
        doc["fell_back_from_direct"],
        serde_json::Value::Null,
        "{doc}"
    );
    assert!(!said.contains("warning"), "{said}");
    assert_same(
        &after,
        &snapshot(tb.host_venv_dir(1)),
        "after apply --relay",
    );
    rollback(&tb, "rollback after the relay apply");

    // The source no longer trusts the target's host key: the relay takes
    // over, with a warning that names both hosts, ssh's reason and the way out.
    common::let_host_reach(&tb, 0, 1, "dst-direct", false);
    let (doc, said) = apply_json(&tb, &["-v"], "apply that falls back");
    assert_eq!(doc["route"], "relay", "{doc}");
    let why = doc["fell_back_from_direct"].as_str().unwrap_or_default();
    assert!(why.contains("Host key verification failed"), "{doc}");
    assert!(
        said.contains("warning: src could not reach dst directly")
            && said.contains("Host key verification failed")
            && said.contains("--relay")
            && said.contains("route = \"direct\"")
            && said.contains("~/.ssh"),
        "{said}"
    );
    assert!(
        said.contains("through this machine (src could not reach dst directly)"),
        "{said}"
    );
    assert_same(&after, &snapshot(tb.host_venv_dir(1)), "after the fallback");
    rollback(&tb, "rollback after the fallback");
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(1)),
        "after the rollbacks",
    );

    // An explicit --direct never falls back: the error, nothing changed.
    let out = tb.overlay(&["apply", "--direct"]).output().unwrap();
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert!(
        said.contains("could not reach the target as \"dst-direct\""),
        "{said}"
    );
    assert!(!said.contains("warning"), "{said}");
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(1)),
        "after a refused --direct",
    );

    // Both flags: a usage error.
    let out = tb
        .overlay(&["apply", "--direct", "--relay"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // A route that is not one: the manifest's line, nothing planned.
    fs::write(
        &manifest,
        text.replacen("route = \"direct\"", "route = \"fast\"", 1),
    )
    .unwrap();
    let out = tb.overlay(&["plan", "src", "dst"]).output().unwrap();
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("overlay.toml:2:9: [apply]: route must be \"relay\"")
            && said.contains("not \"fast\""),
        "{said}"
    );
}
