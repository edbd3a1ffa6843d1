//! End-to-end tests of `overlay apply` (which keeps a backup by default)
//! and `overlay rollback`: real
//! venvs made by pip from the fixture wheels, real sshd test hosts (as root),
//! the local transport for the many crash points.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{Testbed, assert_same, ok, snapshot};

/// The fixture scenario's four sets (see tests/common).
const SETS: &str = common::SCENARIO_SETS;

/// Put a file of 9 MiB and 1,234 bytes (bigger than two of the target's
/// 4 MiB write chunks, with a tail that is not a whole block) into the
/// source's patched set, so that the apply writes it with `O_DIRECT` where
/// the filesystem allows. Returns its path as the plan names it (relative
/// to site-packages).
fn add_big_file(tb: &Testbed) -> String {
    let rel = "minisglang/srt/speculative/big_table.bin";
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let data: Vec<u8> = (0..(9 << 20) + 1234)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 56) as u8
        })
        .collect();
    fs::write(tb.host_venv_dir(0).join(common::SITE).join(rel), data).unwrap();
    rel.to_string()
}

/// Paths (relative to the venv) the plan adds or replaces.
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

/// Every path the plan carries is now as on the source (`src`, a snapshot):
/// byte for byte, or, for a `bin/` script between venvs at different paths,
/// with its shebang naming the target venv, and for a RECORD, with only
/// the rows of such scripts rewritten (tests/bytecode.rs checks their hashes).
fn assert_carried(
    tb: &Testbed,
    plan: &serde_json::Value,
    src: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
    what: &str,
) {
    let moved = tb.hosts[0].venv != tb.hosts[1].venv;
    for p in carried(plan) {
        let rel = site_rel(&p);
        if moved && rel.starts_with("bin/") {
            let text = fs::read_to_string(tb.host_venv_dir(1).join(&rel)).unwrap();
            assert!(
                text.starts_with(&format!("#!{}/bin/", tb.hosts[1].venv)),
                "{rel} {what}: {text}"
            );
            continue;
        }
        if moved && rel.ends_with(".dist-info/RECORD") {
            let rows = |i: usize| common::rows_but_scripts(&tb.host_venv_dir(i).join(&rel));
            assert_eq!(rows(1), rows(0), "{rel} {what}: rows other than scripts'");
            continue;
        }
        assert_eq!(after.get(&rel), src.get(&rel), "{rel} {what}");
    }
}

fn site_rel(p: &str) -> String {
    // RECORD-style path relative to site-packages -> relative to the venv.
    let mut parts: Vec<&str> = common::SITE.split('/').collect();
    for c in p.split('/') {
        if c == ".." {
            parts.pop();
        } else {
            parts.push(c);
        }
    }
    parts.join("/")
}

/// `overlay plan src dst`, which must succeed.
fn plan(tb: &Testbed) {
    ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
}

/// Plan, then `overlay apply ARGS...`; both must succeed.
fn plan_and_apply(tb: &Testbed, args: &[&str]) -> Output {
    plan(tb);
    let mut apply = vec!["apply"];
    apply.extend_from_slice(args);
    ok(tb.overlay(&apply).output().unwrap(), "apply")
}

