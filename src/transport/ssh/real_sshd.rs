//! The ssh transport end to end against a real OpenSSH server (sshd on
//! 127.0.0.9, root's home as the remote home): host key checks, upload and
//! reuse of the agent, both directions of the pipe at once, authentication
//! failures, ssh-agent, and connect errors. Needs root and /usr/sbin/sshd
//! (ignored, and shown so, otherwise):
//!   cargo test --lib transport::ssh::real_sshd -- --nocapture

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use ssh2::MethodType;

use super::config::{LocalEnv, LocalUser, resolve};
use super::connect::connect;
use super::upload::{Renamed, agent_digest, posix_rename};
use super::{AgentPipe, ConnectOptions, Who, start_agent_with};
use crate::error::{Error, Result};

use std::process::{Child, Command, Stdio};

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes what the test created under root's home (file, then empty dirs).
struct RemoveOnDrop(Vec<PathBuf>);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir(p));
        }
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn keygen(path: &Path, pass: &str) {
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", pass, "-C", "test-key", "-f"])
        .arg(path));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.9:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

const ECHO_C: &str = r#"
#include <unistd.h>
#include <string.h>
int main(int argc, char **argv) {
static char buf[65536];
ssize_t n;
int first = 1, fail = 0;
if (argc != 2 || strcmp(argv[1], "agent") != 0) { write(2, "bad args\n", 9); return 2; }
while ((n = read(0, buf, sizeof buf)) > 0) {
    if (first && buf[0] == 'X') fail = 1;
    first = 0;
    for (ssize_t off = 0; off < n;) {
        ssize_t w = write(1, buf + off, n - off);
        if (w <= 0) return 4;
        off += w;
    }
}
if (fail) { write(2, "failing as asked\n", 17); return 3; }
write(2, "echo done\n", 10);
return 0;
}
"#;

fn show(label: &str, e: &Error) {
    eprintln!(
        "--- {label}\nerror: {}\nhint: {}",
        e.message,
        e.hint.as_deref().unwrap_or("-")
    );
}

