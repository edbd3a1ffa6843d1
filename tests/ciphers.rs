//! The controller's SSH crypto under each cipher a real sshd can force on
//! it. overlay builds a patched libssh2 (vendor/libssh2-sys/OVERLAY-PATCH.md)
//! that en/decrypts the middle of every packet in one call over whole runs
//! of cipher blocks instead of one block per call; these tests force the
//! test hosts' sshd to one cipher (and MAC) at a time and send a relayed
//! apply through the controller, so that both directions of libssh2's crypto
//! (decrypting what the source sends, encrypting what goes to the target)
//! carry megabytes in packets of odd lengths. The target must end up byte
//! for byte like the source, and a rollback must give back the target as it
//! was.

mod common;

use std::fs;

use common::{Testbed, assert_same, ok, snapshot};

/// sshd_config lines that leave the hosts one cipher (and MAC) to agree on:
/// a connection that works has used it.
const CIPHERS: &[(&str, &[&str])] = &[
    ("aes128-gcm", &["Ciphers aes128-gcm@openssh.com"]),
    ("aes256-gcm", &["Ciphers aes256-gcm@openssh.com"]),
    (
        "aes128-ctr with hmac-sha2-256",
        &["Ciphers aes128-ctr", "MACs hmac-sha2-256"],
    ),
    (
        "aes128-ctr with hmac-sha2-256-etm",
        &["Ciphers aes128-ctr", "MACs hmac-sha2-256-etm@openssh.com"],
    ),
    (
        "chacha20-poly1305",
        &["Ciphers chacha20-poly1305@openssh.com"],
    ),
];

/// `len` bytes that zstd cannot shrink (xorshift64 from `seed`).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// One pair of hosts, restarted with each cipher in turn: a plan, a relayed
/// apply of a few MB (a file whose length is no multiple of 16, plus the
/// fixture's wheels) checked byte for byte, and a rollback.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn each_cipher_relays_an_apply_byte_for_byte_and_rolls_it_back() {
    let mut tb = Testbed::new(2);
    tb.write_manifest(common::SCENARIO_SETS);
    let rel = "minisglang/srt/speculative/table.bin";
    let before = snapshot(tb.host_venv_dir(1));
    for (k, (cipher, sshd_options)) in CIPHERS.iter().enumerate() {
        tb.restart_host(0, sshd_options);
        tb.restart_host(1, sshd_options);
        let data = noise((3 << 20) + 16 * k + 7, k as u64 + 1);
        fs::write(tb.site_packages(0).join(rel), &data).unwrap();

        ok(
            tb.overlay(&["plan", "src", "dst", "-q"]).output().unwrap(),
            &format!("plan over {cipher}"),
        );
        let out = ok(
            tb.overlay(&["apply", "--backup", "--compress", "none", "--json"])
                .output()
                .unwrap(),
            &format!("apply over {cipher}"),
        );
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("apply --json");
        assert_eq!(doc["route"], "relay", "{cipher}: {doc}");
        let sent = doc["sent_bytes"].as_u64().unwrap();
        assert!(sent > data.len() as u64, "{cipher}: sent {sent} bytes");
        let landed = fs::read(tb.site_packages(1).join(rel)).unwrap();
        assert!(
            landed == data,
            "{cipher}: the target's {rel} differs from the source's ({} bytes for {})",
            landed.len(),
            data.len()
        );
        // Every file of the set's folder came over as it is at the source
        // (bytecode aside: the target's stale bytecode is deleted, not sent).
        let set_dir = |i: usize| snapshot(&tb.site_packages(i).join("minisglang/srt/speculative"));
        let (sent_set, landed_set) = (set_dir(0), set_dir(1));
        for (path, what) in sent_set.iter().filter(|(p, _)| !p.contains("__pycache__")) {
            assert_eq!(
                landed_set.get(path),
                Some(what),
                "{cipher}: the target's speculative/{path}"
            );
        }

        ok(
            tb.overlay(&["rollback", "dst"]).output().unwrap(),
            &format!("rollback over {cipher}"),
        );
        assert_same(
            &before,
            &snapshot(tb.host_venv_dir(1)),
            &format!("{cipher}: target after the rollback"),
        );
    }
}
