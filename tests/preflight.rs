//! `overlay plan`'s preflight: predicted import failures on the target
//! (`"problems"` in `plan --json`, warnings on stderr), each confirmed by a
//! real apply and a real import in the target venv, then rolled back.
//!
//! The fixtures are the `pf` family of tests/fixtures/testbed.py (see its
//! "Preflight scenario" section for which set triggers which problem and
//! what the import then prints): host 0 (`src`) has role pf-source, host 1
//! (`dst`) pf-target.
//!
//! Order in every case: plan (problems recorded), import on the target (works),
//! apply --backup, import again (fails as predicted), rollback, import (works
//! again), and only then the assertions on the predicted problems: so the
//! fixtures and the real failures are checked even where the prediction is
//! still missing or wrong.

mod common;

use common::{Testbed, ok};

/// Every set of the testbed.py preflight scenario; `--set` selects.
const MANIFEST: &str = r#"
# Triggers: each predicts one problem and breaks one import after apply.
[sets.pfbase]
dists = ["pfbase"]
[sets.pfsym]
dists = ["pfsym"]
[sets.pfverext]
dists = ["pfverext"]
[sets.pfrpath-ext]
files = ["pfrpath/_ext.cpython-311-x86_64-linux-gnu.so"]
[sets.pfopt]
dists = ["pfopt"]
[sets.pfapp]
dists = ["pfapp"]
[sets.pftorch]
dists = ["pftorch"]

# Consistent: no problem, everything left on the target imports.
[sets.pfbase-pfext]
dists = ["pfbase", "pfext"]
[sets.pfsym-all]
dists = ["pfsym", "pfsymuser"]
[sets.pfver]
dists = ["pfver", "pfverext"]
[sets.pfrpath]
dists = ["pfrpath"]
[sets.pflocal]
dists = ["pflocal"]
[sets.pfopt-full]
dists = ["pfopt", "pfmissing"]
[sets.pfapp-full]
dists = ["pfapp", "pfb64"]
[sets.pftorch-stack]
dists = ["pftorch", "pfvision", "pfnvidia-*"]

[preflight]
cuda_family = ["pftorch", "pfvision"]
"#;

/// The sets that together keep the target consistent.
const CONSISTENT: &[&str] = &[
    "pfbase-pfext",
    "pfsym-all",
    "pfver",
    "pfrpath",
    "pflocal",
    "pfopt-full",
    "pfapp-full",
    "pftorch-stack",
];

/// Imports each module and prints one line per module:
/// `NAME: ok (info())` or `NAME: ExceptionType: message`.
const PROBE: &str = r#"
import importlib


def probe(mods):
    for m in mods:
        try:
            mod = importlib.import_module(m)
            info = getattr(mod, "info", None)
            print(m + ": ok" + (" (" + info() + ")" if info else ""))
        except BaseException as e:
            print(m + ": " + type(e).__name__ + ": " + str(e))
"#;

/// `python -m pip check` in the venv (exit status 1 when something is broken).
const PIP_CHECK: &str = r#"
import sys
from pip._internal.cli.main import main
sys.exit(main(["check", "--disable-pip-version-check"]))
"#;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The probe's output for `mods` in host `i`'s venv, one line per module.
fn imports(tb: &Testbed, i: usize, mods: &[&str]) -> Vec<String> {
    let out = ok(
        tb.python(i, &format!("{PROBE}\nprobe({mods:?})\n"))
            .output()
            .unwrap(),
        "import probe",
    );
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), mods.len(), "probe output: {lines:?}");
    lines
}

fn assert_imports_ok(tb: &Testbed, i: usize, mods: &[&str], when: &str) {
    for line in imports(tb, i, mods) {
        let (m, rest) = line.split_once(": ").unwrap();
        assert!(
            rest.starts_with("ok"),
            "{when}: {m} does not import: {line}"
        );
    }
}

