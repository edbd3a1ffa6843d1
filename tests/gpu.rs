//! The GPU check of `overlay plan` and `overlay doctor`: the target's NVIDIA
//! driver and GPUs against the CUDA code the overlay brings (docs/preflight.md#gpu).
//!
//! The machine is faked in the target test host's own mount namespace, as
//! the agent reads it: `/proc/driver` and `/sys/module` are bound to
//! folders of the host's directory holding `nvidia/version`, and
//! `/usr/local/bin` to one holding an `nvidia-smi` stand-in that answers
//! from `/root/fake-gpus` (the host's private /root). The fixtures are the
//! pf-gpu roles of tests/fixtures/testbed.py: a CUDA 13 pfgtorch (SASS for
//! sm_75 … sm_120, no PTX, like torch's wheels) over a CUDA 12.8 one (sm_70
//! too), an sm_90a-only extension, an extension covered on newer GPUs only
//! by PTX of CUDA 12.8, and sgl-kernel's per-architecture builds.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{Testbed, ok};

const MANIFEST: &str = r#"
[sets.gpu]
dists = ["pfgtorch", "pfga", "pfgptx", "sgl-kernel"]
"#;

const H100: &str = "NVIDIA H100 80GB HBM3, 9.0, 81559";
const V100: &str = "Tesla V100-SXM2-32GB, 7.0, 32768";
const A100: &str = "NVIDIA A100-SXM4-80GB, 8.0, 81920";

/// The `nvidia-smi` stand-in: `--query-gpu` answers from /root/fake-gpus
/// (`name, compute_cap, memory`); with /root/fake-gpus.old it is a driver
/// that does not know `compute_cap`, as R470's.
const NVIDIA_SMI: &str = r#"#!/bin/sh
# overlay test stand-in for nvidia-smi (tests/gpu.rs)
case "$*" in
  *--query-gpu=*compute_cap*)
    if [ -e /root/fake-gpus.old ]; then
      echo 'Field "compute_cap" is not a valid field to query.'; exit 2
    fi
    cat /root/fake-gpus ;;
  *--query-gpu=name,memory.total*) cut -d, -f1,3 /root/fake-gpus ;;
  *) exit 0 ;;
esac
"#;

/// The faked machine of one test host.
struct FakeMachine {
    dir: PathBuf,
    root: PathBuf,
}

