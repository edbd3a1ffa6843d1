//! Test hosts for the integration tests, built by `tests/fixtures/testbed.py`
//! (see its module docstring for the scenario: which paths each set should
//! add, replace, delete or keep).
//!
//! ```ignore
//! mod common;
//!
//! #[test]
//! #[cfg_attr(not(overlay_test_root), ignore = "needs root: mount namespaces and sshd")]
//! fn plans_torch() {
//!     let tb = common::Testbed::new(2); // host 0 = "src" (source role), 1 = "dst"
//!     tb.write_manifest("[sets.torch]\ndists = [\"minitorch\"]\n");
//!     let out = tb.overlay(&["plan", "src", "dst", "--json"]).output().unwrap();
//!     let expected = tb.record_plan(0, 1); // independent reference
//! }
//! ```
//!
//! A test that needs root (every `Testbed::new` or `with_roles(.., true)`,
//! and anything else that mounts) carries
//! `#[cfg_attr(not(overlay_test_root), ignore = "needs root: ...")]`: build.rs
//! sets `overlay_test_root` when the tests are built as root, so that
//! without root libtest reports them as ignored rather than passed.
//! `Testbed::new` itself panics without root, naming the attribute.
//!
//! With root, every host is an sshd on 127.0.0.X in its own mount namespace
//! whose /root is the host's private home and whose /root/venv is that host's
//! venv; the controller runs with HOME = the client dir (its ~/.ssh/config
//! names the hosts `src`, `dst`, `dst2`, ...). Those venvs are copies of one
//! template per role, built once (under CARGO_TARGET_TMPDIR, keyed by
//! testbed.py's content, like the wheels). `Testbed::local` builds the same
//! venvs for the local transport instead (no root needed, ~3 s per venv).
//!
//! `Testbed::with_roles(&["pf-source", "pf-target"], ssh)` makes the same kind
//! of testbed from other testbed.py roles: the `pf-*` roles are the preflight
//! fixtures (their own wheel family, "Preflight scenario" in testbed.py), used
//! by tests/preflight.rs. `Testbed::python(i, code)` runs Python in host `i`'s
//! venv (over ssh or locally) to confirm what imports.
//!
//! Set OVERLAY_TESTBED_KEEP=1 to keep the testbed's directory after the test.
#![allow(dead_code)]

pub mod needs;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;

use sha2::{Digest, Sha256};
use std::hash::{BuildHasher, Hash, Hasher};
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Instant, SystemTime};

/// The fixture's `[preflight]` CUDA family and a `[verify]` check that
/// imports the overlaid packages and asserts the CUDA 13 build.
#[allow(dead_code)]
pub const VERIFY: &str = r#"
[preflight]
cuda_family = ["minitorch", "minitorchvision"]

[verify]
env = { MINITORCH_CHECK = "1" }
python = '''
import minitorch, minitorchvision
import minitorch._C as c
print("build:", c.build_info())
assert minitorch.version.cuda.startswith("13"), minitorch.version.cuda
'''
"#;

/// The four sets of the fixture scenario (testbed.py's docstring says what
/// each should add, replace, delete and keep).
#[allow(dead_code)]
pub const SCENARIO_SETS: &str = r#"
[sets.torch]
dists = ["minitorch"]
[sets.torchvision]
dists = ["minitorchvision"]
[sets.nvidia-cu13]
dists = ["nvidia-*"]
[sets.sglang-patches]
files = ["minisglang/srt/speculative/**", "minisglang/srt/server_args.py"]
"#;

/// Where every test host sees its venv.
pub const VENV: &str = "/root/venv";
/// Site-packages relative to a venv dir (the fixtures are built for 3.11).
pub const SITE: &str = "lib/python3.11/site-packages";

/// `out` of a command that must have succeeded (`what` names it), else a
/// panic with its status, stdout and stderr.
pub fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn testbed_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/testbed.py")
}

fn target_tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Run a command; panic with its output unless it succeeds.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

fn testbed() -> Command {
    let mut c = Command::new("/usr/bin/python3");
    c.arg(testbed_py());
    c
}

/// Content hash of testbed.py: the key of every cached fixture.
fn fixture_key() -> &'static str {
    static KEY: OnceLock<String> = OnceLock::new();
    KEY.get_or_init(|| {
        let script = fs::read(testbed_py()).expect("read testbed.py");
        let mut h = std::collections::hash_map::DefaultHasher::new();
        script.hash(&mut h);
        format!("{:016x}", h.finish())
    })
}