/// (exit code, stdout) of pip check on host `i`.
fn pip_check(tb: &Testbed, i: usize) -> (i32, String) {
    let out = tb.python(i, PIP_CHECK).output().unwrap();
    (out.status.code().unwrap_or(-1), text(&out.stdout))
}

/// What a case expects of `overlay plan`.
struct Expect {
    check: &'static str,
    /// The problem's `dist` must be one of these.
    dists: &'static [&'static str],
    /// Its `file` must be one of these (`None`: must be null; `Some(&[])`: any).
    files: Option<&'static [&'static str]>,
    /// Each must appear in `reason` (ASCII case-insensitive).
    reason: &'static [&'static str],
}

struct Planned {
    problems: Vec<serde_json::Value>,
    stderr: String,
}

fn plan(tb: &Testbed, sets: &[&str]) -> Planned {
    tb.write_manifest(MANIFEST);
    let mut args = vec!["plan", "src", "dst", "--json"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let out = ok(tb.overlay(&args).output().unwrap(), "plan");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("plan --json: {e}:\n{}", text(&out.stdout)));
    let problems = match &json["problems"] {
        serde_json::Value::Array(a) => a.clone(),
        serde_json::Value::Null => Vec::new(),
        other => panic!("\"problems\" is not an array: {other}"),
    };
    Planned {
        problems,
        stderr: text(&out.stderr),
    }
}

fn apply(tb: &Testbed) {
    ok(
        tb.overlay(&["apply", "--backup"]).output().unwrap(),
        "apply",
    );
}

fn rollback(tb: &Testbed) {
    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
}

fn matches(p: &serde_json::Value, e: &Expect) -> bool {
    let reason = p["reason"].as_str().unwrap_or("").to_ascii_lowercase();
    p["check"] == e.check
        && p["dist"].as_str().is_some_and(|d| e.dists.contains(&d))
        && match e.files {
            None => p["file"].is_null(),
            Some([]) => true,
            Some(files) => p["file"].as_str().is_some_and(|f| files.contains(&f)),
        }
        && e.reason
            .iter()
            .all(|r| reason.contains(&r.to_ascii_lowercase()))
}

/// Each expectation is met by some problem, every problem concerns one of
/// the expected dists (no noise about the rest of the venv), and the first
/// key part of each reason is also on stderr (the warnings).
fn assert_problems(planned: &Planned, expect: &[Expect]) {
    let all = serde_json::to_string_pretty(&planned.problems).unwrap();
    for e in expect {
        assert!(
            planned.problems.iter().any(|p| matches(p, e)),
            "no predicted problem with check {:?}, dist in {:?}, file in {:?}, reason containing {:?}; problems:\n{all}\nstderr:\n{}",
            e.check,
            e.dists,
            e.files,
            e.reason,
            planned.stderr
        );
        assert!(
            planned
                .stderr
                .to_ascii_lowercase()
                .contains(&e.reason[0].to_ascii_lowercase()),
            "the problem about {:?} is not among the warnings on stderr:\n{}",
            e.reason[0],
            planned.stderr
        );
    }
    for p in &planned.problems {
        assert!(
            expect
                .iter()
                .any(|e| p["dist"].as_str().is_some_and(|d| e.dists.contains(&d))),
            "unexpected problem {p}; all problems:\n{all}"
        );
    }
}

fn assert_no_problems(planned: &Planned) {
    assert!(
        planned.problems.is_empty(),
        "a consistent overlay, yet problems were predicted:\n{}",
        serde_json::to_string_pretty(&planned.problems).unwrap()
    );
}

