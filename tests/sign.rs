//! Signed bundles against the real OpenSSH tools (docs/pack.md, "Signing
//! and trust"): keys made by `ssh-keygen` at test time, signatures made by
//! `overlay sign` (from a key file and from a real `ssh-agent`) checked by
//! `ssh-keygen -Y verify`, and signatures made by `ssh-keygen -Y sign`
//! checked by overlay; every refusal (unsigned, unknown signer, another
//! namespace, a bundle changed after it was signed) is of kind `HostKey`
//! (exit 5) and names the key's fingerprint. No root, no hosts: the
//! bundles are written by `overlay::bundle::write` from a small folder.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use overlay::bundle::Bundle;
use overlay::bundle::sign::{Checked, Trust};
use overlay::error::ErrorKind;

fn overlay(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_overlay"));
    c.args(args)
        .env_remove("SSH_AUTH_SOCK")
        .env_remove("OVERLAY_TRUST");
    c
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what}: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A key pair made by ssh-keygen: `ed25519` or `rsa`.
fn keygen(dir: &Path, name: &str, kind: &str) -> PathBuf {
    let key = dir.join(name);
    let mut c = Command::new("ssh-keygen");
    c.args(["-q", "-N", "", "-C", &format!("{name}@test"), "-t", kind]);
    if kind == "rsa" {
        c.args(["-b", "2048"]);
    }
    ok(c.arg("-f").arg(&key).output().unwrap(), "ssh-keygen");
    key
}

fn pubkey(key: &Path) -> String {
    fs::read_to_string(key.with_extension("pub"))
        .unwrap()
        .trim()
        .to_string()
}

/// An allowed_signers file at `dir/name` with `lines`.
fn allowed(dir: &Path, name: &str, lines: &[String]) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

/// A small valid bundle at `dir/name`.
fn bundle(dir: &Path, name: &str, text: &[u8]) -> PathBuf {
    use overlay::model::{BUNDLE_FORMAT, BundleEntry, BundleIndex, BundleKind};
    let stage = dir.join(format!("stage-{name}"));
    let site = "lib/python3.11/site-packages";
    fs::create_dir_all(stage.join(site)).unwrap();
    fs::write(stage.join(site).join("x.py"), text).unwrap();
    let mut entries: Vec<BundleEntry> = ["lib", "lib/python3.11", site]
        .iter()
        .map(|p| BundleEntry {
            path: p.to_string(),
            kind: BundleKind::Dir { mode: 0o755 },
            owner: None,
        })
        .collect();
    entries.push(BundleEntry {
        path: format!("{site}/x.py"),
        kind: BundleKind::File {
            size: text.len() as u64,
            mode: 0o644,
            blake3: blake3::hash(text).to_hex().to_string(),
        },
        owner: None,
    });
    let mut index = BundleIndex {
        format: BUNDLE_FORMAT,
        python: "3.11".into(),
        site_packages: site.into(),
        source_host: "src".into(),
        source_venv: "/root/venv".into(),
        manifest: "[sets.x]\nfiles = [\"x.py\"]\n".into(),
        sets: vec!["x".into()],
        dists: Vec::new(),
        entries,
        facts: Default::default(),
    };
    let out = dir.join(name);
    overlay::bundle::write(&mut index, &mut overlay::bundle::Folder(stage), &out).unwrap();
    out
}

fn trust(file: &Path) -> Trust {
    Trust {
        file: Some((file.to_path_buf(), "--trust".into())),
        insecure_unsigned: false,
    }
}

/// `ssh-keygen -l`'s SHA256 fingerprint of a key.
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

/// `overlay sign FILE --print-message` into a file.
fn message_file(b: &Path) -> PathBuf {
    let out = ok(
        overlay(&["sign", b.to_str().unwrap(), "--print-message"])
            .output()
            .unwrap(),
        "sign --print-message",
    );
    let p = b.with_extension("msg");
    fs::write(&p, &out.stdout).unwrap();
    p
}

/// `ssh-keygen -Y verify` of `sig` over `msg` for `principal`.
fn keygen_verify(signers: &Path, principal: &str, sig: &Path, msg: &Path) -> Output {
    Command::new("ssh-keygen")
        .args(["-Y", "verify", "-f"])
        .arg(signers)
        .args(["-I", principal, "-n", "overlay-bundle", "-s"])
        .arg(sig)
        .stdin(fs::File::open(msg).unwrap())
        .output()
        .unwrap()
}

fn refusal(b: &Path, t: &Trust) -> overlay::error::Error {
    let e = Bundle::open_trusted(b, t).unwrap_err();
    assert_eq!(e.kind, ErrorKind::HostKey, "{e:?}");
    assert_eq!(e.kind.exit_code(), 5);
    assert!(e.hint.is_some(), "{e:?}");
    e
}

