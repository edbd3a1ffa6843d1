//! The live progress lines, as a terminal sees them: `overlay plan` and
//! `overlay apply` run under a pseudo-terminal (util-linux `script`) on the
//! real sshd test hosts while a 64 MiB file of random bytes streams. What
//! the terminal received is read back and checked: every step has its
//! summary line, and the transfer's byte count grows while the file count
//! waits for the big file (bytes are counted block by block, not when a
//! file ends). Off a terminal nothing of it is drawn: tests/sessions.rs
//! snapshots that stderr.

mod common;

use std::fs;
use std::io::Read as _;
use std::process::Command;

use common::Testbed;

/// 64 MiB of random bytes (zstd cannot shrink them) in the source's
/// patched set. Returns its size.
fn add_64_mib(tb: &Testbed) -> u64 {
    let rel = "minisglang/srt/speculative/big_weights.bin";
    let size = 64u64 << 20;
    let mut random = fs::File::open("/dev/urandom").unwrap().take(size);
    let mut file = fs::File::create(tb.host_venv_dir(0).join(common::SITE).join(rel)).unwrap();
    assert_eq!(std::io::copy(&mut random, &mut file).unwrap(), size);
    size
}

/// `overlay ARGS` under a pseudo-terminal of 120 columns; returns all the
/// terminal received (stdout and stderr) and whether it succeeded.
fn on_terminal(tb: &Testbed, args: &str) -> (bool, String) {
    let exe = env!("CARGO_BIN_EXE_overlay");
    let cmd = format!("stty cols 120 rows 40; exec '{exe}' {args}");
    let out = Command::new("script")
        .args(["-qfec", &cmd, "/dev/null"])
        .env("HOME", &tb.client)
        .env_remove("SSH_AUTH_SOCK")
        .env_remove("NO_COLOR")
        .current_dir(&tb.work)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run script(1)");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The terminal's output as the lines it drew: escape sequences out, each
/// redraw (`\r`) or line its own entry.
fn drawn(raw: &str) -> Vec<String> {
    let csi = regex::Regex::new(r"\x1b\[[0-9;?]*[A-Za-z]").unwrap();
    csi.replace_all(raw, "\n")
        .split(['\r', '\n'])
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// Bytes of indicatif's `HumanBytes` ("1.50 MiB", "512 B").
fn bytes_of(n: &str, unit: &str) -> u64 {
    let n: f64 = n.parse().unwrap();
    let scale = match unit {
        "B" => 1u64,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => panic!("unit {other}"),
    };
    (n * scale as f64) as u64
}

/// A live transfer line: files, total files, bytes, total bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Shown {
    files: u64,
    total_files: u64,
    bytes: u64,
    total_bytes: u64,
}

/// Every transfer line the terminal drew (`streaming src -> dst: 3/5 files [...] 12.00 MiB/64.01 MiB ...`).
fn transfer_lines(lines: &[String]) -> Vec<Shown> {
    let re = regex::Regex::new(
        r"streaming +src -> dst: (\d+)/(\d+) files .*?([\d.]+) (B|KiB|MiB|GiB)/([\d.]+) (B|KiB|MiB|GiB)",
    )
    .unwrap();
    lines
        .iter()
        .filter_map(|l| re.captures(l))
        .map(|c| Shown {
            files: c[1].parse().unwrap(),
            total_files: c[2].parse().unwrap(),
            bytes: bytes_of(&c[3], &c[4]),
            total_bytes: bytes_of(&c[5], &c[6]),
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_terminal_sees_every_step_and_bytes_move_within_a_big_file() {
    let tb = Testbed::new(2);
    tb.write_manifest(common::SCENARIO_SETS);

    let big = add_64_mib(&tb);

    // plan: connecting, scanning and hashing on each host.
    let (done, raw) = on_terminal(&tb, "plan src dst");
    assert!(done, "plan failed:\n{raw}");
    let lines = drawn(&raw);
    for host in ["src", "dst"] {
        for step in ["connected", "scanned", "hashed"] {
            assert!(
                lines
                    .iter()
                    .any(|l| l.starts_with(&format!("✓ {step:<10} {host}"))),
                "no `{step}` line for {host}:\n{}",
                lines.join("\n")
            );
        }
    }

    // apply: connecting to both, streaming, switching.
    let (done, raw) = on_terminal(&tb, "apply");
    assert!(done, "apply failed:\n{raw}");
    let lines = drawn(&raw);
    let all = lines.join("\n");
    for want in [
        "✓ connected  dst",
        "✓ connected  src",
        "✓ streamed   src -> dst: ",
        "✓ switched   dst",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(want)),
            "no {want:?}:\n{all}"
        );
    }
    let order: Vec<usize> = [
        "✓ connected  dst",
        "✓ streamed",
        "✓ switched",
        "Applied generation",
    ]
    .iter()
    .map(|w| lines.iter().position(|l| l.starts_with(w)).unwrap())
    .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "steps out of order:\n{all}"
    );

    // The transfer's line: the byte count grows while the file count stays
    // (the 64 MiB file is under way), always within the total.
    let shown = transfer_lines(&lines);
    assert!(!shown.is_empty(), "no transfer line drawn:\n{all}");
    for s in &shown {
        assert!(s.total_bytes >= big, "{s:?}");
        assert!(
            s.bytes <= s.total_bytes && s.files <= s.total_files,
            "{s:?}"
        );
    }
    let grew_within_a_file = shown.iter().any(|a| {
        shown.iter().any(|b| {
            a.files == b.files && a.files < a.total_files && b.bytes >= a.bytes + (1 << 20)
        })
    });
    assert!(
        grew_within_a_file,
        "the byte count never grew while the file count stayed: {shown:?}\n{all}"
    );
    // Nothing is left half-drawn: the last transfer state on screen is the summary.
    let last = lines.iter().rposition(|l| l.contains("streaming")).unwrap();
    let summary = lines
        .iter()
        .rposition(|l| l.starts_with("✓ streamed"))
        .unwrap();
    assert!(summary > last, "{all}");
}