/// One trigger case on a local pf testbed: plan, import before, apply,
/// import after (each `after` fragment must be in that module's line),
/// rollback, import again, then the predicted problems.
fn trigger_case(tb: &Testbed, sets: &[&str], after: &[(&str, &[&str])], expect: &[Expect]) {
    let t0 = std::time::Instant::now();
    let planned = plan(tb, sets);
    let mods: Vec<&str> = after.iter().map(|(m, _)| *m).collect();
    assert_imports_ok(tb, 1, &mods, "before apply");
    apply(tb);
    let lines = imports(tb, 1, &mods);
    for ((m, frags), line) in after.iter().zip(&lines) {
        eprintln!("after apply of {sets:?}: {line}");
        assert!(
            !line.starts_with(&format!("{m}: ok")),
            "{m} still imports: {line}"
        );
        for f in *frags {
            assert!(line.contains(f), "{m}: {f:?} not in {line:?}");
        }
    }
    rollback(tb);
    assert_imports_ok(tb, 1, &mods, "after rollback");
    eprintln!(
        "{sets:?}: confirmed in {:.1}s; predicted: {}",
        t0.elapsed().as_secs_f64(),
        serde_json::to_string(&planned.problems).unwrap()
    );
    assert_problems(&planned, expect);
}

fn local() -> Testbed {
    Testbed::with_roles(&["pf-source", "pf-target"], false)
}

/// Case 1 over SSH: pfbase 2.0 ships only libpfbase.so.1's successor, so the
/// staying pfext's extension loses its DT_NEEDED libpfbase.so.1.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn deleting_a_needed_library_is_predicted_over_ssh() {
    let tb = Testbed::with_roles(&["pf-source", "pf-target"], true);
    let t0 = std::time::Instant::now();
    let planned = plan(&tb, &["pfbase"]);
    eprintln!("ssh plan: {:.1}s", t0.elapsed().as_secs_f64());
    let probe = "/root/venv/bin/python -c 'import pfext._ext as e; print(e.info())'";
    let before = ok(tb.ssh(1, probe).output().unwrap(), "import before apply");
    assert!(text(&before.stdout).contains("libpfbase abi 1"));
    let t1 = std::time::Instant::now();
    apply(&tb);
    eprintln!("ssh apply: {:.1}s", t1.elapsed().as_secs_f64());
    let out = tb.ssh(1, probe).output().unwrap();
    let err = text(&out.stderr);
    eprintln!(
        "after apply of pfbase (ssh): {}",
        err.lines().last().unwrap_or("")
    );
    assert!(
        !out.status.success(),
        "pfext._ext still imports: {}",
        text(&out.stdout)
    );
    assert!(
        err.contains("ImportError: libpfbase.so.1: cannot open shared object file"),
        "{err}"
    );
    let t2 = std::time::Instant::now();
    rollback(&tb);
    eprintln!("ssh rollback: {:.1}s", t2.elapsed().as_secs_f64());
    ok(tb.ssh(1, probe).output().unwrap(), "import after rollback");
    eprintln!(
        "[\"pfbase\"] over ssh: confirmed in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    assert_problems(
        &planned,
        &[Expect {
            check: "elf",
            dists: &["pfext"],
            files: Some(&["pfext/_ext.cpython-311-x86_64-linux-gnu.so"]),
            reason: &["libpfbase.so.1"],
        }],
    );
}

/// Case 1 on the local transport (its consistent companion, pfbase-pfext, is
/// part of the consistent overlay below).
#[test]
fn deleting_a_needed_library_is_predicted() {
    let tb = local();
    trigger_case(
        &tb,
        &["pfbase"],
        &[(
            "pfext._ext",
            &["ImportError: libpfbase.so.1: cannot open shared object file"],
        )],
        &[Expect {
            check: "elf",
            dists: &["pfext"],
            files: Some(&["pfext/_ext.cpython-311-x86_64-linux-gnu.so"]),
            reason: &["libpfbase.so.1"],
        }],
    );
}

