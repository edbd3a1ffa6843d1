//! Exact output of whole user sessions: the real binary against real sshd
//! test hosts (as root), one snapshot per step holding the command line,
//! the exit code, the whole stdout and the whole stderr.
//!
//! Snapshots live in `tests/snapshots/sessions__*.snap`. What varies from
//! run to run or machine to machine is replaced before comparing (see
//! [`Session::redact`] and [`FILTERS`]): the testbed's directory, host
//! addresses, generation ids (numbered `[GEN1]`, `[GEN2]`, ... in order of
//! appearance within a session), timestamps, durations, rates, hashes,
//! host-key fingerprints and the version.
//!
//! When output changes on purpose, review and accept the new snapshots:
//!
//! ```sh
//! cargo insta test --test sessions --review   # with cargo-insta, or:
//! INSTA_UPDATE=always cargo test --locked --test sessions && git diff tests/snapshots
//! ```
//!
//! A mismatch always fails the test. Without `INSTA_UPDATE`, insta also
//! writes `*.snap.new` files beside the snapshots for review (never when
//! the `CI` environment variable is set); they are ignored by git and
//! never make a test pass. Do not set `INSTA_UPDATE` or `INSTA_FORCE_PASS`
//! in CI.

mod common;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::Testbed;

/// The fixture scenario's sets and a `[verify]` check that passes only on
/// the CUDA 13 build the overlay brings (as in tests/verify.rs).
fn manifest() -> String {
    format!("{}{}", common::SCENARIO_SETS, common::VERIFY)
}

/// Regex filters applied (by insta, after [`Session::redact`]) to every
/// snapshot, in this order.
const FILTERS: &[(&str, &str)] = &[
    // Versions of overlay and of the fixture's Python.
    (r"overlay \d+\.\d+\.\d+", "overlay [VERSION]"),
    // Timestamps (history) and dates.
    (
        r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2})?(\.\d+)?(Z|[+-]\d{2}:?\d{2})?",
        "[TIME]",
    ),
    // The verify log's name: a timestamp and nanoseconds.
    (r"\d{8}T\d{6}Z-\d+\.log", "[TIME].log"),
    // Bytes on the wire depend on the compression level picked for the link.
    (
        r"\d+(\.\d+)? (B|KiB|MiB|GiB) on the wire",
        "[SIZE] on the wire",
    ),
    // Sizes that include a wheel's direct_url.json: pip writes the wheel's
    // file URL into it, so its length follows where the checkout is.
    (
        r#"(direct_url\.json",\n\s*"action": "\w+",\n\s*"size": )\d+"#,
        "${1}[N]",
    ),
    (r"\b\d+\.\d\d (KiB|MiB|GiB)\b", "[SIZE]"),
    // Durations and rates.
    (r"\b\d+(\.\d+)?\s?(ms|µs|s|m|h)\b", "[DURATION]"),
    (r"\b\d+(\.\d+)?\s?(B|KiB|MiB|GiB|kB|MB|GB)/s\b", "[RATE]"),
    // Host key fingerprints and content hashes.
    (r"SHA256:[A-Za-z0-9+/]{43}", "SHA256:[FINGERPRINT]"),
    // doctor: what its hash cache vouched for depends on when the venv was
    // copied; a pyc's recorded mtime on when it was built; the sizes of
    // gcc-built objects on the compiler.
    (
        r"\(\d+ hashed, \d+ from the cache\)",
        "([N] hashed, [N] from the cache)",
    ),
    (r"mtime \d+", "mtime [N]"),
    (
        r"(\.so: size|need) \d+(,| bytes,) (RECORD says|the file has) \d+",
        "$1 [N]$2 $3 [N]",
    ),
    (r"\b[0-9a-f]{64}\b", "[HASH]"),
];

/// A copy of the overlay binary without its debug info, for the agent
/// (`OVERLAY_AGENT_BINARY`): the same code, but a fifth of the size, so that
/// the controller hashes and uploads 27 MB instead of 140 MB at each step
/// (an unoptimized SHA-256 of the debug build took seconds per command).
/// `None` (use the binary itself) if `strip` is not installed.
fn stripped_agent() -> Option<&'static Path> {
    static AGENT: OnceLock<Option<PathBuf>> = OnceLock::new();
    AGENT
        .get_or_init(|| {
            let exe = Path::new(env!("CARGO_BIN_EXE_overlay"));
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
            fs::create_dir_all(dir).ok()?;
            let out = dir.join("sessions-agent");
            let tmp = dir.join(format!("sessions-agent.{}", std::process::id()));
            let ok = Command::new("strip")
                .arg("-o")
                .arg(&tmp)
                .arg(exe)
                .status()
                .is_ok_and(|s| s.success());
            (ok && fs::rename(&tmp, &out).is_ok()).then_some(out)
        })
        .as_deref()
}

