//! The Slurm form of docs/fleet.md ("Slurm") and the README, run as
//! written: a one-node Slurm cluster (Debian's slurm-wlm and munge,
//! installed by scripts/setup) whose node is an SSH test host, `salloc` of
//! the documented `sbcast` + `srun ... overlay apply --bundle` command, then
//! the result checked like the pdsh and Ansible forms of tests/bundle.rs.
//!
//! The cluster is the test's own: a munge key, a `slurm.conf` and the
//! daemons' state, spool, pid and log files in a folder of the testbed,
//! ports picked free, no cgroup plugin (`proctrack/linuxproc`,
//! `task/none`, so that it runs in a plain container), no accounting.
//! `munged` and `slurmctld` run in this machine's mount namespace;
//! `slurmd` runs in test host `dst`'s (through `nsenter`), so the tasks it
//! starts see what that host sees: its own /tmp (where `sbcast` writes) and
//! its /root/venv, the venv `srun` applies to, at the path the documents
//! name. [`Cluster`]'s Drop stops the daemons (also when the test fails,
//! and then prints their logs).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Testbed, assert_same, ok, snapshot};

/// A one-node Slurm cluster: munged, slurmctld, and slurmd inside a test
/// host's mount namespace. Stopped when dropped.
struct Cluster {
    /// Its folder: munge key and socket, slurm.conf, state, spool, logs.
    dir: PathBuf,
    /// The node's name (this machine's short hostname, as Slurm takes it).
    node: String,
    /// The daemons, in the order they were started, with their log files.
    daemons: Vec<(&'static str, Child, PathBuf)>,
}

/// This machine's hostname up to its first dot: what slurmctld and slurmd
/// compare SlurmctldHost and NodeName with.
fn short_hostname() -> String {
    let name = fs::read_to_string("/proc/sys/kernel/hostname").expect("read the hostname");
    name.trim().split('.').next().unwrap().to_string()
}

/// A TCP port free on every address now (slurmctld and slurmd bind all).
fn free_port() -> u16 {
    std::net::TcpListener::bind(("0.0.0.0", 0))
        .and_then(|l| l.local_addr())
        .expect("bind a free port")
        .port()
}

impl Cluster {
    /// Start a cluster whose one node runs in the mount namespace of test
    /// host `i` (its sshd's); its folder lies in that host's folder, seen
    /// at the same path from both namespaces. Waits until the node is idle.
    fn start(tb: &Testbed, i: usize) -> Cluster {
        for tool in [
            "mungekey",
            "munged",
            "slurmctld",
            "slurmd",
            "salloc",
            "sbcast",
            "srun",
            "sinfo",
        ] {
            assert!(
                Command::new("sh")
                    .args(["-c", &format!("command -v {tool}")])
                    .output()
                    .unwrap()
                    .status
                    .success(),
                "{tool} is not installed: run scripts/setup (it installs slurm-wlm and munge)"
            );
        }
        let dir = tb.host_dir(i).join("slurm");
        for d in ["", "state", "spool"] {
            fs::create_dir_all(dir.join(d)).unwrap();
        }
        // munged wants its socket's folder searchable by all ...
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        ok(
            Command::new("mungekey")
                .args(["--create", "--keyfile"])
                .arg(dir.join("munge.key"))
                .output()
                .unwrap(),
            "mungekey",
        );
        let node = short_hostname();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let d = dir.display();
        let conf = format!(
            "# written by tests/slurm.rs: one node, this machine, no cgroups, no accounting
ClusterName=overlaytest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
",
            ctld = free_port(),
            slurmd = free_port(),
        );
        fs::write(dir.join("slurm.conf"), conf).unwrap();
        let mut c = Cluster {
            dir: dir.clone(),
            node,
            daemons: Vec::new(),
        };
        // ... but the testbed's folders are root's alone (0700): --force
        // makes that a warning (every client here is root).
        c.spawn(
            "munged",
            Command::new("munged")
                .arg("--foreground")
                .arg("--force")
                .args([
                    format!("--socket={d}/munge.socket"),
                    format!("--key-file={d}/munge.key"),
                    format!("--pid-file={d}/munged.pid"),
                    format!("--seed-file={d}/munged.seed"),
                    format!("--log-file={d}/munged-file.log"),
                ]),
        );
        c.wait_for("munged's socket", |c| c.dir.join("munge.socket").exists());
        c.spawn(
            "slurmctld",
            Command::new("slurmctld")
                .arg("-D")
                .arg("-f")
                .arg(dir.join("slurm.conf")),
        );
        let pid = fs::read_to_string(tb.host_dir(i).join("pid")).unwrap();
        c.spawn(
            "slurmd",
            Command::new("nsenter")
                .arg(format!("--mount=/proc/{}/ns/mnt", pid.trim()))
                .args(["/usr/sbin/slurmd", "-D", "-f"])
                .arg(dir.join("slurm.conf")),
        );
        c.wait_for("the node to be idle", |c| {
            let out = c
                .command("sinfo")
                .args(["-h", "-N", "-o", "%T"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim() == "idle"
        });
        c
    }

    /// Start daemon `name` (in the foreground: its log is its stderr).
    fn spawn(&mut self, name: &'static str, cmd: &mut Command) {
        let log = self.dir.join(format!("{name}.log"));
        let err = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = self
            .clear_env(cmd)
            .stdin(Stdio::null())
            .stdout(err.try_clone().unwrap())
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        self.daemons.push((name, child, log));
    }

    /// Poll `ready` for up to 30 s; panic (the logs follow) if it never is
    /// or a daemon exits meanwhile.
    fn wait_for(&mut self, what: &str, ready: impl Fn(&Cluster) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready(self) {
            for (name, child, _) in &mut self.daemons {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("{name} exited ({status}) while waiting for {what}");
                }
            }
            assert!(Instant::now() < deadline, "no {what} after 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `cmd` without the caller's SLURM_* variables (a test run inside a
    /// Slurm job would otherwise reach that job's cluster), with this
    /// cluster's configuration.
    fn clear_env<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SLURM_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("SLURM_CONF", self.dir.join("slurm.conf"))
    }

    /// A Slurm client command (`sinfo`, `srun`, ...) for this cluster.
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        self.clear_env(&mut c).stdin(Stdio::null());
        c
    }

    /// Shell text `script` run by `sh -c` in folder `cwd` against this
    /// cluster (at most 60 s).
    fn sh(&self, cwd: &Path, script: &str) -> Output {
        let mut c = self.command("timeout");
        c.args(["-k", "5", "60", "sh", "-c", script])
            .current_dir(cwd)
            .output()
            .unwrap()
    }

    /// Every daemon's log, for a failure's message.
    fn logs(&self) -> String {
        let mut s = String::new();
        for (name, _, log) in &self.daemons {
            let text = fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(60).collect();
            s.push_str(&format!("--- {name} ({})\n", log.display()));
            for l in tail.into_iter().rev() {
                s.push_str(l);
                s.push('\n');
            }
        }
        let munge = self.dir.join("munged-file.log");
        if let Ok(text) = fs::read_to_string(&munge) {
            s.push_str(&format!("--- {}\n{text}", munge.display()));
        }
        s
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("slurm: the daemons' logs\n{}", self.logs());
        }
        // slurmd first, munged last; SIGTERM, then SIGKILL after 10 s.
        for (name, child, _) in self.daemons.iter_mut().rev() {
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        eprintln!("slurm: {name} ignored SIGTERM: killed");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }
}

/// The shell commands in `doc` (a path in the repository) that start with
/// `start`: each from its first line to the one where its single quotes
/// close and no `\` continues it, as written.
fn documented(doc: &str, start: &str) -> Vec<String> {
    let text = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(doc)).unwrap();
    let mut found = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if !line.starts_with(start) {
            continue;
        }
        let mut cmd = line.to_string();
        while cmd.matches('\'').count() % 2 == 1 || cmd.ends_with('\\') {
            cmd.push('\n');
            cmd.push_str(
                lines
                    .next()
                    .unwrap_or_else(|| panic!("{doc}: {start} never ends")),
            );
        }
        found.push(cmd);
    }
    found
}

/// A command with its line breaks, continuations and runs of blanks as
/// one space, and no blank after a quote: the README's and docs/fleet.md's
/// forms of one command compare equal.
fn words(cmd: &str) -> String {
    cmd.replace("\\\n", " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace("' ", "'")
}

/// A documented command for this cluster: one node where the documents
/// have 64, and the node's allowed_signers in its /root (the test host's
/// own), since /etc is this machine's, shared with the other tests.
fn for_one_node(cmd: &str) -> String {
    assert!(cmd.contains("-N 64 "), "no `-N 64` in the documented {cmd}");
    SUBSTITUTED
        .iter()
        .fold(cmd.to_string(), |c, (from, to)| c.replace(from, to))
}

const SUBSTITUTED: [(&str, &str); 2] = [
    ("-N 64 ", "-N 1 "),
    ("/etc/overlay/allowed_signers", "/root/allowed_signers"),
];

/// `srun --label` lines of JSON: (task, document), one per line.
fn labelled(stdout: &[u8]) -> Vec<(String, serde_json::Value)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| {
            let (task, doc) = l
                .split_once(": ")
                .unwrap_or_else(|| panic!("not `task: json`: {l}"));
            (
                task.to_string(),
                serde_json::from_str(doc).unwrap_or_else(|e| panic!("{e}: {l}")),
            )
        })
        .collect()
}