/// Case 2: pfsym 2.0's libpfsym.so.1 no longer defines pf_old_api nor
/// pfsym::old_api(int), used by the target-only pfsymuser (outside the set).
/// pfsymuser._ext's weak, never-defined pf_optional_hook is no problem.
#[test]
fn a_symbol_removed_from_a_replaced_library_is_predicted() {
    let tb = local();
    trigger_case(
        &tb,
        &["pfsym"],
        &[
            ("pfsymuser._ext", &["undefined symbol: pf_old_api"]),
            ("pfsymuser._cxx", &["undefined symbol: _ZN5pfsym7old_apiEi"]),
        ],
        &[
            Expect {
                check: "elf",
                dists: &["pfsymuser"],
                files: Some(&["pfsymuser/_ext.cpython-311-x86_64-linux-gnu.so"]),
                reason: &["pf_old_api"],
            },
            Expect {
                check: "elf",
                dists: &["pfsymuser"],
                files: Some(&["pfsymuser/_cxx.cpython-311-x86_64-linux-gnu.so"]),
                reason: &["pfsym::old_api(int)"],
            },
        ],
    );
}

/// Case 3: the source's pfverext needs PFVER_2.0 of libpfver.so.1; the
/// target's pfver (outside the set, staying) defines only PFVER_1.0.
#[test]
fn a_version_need_nothing_provides_is_predicted() {
    let tb = local();
    trigger_case(
        &tb,
        &["pfverext"],
        &[("pfverext._ext", &["version `PFVER_2.0' not found"])],
        &[Expect {
            check: "elf",
            dists: &["pfverext"],
            files: Some(&["pfverext/_ext.cpython-311-x86_64-linux-gnu.so"]),
            reason: &["PFVER_2.0"],
        }],
    );
}

/// Case 4: the target's pfrpath._ext finds deps/libpfb.so's own dependency
/// libpfc.so through its DT_RPATH (inherited); the source's _ext has a
/// DT_RUNPATH (not inherited), and the target's deps/libpfb.so has no path.
#[test]
fn runpath_is_not_inherited_unlike_rpath() {
    let tb = local();
    trigger_case(
        &tb,
        &["pfrpath-ext"],
        &[(
            "pfrpath._ext",
            &["ImportError: libpfc.so: cannot open shared object file"],
        )],
        &[Expect {
            check: "elf",
            dists: &["pfrpath"],
            // The module that fails to import, or the library whose NEEDED is unresolved.
            files: Some(&[
                "pfrpath/_ext.cpython-311-x86_64-linux-gnu.so",
                "pfrpath/deps/libpfb.so",
            ]),
            reason: &["libpfc.so"],
        }],
    );
}

/// Case 5a: pfreq (staying) requires pfopt[fast]; pfopt 2.0's extra `fast`
/// requires pfmissing, not installed on the target. pip check cannot see it
/// (it ignores the extras a requirement asks for).
#[test]
fn a_missing_requirement_of_a_requested_extra_is_predicted() {
    let tb = local();
    trigger_case(
        &tb,
        &["pfopt"],
        &[(
            "pfreq",
            &["ModuleNotFoundError: No module named 'pfmissing'"],
        )],
        &[Expect {
            check: "requirements",
            // The dist whose Requires-Dist is unmet, or the one that asked for the extra.
            dists: &["pfopt", "pfreq"],
            files: None,
            reason: &["pfmissing"],
        }],
    );
}

/// Case 5b: pfapp 2.0 (carried) requires pfb64, absent on the target (like
/// sglang and pybase64); pip check confirms it after the apply.
#[test]
fn a_missing_requirement_of_a_carried_dist_is_predicted() {
    let tb = local();
    let planned = plan(&tb, &["pfapp"]);
    assert_eq!(pip_check(&tb, 1).0, 0);
    apply(&tb);
    let (code, out) = pip_check(&tb, 1);
    eprintln!(
        "pip check after apply of pfapp: exit {code}: {}",
        out.trim()
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("pfapp 2.0 requires pfb64, which is not installed."),
        "{out}"
    );
    let line = &imports(&tb, 1, &["pfapp"])[0];
    eprintln!("after apply of pfapp: {line}");
    assert!(
        line.contains("ModuleNotFoundError: No module named 'pfb64'"),
        "{line}"
    );
    rollback(&tb);
    assert_imports_ok(&tb, 1, &["pfapp"], "after rollback");
    assert_eq!(pip_check(&tb, 1).0, 0);
    assert_problems(
        &planned,
        &[Expect {
            check: "requirements",
            dists: &["pfapp"],
            files: None,
            reason: &["pfb64"],
        }],
    );
}