/// `apply --json`'s `waits`: both ends timed the stream, and each end's
/// parts fit in its whole (a little slack for the clock reads between).
fn assert_waits_add_up(result: &serde_json::Value) {
    let w = &result["waits"];
    let f = |side: &str, k: &str| {
        w[side][k]
            .as_f64()
            .unwrap_or_else(|| panic!("waits.{side}.{k}: {result}"))
    };
    let slack = 0.05;
    assert!(f("source", "secs") > 0.0, "{result}");
    assert!(
        f("source", "sink_secs") + f("source", "starved_secs") <= f("source", "secs") + slack,
        "{result}"
    );
    assert!(f("target", "secs") > 0.0, "{result}");
    let reader =
        f("target", "input_secs") + f("target", "decode_secs") + f("target", "behind_secs");
    assert!(reader <= f("target", "secs") + slack, "{result}");
    assert!(
        f("target", "disk_secs") <= f("target", "secs") + slack,
        "{result}"
    );
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn round_trip_over_ssh_is_exact_and_reversible() {
    let tb = Testbed::new(2);
    tb.write_manifest(SETS);
    let big = add_big_file(&tb);
    let before = snapshot(tb.host_venv_dir(1));
    let src_snap = snapshot(tb.host_venv_dir(0));
    let plan = tb.plan_json();
    let carried = carried(&plan);
    assert!(carried.len() > 10, "{plan}");
    assert!(carried.contains(&big), "{big} not in {carried:?}");

    // No flag: the backup is the default.
    let out = ok(tb.overlay(&["apply", "--json"]).output().unwrap(), "apply");
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(result["generation"].is_string(), "{result}");
    assert!(result["sent_bytes"].as_u64().unwrap() > 0);
    assert_eq!(result["route"], "relay", "{result}");
    assert_waits_add_up(&result);
    assert_eq!(result["backup"], true, "{result}");
    // The backup holds the replaced and deleted files.
    assert!(result["backup_bytes"].as_u64().unwrap() > 0, "{result}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("Applying .overlay/plan.json: src -> dst (/root/venv), "),
        "{err}"
    );
    assert!(
        err.contains("Backup: ")
            && err.contains(
                " on dst; undo with `overlay rollback dst`, free older backups with `overlay prune dst --keep N`."
            ),
        "{err}"
    );

    // Every carried file is now identical to the source.
    let after = snapshot(tb.host_venv_dir(1));
    assert_carried(&tb, &plan, &src_snap, &after, "after apply");
    // Deleted paths are gone, and no old dist-info is left behind.
    assert!(
        !after
            .keys()
            .any(|k| k.contains("minitorch-2.9.1.dist-info")),
        "old dist-info left behind"
    );
    assert!(
        !after.keys().any(|k| k.contains("nvidia_cublas_cu12")),
        "cu12 dist-info left behind"
    );

    // pip sees only the new versions.
    let pip = ok(
        tb.ssh(
            1,
            "/root/venv/bin/python -m pip list --disable-pip-version-check",
        )
        .output()
        .unwrap(),
        "pip list",
    );
    let pip = String::from_utf8_lossy(&pip.stdout);
    assert!(pip.contains("minitorch") && pip.contains("2.11.0"), "{pip}");
    assert!(!pip.contains("2.9.1"), "old torch still listed:\n{pip}");

    // The same-size, same-mtime patched file runs its new code: no stale bytecode.
    let py = ok(
        tb.ssh(1, "/root/venv/bin/python -c 'import minisglang.srt.speculative.dflash_worker as w; print(w.DEFAULT_BLOCK_SIZE)'")
            .output()
            .unwrap(),
        "import patched module",
    );
    assert_eq!(String::from_utf8_lossy(&py.stdout).trim(), "32");
    let imp = ok(
        tb.ssh(
            1,
            "/root/venv/bin/python -c 'import minitorch._C as c; print(c.build_info())'",
        )
        .output()
        .unwrap(),
        "import minitorch._C",
    );
    assert!(
        String::from_utf8_lossy(&imp.stdout).contains("13"),
        "{}",
        String::from_utf8_lossy(&imp.stdout)
    );

    // History shows the generation; rollback restores the target byte for byte.
    let h = ok(tb.overlay(&["history", "dst"]).output().unwrap(), "history");
    assert!(String::from_utf8_lossy(&h.stdout).contains("complete"));
    // The source is not needed for a rollback.
    let mut tb = tb;
    tb.stop(0);
    let r = ok(
        tb.overlay(&["rollback", "dst", "--json"]).output().unwrap(),
        "rollback",
    );
    let report: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert!(report["verified"].as_u64().unwrap() > 0, "{report}");
    // Python ran in the target venv since the apply (pip list, imports) and
    // may have written bytecode for files that did not change; that is not
    // the apply's doing, so compare without bytecode of unchanged sources.
    let strip = |m: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        m.iter()
            .filter(|(k, _)| !k.contains("__pycache__"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    assert_same(
        &strip(&before),
        &strip(&snapshot(tb.host_venv_dir(1))),
        "after rollback",
    );
    let pyc_before: Vec<_> = before
        .iter()
        .filter(|(k, _)| k.contains("__pycache__"))
        .collect();
    let now = snapshot(tb.host_venv_dir(1));
    for (k, v) in pyc_before {
        assert_eq!(now.get(k), Some(v), "bytecode {k} not restored");
    }
}

#[test]
fn a_hardlinked_file_keeps_its_old_content() {
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    let version = tb.site_packages(1).join("minitorch/version.py");
    let old = fs::read(&version).unwrap();
    let link = tb.dir().join("uv-cache-copy-of-version.py");
    fs::hard_link(&version, &link).unwrap();
    plan_and_apply(&tb, &["--backup"]);
    assert_ne!(fs::read(&version).unwrap(), old, "version.py was replaced");
    assert_eq!(
        fs::read(&link).unwrap(),
        old,
        "the other hard link must keep the old content"
    );
    assert_eq!(
        fs::metadata(&link).unwrap().nlink(),
        2,
        "the backup holds the old inode"
    );
}

#[test]
fn with_no_backup_the_old_files_are_dropped_and_rollback_says_why() {
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    let out = plan_and_apply(&tb, &["--no-backup", "--json"]);
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["backup"], false, "{result}");
    assert_eq!(result["backup_bytes"], 0, "{result}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("No backup (--no-backup): `overlay rollback` cannot undo generation"),
        "{err}"
    );
    let gens = tb.host_venv_dir(1).join(".overlay/generations");
    for g in fs::read_dir(&gens).unwrap() {
        assert!(!g.unwrap().path().join("backup").exists(), "backup kept");
    }
    let out = tb.overlay(&["rollback", "dst"]).output().unwrap();
    assert_eq!(out.status.code(), Some(7));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("was applied with --no-backup") && err.contains("hint:"),
        "{err}"
    );
}

/// `--backup` is still accepted (the default); it conflicts with
/// `--no-backup`, and so does `--rollback-on-failure`, which no longer
/// needs `--backup`.
#[test]
fn backup_flags_conflict_only_with_no_backup() {
    // No hosts needed: run where there is no plan.
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_overlay"))
            .args(args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for args in [
        &["apply", "--backup", "--no-backup"][..],
        &["apply", "--verify", "--rollback-on-failure", "--no-backup"],
    ] {
        let (code, err) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains("cannot be used with"), "{args:?}: {err}");
    }
    // These parse: what stops them is the missing plan.
    for args in [
        &["apply", "--backup"][..],
        &["apply", "--verify", "--rollback-on-failure"],
    ] {
        let (code, err) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains("Failed to read the plan"), "{args:?}: {err}");
    }
}