/// The static binary as `overlay` in folder `dir`, where the documented
/// `sbcast -f overlay ...` takes it from (a hard link: 100+ MB in debug).
fn binary_in(dir: &Path) {
    let bin = env!("CARGO_BIN_EXE_overlay");
    if fs::hard_link(bin, dir.join("overlay")).is_err() {
        fs::copy(bin, dir.join("overlay")).unwrap();
    }
}

/// The SHA256 fingerprint of the key pair `key` (as ssh-keygen -l shows it).
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

#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces, sshd and Slurm's daemons"
)]
fn salloc_sbcast_and_srun_apply_a_signed_bundle_as_documented() {
    let apply = documented("docs/fleet.md", "salloc ");
    assert_eq!(apply.len(), 1, "docs/fleet.md's salloc commands: {apply:?}");
    let apply = apply[0].clone();
    let readme = documented("README.md", "salloc ");
    assert_eq!(
        readme.iter().map(|c| words(c)).collect::<Vec<_>>(),
        [words(&apply)],
        "README.md's Slurm command is not docs/fleet.md's"
    );
    let after: Vec<String> = documented("docs/fleet.md", "srun -N 64 ");
    let [history, rollback] = [" history ", " rollback "].map(|w| {
        let found: Vec<&String> = after.iter().filter(|c| c.contains(w)).collect();
        assert_eq!(found.len(), 1, "docs/fleet.md's srun ...{w}: {after:?}");
        for_one_node(found[0])
    });
    assert!(
        apply.contains("--trust /etc/overlay/allowed_signers"),
        "the documented apply trusts no file: {apply}"
    );
    let apply = for_one_node(&apply);
    // The README's own text carries the refused bundle below.
    let readme = for_one_node(&readme[0]);

    let tb = Testbed::new(3);
    tb.write_manifest(&format!("{}{}", common::SCENARIO_SETS, common::VERIFY));
    // In the work dir, as the command names them: the static binary, the
    // bundle and its signature. The node's allowed_signers put in place
    // once, as docs/fleet.md's pdcp does.
    let (stack, signers) = common::pack_signed(&tb, "stack.ovl");
    binary_in(&tb.work);
    let node = tb.host_dir(1);
    fs::copy(&signers, node.join("root/allowed_signers")).unwrap();
    let dst_before = snapshot(tb.host_venv_dir(1));

    let t0 = Instant::now();
    let cluster = Cluster::start(&tb, 1);
    eprintln!(
        "slurm: node {} idle in {:.1}s",
        cluster.node,
        t0.elapsed().as_secs_f64()
    );
    let t1 = Instant::now();
    let out = cluster.sh(&tb.work, &apply);
    eprintln!(
        "slurm: salloc, sbcast and srun in {:.1}s",
        t1.elapsed().as_secs_f64()
    );
    let out = ok(out, &apply);
    // sbcast wrote into the node's /tmp (the test host's own).
    assert_eq!(
        fs::read(node.join("tmp/stack.ovl")).unwrap(),
        fs::read(&stack).unwrap()
    );
    assert!(node.join("tmp/stack.ovl.sig").is_file() && node.join("tmp/overlay").is_file());
    // One JSON line per task (one task on the one node), labelled.
    let lines = labelled(&out.stdout);
    assert_eq!(lines.len(), 1, "{out:?}");
    let (task, result) = &lines[0];
    assert_eq!(task, "0", "{out:?}");
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["verified"], true, "{result}");
    let generation = result["generation"]
        .as_str()
        .expect("a generation")
        .to_string();
    // The documented jq line reads srun's label in place of the host.
    let table = common::jq_table(&String::from_utf8_lossy(&out.stdout));
    let row: Vec<&str> = table.trim_end().split('\t').collect();
    assert_eq!(&row[..3], ["0", "ok", generation.as_str()], "{table}");
    assert!(row[3].parse::<u64>().unwrap() > 10, "{table}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("signed by ops@example"), "{err}");

    // The node's venv equals a live apply of the same sets onto dst2.
    ok(
        tb.overlay(&["plan", "src", "dst2"]).output().unwrap(),
        "plan",
    );
    ok(tb.overlay(&["apply"]).output().unwrap(), "apply");
    assert_same(
        &snapshot(tb.host_venv_dir(2)),
        &snapshot(tb.host_venv_dir(1)),
        "Slurm bundle apply vs live apply",
    );
    // History, through srun too, names the bundle and its signer.
    let out = ok(cluster.sh(&tb.work, &history), &history);
    let text = String::from_utf8_lossy(&out.stdout);
    let blake3 = overlay::bundle::Bundle::open(&stack).unwrap().blake3;
    assert!(
        text.contains(&generation)
            && text.contains(&format!("from bundle /tmp/stack.ovl (BLAKE3 {blake3})"))
            && text.contains(&format!(
                "signed by ops@example (ssh-ed25519 {})",
                fingerprint(&tb.work.join("id_ops"))
            ))
            && text.contains("trusted by /root/allowed_signers"),
        "{text}"
    );
    // Rolled back the same way: byte for byte what it was.
    ok(cluster.sh(&tb.work, &rollback), &rollback);
    assert_same(
        &dst_before,
        &snapshot(tb.host_venv_dir(1)),
        "rollback --venv through srun",
    );

    // The same bundle signed by a key the nodes do not trust, carried by
    // the same command (the README's text of it): every task refuses it
    // (exit 5) and says so.
    let rogue = tb.work.join("rogue");
    fs::create_dir(&rogue).unwrap();
    binary_in(&rogue);
    fs::copy(&stack, rogue.join("stack.ovl")).unwrap();
    let key = rogue.join("id_rogue");
    ok(
        Command::new("ssh-keygen")
            .args(["-q", "-N", "", "-t", "ed25519", "-C", "rogue", "-f"])
            .arg(&key)
            .output()
            .unwrap(),
        "ssh-keygen",
    );
    ok(
        tb.overlay(&["sign", "rogue/stack.ovl", "--key", key.to_str().unwrap()])
            .output()
            .unwrap(),
        "sign",
    );
    let out = cluster.sh(&rogue, &readme);
    assert_eq!(
        fs::read(node.join("tmp/stack.ovl.sig")).unwrap(),
        fs::read(rogue.join("stack.ovl.sig")).unwrap(),
        "sbcast did not carry the rogue signature"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(err.contains("task 0: Exited with exit code 5"), "{err}");
    let lines = labelled(&out.stdout);
    assert_eq!(lines.len(), 1, "{out:?}");
    for (_, line) in &lines {
        assert_eq!(line["ok"], false, "{line}");
        assert_eq!(line["exit"], 5, "{line}");
        let error = line["error"].as_str().unwrap_or_default();
        assert!(error.contains(&fingerprint(&key)), "{line}");
    }
    assert_same(
        &dst_before,
        &snapshot(tb.host_venv_dir(1)),
        "a bundle by an untrusted signer changed the venv",
    );
    let unpacked: Vec<_> = fs::read_dir(node.join("root"))
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".overlay-bundle.")
        })
        .collect();
    assert!(unpacked.is_empty(), "left beside the venv: {unpacked:?}");
    drop(cluster);
}