#[test]
fn ed25519_and_rsa_signatures_verify_here_and_with_ssh_keygen_both_ways() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    for kind in ["ed25519", "rsa"] {
        let key = keygen(d, &format!("id_{kind}"), kind);
        let b = bundle(d, &format!("{kind}.ovl"), b"x = 1\n");
        let before = fs::read(&b).unwrap();
        let out = ok(
            overlay(&[
                "sign",
                b.to_str().unwrap(),
                "--key",
                key.to_str().unwrap(),
                "--json",
            ])
            .output()
            .unwrap(),
            "overlay sign",
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(doc["fingerprint"], fingerprint(&key), "{doc}");
        assert_eq!(fs::read(&b).unwrap(), before, "signing changed the bundle");
        let sig = PathBuf::from(format!("{}.sig", b.display()));
        assert!(
            fs::read_to_string(&sig)
                .unwrap()
                .starts_with("-----BEGIN SSH SIGNATURE-----")
        );
        let signers = allowed(
            d,
            &format!("allowed_{kind}"),
            &[format!(
                "ops@example namespaces=\"overlay-bundle\" {}",
                pubkey(&key)
            )],
        );
        // overlay checks it, and records who signed.
        let opened = Bundle::open_trusted(&b, &trust(&signers)).unwrap();
        let Checked::Trusted(s) = &opened.signature else {
            panic!("{:?}", opened.signature)
        };
        assert_eq!(s.fingerprint, fingerprint(&key));
        assert_eq!(s.principals.as_deref(), Some("ops@example"));
        // OpenSSH checks the same signature over the printed message.
        let msg = message_file(&b);
        let text = fs::read_to_string(&msg).unwrap();
        assert!(text.contains(&opened.blake3), "{text}");
        ok(
            keygen_verify(&signers, "ops@example", &sig, &msg),
            "ssh-keygen -Y verify",
        );
        // And a signature by ssh-keygen over that message is overlay's.
        fs::remove_file(&sig).unwrap();
        ok(
            Command::new("ssh-keygen")
                .args(["-q", "-Y", "sign", "-n", "overlay-bundle", "-f"])
                .arg(&key)
                .arg(&msg)
                .output()
                .unwrap(),
            "ssh-keygen -Y sign",
        );
        fs::rename(msg.with_extension("msg.sig"), &sig).unwrap();
        let opened = Bundle::open_trusted(&b, &trust(&signers)).unwrap();
        assert!(matches!(opened.signature, Checked::Trusted(_)), "{kind}");
    }
}

#[test]
fn unsigned_unknown_other_namespace_and_changed_bundles_are_refused_naming_the_key() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let ops = keygen(d, "ops", "ed25519");
    let eve = keygen(d, "eve", "ed25519");
    let signers = allowed(
        d,
        "allowed",
        &[format!(
            "ops@example namespaces=\"overlay-bundle\" {}",
            pubkey(&ops)
        )],
    );
    let b = bundle(d, "a.ovl", b"x = 1\n");
    let sig = PathBuf::from(format!("{}.sig", b.display()));

    // Unsigned.
    let e = refusal(&b, &trust(&signers));
    assert!(e.message.contains("is not signed"), "{e:?}");
    assert!(e.hint.unwrap().contains("--insecure-unsigned"));
    // Passed with --insecure-unsigned, which says so.
    let insecure = Trust {
        insecure_unsigned: true,
        ..trust(&signers)
    };
    let opened = Bundle::open_trusted(&b, &insecure).unwrap();
    assert!(matches!(opened.signature, Checked::Insecure(_)));
    // No trust configured: as before, unsigned noted.
    let opened = Bundle::open_trusted(&b, &Trust::default()).unwrap();
    assert_eq!(opened.signature, Checked::Unsigned);

    // An unknown signer: refused, naming its fingerprint and the file.
    let sign = |key: &Path, b: &Path| {
        ok(
            overlay(&["sign", b.to_str().unwrap(), "--key", key.to_str().unwrap()])
                .output()
                .unwrap(),
            "overlay sign",
        )
    };
    sign(&eve, &b);
    let e = refusal(&b, &trust(&signers));
    assert!(
        e.message.contains(&fingerprint(&eve)) && e.message.contains("does not trust"),
        "{e:?}"
    );
    assert!(e.message.contains(&signers.display().to_string()), "{e:?}");
    assert!(e.hint.unwrap().contains("namespaces=\"overlay-bundle\""));
    // Known, but not for bundles.
    let git_only = allowed(
        d,
        "git_only",
        &[format!("ops@example namespaces=\"git\" {}", pubkey(&ops))],
    );
    sign(&ops, &b);
    let e = refusal(&b, &trust(&git_only));
    assert!(e.message.contains("namespaces=\"git\""), "{e:?}");

    // A signature for another namespace, by a trusted key.
    let msg = message_file(&b);
    ok(
        Command::new("ssh-keygen")
            .args(["-q", "-Y", "sign", "-n", "file", "-f"])
            .arg(&ops)
            .arg(&msg)
            .output()
            .unwrap(),
        "ssh-keygen -Y sign -n file",
    );
    fs::rename(msg.with_extension("msg.sig"), &sig).unwrap();
    let e = refusal(&b, &trust(&signers));
    assert!(
        e.message.contains("namespace \"file\"") && e.message.contains(&fingerprint(&ops)),
        "{e:?}"
    );

    // Changed after it was signed, and sealed again (a valid trailer): the
    // signature does not sign it.
    sign(&ops, &b);
    let other = bundle(d, "other.ovl", b"x = 2\n");
    fs::copy(&other, &b).unwrap();
    let e = refusal(&b, &trust(&signers));
    assert!(
        e.message.contains("does not sign this bundle") && e.message.contains(&fingerprint(&ops)),
        "{e:?}"
    );
    // A byte flipped, the trailer left: damaged (exit 10), still refused.
    sign(&ops, &other);
    let mut bytes = fs::read(&other).unwrap();
    bytes[10] ^= 1;
    fs::write(&other, &bytes).unwrap();
    let e = Bundle::open_trusted(&other, &trust(&signers)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Protocol, "{e:?}");
    // Garbage for a signature.
    fs::write(&sig, "not a signature\n").unwrap();
    let e = refusal(&b, &trust(&signers));
    assert!(e.message.contains("not an SSH signature"), "{e:?}");
    // A trust file that does not parse is a usage error naming its line.
    let broken = allowed(d, "broken", &["# ok".into(), "ops@example".into()]);
    let e = Bundle::open_trusted(&b, &trust(&broken)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Usage);
    assert!(e.message.contains("broken:2"), "{e:?}");
}

