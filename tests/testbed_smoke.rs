//! The test-host infrastructure itself (tests/common, tests/fixtures/testbed.py).

mod common;

use std::collections::BTreeMap;

fn stdout(mut cmd: std::process::Command) -> String {
    String::from_utf8(common::run(&mut cmd).stdout).unwrap()
}

/// {path: action} of one set of a record-plan.
fn actions(plan: &serde_json::Value, set: &str) -> BTreeMap<String, String> {
    let set = plan["sets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == set)
        .unwrap_or_else(|| panic!("no set {set} in {plan}"));
    set["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_string(),
                c["action"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn ssh_hosts_each_see_their_own_venv() {
    let tb = common::Testbed::new(2);
    let mut versions = Vec::new();
    for (i, build) in [
        (0, "2.11.0+cu130 built for CUDA 13.0"),
        (1, "2.9.1+cu128 built for CUDA 12.8"),
    ] {
        let out = stdout(tb.ssh(
            i,
            "/root/venv/bin/python -c 'import minitorch._C, minib64; print(minitorch._C.build_info())'",
        ));
        assert!(out.contains(build), "host {i}: {out}");

        let list = stdout(tb.ssh(
            i,
            "/root/venv/bin/python -m pip list --format=json --disable-pip-version-check",
        ));
        let list: serde_json::Value = serde_json::from_str(&list).unwrap();
        let v = list
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "minitorch")
            .map(|p| p["version"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("no minitorch in {list}"));
        versions.push(v);

        // The host's home is private: HOSTDIR/root.
        common::run(&mut tb.ssh(
            i,
            "mkdir -p ~/.cache/overlay && echo $HOME > ~/.cache/overlay/marker",
        ));
        let marker = tb.host_dir(i).join("root/.cache/overlay/marker");
        assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "/root");
    }
    assert_eq!(versions, ["2.11.0", "2.9.1"]);
    assert!(
        tb.site_packages(0)
            .join("minitorch-2.11.0.dist-info/RECORD")
            .exists()
    );
    assert!(
        tb.site_packages(1)
            .join("minitorch-2.9.1.dist-info/RECORD")
            .exists()
    );

    let addrs: Vec<_> = tb.hosts.iter().map(|h| h.addr.clone().unwrap()).collect();
    drop(tb);
    for (ip, port) in addrs {
        assert!(
            std::net::TcpStream::connect((ip.as_str(), port)).is_err(),
            "{ip}:{port} still accepts connections after the testbed was dropped"
        );
    }
}

/// The scenario documented in testbed.py, checked with its reference planner
/// on local venvs (different paths: bin/ shebangs must be rewritten).
#[test]
fn local_reference_plan_matches_the_scenario() {
    let tb = common::Testbed::local(2);
    tb.write_manifest(
        r#"
[sets.torch]
dists = ["minitorch"]
[sets.nvidia-cu13]
dists = ["nvidia-*"]
[sets.cublas-only]
dists = ["nvidia-cublas*"]
[sets.sglang-patches]
files = ["minisglang/srt/speculative/**", "minisglang/srt/server_args.py"]
"#,
    );
    let plan = tb.record_plan(0, 1);

    let torch = actions(&plan, "torch");
    for (path, action) in [
        ("../../../bin/minitorchfrtrace", "add"),
        ("minitorch-2.11.0.dist-info/licenses/LICENSE", "add"),
        ("minitorch-2.9.1.dist-info/RECORD", "delete"),
        ("minitorch/_new_in_211.py", "add"),
        ("minitorch/_old_in_291.py", "delete"),
        ("minitorch/version.py", "replace"),
        ("minitorch/_C.cpython-311-x86_64-linux-gnu.so", "replace"),
        ("minitorch/lib/libminitorch_cpu.so", "replace"),
    ] {
        assert_eq!(
            torch.get(path).map(String::as_str),
            Some(action),
            "torch {path}: {torch:?}"
        );
    }
    // Same script once the shebang names the target venv; identical files.
    assert!(
        !torch.contains_key("../../../bin/minitorchrun"),
        "{torch:?}"
    );
    assert!(!torch.contains_key("minitorch/nn/functional.py"));
    assert!(torch.keys().all(|p| !p.contains("__pycache__")));

    assert_eq!(
        actions(&plan, "nvidia-cu13")["nvidia/__init__.py"],
        "delete"
    );
    assert_eq!(
        actions(&plan, "nvidia-cu13")["nvidia/cu13/lib/libcudart.so.13"],
        "add"
    );
    assert_eq!(actions(&plan, "cublas-only")["nvidia/__init__.py"], "keep");

    let sg = actions(&plan, "sglang-patches");
    let expected: BTreeMap<String, String> = [
        ("minisglang/srt/server_args.py", "replace"),
        ("minisglang/srt/speculative/ddtree_utils.py", "add"),
        ("minisglang/srt/speculative/dflash_utils.py", "delete"),
        ("minisglang/srt/speculative/dflash_worker.py", "replace"),
        ("minisglang/srt/speculative/eagle_utils.py", "keep"),
        ("minisglang/srt/speculative/spec_info.py", "replace"),
    ]
    .into_iter()
    .map(|(p, a)| (p.to_string(), a.to_string()))
    .collect();
    assert_eq!(sg, expected);

    // The same-size patch: equal size and mtime, different content.
    let (a, b) = (
        tb.site_packages(0)
            .join("minisglang/srt/speculative/dflash_worker.py"),
        tb.site_packages(1)
            .join("minisglang/srt/speculative/dflash_worker.py"),
    );
    assert_eq!(
        std::fs::metadata(&a).unwrap().len(),
        std::fs::metadata(&b).unwrap().len()
    );
    assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
}