/// One user's session on one testbed: runs `overlay` and snapshots each step.
struct Session<'a> {
    tb: &'a Testbed,
    name: &'static str,
    step: usize,
    /// Generation ids seen so far, in order: `[GEN1]`, `[GEN2]`, ...
    generations: HashMap<String, usize>,
    /// Literal strings to replace, in order: the testbed dir, host addresses.
    literals: Vec<(regex::Regex, String)>,
}

impl<'a> Session<'a> {
    fn new(tb: &'a Testbed, name: &'static str) -> Self {
        let literal = |s: &str| regex::Regex::new(&regex::escape(s)).unwrap();
        let word = |s: &str| regex::Regex::new(&format!(r"\b{}\b", regex::escape(s))).unwrap();
        let mut literals = vec![(
            literal(&tb.dir().display().to_string()),
            "[TESTBED]".to_string(),
        )];
        for h in &tb.hosts {
            if let Some((ip, port)) = &h.addr {
                let to = format!("[{}-ADDR]", h.name);
                literals.push((literal(&format!("[{ip}]:{port}")), to.clone()));
                literals.push((word(&format!("{ip}:{port}")), to));
                literals.push((
                    word(&format!("port {port}")),
                    format!("port [{}-PORT]", h.name),
                ));
            }
        }
        // After every ip:port: hosts may share an address (not a port).
        for h in &tb.hosts {
            if let Some((ip, _)) = &h.addr {
                literals.push((word(ip), "[HOST-IP]".to_string()));
            }
        }
        Session {
            tb,
            name,
            step: 0,
            generations: HashMap::new(),
            literals,
        }
    }

    /// Replace what varies but must stay distinguishable within a session.
    fn redact(&mut self, text: &str) -> String {
        let mut text = text.to_string();
        for (from, to) in &self.literals {
            text = from.replace_all(&text, to.as_str()).into_owned();
        }
        let id = regex::Regex::new(r"\b\d{8}T\d{6}Z-[0-9a-f]{4}\b").unwrap();
        let generations = &mut self.generations;
        id.replace_all(&text, |c: &regex::Captures| {
            let n = generations.len() + 1;
            format!("[GEN{}]", generations.entry(c[0].to_string()).or_insert(n))
        })
        .into_owned()
    }

    /// Run `overlay ARGS` and snapshot it as step `label` of this session.
    fn step(&mut self, label: &str, args: &[&str]) -> std::process::Output {
        self.step += 1;
        let mut cmd = self.tb.overlay(args);
        if let Some(agent) = stripped_agent() {
            cmd.env("OVERLAY_AGENT_BINARY", agent);
        }
        let out = cmd.output().unwrap();
        let text = format!(
            "$ overlay {}\nexit code: {}\n----- stdout -----\n{}----- stderr -----\n{}",
            args.join(" "),
            out.status
                .code()
                .map_or_else(|| format!("{}", out.status), |c| c.to_string()),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let text = self.redact(&text);
        let name = format!("{}-{:02}-{label}", self.name, self.step);
        insta::with_settings!({
            filters => FILTERS.iter().copied(),
            omit_expression => true,
            prepend_module_to_snapshot => true,
        }, {
            insta::assert_snapshot!(name, text);
        });
        out
    }
}

/// plan (text, --json, --check), apply (a backup by default), history,
/// verify, rollback, history, rollback with nothing left, drift (refused,
/// with --backup, still accepted), apply --no-backup and a rollback that
/// refuses it, prune.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn lifecycle() {
    let tb = Testbed::new(2);
    tb.write_manifest(&manifest());
    let mut s = Session::new(&tb, "lifecycle");
    s.step("verify-fails", &["verify", "dst"]);
    s.step("plan", &["plan", "src", "dst"]);
    s.step("plan-json", &["plan", "src", "dst", "--json"]);
    s.step("plan-check", &["plan", "src", "dst", "--check"]);
    s.step("apply-backup", &["apply"]);
    s.step("history", &["history", "dst"]);
    s.step("verify-passes", &["verify", "dst"]);
    s.step("rollback", &["rollback", "dst"]);
    s.step("history-after-rollback", &["history", "dst"]);
    s.step("rollback-nothing", &["rollback", "dst"]);

