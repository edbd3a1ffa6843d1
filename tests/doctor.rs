//! `overlay doctor HOST`: the host's venv checked as it stands, over real
//! sshd test hosts (as root) or the local transport. The target venv of the
//! fixture scenario is damaged by hand in each test, and doctor must name
//! every kind of damage with its distribution and path; a clean venv is
//! exit 0. What a healthy venv shows too (tests/fixtures/doctor_notes.py's
//! wheels: a module imported after its provider, an optional backend,
//! regenerable bytecode, an edited data file) is notes, with exit 0; whole
//! outputs are snapshots (`tests/snapshots/doctor__*.snap`).

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::Testbed;

/// `overlay doctor ARGS` on the testbed: (exit code, stdout, stderr).
fn doctor(tb: &Testbed, args: &[&str]) -> (i32, String, String) {
    let out = tb.overlay(&[&["doctor"], args].concat()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The stray file testbed.py leaves on the target (no dist owns it), and
/// any bytecode of it: gone, the target venv is clean.
fn remove_target_stray(site: &Path) {
    let spec = site.join("minisglang/srt/speculative");
    fs::remove_file(spec.join("dflash_utils.py")).unwrap();
    for e in fs::read_dir(spec.join("__pycache__"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name().to_string_lossy().starts_with("dflash_utils.") {
            fs::remove_file(e.path()).unwrap();
        }
    }
}

/// The lines of `kind`'s section of a text report.
fn section<'a>(stdout: &'a str, heading: &str) -> Vec<&'a str> {
    let mut lines = stdout.lines().skip_while(|l| !l.starts_with(heading));
    lines.next();
    lines.take_while(|l| l.starts_with("  ")).collect()
}

fn has(lines: &[&str], needle: &str) -> bool {
    lines.iter().any(|l| l.contains(needle))
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_clean_venv_is_clean_and_the_second_run_hashes_nothing() {
    let tb = Testbed::new(2);
    tb.write_manifest(common::SCENARIO_SETS);
    // As built, the target has one stray file: doctor names it.
    let (code, stdout, stderr) = doctor(&tb, &["dst"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let extra = section(&stdout, "extra");
    assert_eq!(extra.len(), 1, "{stdout}");
    assert!(
        has(
            &extra,
            "minisglang minisglang/srt/speculative/dflash_utils.py"
        ),
        "{stdout}"
    );

    remove_target_stray(&tb.site_packages(1));
    let (code, stdout, stderr) = doctor(&tb, &["dst"]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert_eq!(stdout, "no problems\n");
    assert!(
        stderr.contains("dst: ") && stderr.contains(": no problems"),
        "{stderr}"
    );

    // A run remembers each sha256 by the file's stamp, except for files
    // changed in the last 3 s (the cache's racy window; the venv was
    // copied just now): after that, a second run reads no file.
    std::thread::sleep(std::time::Duration::from_secs(4));
    let (_, first, _) = doctor(&tb, &["dst", "--json"]);
    let (code, json, _) = doctor(&tb, &["dst", "--json"]);
    assert_eq!(code, 0);
    let first: serde_json::Value = serde_json::from_str(&first).unwrap();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let files = v["report"]["files"].as_u64().unwrap();
    assert!(files > 50, "{v}");
    assert_eq!(first["report"]["files"], files);
    assert_eq!(v["report"]["hashed"], 0, "{v}");
    assert!(v["report"]["cached"].as_u64().unwrap() > 50, "{v}");
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn every_kind_of_damage_is_named() {
    let tb = Testbed::new(2);
    tb.write_manifest(common::SCENARIO_SETS);
    let site = tb.site_packages(1);
    remove_target_stray(&site);

    // A truncated shared object (a half-finished copy).
    let cuda = site.join("minitorch/lib/libminitorch_cuda.so");
    let bytes = fs::read(&cuda).unwrap();
    fs::write(&cuda, &bytes[..bytes.len() / 3]).unwrap();
    // A changed .py (its bytecode goes stale with it).
    let run_py = site.join("minitorch/distributed/run.py");
    let mut text = fs::read_to_string(&run_py).unwrap();
    text.push_str("# patched by hand\n");
    fs::write(&run_py, text).unwrap();
    // A deleted file.
    fs::remove_file(site.join("minitorch/_old_in_291.py")).unwrap();
    // An extra file.
    fs::write(site.join("minitorch/nn/by_hand.py"), "x = 1\n").unwrap();
    // A second dist-info of minitorch.
    common::run(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(site.join("minitorch-2.9.1.dist-info"))
            .arg(site.join("minitorch-9.9.9.dist-info")),
    );
    // Stale bytecode: the source's mtime moves, its content stays.
    let init = site.join("minitorch/utils/__init__.py");
    let f = fs::File::options().write(true).open(&init).unwrap();
    f.set_modified(
        std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000),
    )
    .unwrap();
    drop(f);
    // A broken shebang (its hash changes too).
    let script = tb.host_venv_dir(1).join("bin/minitorchrun");
    let body = fs::read_to_string(&script).unwrap();
    let rest = body.split_once('\n').unwrap().1;
    fs::write(&script, format!("#!/nonexistent/venv/bin/python\n{rest}")).unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();

    let (code, stdout, stderr) = doctor(&tb, &["dst"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    let damaged = section(&stdout, "damaged");
    assert!(
        has(
            &damaged,
            "minitorch minitorch/lib/libminitorch_cuda.so: cut short"
        ),
        "{stdout}"
    );
    let changed = section(&stdout, "changed");
    for p in [
        "minitorch minitorch/lib/libminitorch_cuda.so: size",
        "minitorch minitorch/distributed/run.py: size",
        "minitorch ../../../bin/minitorchrun:",
    ] {
        assert!(has(&changed, p), "{p} not in\n{stdout}");
    }
    assert!(
        has(
            &section(&stdout, "missing"),
            "minitorch minitorch/_old_in_291.py: listed in RECORD"
        ),
        "{stdout}"
    );
    assert!(
        has(
            &section(&stdout, "extra"),
            "minitorch minitorch/nn/by_hand.py"
        ),
        "{stdout}"
    );
    let dup = section(&stdout, "duplicate dist-info");
    assert!(has(&dup, "minitorch-2.9.1.dist-info: "), "{stdout}");
    assert!(has(&dup, "minitorch-9.9.9.dist-info: "), "{stdout}");
    let stale = section(&stdout, "stale bytecode");
    assert!(
        has(
            &stale,
            "minitorch minitorch/utils/__pycache__/__init__.cpython-311.pyc: compiled from another __init__.py"
        ),
        "{stdout}"
    );
    assert!(
        has(
            &stale,
            "minitorch/distributed/__pycache__/run.cpython-311.pyc"
        ),
        "{stdout}"
    );
    assert!(
        has(
            &section(&stdout, "broken shebang"),
            "minitorch ../../../bin/minitorchrun: its interpreter /nonexistent/venv/bin/python does not exist"
        ),
        "{stdout}"
    );
    assert!(
        stderr.contains("dst: ") && stderr.contains("problems ("),
        "{stderr}"
    );

    // --json: the same findings, each with kind, dist, path and reason.
    let (code, json, _) = doctor(&tb, &["dst", "--json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["host"], "dst");
    assert_eq!(v["ok"], false);
    assert_eq!(v["report"]["venv"], common::VENV);
    let findings = v["report"]["findings"].as_array().unwrap();
    let kinds: std::collections::BTreeSet<&str> = findings
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect();
    for k in [
        "damaged",
        "changed",
        "missing",
        "extra",
        "duplicate-dist-info",
        "stale-bytecode",
        "broken-shebang",
    ] {
        assert!(kinds.contains(k), "{k} not in {kinds:?}");
    }
    let damaged = findings.iter().find(|f| f["kind"] == "damaged").unwrap();
    assert_eq!(damaged["dist"], "minitorch");
    assert_eq!(damaged["path"], "minitorch/lib/libminitorch_cuda.so");
    assert!(
        damaged["reason"]
            .as_str()
            .unwrap()
            .contains("truncated copy")
    );
}

/// The preflight's ELF check on the venv as it stands: an extension whose
/// needed library is deleted.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_deleted_needed_library_is_named() {
    let tb = Testbed::new(2);
    tb.write_manifest(common::SCENARIO_SETS);
    let site = tb.site_packages(1);
    remove_target_stray(&site);
    fs::remove_file(site.join("minitorch/lib/libminitorch_cpu.so")).unwrap();
    let (code, stdout, stderr) = doctor(&tb, &["dst"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        has(
            &section(&stdout, "missing"),
            "minitorch minitorch/lib/libminitorch_cpu.so"
        ),
        "{stdout}"
    );
    // The ELF check of the venv as it stands names the extension that
    // needs the deleted library.
    let elf = section(&stdout, "elf");
    assert!(
        has(
            &elf,
            "minitorch minitorch/_C.cpython-311-x86_64-linux-gnu.so"
        ) && has(&elf, "libminitorch_cpu.so"),
        "{stdout}"
    );
}

/// `plan` notes the source's carried files that differ from their own
/// RECORD: the fixture's hand-patched minisglang files by name, and a
/// truncated shared object as a warning.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn plan_notes_carried_files_that_differ_from_their_record() {
    let tb = Testbed::new(2);
    tb.write_manifest(common::SCENARIO_SETS);
    let out = common::ok(
        tb.overlay(&["plan", "src", "dst", "--set", "sglang-patches"])
            .output()
            .unwrap(),
        "plan",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "note: 3 files of minisglang on src differ from their RECORD (hand-patched): \
             minisglang/srt/server_args.py, minisglang/srt/speculative/dflash_worker.py, \
             minisglang/srt/speculative/spec_info.py\n"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("differs from its RECORD"), "{stderr}");

    // A truncated library in a carried dist is a warning, in the plan too.
    let cuda = tb
        .site_packages(0)
        .join("minitorch/lib/libminitorch_cuda.so");
    let bytes = fs::read(&cuda).unwrap();
    fs::write(&cuda, &bytes[..bytes.len() / 3]).unwrap();
    let out = common::ok(
        tb.overlay(&["plan", "src", "dst", "--set", "torch", "--json"])
            .output()
            .unwrap(),
        "plan",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "warning: [torch] minitorch/lib/libminitorch_cuda.so of minitorch on src differs from its RECORD: cut short"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("note:"), "{stderr}");
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let warned = plan["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w["path"] == "minitorch/lib/libminitorch_cuda.so");
    assert!(warned, "{plan}");
}

/// The same command on a host of the local transport (no ssh).
#[test]
fn doctor_runs_on_a_local_host() {
    let tb = Testbed::local(2);
    tb.write_manifest(common::SCENARIO_SETS);
    let (code, stdout, stderr) = doctor(&tb, &["dst"]);
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert_eq!(
        stdout,
        "extra (in no RECORD) (1):\n  minisglang minisglang/srt/speculative/dflash_utils.py: in minisglang/, listed in no RECORD\n"
    );
    remove_target_stray(&tb.site_packages(1));
    let (code, stdout, stderr) = doctor(&tb, &["dst"]);
    assert_eq!((code, stdout.as_str()), (0, "no problems\n"), "{stderr}");
    // A host the manifest does not name is a usage error.
    let (code, _, stderr) = doctor(&tb, &["nowhere"]);
    assert_eq!(code, 2, "{stderr}");
}

/// Site-packages of host `i`, with the note fixtures of
/// tests/fixtures/doctor_notes.py pip-installed (see its docstring): a
/// module that needs another distribution's symbols, an optional backend
/// whose system library is absent, bytecode and a data file.
fn install_note_wheels(tb: &Testbed, i: usize) -> std::path::PathBuf {
    let wheels = tb.dir().join(format!("note-wheels-{i}"));
    common::run(
        std::process::Command::new("python3")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/doctor_notes.py"))
            .arg(&wheels),
    );
    let mut pip = std::process::Command::new(tb.host_venv_dir(i).join("bin/python"));
    pip.args(["-m", "pip", "install", "-q", "--no-index", "--no-deps"]);
    for w in fs::read_dir(&wheels).unwrap() {
        pip.arg(w.unwrap().path());
    }
    common::run(&mut pip);
    tb.site_packages(i)
}

/// What a healthy server shows, made here: the bytecode pip wrote and
/// RECORD lists, deleted; the CA bundle, edited by the site.
fn healthy_with_notes(site: &Path) {
    fs::remove_file(site.join("nsuser/__pycache__/util.cpython-311.pyc")).unwrap();
    let pem = site.join("nsuser/cacert.pem");
    let mut text = fs::read_to_string(&pem).unwrap();
    text.push_str("-----BEGIN CERTIFICATE-----\nMIIBsiteCA\n-----END CERTIFICATE-----\n");
    fs::write(&pem, text).unwrap();
}

/// The whole output of `overlay doctor ARGS` for a snapshot: the command,
/// the exit code, stdout and stderr, with the testbed's directory replaced
/// (the rest by [`snapshot`]'s filters).
fn session(tb: &Testbed, args: &[&str]) -> (i32, String) {
    let (code, stdout, stderr) = doctor(tb, args);
    let dir = tb.dir().to_string_lossy().into_owned();
    let text = format!(
        "$ overlay doctor {}\nexit code: {code}\n----- stdout -----\n{stdout}----- stderr -----\n{stderr}",
        args.join(" ")
    )
    .replace(&dir, "[TESTBED]");
    (code, text)
}

/// Assert the snapshot `name` of `text`, with what varies replaced: what
/// the hash cache vouched for (the venv's age), a pyc's recorded mtime,
/// the sizes of gcc-built objects (as tests/sessions.rs does).
fn snapshot(name: &str, text: &str) {
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(
        r"\(\d+ hashed, \d+ from the cache\)",
        "([N] hashed, [N] from the cache)",
    );
    settings.add_filter(r"mtime \d+", "mtime [N]");
    settings.add_filter(
        r"(\.so: size|need) \d+(,| bytes,) (RECORD says|the file has) \d+",
        "$1 [N]$2 $3 [N]",
    );
    settings.bind(|| insta::assert_snapshot!(name, text));
}

/// A healthy venv's findings are notes, one line per kind, exit 0: a module
/// that needs another distribution imported first, an optional backend
/// without its system library, regenerable bytecode, an edited data file.
/// `-v` lists each; `--json` has them all, each with its class.
#[test]
fn what_a_healthy_venv_shows_is_notes() {
    let tb = Testbed::local(2);
    tb.write_manifest(common::SCENARIO_SETS);
    remove_target_stray(&tb.site_packages(1));
    let site = install_note_wheels(&tb, 1);
    healthy_with_notes(&site);

    let (code, text) = session(&tb, &["dst"]);
    assert_eq!(code, 0, "{text}");
    snapshot("notes-healthy", &text);

    let (code, stdout, _) = doctor(&tb, &["dst", "-v"]);
    assert_eq!(code, 0, "{stdout}");
    for line in [
        "  needs another package imported first (1):",
        "    nsuser nsuser/_bridge.cpython-311-x86_64-linux-gnu.so: needs nsprov imported first: its 1 undefined symbol (nsprov_api) is defined by nsprov/lib/libnsprov.so",
        "  optional backend without its system library (1):",
        "    nsuser nsuser/_tbbpool.cpython-311-x86_64-linux-gnu.so: needs libfoo_absent.so.1, which is not found (searched: ",
        "    nsuser nsuser/__pycache__/util.cpython-311.pyc: listed in RECORD, not on disk",
        "    nsuser nsuser/cacert.pem: size 137, RECORD says 72",
    ] {
        assert!(
            stdout.lines().any(|l| l.starts_with(line)),
            "{line}\nnot in\n{stdout}"
        );
    }

    let (code, json, _) = doctor(&tb, &["dst", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["ok"], true);
    let findings = v["report"]["findings"].as_array().unwrap();
    let notes: std::collections::BTreeMap<&str, &str> = findings
        .iter()
        .map(|f| {
            assert_eq!(f["class"], "note", "{f}");
            (f["path"].as_str().unwrap(), f["note"].as_str().unwrap())
        })
        .collect();
    assert_eq!(
        notes,
        [
            (
                "nsuser/__pycache__/util.cpython-311.pyc",
                "regenerable-bytecode"
            ),
            (
                "nsuser/_bridge.cpython-311-x86_64-linux-gnu.so",
                "imported-first"
            ),
            (
                "nsuser/_tbbpool.cpython-311-x86_64-linux-gnu.so",
                "optional-backend"
            ),
            ("nsuser/cacert.pem", "edited-data"),
        ]
        .into_iter()
        .collect(),
    );
    let bridge = findings
        .iter()
        .find(|f| f["note"] == "imported-first")
        .unwrap();
    assert_eq!(bridge["imported_first"], serde_json::json!(["nsprov"]));
    assert_eq!(bridge["kind"], "elf");
}

/// Real damage beside the notes stays a problem (exit 1): a library cut
/// short (whose symbol the bridge module then finds nowhere: no longer a
/// note), an edited `.py` (its bytecode goes stale with it).
#[test]
fn damage_beside_notes_is_a_problem() {
    let tb = Testbed::local(2);
    tb.write_manifest(common::SCENARIO_SETS);
    remove_target_stray(&tb.site_packages(1));
    let site = install_note_wheels(&tb, 1);
    healthy_with_notes(&site);
    let lib = site.join("nsprov/lib/libnsprov.so");
    let bytes = fs::read(&lib).unwrap();
    fs::write(&lib, &bytes[..bytes.len() / 3]).unwrap();
    let init = site.join("nsuser/__init__.py");
    fs::write(&init, "raise ImportError('patched by hand')\n").unwrap();

    let (code, text) = session(&tb, &["dst"]);
    assert_eq!(code, 1, "{text}");
    snapshot("notes-damaged", &text);
    let (_, stdout, _) = doctor(&tb, &["dst"]);
    assert!(
        has(
            &section(&stdout, "elf"),
            "nsuser nsuser/_bridge.cpython-311-x86_64-linux-gnu.so: undefined symbol: nsprov_api"
        ),
        "{stdout}"
    );
    assert!(
        has(
            &section(&stdout, "changed"),
            "nsuser nsuser/__init__.py: size"
        ),
        "{stdout}"
    );
}

/// `doctor --venv PATH`: a venv on this machine, without a manifest or a
/// plan; the same findings as through the manifest's host.
#[test]
fn doctor_checks_a_local_venv_without_a_manifest() {
    let tb = Testbed::local(2);
    let site = tb.site_packages(1);
    remove_target_stray(&site);
    install_note_wheels(&tb, 1);
    healthy_with_notes(&site);
    let venv = tb.host_venv_dir(1).to_string_lossy().into_owned();
    assert!(!tb.manifest_path().exists());
    let (code, stdout, stderr) = doctor(&tb, &["--venv", &venv]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.starts_with("no problems\nnotes: 1 extension needs nsprov imported first, "),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("Checking local ({venv})...")),
        "{stderr}"
    );
    assert!(
        stderr.contains("local: ") && stderr.contains(": no problems, 4 notes"),
        "{stderr}"
    );
    fs::write(site.join("nsuser/util.py"), "x = 2\n").unwrap();
    let (code, stdout, _) = doctor(&tb, &["--venv", &venv, "--json"]);
    assert_eq!(code, 1, "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (v["host"].as_str(), v["ok"].as_bool()),
        (Some("local"), Some(false))
    );
    // Not a venv: a usage error; a host and --venv together: refused.
    let (code, _, stderr) = doctor(&tb, &["--venv", tb.dir().to_str().unwrap()]);
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = doctor(&tb, &["dst", "--venv", &venv]);
    assert_eq!(code, 2, "{stderr}");
}

/// `plan` shares the load model: a module that needs another package
/// imported first is no predicted problem, when the plan brings it; a real
/// missing symbol still is.
#[test]
fn plan_does_not_warn_about_a_module_imported_after_its_provider() {
    let tb = Testbed::local(2);
    tb.write_manifest(&format!(
        "{}\n[sets.nsuser]\ndists = [\"nsuser\"]\n",
        common::SCENARIO_SETS
    ));
    install_note_wheels(&tb, 0);
    install_note_wheels(&tb, 1);
    // dst has nsprov but not nsuser: the plan brings the bridge module.
    common::run(
        std::process::Command::new(tb.host_venv_dir(1).join("bin/python")).args([
            "-m",
            "pip",
            "uninstall",
            "-q",
            "-y",
            "nsuser",
        ]),
    );
    let plan = |what: &str| {
        let out = tb
            .overlay(&["plan", "src", "dst", "--set", "nsuser", "--json"])
            .output()
            .unwrap();
        let out = common::ok(out, what);
        let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (plan, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (p, stderr) = plan("plan");
    assert!(
        !stderr.contains("nsprov_api") && !p.to_string().contains("nsprov_api"),
        "{stderr}\n{p}"
    );
    // Without nsprov the symbol is defined nowhere: a predicted problem.
    common::run(
        std::process::Command::new(tb.host_venv_dir(1).join("bin/python")).args([
            "-m",
            "pip",
            "uninstall",
            "-q",
            "-y",
            "nsprov",
        ]),
    );
    let (p, stderr) = plan("plan without nsprov");
    assert!(
        stderr.contains("undefined symbol: nsprov_api"),
        "{stderr}\n{p}"
    );
}