#[test]
fn a_key_held_by_a_real_ssh_agent_signs() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let key = keygen(d, "id_agent", "ed25519");
    let rsa = keygen(d, "id_agent_rsa", "rsa");
    let sock = d.join("agent.sock");
    let mut agent = Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(&sock)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if sock.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let with_agent = |args: &[&str]| {
        let mut c = overlay(args);
        c.env("SSH_AUTH_SOCK", &sock);
        c.output().unwrap()
    };
    let b = bundle(d, "a.ovl", b"x = 1\n");
    let bs = b.to_str().unwrap();
    // Not in the agent yet: refused, naming what it holds.
    let pubfile = key.with_extension("pub");
    let out = with_agent(&["sign", bs, "--key", pubfile.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("does not hold") && err.contains("ssh-add"),
        "{err}"
    );
    for k in [&key, &rsa] {
        ok(
            Command::new("ssh-add")
                .arg("-q")
                .arg(k)
                .env("SSH_AUTH_SOCK", &sock)
                .output()
                .unwrap(),
            "ssh-add",
        );
    }
    let signers = allowed(
        d,
        "allowed",
        &[
            format!("ops@example {}", pubkey(&key)),
            format!("rsa@example {}", pubkey(&rsa)),
        ],
    );
    // Two keys: agent: alone is ambiguous.
    let out = with_agent(&["sign", bs, "--key", "agent:"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    for (k, who) in [(&key, "ops@example"), (&rsa, "rsa@example")] {
        // The private key's file moved away: only the agent can sign.
        let pubfile = d.join("only.pub");
        fs::copy(k.with_extension("pub"), &pubfile).unwrap();
        ok(
            with_agent(&["sign", bs, "--key", pubfile.to_str().unwrap()]),
            "sign via agent",
        );
        let opened = Bundle::open_trusted(&b, &trust(&signers)).unwrap();
        let Checked::Trusted(s) = &opened.signature else {
            panic!("{:?}", opened.signature)
        };
        assert_eq!(s.principals.as_deref(), Some(who));
        let sig = PathBuf::from(format!("{bs}.sig"));
        ok(
            keygen_verify(&signers, who, &sig, &message_file(&b)),
            "ssh-keygen -Y verify",
        );
    }
    // By fingerprint.
    let fp = format!("agent:{}", fingerprint(&rsa));
    ok(with_agent(&["sign", bs, "--key", &fp]), "sign agent:SHA256");
    // No agent, a public key: a clear error.
    let out = overlay(&[
        "sign",
        bs,
        "--key",
        key.with_extension("pub").to_str().unwrap(),
    ])
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("SSH_AUTH_SOCK"), "{err}");
    let _ = agent.kill();
    let _ = agent.wait();
}

#[test]
fn an_encrypted_key_without_an_agent_says_what_to_do() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let key = d.join("locked");
    ok(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "secret", "-f"])
            .arg(&key)
            .output()
            .unwrap(),
        "ssh-keygen",
    );
    let b = bundle(d, "a.ovl", b"x = 1\n");
    let out = overlay(&["sign", b.to_str().unwrap(), "--key", key.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("passphrase-protected") && err.contains("ssh-add"),
        "{err}"
    );
    assert!(!Path::new(&format!("{}.sig", b.display())).exists());
    // A damaged bundle is never signed.
    let mut bytes = fs::read(&b).unwrap();
    bytes[5] ^= 1;
    fs::write(&b, &bytes).unwrap();
    let key2 = keygen(d, "plain", "ed25519");
    let out = overlay(&["sign", b.to_str().unwrap(), "--key", key2.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(10), "{out:?}");
    assert!(!Path::new(&format!("{}.sig", b.display())).exists());
}
