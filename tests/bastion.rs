//! Bastions: a target that only a jump host reaches. The target's sshd runs
//! in a network namespace of its own (`Testbed::isolate`), so the
//! controller cannot connect to it; the jump host `bastion` listens here
//! and serves each connection with an sshd inside the target's namespace,
//! so its forwarded connections reach the target. A second jump host
//! `outer` is a plain sshd here (for two hops). One testbed for every case:
//!
//! - reaching the target directly fails (the isolation is real);
//! - manifest `proxy_jump = "bastion"`: plan and apply;
//! - two hops (`outer,bastion`); with `outer` down the error names that hop;
//! - `ProxyCommand` (the real `ssh -W`) from ~/.ssh/config; a failing
//!   ProxyCommand's stderr is in the error;
//! - the jump host's key changed: refused, naming the jump host; unknown:
//!   recorded with --accept-new-host-key.
//!
//! Connection checks run `overlay history dst`, which reaches the target
//! alone (a plan also scans the source). `ProxyJump` from ~/.ssh/config
//! takes the same path as `proxy_jump` once resolved (unit tests in
//! src/transport/ssh/config.rs cover its parsing).

mod common;

use std::fs;
use std::process::Output;

use common::{JumpHost, Testbed, ok};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn fails(o: Output, what: &str) -> String {
    assert!(
        !o.status.success(),
        "{what} should fail:\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
    stderr(&o)
}

/// The manifest with `[hosts.dst]` given `ssh` and optional `proxy_jump`.
fn manifest(tb: &Testbed, dst_ssh: &str, jump: Option<&str>) {
    let jump = jump.map_or(String::new(), |j| format!("proxy_jump = \"{j}\"\n"));
    fs::write(
        tb.manifest_path(),
        format!(
            "[hosts.src]\nssh = \"src\"\nvenv = \"{}\"\n\n[hosts.dst]\nssh = \"{dst_ssh}\"\n{jump}venv = \"{}\"\n\n{}\n",
            common::VENV,
            common::VENV,
            common::SCENARIO_SETS
        ),
    )
    .unwrap();
}

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn jump_hosts_and_proxy_commands() {
    let mut tb = Testbed::new(2);
    let pid = tb.isolate(1);
    let bastion = JumpHost::into_netns(&tb, "bastion", pid);
    let mut outer = JumpHost::daemon(&tb, "outer");
    let (ip, port) = tb.hosts[1].addr.clone().unwrap();
    let ssh_dir = tb.client.join(".ssh");
    let config = ssh_dir.join("config");
    let known_hosts = ssh_dir.join("known_hosts");
    // Reaching the target alone (no scan): `history dst`.
    let reach = |tb: &Testbed| tb.overlay(&["history", "dst"]).output().unwrap();

    // 1. Without a jump the target is out of reach.
    manifest(&tb, "dst", None);
    let e = fails(reach(&tb), "reaching the isolated target directly");
    assert!(e.contains("Failed to connect to dst"), "{e}");

    // 2. One hop from the manifest: plan, then apply (the target's venv changes).
    manifest(&tb, "dst", Some("bastion"));
    ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan through bastion",
    );
    let site = tb.site_packages(1);
    assert!(!site.join("minitorch-2.11.0.dist-info").exists());
    let out = ok(
        tb.overlay(&["apply"]).output().unwrap(),
        "apply through bastion",
    );
    assert!(
        site.join("minitorch-2.11.0.dist-info").exists(),
        "{}",
        stderr(&out)
    );

    // 3. Two hops: outer, then bastion; with outer down, the error names it.
    manifest(&tb, "dst", Some("outer,bastion"));
    ok(reach(&tb), "reaching the target through outer and bastion");
    outer.stop();
    let e = fails(
        reach(&tb),
        "reaching the target through a jump host that is down",
    );
    assert!(e.contains("jump host outer"), "{e}");
    assert!(e.contains("connection refused"), "{e}");

    // 4. ProxyJump and ProxyCommand from ~/.ssh/config.
    let base = fs::read_to_string(&config).unwrap();
    let entry = |name: &str, extra: &str| {
        format!(
            "Host {name}\n    HostName {ip}\n    Port {port}\n    User root\n    IdentityFile {}\n    UserKnownHostsFile {}\n    IdentitiesOnly yes\n{extra}\n",
            ssh_dir.join("id_ed25519").display(),
            known_hosts.display()
        )
    };
    let mut with_proxies = base.clone();
    with_proxies.push_str(&entry(
        "dstpc",
        &format!(
            "    ProxyCommand ssh -F {} -W %h:%p bastion\n",
            config.display()
        ),
    ));
    with_proxies.push_str(&entry(
        "dstbad",
        "    ProxyCommand sh -c 'echo no route to %h >&2; exit 1'\n",
    ));
    fs::write(&config, with_proxies).unwrap();
    manifest(&tb, "dstpc", None);
    ok(reach(&tb), "reaching the target with ProxyCommand ssh -W");
    manifest(&tb, "dstbad", None);
    let e = fails(
        reach(&tb),
        "reaching the target through a failing ProxyCommand",
    );
    assert!(e.contains(&format!("no route to {ip}")), "{e}");
    assert!(e.contains("ProxyCommand"), "{e}");

    // 5. Host keys are checked on the jump host too.
    manifest(&tb, "dst", Some("bastion"));
    let good = fs::read_to_string(&known_hosts).unwrap();
    let line = bastion.known_hosts_line();
    assert!(good.contains(&line));
    let other = tb.dir().join("other_key");
    common::run(
        std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&other),
    );
    let other_pub = fs::read_to_string(other.with_extension("pub")).unwrap();
    let other_key: Vec<&str> = other_pub.split_whitespace().take(2).collect();
    let changed = format!(
        "[{}]:{} {}\n",
        bastion.ip,
        bastion.port,
        other_key.join(" ")
    );
    fs::write(&known_hosts, good.replace(&line, &changed)).unwrap();
    let out = reach(&tb);
    let e = fails(
        out,
        "reaching the target through a jump host whose key changed",
    );
    assert!(e.contains("jump host bastion"), "{e}");
    assert!(e.contains("CHANGED"), "{e}");
    // Unknown: recorded with --accept-new-host-key (as for any host).
    fs::write(&known_hosts, good.replace(&line, "")).unwrap();
    ok(
        tb.overlay(&["history", "dst", "--accept-new-host-key"])
            .output()
            .unwrap(),
        "accepting the jump host's key",
    );
    let recorded = fs::read_to_string(&known_hosts).unwrap();
    assert!(recorded.contains(line.trim()), "{recorded}");
    drop(bastion);
}
