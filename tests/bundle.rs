//! End-to-end tests of bundles (docs/pack.md): `overlay pack` from a real
//! sshd source, and `overlay apply --bundle FILE --venv PATH` run on the
//! target host itself over plain `ssh` (and over pdsh where it is
//! installed), against real venvs made by pip from the fixture wheels.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{Testbed, assert_same, ok, snapshot};

const SETS: &str = common::SCENARIO_SETS;

/// `overlay pack src -o FILE` in the work dir; must succeed, with no
/// staging or apply of its own to report, and nothing left beside FILE.
fn pack(tb: &Testbed, file: &str) -> PathBuf {
    let out = ok(
        tb.overlay(&["pack", "src", "-o", file]).output().unwrap(),
        "pack",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    for leak in ["overlay-pack-stage", "Applied generation", "generation"] {
        assert!(!err.contains(leak), "pack says {leak:?}:\n{err}");
    }
    assert!(err.contains("Packed "), "{err}");
    let left: Vec<_> = fs::read_dir(&tb.work)
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.starts_with(".overlay-pack.").then_some(n)
        })
        .collect();
    assert!(left.is_empty(), "pack left {left:?}");
    tb.work.join(file)
}

/// `overlay ARGS` run on host `i` itself over plain ssh. The static binary
/// is copied to the host's /root first, as an operator would carry it: the
/// test binary's own path may not be visible there (each host has a
/// private /root and /tmp, and a checkout may live under either).
/// A file of this machine named in ARGS (a bundle in the testbed's work
/// dir) is carried to the host's /root the same way, and named there.
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
                let name = p.file_name().unwrap();
                fs::copy(p, root.join(name)).unwrap();
                format!("/root/{}", name.to_string_lossy())
            } else {
                a.to_string()
            }
        })
        .collect();
    tb.ssh(i, &format!("/root/overlay {}", args.join(" ")))
        .output()
        .unwrap()
}

/// Unpack folders left beside a host's venv.
fn leftovers(tb: &Testbed, i: usize) -> Vec<String> {
    fs::read_dir(tb.host_dir(i).join("root"))
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.starts_with(".overlay-bundle.").then_some(n)
        })
        .collect()
}