fn expect_err(r: Result<AgentPipe>) -> Error {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

/// sshd on 127.0.0.9 with its keys, client config and known_hosts files
/// under a temporary home, and the echo agent built for it; the test's
/// steps share it. Dropped in field order: what the test created under
/// root's home, then sshd, then the temporary folder.
struct Sshd {
    _cleanup: RemoveOnDrop,
    _sshd: Kill,
    tmp: tempfile::TempDir,
    port: u16,
    ssh_dir: PathBuf,
    /// The known_hosts file the first connection writes.
    kh: PathBuf,
    env: LocalEnv,
    opts: ConnectOptions,
    /// `opts` with `--accept-new-host-key`.
    accept: ConnectOptions,
    /// The host key's OpenSSH fingerprint.
    fp: String,
    /// Where the agent is uploaded on the host.
    remote: String,
}

impl Sshd {
    fn start() -> Sshd {
        assert!(
            Path::new("/usr/sbin/sshd").exists(),
            "needs /usr/sbin/sshd (openssh-server; scripts/setup installs it)"
        );
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let home = d.join("home");
        let ssh_dir = home.join(".ssh");
        std::fs::create_dir_all(&ssh_dir).unwrap();
        keygen(&d.join("hostkey"), "");
        keygen(&ssh_dir.join("id_ed25519"), "");
        keygen(&ssh_dir.join("wrong"), "");
        keygen(&ssh_dir.join("enc"), "secret");
        keygen(&d.join("other_host"), "");
        std::fs::copy(ssh_dir.join("id_ed25519.pub"), d.join("authorized_keys")).unwrap();
        let port = free_port();
        let sshd = start_sshd(d, port);

        std::fs::write(d.join("echo.c"), ECHO_C).unwrap();
        run(Command::new("musl-gcc")
            .args(["-static", "-O2", "-o"])
            .arg(d.join("echo-agent"))
            .arg(d.join("echo.c")));

        let kh = ssh_dir.join("known_hosts");
        write_client_files(d, &ssh_dir, port);
        let env = LocalEnv {
            user: LocalUser {
                name: "nobody-here".into(),
                home: home.clone(),
            },
            config_path: ssh_dir.join("config"),
            agent_sock: None,
            agent_binary: d.join("echo-agent"),
            global_known_hosts: vec![],
        };
        let opts = ConnectOptions {
            timeout: Duration::from_secs(5),
            accept_new_host_key: false,
        };
        let accept = ConnectOptions {
            accept_new_host_key: true,
            ..opts.clone()
        };
        let fp = run(Command::new("ssh-keygen")
            .arg("-lf")
            .arg(d.join("hostkey.pub")));
        let fp = fp.split_whitespace().nth(1).unwrap().to_string();
        let remote = format!(
            "/root/.cache/overlay/overlay-{}",
            &agent_digest(&env.agent_binary).unwrap().hex[..16]
        );
        let _ = std::fs::remove_file(&remote);
        let cleanup = RemoveOnDrop(
            [remote.as_str(), "/root/.cache/overlay", "/root/.cache"]
                .into_iter()
                .filter(|p| !Path::new(p).exists())
                .map(PathBuf::from)
                .collect(),
        );
        Sshd {
            _cleanup: cleanup,
            _sshd: sshd,
            tmp,
            port,
            ssh_dir,
            kh,
            env,
            opts,
            accept,
            fp,
            remote,
        }
    }
}

/// sshd on 127.0.0.9:`port`, its host key and `authorized_keys` in `d`,
/// listening when this returns.
fn start_sshd(d: &Path, port: u16) -> Kill {
    std::fs::write(
        d.join("sshd_config"),
        format!(
            "ListenAddress 127.0.0.9\nPort {port}\nHostKey {dir}/hostkey\nPidFile {dir}/sshd.pid\n\
             AuthorizedKeysFile {dir}/authorized_keys\nPermitRootLogin prohibit-password\n\
             StrictModes no\nUsePAM no\nSubsystem sftp internal-sftp\nLogLevel ERROR\n",
            dir = d.display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let sshd = Kill(
        Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let addr: SocketAddr = format!("127.0.0.9:{port}").parse().unwrap();
    // Up to 250 tries, 20 ms apart, for sshd to listen.
    let mut tries = 0;
    while TcpStream::connect(addr).is_err() {
        tries += 1;
        assert!(tries < 250, "sshd did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    sshd
}

/// The client's files in `ssh_dir`: known_hosts files with another host's
/// key and with another key type, and the config of every alias the test
/// connects to.
fn write_client_files(d: &Path, ssh_dir: &Path, port: u16) {
    let other_pub = std::fs::read_to_string(d.join("other_host.pub")).unwrap();
    let other_key = other_pub.split_whitespace().nth(1).unwrap();
    std::fs::write(
        ssh_dir.join("kh_tampered"),
        format!("[127.0.0.9]:{port} ssh-ed25519 {other_key}\n"),
    )
    .unwrap();
    std::fs::write(
        ssh_dir.join("kh_rsa"),
        format!("[127.0.0.9]:{port} ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDTqBo3sR/kVyxX\n"),
    )
    .unwrap();
    let entry = |alias: &str, extra: &str| {
        format!("Host {alias}\n    HostName 127.0.0.9\n    Port {port}\n    User root\n{extra}\n")
    };
    let config = [
        entry("box", "    IdentityFile ~/.ssh/id_ed25519"),
        entry("tampered", "    UserKnownHostsFile ~/.ssh/kh_tampered"),
        entry("rsaknown", "    UserKnownHostsFile ~/.ssh/kh_rsa"),
        entry("hashed", "    UserKnownHostsFile ~/.ssh/kh_hashed"),
        entry("wrongkey", "    IdentityFile ~/.ssh/wrong\n    IdentityFile ~/.ssh/enc\n    IdentityFile ~/.ssh/missing"),
        entry("viaagent", "    IdentityFile ~/.ssh/wrong"),
    ]
    .concat();
    std::fs::write(ssh_dir.join("config"), config).unwrap();
}

#[test]
#[cfg_attr(not(overlay_test_root), ignore = "needs root: sshd")]
fn against_real_sshd() {
    let s = Sshd::start();
    let mtime = host_keys_unknown_then_accepted(&s);
    negotiated_algorithms(&s);
    agent_reused_and_both_ways_at_once(&s, mtime);
    damaged_copy_replaced_and_agent_failure_reported(&s);
    posix_rename_replaces_in_one_step(&s);
    host_key_changed_or_of_another_type(&s);
    wrong_keys_listed(&s);
    authenticated_through_ssh_agent(&s);
    connect_errors(&s);
}

/// Steps 1 and 2; returns the uploaded agent's mtime.
fn host_keys_unknown_then_accepted(s: &Sshd) -> std::time::SystemTime {
    // 1. Unknown host key: refused, with the OpenSSH fingerprint.
    let port = s.port;
    let e = expect_err(start_agent_with("ct1", "box", &s.opts, &s.env));
    show("unknown host key", &e);
    assert!(
        e.message.contains("ct1 (ssh box)") && e.message.contains("unknown"),
        "{e:?}"
    );
    assert!(e.message.contains(&s.fp), "{e:?} vs {}", s.fp);
    assert!(e.hint.as_deref().unwrap().contains("--accept-new-host-key"));
    assert!(!s.kh.exists());

    // 2. Accepted once: recorded in OpenSSH format, then trusted.
    let mut pipe = start_agent_with("ct1", "box", &s.accept, &s.env).unwrap();
    let line = std::fs::read_to_string(&s.kh).unwrap();
    assert!(
        line.starts_with(&format!("[127.0.0.9]:{port} ssh-ed25519 ")),
        "{line}"
    );
    run(Command::new("ssh-keygen")
        .arg("-F")
        .arg(format!("[127.0.0.9]:{port}"))
        .arg("-f")
        .arg(&s.kh));
    pipe.writer.write_all(b"hello agent").unwrap();
    pipe.writer.flush().unwrap();
    let mut got = [0u8; 11];
    pipe.reader.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello agent");
    drop(pipe.writer);
    assert_eq!((pipe.finish)().unwrap(), "echo done\n");
    let meta = std::fs::metadata(&s.remote).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o755);
    assert_eq!(
        meta.len(),
        std::fs::metadata(&s.env.agent_binary).unwrap().len()
    );
    meta.modified().unwrap()
}

fn negotiated_algorithms(s: &Sshd) {
    // 3. Negotiated algorithms.
    let r = resolve(
        "box",
        &std::fs::read_to_string(&s.env.config_path).unwrap(),
        &s.env.user,
    )
    .unwrap();
    let conn = connect(
        Who {
            host: "ct1",
            target: "box",
        },
        &r,
        &s.opts,
        &s.env,
    )
    .unwrap();
    eprintln!(
        "--- negotiated: kex {:?}, hostkey {:?}, cipher c>s {:?} s>c {:?}, mac {:?}",
        conn.session.methods(MethodType::Kex),
        conn.session.methods(MethodType::HostKey),
        conn.session.methods(MethodType::CryptCs),
        conn.session.methods(MethodType::CryptSc),
        conn.session.methods(MethodType::MacCs),
    );
    eprintln!(
        "--- libssh2 ciphers: {:?}",
        conn.session.supported_algs(MethodType::CryptCs).unwrap()
    );
    assert_eq!(
        conn.session.methods(MethodType::CryptCs),
        Some("aes128-gcm@openssh.com")
    );
    assert_eq!(
        conn.session.methods(MethodType::CryptSc),
        Some("aes128-gcm@openssh.com")
    );
    drop(conn);
}

fn agent_reused_and_both_ways_at_once(s: &Sshd, mtime: std::time::SystemTime) {
    // 4. Reuse: the second start does not upload again; the reader can
    //    wait while another thread writes; bulk data both ways at once.
    std::thread::sleep(Duration::from_millis(1100));
    let pipe = start_agent_with("ct1", "box", &s.opts, &s.env).unwrap();
    assert_eq!(
        std::fs::metadata(&s.remote).unwrap().modified().unwrap(),
        mtime
    );
    let AgentPipe {
        mut reader,
        mut writer,
        finish,
        ..
    } = pipe;
    let waiting = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1000];
        reader.read_exact(&mut buf).unwrap();
        (reader, buf)
    });
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    for i in 0..10u8 {
        writer.write_all(&[b'a' + i; 100]).unwrap();
    }
    let (mut reader, buf) = waiting.join().unwrap();
    eprintln!("--- ping-pong while a reader waits: {:?}", t.elapsed());
    assert!((0..10u8).all(|i| {
        buf[i as usize * 100..][..100]
            .iter()
            .all(|&b| b == b'a' + i)
    }));
    let data: Vec<u8> = (0..(24u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let expected = Sha256::digest(&data);
    let t = Instant::now();
    let sender = std::thread::spawn(move || {
        writer.write_all(&data).unwrap();
        drop(writer); // EOF
    });
    let mut back = Vec::new();
    reader.read_to_end(&mut back).unwrap();
    sender.join().unwrap();
    eprintln!("--- 24 MiB echoed in {:?}", t.elapsed());
    assert_eq!(back.len(), 24 << 20);
    assert_eq!(Sha256::digest(&back), expected);
    assert_eq!(finish().unwrap(), "echo done\n");
}

fn damaged_copy_replaced_and_agent_failure_reported(s: &Sshd) {
    // 5. A damaged copy on the host is replaced (rename over an existing file).
    std::fs::write(&s.remote, b"truncated").unwrap();
    let pipe = start_agent_with("ct1", "box", &s.opts, &s.env).unwrap();
    assert_eq!(
        std::fs::metadata(&s.remote).unwrap().len(),
        std::fs::metadata(&s.env.agent_binary).unwrap().len()
    );
    // Failing agent: its status and stderr reach the caller.
    let AgentPipe {
        reader,
        mut writer,
        finish,
        ..
    } = pipe;
    writer.write_all(b"X please fail").unwrap();
    drop(writer);
    drop(reader);
    let e = finish().unwrap_err();
    show("agent exits 3", &e);
    assert!(
        e.message.contains("status 3") && e.message.contains("failing as asked"),
        "{e:?}"
    );
}

fn posix_rename_replaces_in_one_step(s: &Sshd) {
    // 5b. What replaces an unusable agent file: OpenSSH's
    //     posix-rename@openssh.com renames over an existing file (rename(2):
    //     the old inode stays whole for whoever has it); a failure is an
    //     SFTP status.
    let r = resolve(
        "box",
        &std::fs::read_to_string(&s.env.config_path).unwrap(),
        &s.env.user,
    )
    .unwrap();
    let who = Who {
        host: "ct1",
        target: "box",
    };
    let conn = connect(who, &r, &s.opts, &s.env).unwrap();
    let d = s.tmp.path();
    let (new, old, kept) = (d.join("pr-new"), d.join("pr-old"), d.join("pr-kept"));
    std::fs::write(&new, b"new").unwrap();
    std::fs::write(&old, b"old").unwrap();
    std::fs::hard_link(&old, &kept).unwrap();
    assert_eq!(
        posix_rename(&conn.session, &new, &old).unwrap(),
        Renamed::Done
    );
    assert_eq!(std::fs::read(&old).unwrap(), b"new");
    assert_eq!(std::fs::read(&kept).unwrap(), b"old");
    assert!(!new.exists());
    let e = posix_rename(&conn.session, &new, &old).unwrap_err();
    assert_eq!(e.code(), ssh2::ErrorCode::SFTP(2), "{e:?}");
    assert_eq!(std::fs::read(&old).unwrap(), b"new");
}

fn host_key_changed_or_of_another_type(s: &Sshd) {
    // 6. Changed host key: refused, even with --accept-new-host-key.
    let port = s.port;
    for o in [&s.opts, &s.accept] {
        let e = expect_err(start_agent_with("ct2", "tampered", o, &s.env));
        show("changed host key", &e);
        assert!(
            e.message.contains("CHANGED") && e.message.contains("kh_tampered"),
            "{e:?}"
        );
        assert!(
            e.hint
                .as_deref()
                .unwrap()
                .contains(&format!("ssh-keygen -R '[127.0.0.9]:{port}' -f"))
        );
    }
    // Known only by another key type: refused.
    let e = expect_err(start_agent_with("ct2", "rsaknown", &s.accept, &s.env));
    show("other key type", &e);
    assert!(e.message.contains("RSA key"), "{e:?}");
    // Hashed known_hosts entries are understood.
    std::fs::copy(&s.kh, s.ssh_dir.join("kh_hashed")).unwrap();
    run(Command::new("ssh-keygen")
        .arg("-H")
        .arg("-f")
        .arg(s.ssh_dir.join("kh_hashed")));
    assert!(
        std::fs::read_to_string(s.ssh_dir.join("kh_hashed"))
            .unwrap()
            .starts_with("|1|")
    );
    let pipe = start_agent_with("ct2", "hashed", &s.opts, &s.env).unwrap();
    drop(pipe.writer);
    assert_eq!((pipe.finish)().unwrap(), "echo done\n");
}

fn wrong_keys_listed(s: &Sshd) {
    // 7. Wrong keys: everything tried is listed.
    let e = expect_err(start_agent_with("ct3", "wrongkey", &s.opts, &s.env));
    show("wrong key", &e);
    assert!(
        e.message
            .starts_with("Failed to authenticate as root on ct3 (ssh wrongkey) (127.0.0.9:"),
        "{e:?}"
    );
    assert!(
        e.message.contains("wrong (not accepted)")
            && e.message.contains("passphrase-protected")
            && e.message.contains("missing (missing)"),
        "{e:?}"
    );
}

fn authenticated_through_ssh_agent(s: &Sshd) {
    // 8. ssh-agent.
    let d = s.tmp.path();
    let sock = d.join("agent.sock");
    let _agent = Kill(
        Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&sock)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut tries = 0;
    while !sock.exists() {
        tries += 1;
        assert!(tries < 250, "ssh-agent did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    run(Command::new("ssh-add")
        .arg("-q")
        .arg(s.ssh_dir.join("id_ed25519"))
        .env("SSH_AUTH_SOCK", &sock));
    let with_agent = LocalEnv {
        agent_sock: Some(sock.clone()),
        ..s.env.clone()
    };
    let pipe = start_agent_with("ct4", "viaagent", &s.opts, &with_agent).unwrap();
    drop(pipe.writer);
    assert_eq!((pipe.finish)().unwrap(), "echo done\n");
}

fn connect_errors(s: &Sshd) {
    // 9. Closed port: refused at once.
    let closed = free_port();
    let e = expect_err(start_agent_with(
        "ct5",
        &format!("root@127.0.0.9:{closed}"),
        &s.accept,
        &s.env,
    ));
    show("closed port", &e);
    assert!(
        e.message.contains("connection refused")
            && e.message.contains(&format!("127.0.0.9:{closed}")),
        "{e:?}"
    );

    // 10. A server that accepts but never speaks, and one that never accepts.
    let short = ConnectOptions {
        timeout: Duration::from_secs(1),
        accept_new_host_key: true,
    };
    let silent = std::net::TcpListener::bind("127.0.0.9:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let holder = std::thread::spawn(move || {
        let (s, _) = silent.accept().unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        drop(s);
    });
    let e = expect_err(start_agent_with(
        "ct6",
        &format!("127.0.0.9:{silent_port}"),
        &short,
        &s.env,
    ));
    show("silent server", &e);
    assert!(e.message.contains("no answer within 1 s"), "{e:?}");
    holder.join().unwrap();
    let backlog = std::net::TcpListener::bind("127.0.0.9:0").unwrap();
    let e = expect_err(start_agent_with(
        "ct6",
        &format!("127.0.0.9:{}", backlog.local_addr().unwrap().port()),
        &short,
        &s.env,
    ));
    show("never accepted", &e);
    assert!(e.message.contains("no answer within 1 s"), "{e:?}");
    // A listener whose accept queue is full drops SYNs: the TCP connect
    // itself times out.
    let full = std::net::TcpListener::bind("127.0.0.9:0").unwrap();
    let full_addr = full.local_addr().unwrap();
    // SAFETY: re-listen on an open socket to shrink its backlog to 0.
    unsafe { libc::listen(full.as_raw_fd(), 0) };
    let _fillers: Vec<TcpStream> = (0..3)
        .filter_map(|_| TcpStream::connect_timeout(&full_addr, Duration::from_millis(300)).ok())
        .collect();
    let e = expect_err(start_agent_with(
        "ct7",
        &format!("root@{full_addr}"),
        &short,
        &s.env,
    ));
    show("SYN dropped", &e);
}