#[test]
fn a_generation_from_the_sha256_era_is_refused_by_rollback_and_nothing_changes() {
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    plan_and_apply(&tb, &["--backup"]);
    // What an overlay before BLAKE3 wrote: no `digest` in meta.json.
    let gens = tb.host_venv_dir(1).join(".overlay/generations");
    let generation = std::fs::read_dir(&gens)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let meta_path = generation.join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    assert_eq!(meta["digest"], "blake3");
    meta.as_object_mut().unwrap().remove("digest");
    std::fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    let before = snapshot(tb.host_venv_dir(1));
    let out = tb.overlay(&["rollback", "dst"]).output().unwrap();
    assert_eq!(out.status.code(), Some(7));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sha256") && err.contains("hint:"), "{err}");
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(1)),
        "after the refused rollback",
    );
}

#[test]
fn a_drifted_target_is_refused_and_nothing_changes() {
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    plan(&tb);
    fs::write(
        tb.site_packages(1).join("minitorch/version.py"),
        "changed by hand\n",
    )
    .unwrap();
    let before = snapshot(tb.host_venv_dir(1));
    let out = tb.overlay(&["apply", "--backup"]).output().unwrap();
    assert_eq!(out.status.code(), Some(6));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("drifted")
            && err.contains("minitorch/version.py")
            && err.contains("overlay plan"),
        "{err}"
    );
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(1)),
        "after a refused apply",
    );
}