/// A valid bundle (right trailer and hashes) packed from Python 3.12.
fn other_python_bundle(dir: &Path) -> PathBuf {
    use overlay::model::{BUNDLE_FORMAT, BundleEntry, BundleIndex, BundleKind};
    let stage = dir.join("stage312");
    let site = "lib/python3.12/site-packages";
    fs::create_dir_all(stage.join(site)).unwrap();
    fs::write(stage.join(site).join("x.py"), b"x = 1\n").unwrap();
    let mut entries = Vec::new();
    for p in ["lib", "lib/python3.12", site] {
        entries.push(BundleEntry {
            path: p.into(),
            kind: BundleKind::Dir { mode: 0o755 },
            owner: None,
        });
    }
    entries.push(BundleEntry {
        path: format!("{site}/x.py"),
        kind: BundleKind::File {
            size: 6,
            mode: 0o644,
            blake3: blake3::hash(b"x = 1\n").to_hex().to_string(),
        },
        owner: None,
    });
    let mut index = BundleIndex {
        format: BUNDLE_FORMAT,
        python: "3.12".into(),
        site_packages: site.into(),
        source_host: "py312".into(),
        source_venv: "/root/venv".into(),
        manifest: "[sets.x]\nfiles = [\"x.py\"]\n".into(),
        sets: vec!["x".into()],
        dists: Vec::new(),
        entries,
        facts: Default::default(),
    };
    let out = dir.join("py312.ovl");
    overlay::bundle::write(&mut index, &mut overlay::bundle::Folder(stage), &out).unwrap();
    out
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_bundle_applied_on_the_host_equals_a_live_apply_and_rolls_back() {
    let tb = Testbed::new(3);
    tb.write_manifest(&format!("{SETS}{}", common::VERIFY));

    // Deterministic: two packs, the same bytes.
    let a = pack(&tb, "a.ovl");
    let b = pack(&tb, "b.ovl");
    let (ba, bb) = (fs::read(&a).unwrap(), fs::read(&b).unwrap());
    assert!(ba.len() > 1000);
    assert!(ba == bb, "two packs of the same source differ");
    // A standard zstd + tar: the index first, then venv/... members.
    let list = ok(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("zstd -dc {} | tar -t", a.display()))
            .output()
            .unwrap(),
        "zstd | tar",
    );
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(list.starts_with("overlay-bundle.json\nvenv/"), "{list}");

    let dst_before = snapshot(tb.host_venv_dir(1));

    // plan --bundle: read-only, shows the changes.
    let out = on_host(
        &tb,
        1,
        &format!("plan --bundle {} --venv /root/venv --check", a.display()),
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("minitorch"),
        "{out:?}"
    );
    assert_same(
        &dst_before,
        &snapshot(tb.host_venv_dir(1)),
        "plan --bundle changed the venv",
    );
    assert!(leftovers(&tb, 1).is_empty());

    // Another Python minor, a truncated and a tampered bundle: refused,
    // nothing changed, nothing left behind.
    let py312 = other_python_bundle(&tb.work);
    let out = on_host(
        &tb,
        1,
        &format!("apply --bundle {} --venv /root/venv", py312.display()),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("Python 3.12") && err.contains("3.11"), "{err}");
    assert_eq!(out.status.code(), Some(8), "refused: {err}");
    let cut = tb.work.join("cut.ovl");
    fs::write(&cut, &ba[..ba.len() - 100]).unwrap();
    let out = on_host(
        &tb,
        1,
        &format!("apply --bundle {} --venv /root/venv", cut.display()),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("truncated or damaged"), "{err}");
    assert_eq!(out.status.code(), Some(10), "damaged: {err}");
    let mut bad = ba.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    let tampered = tb.work.join("tampered.ovl");
    fs::write(&tampered, &bad).unwrap();
    let out = on_host(
        &tb,
        1,
        &format!(
            "apply --bundle {} --venv /root/venv --json",
            tampered.display()
        ),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("does not match"), "{err}");
    // --json: one line saying so, for the fleet's table.
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["ok"], false, "{line}");
    assert_eq!(line["exit"], 10, "{line}");
    assert_same(
        &dst_before,
        &snapshot(tb.host_venv_dir(1)),
        "a refused bundle changed the venv",
    );
    assert!(leftovers(&tb, 1).is_empty());

    // The bundle on dst over plain ssh; a live apply of the same sets on dst2.
    let out = on_host(
        &tb,
        1,
        &format!(
            "apply --bundle {} --venv /root/venv --verify --json",
            a.display()
        ),
    );
    let out = ok(out, "apply --bundle over ssh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout}");
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(result["generation"].is_string(), "{result}");
    assert_eq!(result["verified"], true, "{result}");
    assert!(leftovers(&tb, 1).is_empty());
    ok(
        tb.overlay(&["plan", "src", "dst2"]).output().unwrap(),
        "plan",
    );
    ok(tb.overlay(&["apply"]).output().unwrap(), "apply");
    assert_same(
        &snapshot(tb.host_venv_dir(2)),
        &snapshot(tb.host_venv_dir(1)),
        "bundle apply vs live apply",
    );
    // Nothing left to do, by the bundle's own plan.
    let out = on_host(
        &tb,
        1,
        &format!("plan --bundle {} --venv /root/venv --check", a.display()),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    // The journal is the ordinary one: history from the controller ...
    let out = ok(
        tb.overlay(&["history", "dst", "--json"]).output().unwrap(),
        "history",
    );
    let gen_id = result["generation"].as_str().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(gen_id),
        "{out:?}"
    );
    // ... and on the host itself, with no manifest.
    let out = ok(
        on_host(&tb, 1, "history --venv /root/venv --json"),
        "history --venv",
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(gen_id),
        "{out:?}"
    );
    ok(
        on_host(&tb, 1, "rollback --venv /root/venv"),
        "rollback --venv",
    );
    assert_same(
        &dst_before,
        &snapshot(tb.host_venv_dir(1)),
        "rollback after a bundle apply",
    );
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn pdcp_and_pdsh_carry_a_bundle_and_the_binary_to_every_host() {
    for tool in ["pdsh", "pdcp", "jq"] {
        assert!(
            std::process::Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .unwrap()
                .status
                .success(),
            "{tool} is not installed: run scripts/setup (it installs pdsh and jq)"
        );
    }
    let tb = Testbed::new(3);
    tb.write_manifest(SETS);
    let (stack, signers) = common::pack_signed(&tb, "stack.ovl");
    let sig = tb.work.join("stack.ovl.sig");
    // dst2's venv is broken (no site-packages): its row says so, dst goes on.
    fs::rename(
        tb.host_venv_dir(2).join("lib"),
        tb.host_venv_dir(2).join("lib.away"),
    )
    .unwrap();
    let dst_before = snapshot(tb.host_venv_dir(1));

    // pdsh runs the system ssh: the testbed's config, key and known_hosts,
    // host keys checked.
    let ssh = tb.client.join(".ssh");
    let ssh_args = format!(
        "-F {} -o UserKnownHostsFile={} -o StrictHostKeyChecking=yes -i {} -o IdentitiesOnly=yes -o BatchMode=yes -l%u %h",
        ssh.join("config").display(),
        ssh.join("known_hosts").display(),
        ssh.join("id_ed25519").display()
    );
    let pd = |tool: &str, args: &[&str]| {
        let mut c = std::process::Command::new(tool);
        c.args(["-R", "ssh", "-w", "dst,dst[2-2]"])
            .args(args)
            .env("PDSH_SSH_ARGS", &ssh_args)
            .env("HOME", &tb.client)
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("PDSH_RCMD_TYPE")
            .current_dir(&tb.work)
            .stdin(std::process::Stdio::null());
        c.output().unwrap()
    };
    // The static binary, the bundle, its signature and who may sign, to
    // every host's /root.
    let bin = env!("CARGO_BIN_EXE_overlay");
    let files = [bin, stack.to_str().unwrap(), sig.to_str().unwrap()];
    ok(
        pd(
            "pdcp",
            &[&["-p"], &files[..], &[signers.to_str().unwrap(), "/root/"]].concat(),
        ),
        "pdcp",
    );
    for i in [1, 2] {
        let home = tb.host_dir(i).join("root");
        assert_eq!(
            fs::read(home.join("stack.ovl")).unwrap(),
            fs::read(&stack).unwrap()
        );
        assert!(home.join("overlay").is_file());
    }
    let out = pd(
        "pdsh",
        &[
            "/root/overlay apply --bundle /root/stack.ovl --venv /root/venv --trust /root/allowed_signers --json",
        ],
    );
    let lines = String::from_utf8_lossy(&out.stdout).into_owned();
    let table = common::jq_table(&lines);
    let mut rows: Vec<Vec<&str>> = table.lines().map(|l| l.split('\t').collect()).collect();
    rows.sort();
    assert_eq!(
        rows.len(),
        2,
        "{table}\n--- pdsh\n{lines}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(&rows[0][..2], ["dst", "ok"], "{table}");
    assert!(rows[0][3].parse::<u64>().unwrap() > 10, "{table}");
    assert_eq!(&rows[1][..2], ["dst2", "FAILED"], "{table}");
    assert!(rows[1][4].contains("site-packages"), "{table}");

    // dst equals a live apply of the same sets (onto dst2, repaired).
    fs::rename(
        tb.host_venv_dir(2).join("lib.away"),
        tb.host_venv_dir(2).join("lib"),
    )
    .unwrap();
    ok(
        tb.overlay(&["plan", "src", "dst2"]).output().unwrap(),
        "plan",
    );
    ok(tb.overlay(&["apply"]).output().unwrap(), "apply");
    assert_same(
        &snapshot(tb.host_venv_dir(2)),
        &snapshot(tb.host_venv_dir(1)),
        "pdsh bundle apply vs live apply",
    );
    ok(
        tb.overlay(&["rollback", "dst"]).output().unwrap(),
        "rollback",
    );
    assert_same(
        &dst_before,
        &snapshot(tb.host_venv_dir(1)),
        "rollback after pdsh",
    );
}

/// The playbook of docs/fleet.md's Ansible form (paths filled in): the
/// binary, the bundle, its signature and the allowed_signers file copied,
/// the apply run with `--trust`, in batches of one that
/// stop at the first failure.
const PLAYBOOK: &str = r#"- hosts: fleet
  serial: 1
  max_fail_percentage: 0
  gather_facts: false
  tasks:
    - name: overlay binary
      ansible.builtin.copy: {src: "{{ overlay_bin }}", dest: /root/overlay, mode: "0755"}
    - name: bundle
      ansible.builtin.copy: {src: "{{ bundle }}", dest: /root/stack.ovl, mode: "0644"}
    - name: its signature
      ansible.builtin.copy: {src: "{{ bundle }}.sig", dest: /root/stack.ovl.sig, mode: "0644"}
    - name: who may sign bundles
      ansible.builtin.copy: {src: "{{ signers }}", dest: /root/allowed_signers, mode: "0644"}
    - name: apply
      ansible.builtin.command: /root/overlay apply --bundle /root/stack.ovl --venv /root/venv --trust /root/allowed_signers --json
      register: overlay
      changed_when: (overlay.stdout | from_json).changes | default(0) > 0
"#;

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn an_ansible_play_applies_in_batches_and_stops_at_a_failure() {
    assert!(
        std::process::Command::new("sh")
            .args(["-c", "command -v ansible-playbook"])
            .output()
            .unwrap()
            .status
            .success(),
        "ansible-playbook is not installed: run scripts/setup (it installs ansible-core)"
    );
    let tb = Testbed::new(3);
    tb.write_manifest(SETS);
    let (stack, signers) = common::pack_signed(&tb, "stack.ovl");
    let before = [snapshot(tb.host_venv_dir(1)), snapshot(tb.host_venv_dir(2))];
    // dst2 first, and broken: the play stops there, dst is not started.
    fs::rename(
        tb.host_venv_dir(2).join("lib"),
        tb.host_venv_dir(2).join("lib.away"),
    )
    .unwrap();
    let ssh = tb.client.join(".ssh");
    let inventory = format!(
        "[fleet]\ndst2\ndst\n\n[fleet:vars]\nansible_user=root\nansible_python_interpreter=/usr/bin/python3\n\
         ansible_ssh_common_args=-F {} -o UserKnownHostsFile={} -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -i {}\n",
        ssh.join("config").display(),
        ssh.join("known_hosts").display(),
        ssh.join("id_ed25519").display()
    );
    fs::write(tb.work.join("inventory.ini"), inventory).unwrap();
    fs::write(tb.work.join("play.yml"), PLAYBOOK).unwrap();
    let play = || {
        std::process::Command::new("ansible-playbook")
            .args(["-i", "inventory.ini", "play.yml", "-e"])
            .arg(format!(
                "overlay_bin={} bundle={} signers={}",
                env!("CARGO_BIN_EXE_overlay"),
                stack.display(),
                signers.display()
            ))
            .env("HOME", &tb.client)
            .env("ANSIBLE_PIPELINING", "1")
            // No ControlPersist: its socket path under the testbed is too long.
            .env("ANSIBLE_SSH_ARGS", "-o ControlMaster=no")
            .env("ANSIBLE_NOCOLOR", "1")
            .env_remove("SSH_AUTH_SOCK")
            .current_dir(&tb.work)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let out = play();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("site-packages"), "{text}");
    let dst_home = tb.host_dir(1).join("root");
    assert!(
        !dst_home.join("stack.ovl").exists(),
        "dst was started:\n{text}"
    );
    assert_same(
        &before[0],
        &snapshot(tb.host_venv_dir(1)),
        "dst after the stop",
    );

    // Repaired, the play goes through both; each equals a live apply.
    fs::rename(
        tb.host_venv_dir(2).join("lib.away"),
        tb.host_venv_dir(2).join("lib"),
    )
    .unwrap();
    assert_same(
        &before[1],
        &snapshot(tb.host_venv_dir(2)),
        "dst2 after its failure",
    );
    let out = play();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("changed=1"), "{text}");
    let applied = snapshot(tb.host_venv_dir(1));
    assert_same(&applied, &snapshot(tb.host_venv_dir(2)), "dst vs dst2");
    ok(
        tb.overlay(&["rollback", "dst2"]).output().unwrap(),
        "rollback",
    );
    ok(
        tb.overlay(&["plan", "src", "dst2"]).output().unwrap(),
        "plan",
    );
    ok(tb.overlay(&["apply"]).output().unwrap(), "apply");
    assert_same(
        &applied,
        &snapshot(tb.host_venv_dir(2)),
        "ansible vs live apply",
    );
}