/// `CARGO_TARGET_TMPDIR/{prefix}{key}`, made by `build(dir)` unless a
/// previous run finished it (`.complete`), under `{prefix}lock` so that
/// parallel test processes wait for each other. Older keys are removed.
fn cached(prefix: &str, build: impl FnOnce(&Path)) -> PathBuf {
    let key = fixture_key();
    let tmp = target_tmp();
    fs::create_dir_all(&tmp).unwrap();
    let dir = tmp.join(format!("{prefix}{key}"));
    let lock = fs::File::create(tmp.join(format!("{prefix}lock"))).unwrap();
    lock.lock().expect("lock the fixture cache");
    if !dir.join(".complete").exists() {
        for e in fs::read_dir(&tmp).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.strip_prefix(prefix).is_some_and(|k| k.len() == 16) && e.path().is_dir() {
                let _ = fs::remove_dir_all(e.path());
            }
        }
        build(&dir);
        fs::write(dir.join(".complete"), key).unwrap();
    }
    drop(lock);
    dir
}

/// The fixture wheels, built once per `cargo test` run (and kept across runs
/// while testbed.py is unchanged) under CARGO_TARGET_TMPDIR.
pub fn wheels_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        cached("testbed-wheels-", |dir| {
            run(testbed().arg("wheels").arg(dir));
        })
    })
    .clone()
}

/// The preflight (`pf`) family of fixture wheels (`testbed.py wheels DIR
/// --family pf`), built once like [`wheels_dir`].
pub fn pf_wheels_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        cached("testbed-pfwheels-", |dir| {
            run(testbed().args(["wheels", "--family", "pf"]).arg(dir));
        })
    })
    .clone()
}

/// The wheels a venv of `role` is built from: roles `pf-*` use the pf family.
pub fn wheels_for_role(role: &str) -> PathBuf {
    if role.starts_with("pf-") {
        pf_wheels_dir()
    } else {
        wheels_dir()
    }
}

/// [`venv_template`] for any role of testbed.py (`source`, `target`,
/// `pf-source`, `pf-target`), memoized per role.
fn role_template(role: &str) -> PathBuf {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    static CELLS: OnceLock<Mutex<HashMap<String, Arc<OnceLock<PathBuf>>>>> = OnceLock::new();
    let cell = CELLS
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(role.to_string())
        .or_default()
        .clone();
    cell.get_or_init(|| {
        let wheels = wheels_for_role(role);
        cached(&format!("testbed-venv-{role}-"), |dir| {
            let _ = fs::remove_dir_all(dir);
            fs::create_dir_all(dir).unwrap();
            run(testbed()
                .arg("venv")
                .arg(dir.join("venv"))
                .args(["--at", VENV, "--role", role])
                .arg("--wheels")
                .arg(&wheels));
        })
        .join("venv")
    })
    .clone()
}

/// A venv of `role` built once at /root/venv (bind-mounted) and copied for
/// each SSH testbed: every SSH host has its venv at /root/venv, so the copy
/// is exact (shebangs, pyvenv.cfg, RECORD, mtimes with `cp -a`).
fn venv_template(role: &'static str) -> PathBuf {
    role_template(role)
}

fn random_u64() -> u64 {
    std::hash::RandomState::new().hash_one((std::process::id(), SystemTime::now(), Instant::now()))
}

/// A random loopback address 127.0.0.X (X in 10..250) and a port free on it.
fn pick_address() -> (String, u16) {
    let ip = format!("127.0.0.{}", 10 + random_u64() % 240);
    let port = TcpListener::bind((ip.as_str(), 0))
        .and_then(|l| l.local_addr())
        .expect("bind a free port")
        .port();
    (ip, port)
}

pub struct Host {
    /// Name in the manifest and ssh alias: "src", "dst", "dst2", ...
    pub name: String,
    /// HOSTDIR: sshd_config, host key, root/ (the host's ~), tmp/ (its /tmp).
    pub dir: PathBuf,
    /// The real directory behind the host's /root/venv.
    pub venv_dir: PathBuf,
    /// The venv path in the manifest ("/root/venv", or venv_dir for local).
    pub venv: String,
    /// None for a local-transport host.
    pub addr: Option<(String, u16)>,
    up: bool,
}

pub struct Testbed {
    root: Option<tempfile::TempDir>,
    /// HOME of the controller: .ssh/{config,known_hosts,id_ed25519}.
    pub client: PathBuf,
    /// The controller's current directory, holding overlay.toml.
    pub work: PathBuf,
    pub hosts: Vec<Host>,
}