    // Drift: the target changes between plan and apply; the apply refuses.
    s.step(
        "plan-patches",
        &["plan", "src", "dst", "--set", "sglang-patches"],
    );
    let edited = tb.site_packages(1).join("minisglang/srt/server_args.py");
    let good = fs::read(&edited).unwrap();
    fs::write(&edited, b"# edited by hand after the plan\n").unwrap();
    s.step("apply-drifted", &["apply", "--backup"]);
    fs::write(&edited, good).unwrap();

    // As the hint says: plan again. Applied with --no-backup, the
    // generation cannot be rolled back.
    s.step(
        "plan-after-drift",
        &["plan", "src", "dst", "--set", "sglang-patches"],
    );
    s.step("apply-no-backup", &["apply", "--no-backup"]);
    s.step("rollback-no-backup", &["rollback", "dst"]);
    s.step("history-mixed", &["history", "dst"]);
    s.step("prune", &["prune", "dst", "--keep", "1"]);
    s.step("history-after-prune", &["history", "dst"]);
}

/// Each class of error a user meets, on one testbed.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn errors() {
    let tb = Testbed::new(2);
    tb.write_manifest(&format!(
        "{}\n[hosts.closed]\nssh = \"root@127.0.0.1:1\"\nvenv = \"/root/venv\"\n",
        manifest()
    ));
    let mut s = Session::new(&tb, "errors");
    // Arguments (clap's own format).
    s.step("missing-target", &["plan", "src"]);
    s.step("bad-option-value", &["apply", "--compress", "fast"]);
    s.step("unknown-command", &["plna", "src", "dst"]);
    // Manifest, hosts and sets.
    s.step("unknown-host", &["plan", "src", "ct404"]);
    s.step("unknown-set", &["plan", "src", "dst", "--set", "nope"]);
    s.step(
        "unreachable",
        &["plan", "src", "closed", "--connect-timeout", "2"],
    );
    // Plan files.
    s.step("plan-missing", &["apply", "no-such-plan.json"]);
    fs::write(tb.work.join("damaged.json"), "{\"version\": 1, \"sets\": [").unwrap();
    s.step("plan-damaged", &["apply", "damaged.json"]);

    // Host keys: unknown, then changed.
    let kh = tb.client.join(".ssh/known_hosts");
    let good_kh = fs::read_to_string(&kh).unwrap();
    let (ip, port) = tb.hosts[1].addr.clone().unwrap();
    let entry = format!("[{ip}]:{port} ");
    let without: String = good_kh
        .lines()
        .filter(|l| !l.starts_with(&entry))
        .map(|l| format!("{l}\n"))
        .collect();
    fs::write(&kh, &without).unwrap();
    s.step("host-key-unknown", &["plan", "src", "dst"]);
    let other = tb.dir().join("otherkey");
    common::run(
        std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&other),
    );
    let other_pub = fs::read_to_string(other.with_extension("pub")).unwrap();
    let key: Vec<&str> = other_pub.split_whitespace().take(2).collect();
    fs::write(&kh, format!("{without}{entry}{}\n", key.join(" "))).unwrap();
    s.step(
        "host-key-changed",
        &["plan", "src", "dst", "--accept-new-host-key"],
    );
    fs::write(&kh, good_kh).unwrap();

    // A manifest line that is wrong: the error names the line and column.
    let bad = tb.manifest_path();
    let text = fs::read_to_string(&bad).unwrap();
    fs::write(
        &bad,
        text.replace("dists = [\"minitorch\"]", "dists = \"minitorch\""),
    )
    .unwrap();
    s.step("manifest-bad-type", &["plan", "src", "dst"]);
    fs::write(
        &bad,
        text.replace(
            "dists = [\"minitorch\"]",
            "files = [\"../../../../etc/passwd\"]",
        ),
    )
    .unwrap();
    s.step("manifest-escaping-glob", &["plan", "src", "dst"]);
    fs::write(&bad, text.replace("[verify]", "[verify")).unwrap();
    s.step("manifest-syntax", &["plan", "src", "dst"]);
}