impl FakeMachine {
    /// Bind the fake folders over the host's `/proc/driver`, `/sys/module`
    /// and `/usr/local/bin`, in its mount namespace only.
    fn install(tb: &Testbed, i: usize) -> FakeMachine {
        let host = tb.host_dir(i);
        let dir = host.join("fake");
        for d in ["proc-driver", "sys-module", "bin"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let smi = dir.join("bin/nvidia-smi");
        std::fs::write(&smi, NVIDIA_SMI).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
        let pid = std::fs::read_to_string(host.join("pid")).unwrap();
        let d = dir.display();
        ok(
            Command::new("nsenter")
                .args(["-t", pid.trim(), "-m", "sh", "-c"])
                .arg(format!(
                    "mount --bind {d}/proc-driver /proc/driver && \
                     mount --bind {d}/sys-module /sys/module && \
                     mount --bind {d}/bin /usr/local/bin"
                ))
                .output()
                .unwrap(),
            "bind the fake machine",
        );
        FakeMachine {
            dir,
            root: host.join("root"),
        }
    }

    /// A driver of `version` (none: no NVIDIA module) and these GPUs
    /// (`nvidia-smi` CSV lines); `old_smi`: its nvidia-smi rejects
    /// `compute_cap`.
    fn set(&self, version: Option<&str>, gpus: &[&str], old_smi: bool) {
        for d in ["proc-driver/nvidia", "sys-module/nvidia"] {
            let _ = std::fs::remove_dir_all(self.dir.join(d));
        }
        if let Some(v) = version {
            std::fs::create_dir_all(self.dir.join("proc-driver/nvidia")).unwrap();
            std::fs::create_dir_all(self.dir.join("sys-module/nvidia")).unwrap();
            std::fs::write(
                self.dir.join("proc-driver/nvidia/version"),
                format!(
                    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  (dvs-builder@U22)  Thu Jul 31 2025\nGCC version:  gcc version 12.2.0\n"
                ),
            )
            .unwrap();
            std::fs::write(self.dir.join("sys-module/nvidia/version"), format!("{v}\n")).unwrap();
        }
        let mut csv = gpus.join("\n");
        csv.push('\n');
        std::fs::write(self.root.join("fake-gpus"), csv).unwrap();
        let old = self.root.join("fake-gpus.old");
        if old_smi {
            std::fs::write(old, "").unwrap();
        } else {
            let _ = std::fs::remove_file(old);
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct Planned {
    json: serde_json::Value,
    /// The new problems of the GPU check (not pre-existing, not optional).
    gpu: Vec<serde_json::Value>,
    /// Every new problem.
    new: Vec<serde_json::Value>,
    text: String,
}

fn plan(tb: &Testbed) -> Planned {
    let out = ok(
        tb.overlay(&["plan", "src", "dst", "--json"])
            .output()
            .unwrap(),
        "plan --json",
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let new: Vec<serde_json::Value> = json["problems"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p["preexisting"] != true && p["optional"] != true)
        .collect();
    let gpu = new
        .iter()
        .filter(|p| p["check"] == "gpu")
        .cloned()
        .collect();
    let out = ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    Planned {
        json,
        gpu,
        new,
        text: format!("{}{}", text(&out.stdout), text(&out.stderr)),
    }
}

fn reasons(p: &Planned) -> String {
    serde_json::to_string_pretty(&p.new).unwrap()
}

fn has(p: &Planned, dist: &str, file: Option<&str>, parts: &[&str]) -> bool {
    p.gpu.iter().any(|g| {
        let reason = g["reason"].as_str().unwrap_or("");
        g["dist"] == dist
            && file.is_none_or(|f| g["file"] == f)
            && parts.iter().all(|s| reason.contains(s))
    })
}

fn ext(name: &str) -> String {
    format!("{name}/_C.cpython-311-x86_64-linux-gnu.so")
}

fn testbed() -> (Testbed, FakeMachine) {
    let tb = Testbed::with_roles(&["pf-gpu-source", "pf-gpu-target"], true);
    tb.write_manifest(MANIFEST);
    let fake = FakeMachine::install(&tb, 1);
    (tb, fake)
}

/// Every case of the plan's GPU check on one pair of hosts, the target's
/// machine changed between plans.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn the_plan_judges_the_targets_driver_and_gpus() {
    let (tb, fake) = testbed();

    // A CUDA 13 stack onto driver 570: the driver and 580 are named.
    fake.set(Some("570.172.08"), &[H100, H100], false);
    let p = plan(&tb);
    assert_eq!(
        p.json["target_machine"]["driver"],
        serde_json::json!({"state": "loaded", "version": "570.172.08"})
    );
    assert!(
        has(
            &p,
            "pfgtorch",
            None,
            &[
                "2.11.0+cu130 needs an NVIDIA driver ≥ 580.65.06 (CUDA 13)",
                "dst has 570.172.08 (CUDA ≤ 12.8)"
            ]
        ),
        "{}",
        reasons(&p)
    );
    assert_eq!(p.gpu.len(), 1, "only the driver: {}", reasons(&p));
    assert!(
        p.text.contains("  dst: NVIDIA driver 570.172.08 (CUDA ≤ 12.8), 2 × NVIDIA H100 80GB HBM3 (sm_90, 80 GiB)"),
        "{}",
        p.text
    );
    assert!(
        p.text.contains("needs an NVIDIA driver ≥ 580.65.06"),
        "{}",
        p.text
    );

    // Onto an H100 with driver 580: nothing new. sgl-kernel's sm100 build
    // (no sm_90 code) is not what its loader picks there.
    fake.set(Some("580.159.04"), &[H100; 8], false);
    let p = plan(&tb);
    assert!(p.new.is_empty(), "{}", reasons(&p));
    assert!(p.text.contains("0 predicted problems"), "{}", p.text);

    // Onto V100s: torch's library names sm_70 and what it has; the
    // `a`-only module, PTX for newer GPUs only, and sgl-kernel's sm100
    // build (its loader's pick on 7.0) have nothing either.
    fake.set(Some("580.159.04"), &[V100; 8], false);
    let p = plan(&tb);
    assert!(
        has(
            &p,
            "pfgtorch",
            Some("pfgtorch/lib/libpfgtorch_cuda.so"),
            &[
                "dst's 8 × Tesla V100-SXM2-32GB (sm_70)",
                "has kernels for sm_75, sm_80",
                "sm_120",
                "no PTX"
            ]
        ),
        "{}",
        reasons(&p)
    );
    assert!(
        has(&p, "pfga", Some(&ext("pfga")), &["sm_70", "sm_90a"]),
        "{}",
        reasons(&p)
    );
    assert!(
        has(
            &p,
            "pfgptx",
            Some(&ext("pfgptx")),
            &["sm_70", "PTX for sm_80"]
        ),
        "{}",
        reasons(&p)
    );
    assert!(
        has(
            &p,
            "sgl-kernel",
            Some("sgl_kernel/sm100/common_ops.abi3.so"),
            &["sm_70"]
        ),
        "{}",
        reasons(&p)
    );
    assert!(
        !p.gpu
            .iter()
            .any(|g| g["file"] == "sgl_kernel/sm90/common_ops.abi3.so"),
        "{}",
        reasons(&p)
    );
    assert_eq!(p.gpu.len(), 4, "{}", reasons(&p));
    assert!(
        p.text
            .contains("no kernel for 8 × Tesla V100-SXM2-32GB (sm_70)"),
        "{}",
        p.text
    );

    // A host of two GPU kinds is judged per kind: only the A100s fail, for
    // the `a`-only module and sgl-kernel's sm100 build.
    fake.set(Some("580.159.04"), &[H100, H100, A100, A100], false);
    let p = plan(&tb);
    assert!(
        has(
            &p,
            "pfga",
            Some(&ext("pfga")),
            &["2 × NVIDIA A100-SXM4-80GB (sm_80)"]
        ),
        "{}",
        reasons(&p)
    );
    assert!(
        has(
            &p,
            "sgl-kernel",
            Some("sgl_kernel/sm100/common_ops.abi3.so"),
            &["sm_80"]
        ),
        "{}",
        reasons(&p)
    );
    assert_eq!(p.gpu.len(), 2, "{}", reasons(&p));

    // A GPU covered only by PTX, with a driver too old to JIT it: CUDA
    // 12.8's PTX needs 570.26 (and the CUDA 13 runtime 580).
    fake.set(Some("560.35.03"), &[H100], false);
    let p = plan(&tb);
    assert!(
        has(
            &p,
            "pfgptx",
            Some(&ext("pfgptx")),
            &[
                "only as PTX (sm_80, made by CUDA 12.8)",
                "560.35.03",
                "570.26"
            ]
        ),
        "{}",
        reasons(&p)
    );

    // An old driver whose nvidia-smi does not know compute_cap: the GPU is
    // known by its name, and the plan says so.
    fake.set(
        Some("470.256.02"),
        &["Tesla V100-SXM2-32GB, 7.0, 32768"],
        true,
    );
    let p = plan(&tb);
    assert!(
        p.text.contains("does not report compute capability"),
        "{}",
        p.text
    );
    assert!(
        has(
            &p,
            "pfgtorch",
            Some("pfgtorch/lib/libpfgtorch_cuda.so"),
            &["sm_70"]
        ),
        "{}",
        reasons(&p)
    );

    // No driver: no GPU problem, and the machine is a fact in --json.
    fake.set(None, &[], false);
    let p = plan(&tb);
    assert!(p.gpu.is_empty(), "{}", reasons(&p));
    assert_eq!(
        p.json["target_machine"]["driver"],
        serde_json::json!({"state": "none"})
    );
}

/// `overlay doctor` judges the venv as it stands against its host, and
/// the generation records the machine it was planned for.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn doctor_judges_the_venv_as_it_stands_and_the_generation_records_the_machine() {
    let (tb, fake) = testbed();
    // The target's own CUDA 12.8 stack on a driver older than CUDA 12.
    fake.set(Some("520.61.05"), &[V100], false);
    let out = tb.overlay(&["doctor", "dst"]).output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "2.9.1+cu128 needs an NVIDIA driver ≥ 525.60.13 (CUDA 12); this host has 520.61.05"
        ),
        "{stdout}"
    );
    assert!(
        stderr.contains(
            "dst: NVIDIA driver 520.61.05 (CUDA ≤ 11.8), 1 × Tesla V100-SXM2-32GB (sm_70, 32 GiB)"
        ),
        "{stderr}"
    );
    // A healthy machine for it: no problem.
    fake.set(Some("580.159.04"), &[V100], false);
    let out = tb.overlay(&["doctor", "dst"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    // Apply onto H100s with driver 580: the generation keeps the machine.
    fake.set(Some("580.159.04"), &[H100; 8], false);
    let _ = plan(&tb);
    ok(tb.overlay(&["apply"]).output().unwrap(), "apply");
    let out = ok(
        tb.overlay(&["history", "dst", "--json"]).output().unwrap(),
        "history --json",
    );
    let h: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let recorded = serde_json::to_string(&h).unwrap();
    assert!(
        recorded.contains(r#""version":"580.159.04""#)
            && recorded.contains("NVIDIA H100 80GB HBM3"),
        "{recorded}"
    );
    let out = tb.overlay(&["doctor", "dst"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
}