#[test]
fn a_source_file_changed_since_the_plan_aborts_with_nothing_applied() {
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    plan(&tb);
    // Same size, different content: only the hash while streaming can tell.
    let f = tb.site_packages(0).join("minitorch/version.py");
    let mut content = fs::read(&f).unwrap();
    let last = content.len() - 2;
    content[last] ^= 0x01;
    fs::write(&f, content).unwrap();
    let before = snapshot(tb.host_venv_dir(1));
    let out = tb.overlay(&["apply", "--backup"]).output().unwrap();
    assert_eq!(out.status.code(), Some(6));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("changed since the plan") && err.contains("version.py"),
        "{err}"
    );
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(1)),
        "after an aborted apply",
    );
    let gens = tb.host_venv_dir(1).join(".overlay/generations");
    assert_eq!(
        fs::read_dir(gens).unwrap().count(),
        0,
        "the aborted generation is cleaned up"
    );
}

/// Count the journal records of a complete apply.
/// After an interrupted apply: `overlay rollback dst` (which first recovers
/// the unfinished generation, or finds nothing to do) leaves the target
/// exactly as `before`.
fn rollback_restores(tb: &Testbed, before: &BTreeMap<String, String>, what: &str) {
    let r = tb.overlay(&["rollback", "dst"]).output().unwrap();
    let msg = String::from_utf8_lossy(&r.stderr).into_owned();
    assert!(
        r.status.success() || msg.contains("Nothing to roll back"),
        "{what}: rollback failed: {msg}"
    );
    assert_same(before, &snapshot(tb.host_venv_dir(1)), what);
}

fn journal_len(venv: &Path) -> usize {
    let gens = venv.join(".overlay/generations");
    let g = fs::read_dir(&gens).unwrap().next().unwrap().unwrap().path();
    fs::read_to_string(g.join("journal"))
        .unwrap()
        .lines()
        .count()
}

#[test]
fn the_agent_stopping_after_any_journal_step_rolls_back_exactly() {
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    let before = snapshot(tb.host_venv_dir(1));
    plan(&tb);
    // A clean run tells how many journal steps there are.
    ok(
        tb.overlay(&["apply", "--backup"]).output().unwrap(),
        "apply",
    );
    let steps = journal_len(tb.host_venv_dir(1));
    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
    ok(
        tb.overlay(&["prune", "dst", "--keep", "0"])
            .output()
            .unwrap(),
        "prune",
    );
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(1)),
        "after the clean round trip",
    );
    assert!(steps >= 20, "only {steps} journal steps");

    // Every one of the first steps (prepare, staging, the first moves), then
    // an even spread over the rest of the switch, and the last steps.
    let mut ns: Vec<usize> = (1..=8).collect();
    ns.extend((9..steps.saturating_sub(4)).step_by(((steps - 12) / 12).max(1)));
    ns.extend(steps.saturating_sub(3)..=steps);
    ns.dedup();
    eprintln!("{steps} journal steps; stopping after each of {ns:?}");
    let mut points = 0;
    for n in ns {
        let out = tb
            .overlay(&["apply", "--backup"])
            .env("OVERLAY_TEST_STOP_AFTER", n.to_string())
            .output()
            .unwrap();
        assert!(!out.status.success(), "stop after {n}: apply should fail");
        // The next command finds the unfinished journal and rolls it back.
        rollback_restores(&tb, &before, &format!("stop after journal step {n}"));
        points += 1;
    }
    assert!(points >= 20);
}

