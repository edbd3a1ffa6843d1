//! `overlay rollback` over changes made after the apply (issue 15, point 3):
//! real sshd test hosts, venvs made by pip from the fixture wheels, and pip
//! run on the target between the apply and the rollback.
//!
//! One testbed, three applies in turn (each rolled back before the next):
//! 1. pip reinstalls a distribution the generation did not touch: the
//!    rollback goes ahead as before;
//! 2. pip downgrades minitorch (a distribution the generation replaced) back
//!    to 2.9.1: the rollback is refused with the list (snapshotted) and
//!    changes nothing; `--force` restores the venv from before the apply
//!    and keeps what pip wrote in the state folder;
//! 3. pip installs a third minitorch version (a tiny wheel made here):
//!    `--force` moves its dist-info and its own file out of site-packages,
//!    so one version stays, and names the files of 2.9.1 nothing could bring
//!    back (pip's uninstall of 2.11.0 removed files the apply had not changed).

mod common;

use std::collections::BTreeMap;
use std::process::Output;

use common::{SITE, Testbed, assert_same, ok, snapshot};

/// The venv without bytecode (Python and pip write it as they run).
fn venv(tb: &Testbed) -> BTreeMap<String, String> {
    snapshot(tb.host_venv_dir(1))
        .into_iter()
        .filter(|(k, _)| !k.contains("__pycache__"))
        .collect()
}

/// `pip ARGS` with the target's own interpreter, on the target.
fn pip(tb: &Testbed, args: &str) -> Output {
    ok(
        tb.ssh(
            1,
            &format!("/root/venv/bin/python -m pip --disable-pip-version-check {args}"),
        )
        .output()
        .unwrap(),
        &format!("pip {args}"),
    )
}

/// The fixture wheel of `dist` `version`, copied into the target's /root
/// (the test hosts have their own /root and /tmp, so a path of this
/// machine may not exist there): its path as the target sees it.
fn wheel(tb: &Testbed, dist: &str, version: &str) -> String {
    let prefix = format!("{dist}-{version}-");
    let found = common::file_starting_with(&common::wheels_dir(), &prefix)
        .unwrap_or_else(|| panic!("no wheel {prefix}*"));
    let name = found.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::copy(&found, tb.host_dir(1).join("root").join(&name)).unwrap();
    format!("/root/{name}")
}

/// The target's dist-info directories of minitorch.
fn minitorch_dist_infos(tb: &Testbed) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(tb.site_packages(1))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("minitorch-") && n.ends_with(".dist-info"))
        .collect();
    v.sort();
    v
}

/// What pip lists for minitorch, and what Python imports.
fn pip_and_import(tb: &Testbed) -> (String, String) {
    let list = pip(tb, "list --format=freeze");
    let listed: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter(|l| l.starts_with("minitorch=="))
        .map(str::to_string)
        .collect();
    let imported = ok(
        tb.python(1, "import minitorch.version as v; print(v.__version__)")
            .output()
            .unwrap(),
        "import",
    );
    (
        listed.join(" "),
        String::from_utf8_lossy(&imported.stdout).trim().to_string(),
    )
}