/// Case 5c: no problem: pfreq's `pflocal==1.0` is satisfied by 1.0+cu130
/// (PEP 440 ignores the local label) and `pfwin; sys_platform == "win32"`
/// is excluded by its marker.
#[test]
fn a_local_label_and_an_excluded_marker_are_no_problem() {
    let tb = local();
    let planned = plan(&tb, &["pflocal"]);
    apply(&tb);
    let out = ok(
        tb.python(
            1,
            "import importlib.metadata as m, pfreq, pflocal; print(m.version('pflocal'), pflocal.__version__)",
        )
        .output()
        .unwrap(),
        "import pfreq",
    );
    assert_eq!(text(&out.stdout).trim(), "1.0+cu130 1.0+cu130");
    let (code, check) = pip_check(&tb, 1);
    assert_eq!(code, 0, "{check}");
    rollback(&tb);
    assert_no_problems(&planned);
}

/// Case 6: pftorch 2.11.0+cu130 onto a target whose pfvision (built for CUDA
/// 12: +cu128, its _C needs libcudart.so.12) stays: pfvision's import raises.
#[test]
fn a_cuda_major_mix_is_predicted() {
    let tb = local();
    trigger_case(
        &tb,
        &["pftorch"],
        &[(
            "pfvision",
            &[
                "RuntimeError: Detected that pftorch and pfvision were compiled with different CUDA major versions",
            ],
        )],
        &[Expect {
            check: "cuda",
            dists: &["pfvision", "pftorch"],
            files: Some(&[]),
            reason: &["cuda", "12", "13"],
        }],
    );
}

