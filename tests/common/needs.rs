//! Plans of several targets whose needs differ (tests/fleet.rs,
//! tests/connections.rs): give targets parts of the scenario first, and
//! check afterwards that each got exactly its own plan.

use super::{Testbed, ok};

/// Apply `sets` of the scenario to each `target` first (its own plan of
/// those sets), so that the targets need different files from src.
pub fn apply_parts_first(tb: &Testbed, parts: &[(&str, &[&str])]) {
    for (target, sets) in parts {
        let mut args = vec!["plan", "src", target, "-o", "pre.json"];
        for s in *sets {
            args.extend(["--set", s]);
        }
        ok(tb.overlay(&args).output().unwrap(), "plan a part");
        ok(
            tb.overlay(&["apply", "pre.json"]).output().unwrap(),
            "apply a part",
        );
    }
}

/// Each of `targets` got exactly its own plan: planning them again from
/// src finds nothing to change, as after an apply of each alone.
pub fn nothing_left_to_plan(tb: &Testbed, targets: &[&str]) {
    let mut args = vec!["plan", "src"];
    args.extend(targets);
    args.extend(["--json", "-o", "again.json"]);
    let out = ok(tb.overlay(&args).output().unwrap(), "plan again");
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json prints JSON");
    for t in again["targets"].as_array().unwrap() {
        for s in t["sets"].as_array().unwrap() {
            assert_eq!(s["changes"], serde_json::json!([]), "{}", t["target"]);
        }
    }
}