fn host_name(i: usize) -> String {
    match i {
        0 => "src".into(),
        1 => "dst".into(),
        _ => format!("dst{i}"),
    }
}

impl Testbed {
    /// `n_hosts` SSH test hosts (needs root): host 0 has the source venv,
    /// the others the target venv, each at /root/venv.
    pub fn new(n_hosts: usize) -> Testbed {
        Self::build(n_hosts, true)
    }

    /// The same venvs for the local transport (no root needed): each lives at
    /// its own directory and the manifest's hosts have no `ssh`.
    pub fn local(n_hosts: usize) -> Testbed {
        Self::build(n_hosts, false)
    }

    /// One host per entry of `roles` (testbed.py venv roles: "source",
    /// "target", "pf-source", "pf-target"), named src, dst, dst2, ... in
    /// that order; SSH hosts (root) when `ssh`, else the local transport.
    /// `with_roles(&["pf-source", "pf-target"], false)` is the preflight pair.
    pub fn with_roles(roles: &[&str], ssh: bool) -> Testbed {
        let roles: Vec<String> = roles.iter().map(|r| r.to_string()).collect();
        Self::build_roles(&roles, ssh)
    }

    fn build(n_hosts: usize, ssh: bool) -> Testbed {
        assert!(n_hosts >= 1);
        let roles: Vec<String> = (0..n_hosts)
            .map(|i| if i == 0 { "source" } else { "target" }.to_string())
            .collect();
        Self::build_roles(&roles, ssh)
    }

