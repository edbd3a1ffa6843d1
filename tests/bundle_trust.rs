//! Signed bundles end to end (docs/pack.md, "Signing and trust"): `overlay
//! pack --sign` from a real sshd source, `overlay apply --bundle --trust`
//! run on the target host itself over plain ssh, refusing an unsigned
//! bundle, an unknown signer, a signature for another namespace and a
//! bundle changed after it was signed (exit 5, the venv unchanged, nothing
//! left beside it), and `overlay history` naming the bundle's BLAKE3 and
//! signer; from the controller, `plan --bundle` with the manifest's
//! `[apply] trust`.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Testbed, assert_same, ok, snapshot};

const SETS: &str = common::SCENARIO_SETS;

/// A key pair made by ssh-keygen.
fn keygen(dir: &Path, name: &str) -> PathBuf {
    let key = dir.join(name);
    ok(
        Command::new("ssh-keygen")
            .args(["-q", "-N", "", "-t", "ed25519", "-C", name, "-f"])
            .arg(&key)
            .output()
            .unwrap(),
        "ssh-keygen",
    );
    key
}

fn fingerprint(key: &Path) -> String {
    let out = ok(
        Command::new("ssh-keygen")
            .arg("-lf")
            .arg(key.with_extension("pub"))
            .output()
            .unwrap(),
        "ssh-keygen -l",
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string()
}

/// `overlay ARGS` on host `i` over plain ssh, the binary and every file of
/// the work dir named in ARGS (with its `.sig`, if it has one) copied to
/// the host's /root first, as an operator would carry them.
fn on_host(tb: &Testbed, i: usize, args: &str) -> Output {
    let root = tb.host_dir(i).join("root");
    let there = root.join("overlay");
    if !there.exists() {
        fs::copy(env!("CARGO_BIN_EXE_overlay"), &there).unwrap();
    }
    let args: Vec<String> = args
        .split(' ')
        .map(|a| {
            let p = Path::new(a);
            if a.starts_with(&*tb.work.to_string_lossy()) && p.is_file() {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                fs::copy(p, root.join(&name)).unwrap();
                let sig = PathBuf::from(format!("{a}.sig"));
                let sig_there = root.join(format!("{name}.sig"));
                if sig.exists() {
                    fs::copy(&sig, &sig_there).unwrap();
                } else {
                    let _ = fs::remove_file(&sig_there);
                }
                format!("/root/{name}")
            } else {
                a.to_string()
            }
        })
        .collect();
    tb.ssh(i, &format!("/root/overlay {}", args.join(" ")))
        .output()
        .unwrap()
}

fn leftovers(tb: &Testbed, i: usize) -> Vec<String> {
    fs::read_dir(tb.host_dir(i).join("root"))
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.starts_with(".overlay-bundle.").then_some(n)
        })
        .collect()
}