#[test]
fn an_interrupted_switch_can_be_resumed() {
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    plan(&tb);
    let src = snapshot(tb.host_venv_dir(0));
    let plan = tb.plan_json();
    // Step 2 is "staged", so stopping at 6 is in the middle of the switch.
    let out = tb
        .overlay(&["apply", "--backup"])
        .env("OVERLAY_TEST_STOP_AFTER", "6")
        .output()
        .unwrap();
    assert!(!out.status.success());
    ok(
        tb.overlay(&["apply", "--resume"]).output().unwrap(),
        "apply --resume",
    );
    let after = snapshot(tb.host_venv_dir(1));
    assert_carried(&tb, &plan, &src, &after, "after resume");
    let h = ok(
        tb.overlay(&["history", "dst", "--json"]).output().unwrap(),
        "history",
    );
    let gens: serde_json::Value = serde_json::from_slice(&h.stdout).unwrap();
    assert_eq!(gens[0]["status"], "complete", "{gens}");
}

#[test]
fn killing_the_controller_at_random_moments_never_loses_a_file() {
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    let before = snapshot(tb.host_venv_dir(1));
    plan(&tb);
    // Deterministic "random" delays spread over the apply's lifetime.
    let mut seed: u64 = 0x9e3779b97f4a7c15;
    for round in 0..8 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = Duration::from_millis(seed % 400);
        let mut child = tb
            .overlay(&["apply", "--backup"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        // The orphaned agent may still hold the lock for a moment; rollback waits for it.
        rollback_restores(
            &tb,
            &before,
            &format!("round {round}, killed after {delay:?}"),
        );
    }
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn cutting_the_ssh_connection_mid_apply_rolls_back_exactly() {
    let tb = Testbed::new(2);
    tb.write_manifest(SETS);
    let before = snapshot(tb.host_venv_dir(1));
    plan(&tb);
    let listener: i32 = fs::read_to_string(tb.host_dir(1).join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for (round, delay_ms) in [150u64, 300, 600].into_iter().enumerate() {
        let mut child = tb
            .overlay(&["apply", "--backup"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        // Kill the target's sshd session processes (children of its listener): the connection drops.
        let _ = Command::new("pkill")
            .args(["-9", "-P", &listener.to_string()])
            .status();
        let _ = child.wait();
        std::thread::sleep(Duration::from_millis(200));
        rollback_restores(
            &tb,
            &before,
            &format!("round {round}: connection cut after {delay_ms} ms"),
        );
    }
}

#[test]
#[cfg_attr(not(overlay_test_root), ignore = "needs root: a tmpfs mount")]
fn a_full_disk_names_the_host_and_the_bytes_and_changes_nothing() {
    let tb = Testbed::local(2);
    tb.write_manifest(SETS);
    plan(&tb);
    // Move the target venv onto a tmpfs with almost no room left.
    let venv = tb.host_venv_dir(1).to_path_buf();
    let copy = tb.dir().join("venv-copy");
    ok(
        Command::new("cp")
            .arg("-a")
            .arg(&venv)
            .arg(&copy)
            .output()
            .unwrap(),
        "cp",
    );
    let used: u64 = walkdir::WalkDir::new(&copy)
        .into_iter()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len().div_ceil(4096) * 4096 + 4096)
        .sum();
    fs::remove_dir_all(&venv).unwrap();
    fs::create_dir(&venv).unwrap();
    // Room for the generation's small metadata, and for half the new files.
    let need: u64 = {
        let plan: serde_json::Value =
            serde_json::from_slice(&fs::read(tb.work.join(".overlay/plan.json")).unwrap()).unwrap();
        plan["sets"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["changes"].as_array().unwrap().iter())
            .filter(|c| c["action"] != "delete")
            .map(|c| c["size"].as_u64().unwrap())
            .sum()
    };
    assert!(
        need > 32 * 1024,
        "the fixture's new files ({need} bytes) are too small for this test"
    );
    let size = used + 4 * need;
    ok(
        Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "overlay-enospc",
            ])
            .arg(&venv)
            .output()
            .unwrap(),
        "mount tmpfs",
    );
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(venv.clone());
    ok(
        Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", copy.display()))
            .arg(&venv)
            .output()
            .unwrap(),
        "fill tmpfs",
    );
    // The venv's files are new copies now (new inodes): plan again.
    ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan on tmpfs",
    );
    // Leave room for the generation's small metadata and half the new files.
    let df = ok(
        Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&venv)
            .output()
            .unwrap(),
        "df",
    );
    let avail: u64 = String::from_utf8_lossy(&df.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let ballast = avail.saturating_sub(96 * 1024 + need / 2);
    fs::write(venv.join("ballast"), vec![0u8; ballast as usize]).unwrap();
    let before = snapshot(&venv);

    // The free-space check refuses before streaming.
    let out = tb.overlay(&["apply", "--backup"]).output().unwrap();
    assert_eq!(out.status.code(), Some(8));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Not enough space")
            && err.contains("needed")
            && err.contains("free")
            && err.contains("dst"),
        "{err}"
    );
    assert_same(&before, &snapshot(&venv), "after the space check refused");

    // And if the disk fills up anyway while streaming, the same promise holds.
    let out = tb
        .overlay(&["apply", "--backup"])
        .env("OVERLAY_TEST_SKIP_SPACE_CHECK", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(9));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("No space left") && err.contains("bytes") && err.contains("dst"),
        "{err}"
    );
    assert_same(&before, &snapshot(&venv), "after ENOSPC while staging");
    let gens = venv.join(".overlay/generations");
    assert_eq!(
        fs::read_dir(gens).unwrap().count(),
        0,
        "staging is cleaned up"
    );
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn the_direct_route_streams_source_to_target_and_refuses_an_unknown_host_key() {
    let tb = Testbed::new(2);
    // The source knows the target as "dst-direct", through its own ssh config.
    let manifest = tb.write_manifest(SETS);
    let text = fs::read_to_string(&manifest).unwrap();
    let text = text.replacen(
        "[hosts.dst]\n",
        "[hosts.dst]\ndirect_ssh = \"dst-direct\"\n",
        1,
    );
    assert!(text.contains("direct_ssh"), "{text}");
    fs::write(&manifest, text).unwrap();
    let big = add_big_file(&tb);
    let before = snapshot(tb.host_venv_dir(1));
    let src_snap = snapshot(tb.host_venv_dir(0));
    let plan = tb.plan_json();
    assert!(carried(&plan).contains(&big), "{big} not carried: {plan}");

    // Unknown host key on the source: refused before anything changes.
    common::let_host_reach(&tb, 0, 1, "dst-direct", false);
    let out = tb
        .overlay(&["apply", "--direct", "--backup"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("could not reach the target as \"dst-direct\""),
        "{err}"
    );
    assert!(err.contains("hint:"), "{err}");
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(1)),
        "after a refused direct apply",
    );

    // Trusted: the stream goes source -> target, exactly as the relay would.
    common::let_host_reach(&tb, 0, 1, "dst-direct", true);
    let out = ok(
        tb.overlay(&["apply", "--direct", "--backup", "--json", "-vv"])
            .output()
            .unwrap(),
        "apply --direct",
    );
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(result["generation"].is_string(), "{result}");
    assert!(result["sent_bytes"].as_u64().unwrap() > 0, "{result}");
    assert_eq!(result["route"], "direct", "{result}");
    assert_waits_add_up(&result);
    let status = String::from_utf8_lossy(&out.stderr);
    assert!(status.contains("stream waits: source "), "{status}");
    assert!(status.contains("; target "), "{status}");
    assert!(
        status.contains("directly from src to \"dst-direct\""),
        "{status}"
    );
    let after = snapshot(tb.host_venv_dir(1));
    assert_carried(&tb, &plan, &src_snap, &after, "after apply --direct");
    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
    assert_same(
        &before,
        &snapshot(tb.host_venv_dir(1)),
        "after rolling back the direct apply",
    );
}