    fn build_roles(roles: &[String], ssh: bool) -> Testbed {
        let n_hosts = roles.len();
        assert!(n_hosts >= 1);
        if ssh {
            assert!(
                is_root(),
                "SSH test hosts need root (mount namespaces, sshd): mark the test \
                 #[cfg_attr(not(overlay_test_root), ignore = \"needs root: mount namespaces and sshd\")]"
            );
            for tool in ["/usr/sbin/sshd", "/usr/bin/unshare"] {
                assert!(
                    Path::new(tool).exists(),
                    "SSH test hosts need {tool} (packages openssh-server, util-linux; run scripts/setup)"
                );
            }
        }
        let t0 = Instant::now();
        for r in roles {
            // Build each wheel family once, before the parallel venv builds.
            wheels_for_role(r);
        }
        let root = tempfile::Builder::new()
            .prefix("testbed-")
            .tempdir_in(target_tmp())
            .expect("create testbed dir");
        let base = root.path().to_path_buf();
        let mut tb = Testbed {
            root: Some(root),
            client: base.join("client"),
            work: base.join("work"),
            hosts: Vec::new(),
        };
        fs::create_dir_all(&tb.work).unwrap();
        for i in 0..n_hosts {
            let dir = base.join(format!("host{i}"));
            let venv_dir = dir.join("venv");
            let venv = if ssh {
                VENV.to_string()
            } else {
                venv_dir.to_str().unwrap().to_string()
            };
            tb.hosts.push(Host {
                name: host_name(i),
                dir,
                venv_dir,
                venv,
                addr: None,
                up: false,
            });
        }
        let role = |i: usize| roles[i].as_str();
        if ssh {
            // Copies of the cached templates (~0.1 s instead of ~3 s each).
            let mut distinct: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
            distinct.sort();
            distinct.dedup();
            std::thread::scope(|s| {
                for r in &distinct {
                    s.spawn(move || role_template(r));
                }
            });
            let copies: Vec<_> = tb
                .hosts
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    fs::create_dir_all(&h.dir).unwrap();
                    let mut c = Command::new("cp");
                    c.arg("-a").arg(role_template(role(i))).arg(&h.venv_dir);
                    (format!("{c:?}"), c.spawn().expect("spawn cp"))
                })
                .collect();
            for (cmd, mut child) in copies {
                assert!(child.wait().unwrap().success(), "{cmd} failed");
            }
        } else {
            // Each local venv lives at its own path: built in parallel (~3 s each).
            let children: Vec<_> = tb
                .hosts
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    fs::create_dir_all(&h.dir).unwrap();
                    let mut c = testbed();
                    c.arg("venv")
                        .arg(&h.venv_dir)
                        .args(["--at", &h.venv, "--role", role(i)])
                        .arg("--wheels")
                        .arg(wheels_for_role(role(i)))
                        .stdin(Stdio::null())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped());
                    (format!("{c:?}"), c.spawn().expect("spawn testbed.py venv"))
                })
                .collect();
            for (cmd, child) in children {
                let out = child.wait_with_output().unwrap();
                assert!(
                    out.status.success(),
                    "{cmd} failed:\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        run(testbed().arg("client").arg(&tb.client));
        if ssh {
            let key = tb.client.join(".ssh/id_ed25519.pub");
            for h in tb.hosts.iter_mut() {
                let mut last = String::new();
                for _attempt in 0..5 {
                    let (ip, port) = pick_address();
                    let out = testbed()
                        .args(["host", "up"])
                        .arg(&h.dir)
                        .arg("--venv-dir")
                        .arg(&h.venv_dir)
                        .args(["--ip", &ip, "--port", &port.to_string()])
                        .arg("--authorized-keys")
                        .arg(&key)
                        .stdin(Stdio::null())
                        .output()
                        .expect("run testbed.py host up");
                    if out.status.success() {
                        h.addr = Some((ip, port));
                        h.up = true;
                        break;
                    }
                    last = String::from_utf8_lossy(&out.stderr).into_owned();
                }
                assert!(h.up, "host {} did not come up:\n{last}", h.name);
            }
            tb.write_client();
        }
        eprintln!(
            "testbed: {} {} host(s) in {:.1}s at {}",
            n_hosts,
            if ssh { "ssh" } else { "local" },
            t0.elapsed().as_secs_f64(),
            base.display()
        );
        tb
    }

    pub fn dir(&self) -> &Path {
        self.root.as_ref().unwrap().path()
    }

    /// The real directory behind host `i`'s venv (inspect it directly).
    pub fn host_venv_dir(&self, i: usize) -> &Path {
        &self.hosts[i].venv_dir
    }

    /// Host `i`'s site-packages, seen from the test process.
    pub fn site_packages(&self, i: usize) -> PathBuf {
        self.hosts[i].venv_dir.join(SITE)
    }

    /// HOSTDIR of host `i`; `host_dir(i).join("root")` is its home (~/.cache/overlay...).
    pub fn host_dir(&self, i: usize) -> &Path {
        &self.hosts[i].dir
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.work.join("overlay.toml")
    }

    /// Write work/overlay.toml: the `[hosts.*]` tables, then `sets_toml`.
    pub fn write_manifest(&self, sets_toml: &str) -> PathBuf {
        let mut s = String::from("# written by tests/common/mod.rs\n");
        for h in &self.hosts {
            s.push_str(&format!("[hosts.{}]\n", h.name));
            if h.addr.is_some() {
                s.push_str(&format!("ssh = \"{}\"\n", h.name));
            }
            s.push_str(&format!("venv = \"{}\"\n\n", h.venv));
        }
        s.push_str(sets_toml);
        s.push('\n');
        let path = self.manifest_path();
        fs::write(&path, s).unwrap();
        path
    }

    /// `overlay ARGS` with HOME = the client dir, run in the work dir.
    pub fn overlay(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_overlay"));
        c.args(args)
            .env("HOME", &self.client)
            .env_remove("SSH_AUTH_SOCK")
            .current_dir(&self.work)
            .stdin(Stdio::null());
        c
    }

    /// The system ssh client, to look at host `i` from the outside.
    pub fn ssh(&self, i: usize, remote_cmd: &str) -> Command {
        let ssh = self.client.join(".ssh");
        let mut c = Command::new("ssh");
        c.arg("-F")
            .arg(ssh.join("config"))
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                ssh.join("known_hosts").display()
            ))
            .arg("-i")
            .arg(ssh.join("id_ed25519"))
            .args(["-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes"])
            .arg(&self.hosts[i].name)
            .arg(remote_cmd)
            .env_remove("SSH_AUTH_SOCK")
            .stdin(Stdio::null());
        c
    }

    /// Run Python `code` with host `i`'s venv interpreter, as that host sees
    /// it: over ssh (`/root/venv/bin/python -c CODE`) for an SSH host, else
    /// the local venv's bin/python run directly with a clean loader/Python
    /// environment (no LD_LIBRARY_PATH, PYTHONPATH, PYTHONHOME).
    pub fn python(&self, i: usize, code: &str) -> Command {
        let h = &self.hosts[i];
        if h.addr.is_some() {
            let quoted = format!("'{}'", code.replace('\'', r"'\''"));
            self.ssh(i, &format!("{}/bin/python -c {quoted}", h.venv))
        } else {
            let mut c = Command::new(h.venv_dir.join("bin/python"));
            c.arg("-c")
                .arg(code)
                .env_remove("LD_LIBRARY_PATH")
                .env_remove("LD_PRELOAD")
                .env_remove("PYTHONPATH")
                .env_remove("PYTHONHOME")
                .env_remove("VIRTUAL_ENV")
                .current_dir(&h.dir)
                .stdin(Stdio::null());
            c
        }
    }

    /// The reference plan from testbed.py record-plan between hosts `src`
    /// and `dst`, for the sets of the current overlay.toml (write it first).
    /// `{"sets":[{"name","changes":[{"path","action","size"}],"unchanged"}]}`;
    /// action is add/replace/delete/keep.
    pub fn record_plan(&self, src: usize, dst: usize) -> serde_json::Value {
        let out = run(testbed()
            .arg("record-plan")
            .arg(&self.hosts[src].venv_dir)
            .arg(&self.hosts[dst].venv_dir)
            .arg("--manifest")
            .arg(self.manifest_path())
            .args([
                "--src-at",
                &self.hosts[src].venv,
                "--dst-at",
                &self.hosts[dst].venv,
            ]));
        serde_json::from_slice(&out.stdout).expect("record-plan prints JSON")
    }

    /// `overlay plan src dst --json`, which must succeed: the plan.
    pub fn plan_json(&self) -> serde_json::Value {
        let out = ok(
            self.overlay(&["plan", "src", "dst", "--json"])
                .output()
                .unwrap(),
            "plan",
        );
        serde_json::from_slice(&out.stdout).expect("plan --json prints JSON")
    }

    /// Stop host `i` (Drop does it for all).
    pub fn stop(&mut self, i: usize) {
        let h = &mut self.hosts[i];
        if h.up {
            h.up = false;
            let out = testbed()
                .args(["host", "down"])
                .arg(&h.dir)
                .stdin(Stdio::null())
                .output();
            match out {
                Ok(o) if o.status.success() => {}
                Ok(o) => eprintln!(
                    "testbed: host down {} failed: {}",
                    h.dir.display(),
                    String::from_utf8_lossy(&o.stderr)
                ),
                Err(e) => eprintln!("testbed: host down {}: {e}", h.dir.display()),
            }
        }
    }

    /// Give SSH host `i` the home directory of SSH host `with`, as hosts
    /// that mount one NFS `/home` or `/root` share it: host `i` is
    /// restarted with its HOSTDIR/root a symlink to `with`'s, so both see
    /// one /root (`~/.cache/overlay` included), each still with its own
    /// /root/venv and /tmp (bound in its own mount namespace).
    pub fn share_home(&mut self, i: usize, with: usize) {
        assert_ne!(i, with);
        self.stop(i);
        let mine = self.hosts[i].dir.join("root");
        fs::remove_dir_all(&mine).unwrap();
        std::os::unix::fs::symlink(self.hosts[with].dir.join("root"), &mine).unwrap();
        self.restart_host(i, &[]);
    }

    /// Restart SSH host `i` on its address with `sshd_options` as extra
    /// sshd_config lines (e.g. `["Ciphers aes128-ctr", "MACs hmac-sha2-256"]`;
    /// none for the default config). Its host key, ~ and venv stay.
    pub fn restart_host(&mut self, i: usize, sshd_options: &[&str]) {
        self.stop(i);
        let key = self.client.join(".ssh/id_ed25519.pub");
        let h = &mut self.hosts[i];
        let (ip, port) = h.addr.clone().expect("restart_host: an SSH host");
        let mut c = testbed();
        c.args(["host", "up"])
            .arg(&h.dir)
            .arg("--venv-dir")
            .arg(&h.venv_dir)
            .args(["--ip", &ip, "--port", &port.to_string()])
            .arg("--authorized-keys")
            .arg(&key);
        for o in sshd_options {
            c.arg(format!("--sshd-option={o}"));
        }
        run(c.stdin(Stdio::null()));
        h.up = true;
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for i in 0..self.hosts.len() {
            self.stop(i);
        }
        if std::env::var_os("OVERLAY_TESTBED_KEEP").is_some()
            && let Some(root) = self.root.take()
        {
            let path = root.keep();
            let _ = writeln!(std::io::stderr(), "testbed: kept {}", path.display());
        }
    }
}