/// The plan files `overlay plan` wrote under the work dir's .overlay.
fn state(tb: &Testbed) -> Vec<String> {
    let dir = tb.work.join(".overlay");
    if !dir.exists() {
        return Vec::new();
    }
    let mut out: Vec<String> = walkdir::WalkDir::new(&dir)
        .min_depth(1)
        .max_depth(2)
        .into_iter()
        .map(|e| {
            e.unwrap()
                .path()
                .strip_prefix(&dir)
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    out.sort();
    out
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_bundle_planned_from_the_controller_needs_no_source_and_equals_a_live_apply() {
    let mut tb = Testbed::new(4);
    tb.write_manifest(&format!("{SETS}{}", common::VERIFY));
    let stack = pack(&tb, "stack.ovl");
    let before = [snapshot(tb.host_venv_dir(1)), snapshot(tb.host_venv_dir(2))];
    // The reference: a live apply onto dst3, while the source is up.
    ok(
        tb.overlay(&["plan", "src", "dst3", "-o", "live.json"])
            .output()
            .unwrap(),
        "live plan",
    );
    ok(
        tb.overlay(&["apply", "live.json"]).output().unwrap(),
        "live apply",
    );
    let live = snapshot(tb.host_venv_dir(3));
    assert_ne!(live, before[0], "the live apply changed nothing");
    // The source host is gone: nothing below may need it.
    tb.stop(0);

    // A tampered bundle: refused before anything is written or reached.
    let mut bad = fs::read(&stack).unwrap();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    fs::write(tb.work.join("tampered.ovl"), &bad).unwrap();
    let out = tb
        .overlay(&["plan", "--bundle", "tampered.ovl", "dst", "dst2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(10), "damaged: {err}");
    assert!(
        err.contains("tampered.ovl") && err.contains("does not match"),
        "{err}"
    );
    assert!(state(&tb).is_empty(), "written: {:?}", state(&tb));
    // The source named too: --bundle takes its place.
    let out = tb
        .overlay(&["plan", "--bundle", "stack.ovl", "src", "dst"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("src is the host the bundle"), "{err}");
    // Another Python minor: refused, naming the target and both minors.
    other_python_bundle(&tb.work);
    let out = tb
        .overlay(&["plan", "--bundle", "py312.ovl", "dst"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "refused: {err}");
    assert!(
        err.contains("3.12") && err.contains("3.11") && err.contains("dst"),
        "{err}"
    );
    assert!(!tb.work.join(".overlay/plan.json").exists());
    assert_same(&before[0], &snapshot(tb.host_venv_dir(1)), "refused: dst");

    // Two targets from the bundle: the plan files of a live plan of two.
    let out = ok(
        tb.overlay(&["plan", "--bundle", "stack.ovl", "dst", "dst2"])
            .output()
            .unwrap(),
        "plan --bundle dst dst2",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("dst, dst2"), "grouped: {text}");
    // The scripts, read from the bundle as packed, are not taken for hand patches.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("differs from its RECORD"), "{err}");
    let files = state(&tb);
    for f in ["plan.json", "plan.d/dst.json", "plan.d/dst2.json"] {
        assert!(files.contains(&f.to_string()), "{files:?}");
    }
    let plan: serde_json::Value =
        serde_json::from_slice(&fs::read(tb.work.join(".overlay/plan.d/dst.json")).unwrap())
            .unwrap();
    assert_eq!(plan["source"]["name"], "stack.ovl", "{plan}");
    // Read in place: no folder unpacked, the plan names the bundle itself,
    // pinned to the BLAKE3 checked when it was planned.
    let abs = tb.work.join("stack.ovl");
    assert_eq!(
        plan["source"]["venv"].as_str(),
        Some(
            format!(
                "bundle:{}:{}",
                plan["bundle"]["blake3"].as_str().unwrap(),
                abs.display()
            )
            .as_str()
        ),
        "{plan}"
    );
    assert!(plan["bundle"].get("cache").is_none(), "{plan}");
    assert!(!tb.work.join(".overlay/bundles").exists());
    // Applied (and checked with the bundle's [verify]) from the bundle
    // read in place: each target equals the live apply.
    let out = tb.overlay(&["apply", "--verify"]).output().unwrap();
    ok(out, "apply of the bundle's plans");
    for i in [1, 2] {
        assert_same(&live, &snapshot(tb.host_venv_dir(i)), "bundle vs live");
    }
    // One target, by the single-target path: nothing left to do.
    let out = tb
        .overlay(&["plan", "--bundle", "stack.ovl", "dst", "--check"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    ok(
        tb.overlay(&["rollback", "dst", "dst2"]).output().unwrap(),
        "rollback",
    );
    for i in [1, 2] {
        assert_same(&before[i - 1], &snapshot(tb.host_venv_dir(i)), "rollback");
    }

    // A saved plan whose bundle was damaged, replaced, then is gone:
    // refused, dst unchanged; nothing unpacked anywhere meanwhile.
    ok(
        tb.overlay(&["plan", "--bundle", "stack.ovl", "dst"])
            .output()
            .unwrap(),
        "plan --bundle dst",
    );
    let good = fs::read(&stack).unwrap();
    fs::write(&stack, &bad).unwrap();
    let out = tb.overlay(&["apply"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(10), "damaged after the plan: {err}");
    assert!(err.contains("does not match"), "{err}");
    assert_same(&before[0], &snapshot(tb.host_venv_dir(1)), "damaged: dst");
    fs::copy(tb.work.join("py312.ovl"), &stack).unwrap();
    let out = tb.overlay(&["apply"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{err}");
    assert!(
        err.contains("another bundle") && err.contains("plan --bundle"),
        "{err}"
    );
    assert_same(&before[0], &snapshot(tb.host_venv_dir(1)), "replaced: dst");
    // Plan and apply in one, from the bundle as it was.
    fs::write(&stack, &good).unwrap();
    ok(
        tb.overlay(&["apply", "--bundle", "stack.ovl", "dst"])
            .output()
            .unwrap(),
        "apply --bundle dst",
    );
    assert_same(&live, &snapshot(tb.host_venv_dir(1)), "apply --bundle dst");
    assert!(!tb.work.join(".overlay/bundles").exists());
    fs::remove_file(&stack).unwrap();
    let out = tb.overlay(&["apply"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{err}");
    assert!(
        err.contains("no such file") && err.contains("plan --bundle"),
        "{err}"
    );
}