/// All the consistent sets at once: no problem predicted, pip check clean,
/// every module left on the target imports (pfsymuser is deleted by
/// pfsym-all: it exists only on the target).
#[test]
fn the_consistent_overlay_has_no_problems_and_imports() {
    let tb = local();
    let t0 = std::time::Instant::now();
    let planned = plan(&tb, CONSISTENT);
    let mods = [
        "pfext._ext",
        "pfverext._ext",
        "pfrpath._ext",
        "pfreq",
        "pfapp",
        "pfvision",
        "pfmissing",
        "pfb64",
    ];
    apply(&tb);
    for line in imports(&tb, 1, &mods) {
        eprintln!("after the consistent overlay: {line}");
    }
    assert_imports_ok(&tb, 1, &mods, "after the consistent overlay");
    let gone = &imports(&tb, 1, &["pfsymuser"])[0];
    assert!(gone.contains("ModuleNotFoundError"), "{gone}");
    let info = ok(
        tb.python(
            1,
            "import pfvision._C as c; print(c.info(), c.cuda_version())",
        )
        .output()
        .unwrap(),
        "pfvision._C",
    );
    assert_eq!(
        text(&info.stdout).trim(),
        "pfvision 0.26.0+cu130 on cudart 13.0.96 13000"
    );
    let (code, check) = pip_check(&tb, 1);
    assert_eq!(code, 0, "{check}");
    rollback(&tb);
    assert_imports_ok(
        &tb,
        1,
        &["pfsymuser._ext", "pfsymuser._cxx"],
        "after rollback",
    );
    eprintln!(
        "consistent overlay: confirmed in {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    assert_no_problems(&planned);
}

// ---------------------------------------------------------------------------
// The load model (roles pf-lm-source / pf-lm-target, "Preflight load model"
// in testbed.py): what counts as loaded, optional plugins, pre-existing
// problems as one line, grouped causes.
// ---------------------------------------------------------------------------

const LM_MANIFEST: &str = r#"
[sets.lm-plugin]
dists = ["pfplug"]
[sets.lm-plugin-reached]
dists = ["pfplug", "pfplugext"]
[sets.lm-torch]
dists = ["pfltorch", "pfltvision"]
"#;

fn lm() -> Testbed {
    Testbed::with_roles(&["pf-lm-source", "pf-lm-target"], false)
}

/// `overlay plan` of `sets` with `--json`: the problems.
fn lm_plan_json(tb: &Testbed, sets: &[&str]) -> Vec<serde_json::Value> {
    tb.write_manifest(LM_MANIFEST);
    let mut args = vec!["plan", "src", "dst", "--json"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let out = ok(tb.overlay(&args).output().unwrap(), "plan --json");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["problems"].as_array().cloned().unwrap_or_default()
}

/// The problem section of `overlay plan` (text, `-v` when `verbose`): the
/// problem lines of stderr and the summary line of stdout, as snapshotted.
fn lm_plan_text(tb: &Testbed, sets: &[&str], verbose: bool) -> String {
    tb.write_manifest(LM_MANIFEST);
    let mut args = vec!["plan", "src", "dst"];
    if verbose {
        args.push("-v");
    }
    for s in sets {
        args.extend(["--set", s]);
    }
    let out = ok(tb.overlay(&args).output().unwrap(), "plan");
    let stderr = text(&out.stderr);
    let mut lines: Vec<&str> = stderr
        .lines()
        .filter(|l| {
            l.starts_with("warning: ")
                || l.starts_with("error: ")
                || l.starts_with("note: ")
                || l.starts_with("  ")
        })
        .collect();
    let stdout = text(&out.stdout);
    let summary = stdout.lines().last().unwrap_or("").to_string();
    lines.push(&summary);
    let site = tb.site_packages(1).display().to_string();
    lines.join("\n").replace(&site, "[SITE]") + "\n"
}

fn lm_snapshot(name: &str, text: &str) {
    insta::with_settings!({
        filters => vec![
            (r"\b\d+(\.\d+)? (B|KiB|MiB|GiB) to transfer", "[SIZE] to transfer"),
        ],
        omit_expression => true,
        prepend_module_to_snapshot => true,
    }, {
        insta::assert_snapshot!(name, text);
    });
}

/// The ids of new (not pre-existing, not optional) problems.
fn lm_new(problems: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    problems
        .iter()
        .filter(|p| p["preexisting"] != true && p["optional"] != true)
        .collect()
}

/// pflbroken and pflbroken2's unmet requirement; pflstale's missing
/// library, its extension re-checked because pfplug replaces its other
/// dependency (libpfplugbase.so): the same problem as before.
const PREEXISTING_LINE: &str = "note: 2 requirement problems and 1 ELF problem existed before this overlay and are unchanged; `plan -v` lists them";

/// (a) pfplug 2.0 brings a plugin whose DT_NEEDED nothing provides, but no
/// extension module reaches it: not a new problem, one note by default,
/// listed with -v; `import pfplug._core` works after the apply.
#[test]
fn lm_an_unreached_plugin_is_optional() {
    let tb = lm();
    let problems = lm_plan_json(&tb, &["lm-plugin"]);
    let default = lm_plan_text(&tb, &["lm-plugin"], false);
    let verbose = lm_plan_text(&tb, &["lm-plugin"], true);
    apply(&tb);
    assert_imports_ok(&tb, 1, &["pfplug._core"], "after apply of pfplug 2.0");
    let plugin = tb.site_packages(1).join("pfplug/plugins/libpfplug_rdma.so");
    assert!(plugin.is_file(), "the plugin was placed");
    rollback(&tb);
    let all = serde_json::to_string_pretty(&problems).unwrap();
    assert!(lm_new(&problems).is_empty(), "{all}");
    assert!(
        problems.iter().any(|p| p["optional"] == true
            && p["file"] == "pfplug/plugins/libpfplug_rdma.so"
            && p["cause"] == "needs libpfibverbs.so.1, which is not found"),
        "{all}"
    );
    assert!(
        problems.iter().any(|p| p["preexisting"] == true
            && p["check"] == "elf"
            && p["file"] == "pflstale/_ext.cpython-311-x86_64-linux-gnu.so"
            && p["cause"] == "needs libpfibverbs.so.1, which is not found"),
        "{all}"
    );
    assert!(default.contains(PREEXISTING_LINE), "{default}");
    assert!(
        default
            .contains("note: optional plugins with unmet needs: 1 in pfplug; `plan -v` lists them"),
        "{default}"
    );
    assert!(!default.contains("libpfibverbs"), "{default}");
    assert!(verbose.contains("libpfibverbs.so.1"), "{verbose}");
    lm_snapshot("lm_plugin_default", &default);
    lm_snapshot("lm_plugin_verbose", &verbose);
}

/// (a) The same plugin reached from pfplugext's two extension modules: a new
/// problem, one grouped line for both files; the import fails after apply.
#[test]
fn lm_a_plugin_reached_from_an_extension_is_a_problem() {
    let tb = lm();
    let problems = lm_plan_json(&tb, &["lm-plugin-reached"]);
    let default = lm_plan_text(&tb, &["lm-plugin-reached"], false);
    let verbose = lm_plan_text(&tb, &["lm-plugin-reached"], true);
    apply(&tb);
    for m in ["pfplugext._ext", "pfplugext._ext2"] {
        let line = &imports(&tb, 1, &[m])[0];
        eprintln!("after apply of lm-plugin-reached: {line}");
        assert!(
            line.contains("libpfibverbs.so.1: cannot open shared object file"),
            "{line}"
        );
    }
    rollback(&tb);
    let all = serde_json::to_string_pretty(&problems).unwrap();
    let new = lm_new(&problems);
    assert_eq!(new.len(), 2, "{all}");
    for p in new {
        assert_eq!(p["cause"], "needs libpfibverbs.so.1, which is not found");
        assert_eq!(p["dist"], "pfplugext");
    }
    assert!(
        default.contains("warning: [elf] needs libpfibverbs.so.1, which is not found: 2 files"),
        "{default}"
    );
    lm_snapshot("lm_plugin_reached_default", &default);
    lm_snapshot("lm_plugin_reached_verbose", &verbose);
}

/// (b) pfltvision's image.so needs libpfltorch_python.so with no path to it;
/// importing pfltorch (which pfltvision requires) has loaded it by soname
/// through pfltorch._C. Both are new on the target: no problem, and the
/// import works. (d) A consistent overlay predicts nothing new; (c) the
/// target's own requirement problems are one line.
#[test]
fn lm_a_library_an_earlier_import_loaded_is_no_problem() {
    let tb = lm();
    let problems = lm_plan_json(&tb, &["lm-torch"]);
    let default = lm_plan_text(&tb, &["lm-torch"], false);
    let verbose = lm_plan_text(&tb, &["lm-torch"], true);
    apply(&tb);
    assert_imports_ok(&tb, 1, &["pfltvision", "pfltvision.image"], "after apply");
    rollback(&tb);
    let all = serde_json::to_string_pretty(&problems).unwrap();
    assert!(lm_new(&problems).is_empty(), "{all}");
    assert_eq!(
        problems
            .iter()
            .filter(|p| p["preexisting"] == true && p["check"] == "requirements")
            .count(),
        2,
        "{all}"
    );
    assert_eq!(
        default.lines().filter(|l| l.starts_with("note: ")).count(),
        1,
        "{default}"
    );
    assert!(
        default.contains("note: 2 requirement problems existed before this overlay and are unchanged; `plan -v` lists them"),
        "{default}"
    );
    assert!(default.contains(", 0 predicted problems"), "{default}");
    lm_snapshot("lm_torch_default", &default);
    lm_snapshot("lm_torch_verbose", &verbose);
}