/// Every path of a venv (but overlay's own state) with type, mode, size and
/// content hash or link target: compare before/after trees with [`assert_same`].
pub fn snapshot(venv: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in walkdir::WalkDir::new(venv).min_depth(1).sort_by_file_name() {
        let e = e.unwrap();
        let rel = e
            .path()
            .strip_prefix(venv)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel == ".overlay" || rel.starts_with(".overlay/") {
            continue;
        }
        let m = fs::symlink_metadata(e.path()).unwrap();
        let mode = m.permissions().mode() & 0o7777;
        let desc = if m.file_type().is_symlink() {
            format!("link {}", fs::read_link(e.path()).unwrap().display())
        } else if m.is_dir() {
            format!("dir {mode:o}")
        } else {
            let sha = overlay::text::hex(&Sha256::digest(fs::read(e.path()).unwrap()));
            format!("file {mode:o} {} {sha}", m.len())
        };
        out.insert(rel, desc);
    }
    out
}

/// A RECORD's rows other than those of `bin/` scripts: after an apply
/// between venvs at different paths, the target rewrites the rows of the
/// scripts whose shebang was rewritten, and keeps every other row.
pub fn rows_but_scripts(record: &Path) -> Vec<String> {
    fs::read_to_string(record)
        .unwrap()
        .lines()
        .filter(|l| !l.contains("/bin/"))
        .map(String::from)
        .collect()
}