/// As root, a new file takes the target's owners (the directory it lands
/// in, then the file it replaces), never the source's uid/gid, unless
/// `--same-owner`; a setuid bit on the source never arrives.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn owners_come_from_the_target_unless_same_owner_and_no_setuid_arrives() {
    use std::os::unix::fs::PermissionsExt;
    let tb = Testbed::new(2);
    tb.write_manifest(SETS);
    let rel = site_rel(&add_big_file(&tb));
    let src = tb.host_venv_dir(0).join(&rel);
    let dst = tb.host_venv_dir(1).join(&rel);
    std::os::unix::fs::chown(&src, Some(4242), Some(4243)).unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o4755)).unwrap();
    plan_and_apply(&tb, &[]);
    let m = fs::metadata(&dst).unwrap();
    let parent = fs::metadata(dst.parent().unwrap()).unwrap();
    assert_eq!((m.uid(), m.gid()), (parent.uid(), parent.gid()));
    assert_ne!(m.uid(), 4242);
    assert_eq!(m.mode() & 0o7777, 0o755, "no setuid bit");
    // The file it replaces decides next time; with --same-owner, the source.
    std::os::unix::fs::chown(&dst, Some(5151), Some(5152)).unwrap();
    fs::OpenOptions::new()
        .append(true)
        .open(&src)
        .unwrap()
        .write_all(b"x")
        .unwrap();
    fs::set_permissions(&src, fs::Permissions::from_mode(0o4755)).unwrap();
    plan_and_apply(&tb, &[]);
    let m = fs::metadata(&dst).unwrap();
    assert_eq!(
        (m.uid(), m.gid()),
        (5151, 5152),
        "the replaced file's owner"
    );
    fs::OpenOptions::new()
        .append(true)
        .open(&src)
        .unwrap()
        .write_all(b"y")
        .unwrap();
    plan_and_apply(&tb, &["--same-owner"]);
    let m = fs::metadata(&dst).unwrap();
    assert_eq!((m.uid(), m.gid()), (4242, 4243), "--same-owner");
    assert_eq!(m.mode() & 0o7777, 0o755);
}