/// `verify` of a check that crashes (SIGBUS on a truncated shared object)
/// and of one that hangs (killed at `[verify] timeout`): the signal, the
/// Python frame and faulthandler's whole dump.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn verify_crashes() {
    let tb = Testbed::new(2);
    tb.write_manifest(&manifest());
    let mut s = Session::new(&tb, "verify-crashes");
    // faulthandler's thread ids, and the interpreter's own paths and line
    // numbers (they follow the Python the testbed was built with).
    let re = |r: &str| regex::Regex::new(r).unwrap();
    s.literals.extend([
        (re(r"thread 0x[0-9a-f]+"), "thread [THREAD]".to_string()),
        (
            re(r#"File "[^"]*/lib/python3\.\d+/(ctypes/[a-z_]+\.py)", line \d+"#),
            r#"File "[STDLIB]/$1", line [N]"#.to_string(),
        ),
        (
            re(r#"File "(<frozen [a-z_.]+>)", line \d+"#),
            r#"File "$1", line [N]"#.to_string(),
        ),
        (re(r"/lib/python3\.\d+/"), "/lib/python3.X/".to_string()),
    ]);
    // A half-finished copy: minitorchvision/_C.so cut after its first page.
    let so = tb.site_packages(1).join("minitorchvision/_C.so");
    fs::OpenOptions::new()
        .write(true)
        .open(&so)
        .unwrap()
        .set_len(4096)
        .unwrap();
    s.step("sigbus", &["verify", "dst"]);
    tb.write_manifest(&format!(
        "{}{}",
        common::SCENARIO_SETS,
        r#"
[verify]
timeout = 3
python = '''
import subprocess, time
def wait_for_the_gpu():
    subprocess.Popen(["sleep", "1000"])
    time.sleep(1000)
wait_for_the_gpu()
'''
"#
    ));
    s.step("timeout", &["verify", "dst"]);
}

/// `overlay doctor` on the target as the fixture builds it (one stray
/// file), then damaged by hand: a truncated library, a patched and a
/// deleted file, a second dist-info, a broken script.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn doctor() {
    let tb = Testbed::new(2);
    tb.write_manifest(&manifest());
    let mut s = Session::new(&tb, "doctor");
    s.step("as-built", &["doctor", "dst"]);
    let site = tb.site_packages(1);
    let cuda = site.join("minitorch/lib/libminitorch_cuda.so");
    let bytes = fs::read(&cuda).unwrap();
    fs::write(&cuda, &bytes[..bytes.len() / 3]).unwrap();
    let run_py = site.join("minitorch/distributed/run.py");
    let text = fs::read_to_string(&run_py).unwrap();
    fs::write(&run_py, format!("{text}# patched by hand\n")).unwrap();
    fs::remove_file(site.join("minitorch/_old_in_291.py")).unwrap();
    common::run(
        Command::new("cp")
            .arg("-a")
            .arg(site.join("minitorch-2.9.1.dist-info"))
            .arg(site.join("minitorch-9.9.9.dist-info")),
    );
    let script = tb.host_venv_dir(1).join("bin/minitorchrun");
    let body = fs::read_to_string(&script).unwrap();
    let rest = body.split_once('\n').unwrap().1;
    fs::write(&script, format!("#!/nonexistent/venv/bin/python\n{rest}")).unwrap();
    s.step("damaged", &["doctor", "dst"]);
}

/// Many targets from one controller: a plan of three targets (two alike,
/// one with the torch set already overlaid) through a group, its rollout
/// with a canary and the check, then history, verify and rollback of
/// several hosts.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn fleet() {
    let tb = Testbed::new(4);
    tb.write_manifest(&format!(
        "{}\n[groups.fleet]\nhosts = [\"dst\", \"dst2\", \"dst3\"]\n",
        manifest()
    ));
    let mut s = Session::new(&tb, "fleet");
    s.step(
        "plan-dst3-torch",
        &[
            "plan",
            "src",
            "dst3",
            "--set",
            "torch",
            "-o",
            "dst3.json",
            "-q",
        ],
    );
    s.step("apply-dst3-torch", &["apply", "dst3.json", "-q"]);
    s.step("plan", &["plan", "src", "fleet"]);
    s.step(
        "apply",
        &[
            "apply",
            "--canary",
            "1",
            "--verify",
            "--rollback-on-failure",
            "-q",
        ],
    );
    s.step("history", &["history"]);
    s.step("verify", &["verify", "dst", "dst2"]);
    s.step("rollback", &["rollback", "fleet"]);
    s.step("rollback-nothing", &["rollback", "dst", "dst2"]);
}