pub fn assert_same(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>, what: &str) {
    let mut diffs = Vec::new();
    for (k, v) in a {
        match b.get(k) {
            None => diffs.push(format!("- {k} ({v})")),
            Some(w) if w != v => diffs.push(format!("~ {k}: {v} -> {w}")),
            _ => {}
        }
    }
    for k in b.keys().filter(|k| !a.contains_key(*k)) {
        diffs.push(format!("+ {k}"));
    }
    assert!(
        diffs.is_empty(),
        "{what}: {} differences:\n{}",
        diffs.len(),
        diffs
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Give host `from` an SSH identity, config and known_hosts entry for host
/// `to` (as alias `name`), and let `to` accept that identity: what
/// `apply --direct` needs of a real source host.
pub fn let_host_reach(tb: &Testbed, from: usize, to: usize, name: &str, trust_key: bool) {
    let home = tb.host_dir(from).join("root");
    let ssh = home.join(".ssh");
    fs::create_dir_all(&ssh).unwrap();
    let key = ssh.join("id_ed25519");
    if !key.exists() {
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "overlay-test", "-f"])
            .arg(&key));
    }
    let pubkey = fs::read_to_string(ssh.join("id_ed25519.pub")).unwrap();
    let ak = tb.host_dir(to).join("authorized_keys");
    let mut keys = fs::read_to_string(&ak).unwrap();
    if !keys.contains(pubkey.trim()) {
        keys.push_str(&pubkey);
        fs::write(&ak, keys).unwrap();
    }
    let (ip, port) = tb.hosts[to].addr.clone().unwrap();
    fs::write(
        ssh.join("config"),
        format!(
            "Host {name}\n    HostName {ip}\n    Port {port}\n    User root\n    IdentityFile /root/.ssh/id_ed25519\n    IdentitiesOnly yes\n    UserKnownHostsFile /root/.ssh/known_hosts\n    StrictHostKeyChecking yes\n"
        ),
    )
    .unwrap();
    let hostkey = fs::read_to_string(tb.host_dir(to).join("ssh_host_ed25519_key.pub")).unwrap();
    let hostkey: Vec<&str> = hostkey.split_whitespace().take(2).collect();
    let kh = if trust_key {
        format!("[{ip}]:{port} {}\n", hostkey.join(" "))
    } else {
        String::new()
    };
    fs::write(ssh.join("known_hosts"), kh).unwrap();
}

// ---------------------------------------------------------------------------
// Bastions (tests/bastion.rs): a host that only a jump host reaches, and
// jump hosts (plain sshds with no venv).