/// `overlay pack src -o FILE` (`--sign KEY`).
fn pack(tb: &Testbed, file: &str, key: Option<&Path>) -> PathBuf {
    let mut args = vec!["pack", "src", "-o", file];
    let k;
    if let Some(key) = key {
        k = key.to_string_lossy().into_owned();
        args.extend(["--sign", &k]);
    }
    let out = ok(tb.overlay(&args).output().unwrap(), "pack");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.contains("Signed with ssh-ed25519 SHA256:"),
        key.is_some(),
        "{err}"
    );
    assert_eq!(tb.work.join(format!("{file}.sig")).exists(), key.is_some());
    tb.work.join(file)
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_signed_bundle_is_checked_before_it_is_read_and_history_names_its_signer() {
    let tb = Testbed::new(2);
    tb.write_manifest(SETS);
    let ops = keygen(&tb.work, "ops");
    let eve = keygen(&tb.work, "eve");
    let line = format!(
        "ops@example namespaces=\"overlay-bundle\" {}",
        fs::read_to_string(ops.with_extension("pub"))
            .unwrap()
            .trim()
    );
    let signers = tb.work.join("allowed_signers");
    fs::write(&signers, format!("# who may sign bundles\n{line}\n")).unwrap();

    // Signing adds a file beside the bundle and leaves its bytes alone.
    let signed = pack(&tb, "stack.ovl", Some(&ops));
    let plain = pack(&tb, "plain.ovl", None);
    assert!(fs::read(&signed).unwrap() == fs::read(&plain).unwrap());
    // The same bundle signed by a key the file does not name.
    let by_eve = tb.work.join("eve.ovl");
    fs::copy(&signed, &by_eve).unwrap();
    ok(
        tb.overlay(&["sign", "eve.ovl", "--key", eve.to_str().unwrap()])
            .output()
            .unwrap(),
        "sign eve",
    );
    // Signed by ops, for another namespace (by ssh-keygen, over the message).
    let other_ns = tb.work.join("file-ns.ovl");
    fs::copy(&signed, &other_ns).unwrap();
    let msg = ok(
        tb.overlay(&["sign", "file-ns.ovl", "--print-message"])
            .output()
            .unwrap(),
        "--print-message",
    );
    fs::write(tb.work.join("file-ns.msg"), &msg.stdout).unwrap();
    ok(
        Command::new("ssh-keygen")
            .args(["-q", "-Y", "sign", "-n", "file", "-f"])
            .arg(&ops)
            .arg(tb.work.join("file-ns.msg"))
            .output()
            .unwrap(),
        "ssh-keygen -Y sign -n file",
    );
    fs::rename(
        tb.work.join("file-ns.msg.sig"),
        tb.work.join("file-ns.ovl.sig"),
    )
    .unwrap();
    // Changed after it was signed: other sets, packed and sealed by
    // overlay (a valid trailer), under the signature of the first.
    ok(
        tb.overlay(&["pack", "src", "--set", "torch", "-o", "changed.ovl"])
            .output()
            .unwrap(),
        "pack --set torch",
    );
    let changed = tb.work.join("changed.ovl");
    fs::copy(
        tb.work.join("stack.ovl.sig"),
        tb.work.join("changed.ovl.sig"),
    )
    .unwrap();

    let before = snapshot(tb.host_venv_dir(1));
    let trust = signers.display().to_string();
    for (bundle, says) in [
        (&plain, "is not signed".to_string()),
        (&by_eve, format!("{}, which", fingerprint(&eve))),
        (&other_ns, "namespace \"file\"".to_string()),
        (&changed, "does not sign this bundle".to_string()),
    ] {
        for cmd in ["plan", "apply"] {
            let out = on_host(
                &tb,
                1,
                &format!(
                    "{cmd} --bundle {} --venv /root/venv --trust {trust} --json",
                    bundle.display()
                ),
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(5), "{cmd} {bundle:?}: {err}");
            assert!(err.contains(&says), "{cmd} {bundle:?}: {says:?} in {err}");
            assert!(err.contains("hint: "), "{err}");
            if cmd == "apply" {
                let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                assert_eq!(line["exit"], 5, "{line}");
            }
            assert_same(
                &before,
                &snapshot(tb.host_venv_dir(1)),
                "a refused bundle changed the venv",
            );
            assert!(leftovers(&tb, 1).is_empty(), "{:?}", leftovers(&tb, 1));
        }
    }
    // The fingerprint of a signer the file does not trust is named.
    let out = on_host(
        &tb,
        1,
        &format!(
            "apply --bundle {} --venv /root/venv --trust {trust}",
            by_eve.display()
        ),
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains(&fingerprint(&eve)));
    // The explicit opt-out: planned, with a warning.
    let out = on_host(
        &tb,
        1,
        &format!(
            "plan --bundle {} --venv /root/venv --trust {trust} --insecure-unsigned --check",
            plain.display()
        ),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--insecure-unsigned") && err.contains("applied anyway"),
        "{err}"
    );

    // The signed bundle: checked, applied, and history says where from.
    let out = ok(
        on_host(
            &tb,
            1,
            &format!(
                "apply --bundle {} --venv /root/venv --trust {trust} --json",
                signed.display()
            ),
        ),
        "apply --bundle --trust",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("signed by ops@example"), "{err}");
    let blake3 = overlay::bundle::Bundle::open(&signed).unwrap().blake3;
    let out = ok(
        on_host(&tb, 1, "history --venv /root/venv -v"),
        "history -v",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("from bundle /root/stack.ovl (BLAKE3 {blake3})"))
            && text.contains(&format!(
                "signed by ops@example (ssh-ed25519 {})",
                fingerprint(&ops)
            )),
        "{text}"
    );
    let out = ok(
        tb.overlay(&["history", "dst", "--json"]).output().unwrap(),
        "history --json",
    );
    let gens: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &gens[0]["provenance"];
    assert_eq!(p["host"], "src", "{gens}");
    assert_eq!(p["bundle"]["blake3"], blake3.as_str(), "{gens}");
    assert_eq!(p["bundle"]["signer"]["fingerprint"], fingerprint(&ops));
    assert_eq!(p["bundle"]["signer"]["principals"], "ops@example");
    assert_eq!(p["bundle"]["signer"]["trusted_by"], "/root/allowed_signers");
    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
    assert_same(&before, &snapshot(tb.host_venv_dir(1)), "rollback");

    // From the controller: the manifest's [apply] trust decides.
    let manifest = fs::read_to_string(tb.manifest_path()).unwrap();
    fs::write(
        tb.manifest_path(),
        format!("[apply]\ntrust = \"allowed_signers\"\n{manifest}"),
    )
    .unwrap();
    let out = tb
        .overlay(&["plan", "--bundle", "eve.ovl", "dst"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(
        err.contains(&fingerprint(&eve)) && err.contains("[apply] trust"),
        "{err}"
    );
    assert!(!tb.work.join(".overlay/plan.json").exists());
    assert!(!tb.work.join(".overlay/bundles").exists());
    ok(
        tb.overlay(&["plan", "--bundle", "stack.ovl", "dst"])
            .output()
            .unwrap(),
        "plan --bundle with [apply] trust",
    );
    let plan: serde_json::Value =
        serde_json::from_slice(&fs::read(tb.work.join(".overlay/plan.json")).unwrap()).unwrap();
    assert_eq!(
        plan["provenance"]["bundle"]["signer"]["fingerprint"],
        fingerprint(&ops),
        "{plan}"
    );
    ok(tb.overlay(&["apply"]).output().unwrap(), "apply");
    let out = ok(
        tb.overlay(&["history", "dst", "-v"]).output().unwrap(),
        "history -v",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "from bundle stack.ovl (BLAKE3 {blake3}), signed by ops@example"
        )),
        "{text}"
    );
    // A live apply records its source host and venv.
    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
    ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    ok(tb.overlay(&["apply"]).output().unwrap(), "apply");
    let out = ok(
        tb.overlay(&["history", "dst", "-v"]).output().unwrap(),
        "history -v",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("from live source src:/root/venv"), "{text}");
}