/// `plan -o FILE` names the file in the command it prints; a plan records
/// its manifest, so an explicit `--manifest` (or OVERLAY_MANIFEST) that
/// differs, or the same file edited since, is refused with nothing applied;
/// without `--manifest`, `--verify` runs the recorded manifest's check and
/// says so; `history` shows the versions each generation changed.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn plans_are_named_and_never_mixed_up_and_history_shows_versions() {
    let tb = Testbed::new(3);
    let manifest = tb.write_manifest(&format!("{SETS}{}", common::VERIFY));
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();
    let out = ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    assert!(
        stderr(&out)
            .contains("Plan saved to .overlay/plan.json; run `overlay apply` to carry it out."),
        "{}",
        stderr(&out)
    );
    let out = ok(
        tb.overlay(&["plan", "src", "dst2", "-o", "c-plan.json"])
            .output()
            .unwrap(),
        "plan -o",
    );
    assert!(
        stderr(&out).contains(
            "Plan saved to c-plan.json; run `overlay apply c-plan.json` to carry it out."
        ),
        "{}",
        stderr(&out)
    );
    let saved: serde_json::Value =
        serde_json::from_slice(&fs::read(tb.work.join("c-plan.json")).unwrap()).unwrap();
    assert_eq!(
        saved["manifest"],
        fs::canonicalize(&manifest).unwrap().to_str().unwrap()
    );
    assert_eq!(saved["manifest_sha256"].as_str().unwrap().len(), 64);

    // Another manifest, by flag or by environment: refused, nothing changes.
    let (dst, dst2) = (snapshot(tb.host_venv_dir(1)), snapshot(tb.host_venv_dir(2)));
    let other = tb.work.join("other.toml");
    fs::write(
        &other,
        fs::read_to_string(&manifest)
            .unwrap()
            .replace("nvidia-*", "nvidia-cu*"),
    )
    .unwrap();
    let refused = |out: Output, what: &str| {
        assert_eq!(out.status.code(), Some(2), "{what}: {}", stderr(&out));
        assert_same(&dst, &snapshot(tb.host_venv_dir(1)), what);
        assert_same(&dst2, &snapshot(tb.host_venv_dir(2)), what);
        stderr(&out)
    };
    let err = refused(
        tb.overlay(&["apply", "-m", "other.toml", "c-plan.json", "--verify"])
            .output()
            .unwrap(),
        "apply -m other.toml",
    );
    assert!(
        err.contains("error: The plan c-plan.json was made from ")
            && err.contains("nothing was applied to dst2")
            && err.contains("hint: re-run `overlay plan -m other.toml src dst2`"),
        "{err}"
    );
    refused(
        tb.overlay(&["apply", "c-plan.json"])
            .env("OVERLAY_MANIFEST", &other)
            .output()
            .unwrap(),
        "OVERLAY_MANIFEST=other.toml",
    );
    // The same file, edited since the plan.
    let text = fs::read_to_string(&manifest).unwrap();
    fs::write(&manifest, format!("{text}\n# edited\n")).unwrap();
    let err = refused(
        tb.overlay(&["apply", "-m", "overlay.toml", "c-plan.json"])
            .output()
            .unwrap(),
        "apply -m edited overlay.toml",
    );
    assert!(
        err.contains("has changed since the plan c-plan.json"),
        "{err}"
    );
    fs::write(&manifest, text).unwrap();

    // Without -m, from a folder with no manifest: the named plan's target
    // only, and its manifest's check.
    let elsewhere = tb.work.join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    let plan_file = tb.work.join("c-plan.json");
    let out = ok(
        tb.overlay(&["apply", plan_file.to_str().unwrap(), "--verify"])
            .current_dir(&elsewhere)
            .output()
            .unwrap(),
        "apply c-plan.json --verify",
    );
    let err = stderr(&out);
    assert!(
        err.starts_with(&format!(
            "Applying {}: src -> dst2 (/root/venv), ",
            plan_file.display()
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "The check is the [verify] of {}, the manifest the plan was made from",
            fs::canonicalize(&manifest).unwrap().display()
        )),
        "{err}"
    );
    assert_same(
        &dst,
        &snapshot(tb.host_venv_dir(1)),
        "dst after applying dst2's plan",
    );

    // History: the versions the generation changed.
    let out = ok(
        tb.overlay(&["history", "dst2"]).output().unwrap(),
        "history",
    );
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[2].starts_with("    minitorch 2.9.1+cu128 -> 2.11.0+cu130, ")
            && lines[2].ends_with(" more"),
        "{table}"
    );
    let out = ok(
        tb.overlay(&["history", "dst2", "-v"]).output().unwrap(),
        "history -v",
    );
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in [
        "    minitorch 2.9.1+cu128 -> 2.11.0+cu130",
        "    minitorchvision 0.24.1+cu128 -> 0.26.0+cu130",
        "    nvidia-cublas (absent) -> 13.1.0.3",
        "    nvidia-cublas-cu12 12.8.4.1 -> (removed)",
    ] {
        assert!(table.lines().any(|l| l == line), "{line:?} not in\n{table}");
    }
    let out = ok(
        tb.overlay(&["history", "dst2", "--json"]).output().unwrap(),
        "history --json",
    );
    let gens: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let versions = gens[0]["versions"].as_array().unwrap();
    assert!(
        versions.contains(&serde_json::json!({
            "name": "nvidia-cublas-cu12", "from": "12.8.4.1", "to": null
        })),
        "{gens}"
    );
}