impl Testbed {
    /// Restart host `i`'s sshd in a network namespace of its own (its own
    /// loopback, nothing else): nothing in this namespace can reach it. The
    /// client's ~/.ssh/config and known_hosts are written again for its new
    /// address. Returns the pid of a process in that namespace (for
    /// `nsenter --net=/proc/PID/ns/net`).
    pub fn isolate(&mut self, i: usize) -> u32 {
        self.stop(i);
        let key = self.client.join(".ssh/id_ed25519.pub");
        let h = &mut self.hosts[i];
        let (ip, port) = pick_address();
        run(Command::new("unshare")
            .args([
                "--net",
                "sh",
                "-c",
                "ip link set lo up && exec \"$@\"",
                "sh",
            ])
            .arg("/usr/bin/python3")
            .arg(testbed_py())
            .args(["host", "up"])
            .arg(&h.dir)
            .arg("--venv-dir")
            .arg(&h.venv_dir)
            .args(["--ip", &ip, "--port", &port.to_string()])
            .arg("--authorized-keys")
            .arg(&key));
        h.addr = Some((ip, port));
        h.up = true;
        let pid: u32 = fs::read_to_string(h.dir.join("pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        self.write_client();
        pid
    }

    /// Write the client's ~/.ssh/config and known_hosts for the hosts'
    /// current addresses.
    pub fn write_client(&self) {
        let mut c = testbed();
        c.arg("client").arg(&self.client);
        for h in &self.hosts {
            let (ip, port) = h.addr.as_ref().unwrap();
            c.arg("--host")
                .arg(format!("{}={ip}:{port}:{}", h.name, h.dir.display()));
        }
        run(&mut c);
    }
}

/// The first file in `dir` whose name starts with `prefix`.
pub fn file_starting_with(dir: &Path, prefix: &str) -> Option<PathBuf> {
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
}

/// A jump host: an sshd that lets the test client's key in and forwards.
pub struct JumpHost {
    pub name: String,
    pub dir: PathBuf,
    pub ip: String,
    pub port: u16,
    /// The daemon (None for one that serves from inside a namespace).
    daemon: Option<std::process::Child>,
}

impl JumpHost {
    fn prepare(tb: &Testbed, name: &str) -> (PathBuf, PathBuf, String, u16) {
        let dir = tb.dir().join(format!("jump-{name}"));
        fs::create_dir_all(&dir).unwrap();
        let key = dir.join("ssh_host_ed25519_key");
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
            .arg(&key));
        let ak = dir.join("authorized_keys");
        fs::copy(tb.client.join(".ssh/id_ed25519.pub"), &ak).unwrap();
        let (ip, port) = pick_address();
        let cfg = dir.join("sshd_config");
        fs::write(
            &cfg,
            format!(
                "ListenAddress {ip}\nPort {port}\nHostKey {}\nPidFile none\nAuthorizedKeysFile {}\n\
                 PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nStrictModes no\nUsePAM no\nUseDNS no\n\
                 AllowTcpForwarding yes\nMaxStartups 64:30:128\nLogLevel ERROR\n",
                key.display(),
                ak.display()
            ),
        )
        .unwrap();
        (dir, cfg, ip, port)
    }

    /// An sshd daemon on 127.0.0.X of this network namespace.
    pub fn daemon(tb: &Testbed, name: &str) -> JumpHost {
        let (dir, cfg, ip, port) = Self::prepare(tb, name);
        let log = fs::File::create(dir.join("sshd.log")).unwrap();
        let child = Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sshd");
        while std::net::TcpStream::connect((ip.as_str(), port)).is_err() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let j = JumpHost {
            name: name.into(),
            dir,
            ip,
            port,
            daemon: Some(child),
        };
        j.trust(tb);
        j
    }

    /// A jump host reached on 127.0.0.X of this network namespace whose
    /// sshd runs in the network namespace of process `pid`: each connection
    /// is served by `nsenter --net sshd -i`, so its forwarded connections
    /// start from there.
    pub fn into_netns(tb: &Testbed, name: &str, pid: u32) -> JumpHost {
        let (dir, cfg, ip, port) = Self::prepare(tb, name);
        let listener = TcpListener::bind((ip.as_str(), port)).expect("bind the jump host's port");
        let log = dir.join("sshd.log");
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let out = conn.try_clone().unwrap();
                let err = fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap();
                let child = Command::new("nsenter")
                    .arg(format!("--net=/proc/{pid}/ns/net"))
                    .args(["/usr/sbin/sshd", "-i", "-e", "-f"])
                    .arg(&cfg)
                    .stdin(Stdio::from(std::os::fd::OwnedFd::from(conn)))
                    .stdout(Stdio::from(std::os::fd::OwnedFd::from(out)))
                    .stderr(err)
                    .spawn();
                if let Ok(mut child) = child {
                    std::thread::spawn(move || child.wait());
                }
            }
        });
        let j = JumpHost {
            name: name.into(),
            dir,
            ip,
            port,
            daemon: None,
        };
        j.trust(tb);
        j
    }

    /// Name it in the client's ~/.ssh/config and its host key in known_hosts.
    fn trust(&self, tb: &Testbed) {
        let ssh = tb.client.join(".ssh");
        let mut config = fs::read_to_string(ssh.join("config")).unwrap();
        config.push_str(&format!(
            "Host {}\n    HostName {}\n    Port {}\n    User root\n    IdentityFile {}\n    UserKnownHostsFile {}\n    IdentitiesOnly yes\n    BatchMode yes\n\n",
            self.name,
            self.ip,
            self.port,
            ssh.join("id_ed25519").display(),
            ssh.join("known_hosts").display()
        ));
        fs::write(ssh.join("config"), config).unwrap();
        let mut kh = fs::read_to_string(ssh.join("known_hosts")).unwrap();
        kh.push_str(&self.known_hosts_line());
        fs::write(ssh.join("known_hosts"), kh).unwrap();
    }

    /// Its line for known_hosts: `[ip]:port type key`.
    pub fn known_hosts_line(&self) -> String {
        let public = fs::read_to_string(self.dir.join("ssh_host_ed25519_key.pub")).unwrap();
        let k: Vec<&str> = public.split_whitespace().take(2).collect();
        format!("[{}]:{} {}\n", self.ip, self.port, k.join(" "))
    }

    /// Stop the daemon (a jump host that is down).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for JumpHost {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---------------------------------------------------------------------------
