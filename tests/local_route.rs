//! The local route: both hosts on this machine (no `ssh` for either), so
//! the target's agent copies the files from the source venv itself with the
//! kernel's copy, checked against the plan (src/stream/local/). Plan,
//! apply and rollback are exact; a symlink in the source that points out
//! of the venv is copied as a symlink, never followed; a source file
//! changed after the plan is refused and the target is unchanged.

mod common;

use std::fs;

use common::{Testbed, assert_same, ok, snapshot};

const SETS: &str = common::SCENARIO_SETS;

/// Paths (relative to site-packages) the plan adds or replaces.
fn carried(plan: &serde_json::Value) -> Vec<String> {
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

#[test]
fn the_local_route_copies_checks_and_rolls_back() {
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    let speculative = tb
        .host_venv_dir(0)
        .join(common::SITE)
        .join("minisglang/srt/speculative");
    // A file bigger than one copy step's 16 MiB, not a multiple of a page.
    let big: Vec<u8> = (0..(17u32 << 20) + 1234)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    fs::write(speculative.join("big_table.bin"), &big).unwrap();
    // A symlink out of the venv, to a file only its target may read.
    let secret = tb.dir().join("secret");
    fs::write(&secret, "not for the venv\n").unwrap();
    std::os::unix::fs::symlink(&secret, speculative.join("outside")).unwrap();
    let before = snapshot(tb.host_venv_dir(1));
    let src_before = snapshot(tb.host_venv_dir(0));
    let plan = tb.plan_json();
    let carried = carried(&plan);
    assert!(
        carried.iter().any(|p| p.ends_with("speculative/outside")),
        "{carried:?}"
    );

    let out = ok(
        tb.overlay(&["apply", "--json", "-vv"]).output().unwrap(),
        "apply",
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["route"], "local", "{result}");
    assert_eq!(result["sent_bytes"], 0, "{result}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("files copied on this machine from src"),
        "{err}"
    );
    assert!(err.contains("by copy_file_range"), "{err}");

    // Every carried file is as on the source (scripts under bin/ name the
    // target's venv instead); the symlink is a symlink, pointing out.
    let after = snapshot(tb.host_venv_dir(1));
    let site = |p: &str| format!("{}/{p}", common::SITE);
    for p in &carried {
        let rel = site(p);
        if p.starts_with("../../../bin/") {
            let text = fs::read_to_string(tb.host_venv_dir(1).join(&rel)).unwrap_or_default();
            if text.starts_with("#!") {
                assert!(
                    text.starts_with(&format!("#!{}/bin/", tb.hosts[1].venv)),
                    "{rel}"
                );
                continue;
            }
        }
        let rel = std::path::Path::new(&rel)
            .components()
            .fold(std::path::PathBuf::new(), |mut acc, c| {
                match c {
                    std::path::Component::ParentDir => {
                        acc.pop();
                    }
                    c => acc.push(c),
                }
                acc
            })
            .to_string_lossy()
            .into_owned();
        if rel.ends_with(".dist-info/RECORD") {
            // The rows of the scripts whose shebang was rewritten describe
            // the target's scripts (tests/bytecode.rs checks them); the rest
            // are the source's.
            let rows = |i: usize| common::rows_but_scripts(&tb.host_venv_dir(i).join(&rel));
            assert_eq!(rows(1), rows(0), "{rel}: rows other than scripts'");
            continue;
        }
        assert_eq!(after.get(&rel), src_before.get(&rel), "{rel}");
    }
    let link = tb
        .site_packages(1)
        .join("minisglang/srt/speculative/outside");
    assert_eq!(fs::read_link(&link).unwrap(), secret);
    assert_eq!(fs::read(&secret).unwrap(), b"not for the venv\n");
    assert!(
        fs::read(
            tb.site_packages(1)
                .join("minisglang/srt/speculative/big_table.bin")
        )
        .unwrap()
            == big
    );
    assert_same(&src_before, &snapshot(tb.host_venv_dir(0)), "the source");

    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
    assert_same(&before, &snapshot(tb.host_venv_dir(1)), "after rollback");

    // A source file changed after the plan: refused, the target unchanged.
    tb.plan_json();
    let patched = tb
        .site_packages(0)
        .join("minisglang/srt/speculative/dflash_worker.py");
    let mut text = fs::read(&patched).unwrap();
    text.extend_from_slice(b"# edited after the plan\n");
    fs::write(&patched, text).unwrap();
    let out = tb.overlay(&["apply"]).output().unwrap();
    assert_eq!(out.status.code(), Some(6), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("dflash_worker.py changed since the plan") && err.contains("overlay plan"),
        "{err}"
    );
    assert_same(&before, &snapshot(tb.host_venv_dir(1)), "after the refusal");
    let gens = tb.host_venv_dir(1).join(".overlay/generations");
    let staged = fs::read_dir(&gens)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().join("staging").exists())
                .count()
        })
        .unwrap_or(0);
    assert_eq!(staged, 0, "a staging folder was left behind");
}