fn plan_and_apply(tb: &Testbed) {
    ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    ok(
        tb.overlay(&["apply", "--backup"]).output().unwrap(),
        "apply",
    );
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn rollback_over_later_pip_changes_is_refused_then_forced() {
    let tb = Testbed::new(2);
    tb.write_manifest(common::SCENARIO_SETS);
    let before = venv(&tb);
    assert_eq!(minitorch_dist_infos(&tb), ["minitorch-2.9.1.dist-info"]);

    // 1. pip changes a distribution the generation did not touch: no reason to refuse.
    plan_and_apply(&tb);
    pip(
        &tb,
        &format!(
            "install --no-index --no-deps --force-reinstall {}",
            wheel(&tb, "minitriton", "3.5.0")
        ),
    );
    let r = ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback after an unrelated pip run",
    );
    assert!(!text(&r.stderr).contains("warning"), "{}", text(&r.stderr));
    // (pip rewrote minitriton's RECORD and direct_url.json: a wheel path of its own.)
    let no_triton = |m: BTreeMap<String, String>| -> BTreeMap<String, String> {
        m.into_iter()
            .filter(|(k, _)| !k.contains("minitriton-3.5.0.dist-info/"))
            .collect()
    };
    assert_same(
        &no_triton(before.clone()),
        &no_triton(venv(&tb)),
        "after the first rollback",
    );
    let before = venv(&tb);

    // 2. pip puts back another version of a distribution the generation replaced.
    plan_and_apply(&tb);
    assert_eq!(minitorch_dist_infos(&tb), ["minitorch-2.11.0.dist-info"]);
    pip(
        &tb,
        &format!(
            "install --no-index --no-deps {}",
            wheel(&tb, "minitorch", "2.9.1")
        ),
    );
    let after_pip = venv(&tb);
    let r = tb.overlay(&["rollback", "dst", "--json"]).output().unwrap();
    assert_eq!(r.status.code(), Some(7), "{}", text(&r.stderr));
    let report: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(report["refused"], true, "{report}");
    assert_eq!(
        report["later"]["dist_infos_added"],
        serde_json::json!(["minitorch-2.9.1.dist-info"])
    );
    assert_eq!(
        report["later"]["dist_infos_removed"],
        serde_json::json!(["minitorch-2.11.0.dist-info"])
    );
    let files = report["later"]["changed_files"].as_array().unwrap();
    assert!(
        files
            .iter()
            .any(|f| f["path"] == "minitorch/version.py" && f["change"] == "modified"),
        "{report}"
    );
    assert!(
        files.iter().all(|f| {
            let p = f["path"].as_str().unwrap();
            p.starts_with("minitorch") || p.starts_with("../../../bin/minitorch")
        }),
        "only the generation's distributions: {report}"
    );
    assert_same(&after_pip, &venv(&tb), "after the refused rollback");
    let h = ok(tb.overlay(&["history", "dst"]).output().unwrap(), "history");
    // The newest generation's line (version lines are indented below it).
    let newest = text(&h.stdout)
        .lines()
        .rfind(|l| !l.starts_with(' '))
        .unwrap()
        .to_string();
    assert!(newest.contains("complete"), "{newest}");
    // The refusal as the user sees it (without --json; -v lists every file).
    let r = tb.overlay(&["rollback", "dst"]).output().unwrap();
    assert_eq!(r.status.code(), Some(7));
    let gen_id = regex::Regex::new(r"\b\d{8}T\d{6}Z-[0-9a-f]{4}\b").unwrap();
    insta::assert_snapshot!("refused", gen_id.replace_all(&text(&r.stderr), "[GEN]"));
    let all = tb.overlay(&["rollback", "dst", "-v"]).output().unwrap();
    assert!(
        !text(&all.stderr).contains("more (-v lists all)"),
        "{}",
        text(&all.stderr)
    );
    // Forced: the venv from before the apply; what pip wrote is kept.
    let r = ok(
        tb.overlay(&["rollback", "dst", "--force", "--json"])
            .output()
            .unwrap(),
        "rollback --force",
    );
    let report: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    assert_eq!(report["refused"], false, "{report}");
    let stderr = text(&r.stderr);
    assert!(
        stderr.contains("Rolling back over changes made since the apply")
            && stderr.contains("kept in /root/venv/.overlay/generations/"),
        "{stderr}"
    );
    assert!(!stderr.contains("not consistent"), "{stderr}");
    // bin/minitorchrun is minitorch's, but the apply did not change it (the
    // same script once its shebang is rewritten); pip wrote its own.
    let no_script = |mut m: BTreeMap<String, String>| {
        m.remove("bin/minitorchrun");
        m
    };
    assert_same(
        &no_script(before.clone()),
        &no_script(venv(&tb)),
        "after the forced rollback",
    );
    assert_eq!(minitorch_dist_infos(&tb), ["minitorch-2.9.1.dist-info"]);
    let (listed, imported) = pip_and_import(&tb);
    assert_eq!(listed, "minitorch==2.9.1");
    assert_eq!(imported, "2.9.1+cu128");

    // 3. pip installs a third version: --force keeps one.
    plan_and_apply(&tb);
    let tiny = "/tmp/minitorch-2.10.0-py3-none-any.whl";
    let build = format!(
        r#"
import base64, hashlib, zipfile
files = {{
    "minitorch/version.py": b"__version__ = '2.10.0'\n",
    "minitorch/_only_in_210.py": b"",
    "minitorch-2.10.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: minitorch\nVersion: 2.10.0\n",
    "minitorch-2.10.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}}
def h(d):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
rec = "".join(f"{{p}},{{h(d)}},{{len(d)}}\n" for p, d in files.items()) + "minitorch-2.10.0.dist-info/RECORD,,\n"
with zipfile.ZipFile("{tiny}", "w") as z:
    for p, d in files.items():
        z.writestr(p, d)
    z.writestr("minitorch-2.10.0.dist-info/RECORD", rec)
"#
    );
    ok(tb.python(1, &build).output().unwrap(), "build a tiny wheel");
    pip(&tb, &format!("install --no-index --no-deps {tiny}"));
    assert_eq!(minitorch_dist_infos(&tb), ["minitorch-2.10.0.dist-info"]);
    let r = tb.overlay(&["rollback", "dst"]).output().unwrap();
    assert_eq!(r.status.code(), Some(7), "{}", text(&r.stderr));
    let r = ok(
        tb.overlay(&["rollback", "dst", "--force", "--json"])
            .output()
            .unwrap(),
        "rollback --force over a third version",
    );
    let report: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let stderr = text(&r.stderr);
    assert_eq!(
        report["displaced"],
        serde_json::json!(["minitorch-2.10.0.dist-info"]),
        "{report}"
    );
    let displaced = report["displaced_to"].as_str().unwrap();
    assert!(
        stderr.contains(&format!(
            "minitorch-2.10.0.dist-info added since the apply: moved out, with the files only its RECORD lists, to {displaced}"
        )),
        "{stderr}"
    );
    // Kept, not deleted: in the target's state folder.
    let kept = tb
        .host_venv_dir(1)
        .join(displaced.strip_prefix("/root/venv/").unwrap())
        .join(SITE);
    assert!(kept.join("minitorch/_only_in_210.py").is_file());
    assert!(kept.join("minitorch-2.10.0.dist-info/METADATA").is_file());
    assert!(
        !tb.site_packages(1)
            .join("minitorch/_only_in_210.py")
            .exists()
    );
    // One version of minitorch, and what could not be made whole is named:
    // pip's uninstall of 2.11.0 removed files the apply had not changed.
    assert_eq!(minitorch_dist_infos(&tb), ["minitorch-2.9.1.dist-info"]);
    assert!(
        stderr.contains("warning: not consistent after the rollback: minitorch-2.9.1.dist-info:")
            && stderr.contains("minitorch/__init__.py")
            && stderr.contains("overlay doctor dst"),
        "{stderr}"
    );
    let listed = pip(&tb, "list --format=freeze");
    let listed: Vec<String> = text(&listed.stdout)
        .lines()
        .filter(|l| l.starts_with("minitorch=="))
        .map(str::to_string)
        .collect();
    assert_eq!(listed, ["minitorch==2.9.1"]);
}