// sudo (tests/sudo.rs): ordinary login users on the SSH test hosts
// ---------------------------------------------------------------------------

/// Make sure the ordinary user `name` exists on this machine (the test hosts
/// share /etc and /home with it), with a home of its own, an account sshd
/// accepts a key for (password `*`: no password, not locked), and, when
/// `sudoers` is given, that line in /etc/sudoers.d/`name` (checked with
/// visudo). Idempotent; the test hosts' shared AuthorizedKeysFile lets the
/// testbed's client key in as any user.
pub fn ensure_user(name: &str, sudoers: Option<&str>) {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let exists = Command::new("id")
        .args(["-u", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !exists {
        run(Command::new("useradd").args(["-m", "-s", "/bin/sh", name]));
    }
    run(Command::new("usermod").args(["-p", "*", name]));
    let file = PathBuf::from(format!("/etc/sudoers.d/{name}"));
    match sudoers {
        Some(line) => {
            let tmp = PathBuf::from(format!("/etc/sudoers.d/.{name}.tmp"));
            fs::write(&tmp, format!("{line}\n")).unwrap();
            fs::set_permissions(&tmp, fs::Permissions::from_mode(0o440)).unwrap();
            run(Command::new("visudo")
                .arg("-c")
                .arg("-q")
                .arg("-f")
                .arg(&tmp));
            fs::rename(&tmp, &file).unwrap();
        }
        None => {
            let _ = fs::remove_file(&file);
        }
    }
}

/// The uid of user `name` on this machine.
pub fn uid_of(name: &str) -> u32 {
    let out = run(Command::new("id").args(["-u", name]));
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

// ---------------------------------------------------------------------------
// Signed bundles carried by fleet tools (tests/bundle.rs, tests/slurm.rs)
// ---------------------------------------------------------------------------

/// `overlay pack src -o FILE --sign KEY` with a key made here, and an
/// allowed_signers file trusting it for bundles: (bundle, allowed_signers).
pub fn pack_signed(tb: &Testbed, file: &str) -> (PathBuf, PathBuf) {
    let key = tb.work.join("id_ops");
    if !key.exists() {
        ok(
            Command::new("ssh-keygen")
                .args(["-q", "-N", "", "-t", "ed25519", "-C", "ops", "-f"])
                .arg(&key)
                .output()
                .unwrap(),
            "ssh-keygen",
        );
    }
    let out = ok(
        tb.overlay(&["pack", "src", "-o", file, "--sign", key.to_str().unwrap()])
            .output()
            .unwrap(),
        "pack --sign",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Signed with ssh-ed25519"), "{err}");
    let signers = tb.work.join("allowed_signers");
    fs::write(
        &signers,
        format!(
            "ops@example namespaces=\"overlay-bundle\" {}",
            fs::read_to_string(key.with_extension("pub")).unwrap()
        ),
    )
    .unwrap();
    (tb.work.join(file), signers)
}

/// The documented jq line (docs/fleet.md "Bundles"): pdsh's `host: {json}`
/// lines (or srun --label's `task: {json}`) as a table, one tab-separated
/// row per host.
pub const JQ_TABLE: &str = r#"capture("^(?<host>[^:]+): (?<doc>[{].*)$") | (.doc | fromjson) as $r | [.host, (if $r.ok then "ok" else "FAILED" end), ($r.generation // "-"), ($r.changes // 0), ($r.error // "")] | @tsv"#;

/// [`JQ_TABLE`] run by jq over `lines`: the table's text.
pub fn jq_table(lines: &str) -> String {
    let out = Command::new("jq")
        .args(["-rR", JQ_TABLE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(lines.as_bytes())?;
            c.wait_with_output()
        })
        .expect("run jq (scripts/setup installs it)");
    String::from_utf8_lossy(&ok(out, "jq").stdout).into_owned()
}
