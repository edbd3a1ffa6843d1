//! The ssh transport: libssh2 (the `ssh2` crate) connects to the host named by
//! the manifest's `ssh = "..."` value, checks its host key against
//! known_hosts, authenticates with ssh-agent or identity files, uploads this
//! exact agent build over SFTP when the host lacks it, and runs it on an exec
//! channel.
//!
//! The only command ever sent to the remote shell is
//! `'<home>/.cache/overlay/overlay-<hash>' agent`, built from the server's home
//! directory and a hex digest; no manifest value or file name goes into it.
//! Before the upload path runs that file it checks over SFTP that no other
//! user could have replaced it (OpenSSH's `StrictModes` rule for the file
//! and its folders up to the home directory): an unsafe file is uploaded
//! again, an unsafe folder refused. On the fast path, which runs it without
//! SFTP, the agent makes the same check itself ([`crate::agent::selfcheck`]).
//!
//! The reader and the writer of the returned [`AgentPipe`] share one libssh2
//! session. Neither holds the session while it waits for the network, so one
//! thread may block in `read` while another writes.
//!
//! A dead agent is noticed without waiting: a read ends at the channel's
//! EOF, a write that finds no room asks whether sshd reported the agent's
//! exit (libssh2 would otherwise wait for ever on the window of a closed
//! channel), and the pipe's [`super::Watch`] lets another thread ask the
//! same, or cut the connection. A silent network ends the connection
//! through TCP keepalive and `TCP_USER_TIMEOUT` (about 30 s).

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use ssh2::{
    BlockDirections, Channel, CheckResult, ErrorCode, FileType, KnownHostFileKind, MethodType,
    OpenFlags, OpenType, RenameFlags, Session, Sftp,
};
use ssh2_config::{ParseRule, SshConfig};

use super::{AgentPipe, ConnectOptions};
use crate::err;
use crate::error::{Error, Result};

/// Ciphers in order of preference: AES-GCM is the fastest with AES-NI.
/// Only names libssh2 supports are sent (filtered at run time).
const CIPHER_PREFERENCE: &[&str] = &[
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "aes128-ctr",
    "chacha20-poly1305@openssh.com",
    "aes256-ctr",
    "aes192-ctr",
];
/// Identity files tried when ~/.ssh/config names none.
const DEFAULT_IDENTITIES: &[&str] = &["id_ed25519", "id_ecdsa", "id_rsa"];
/// Known-hosts files read (never written) besides the user's.
const GLOBAL_KNOWN_HOSTS: &[&str] = &["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"];
/// Receive window of the agent channel and the largest packet we accept.
const CHANNEL_WINDOW: u32 = 16 * 1024 * 1024;
const CHANNEL_PACKET: u32 = 32768;
/// Size of the SFTP writes when uploading the agent.
const UPLOAD_CHUNK: usize = 256 * 1024;
/// Bound on one SFTP operation during the upload.
const UPLOAD_OP_TIMEOUT: Duration = Duration::from_secs(60);
/// Once the agent runs, a libssh2 call holds the session at most this long
/// before it lets the other side of the pipe in; the caller never sees these
/// slices, only data, EOF or a real error.
const READ_SLICE_MS: u32 = 2;
const WRITE_SLICE_MS: u32 = 20;
/// How long a waiting reader or writer sleeps on the socket between attempts.
const IDLE_POLL_MS: i32 = 50;
/// TCP keepalive and user timeout, so that a host or network that goes
/// silent ends the connection within about 30 s, even while it waits on an
/// agent hashing for minutes (the peer's kernel answers the probes, so a
/// busy agent is never taken for a dead one). libssh2's own keepalive is not
/// used: it is a packet like any other, sent under the session lock by
/// whichever thread holds it, and one left half-sent when that call gives
/// up wedges the session; the kernel's probes need no thread and no lock.
/// A dead agent or sshd is seen sooner, from the channel itself (see
/// [`gone`]). docs/design.md, "A dead peer is noticed".
const TCP_KEEPIDLE_SECS: i32 = 10;
const TCP_KEEPINTVL_SECS: i32 = 5;
const TCP_KEEPCNT: i32 = 4;
const TCP_USER_TIMEOUT_MS: i32 = 30_000;

// ---------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------

/// Connect to `target` (an alias from ~/.ssh/config or `[user@]host[:port]`),
/// make sure this agent build is on the host, and start `overlay agent` there.
/// `host` is the manifest's host name, used in every message.
pub fn start_agent(host: &str, target: &str, opts: &ConnectOptions) -> Result<AgentPipe> {
    let env = LocalEnv::from_process().map_err(|e| e.context(format_args!("on {host}")))?;
    start_agent_with(host, target, opts, &env)
}

/// Connect to `target` and start the agent this build would have uploaded
/// (`~/.cache/overlay/overlay-<digest>` there) without checking that it is
/// there: no SFTP session, which costs ~50 ms per host. When the agent then
/// does not answer, the caller falls back to [`start_agent`]. Connection
/// and host-key errors are returned as they are.
pub fn start_cached_agent(host: &str, target: &str, opts: &ConnectOptions) -> Result<AgentPipe> {
    let env = LocalEnv::from_process().map_err(|e| e.context(format_args!("on {host}")))?;
    let who = Who { host, target };
    let r = resolve_target(who, &env)?;
    // The binary's digest (~10 ms for 15 MB) is taken while the handshake runs.
    let (digest, conn) = std::thread::scope(|s| {
        let digest = s.spawn(|| agent_digest(&env.agent_binary));
        let conn = connect(who, &r, opts, &env);
        (digest.join().expect("the digest thread panicked"), conn)
    });
    let digest = digest.map_err(|e| Error {
        message: format!("{} (to start the agent on {who})", e.message),
        ..e
    })?;
    let conn = conn?;
    // Relative to the login directory, where sshd starts the command (and
    // where SFTP's "." is): the same file `upload_agent` would name.
    exec_agent(who, conn, &format!("{AGENT_DIR}/{}", agent_name(&digest)))
}

/// Where agents are kept, relative to the home directory.
pub const AGENT_DIR: &str = ".cache/overlay";

/// The file name of this build of the agent: named by its digest.
fn agent_name(digest: &AgentDigest) -> String {
    format!("overlay-{}", &digest.hex[..16])
}

/// `[user@]host[:port]` as written in the manifest; `host` may be an alias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

/// Split `[user@]host[:port]`. IPv6 addresses go in brackets when a port
/// follows (`[::1]:2222`); a bare address with several colons has no port.
pub fn parse_target(s: &str) -> std::result::Result<Target, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("it is empty".into());
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("it contains whitespace".into());
    }
    let (user, rest) = match s.rsplit_once('@') {
        Some((u, r)) => {
            if u.is_empty() {
                return Err("the user before `@` is empty".into());
            }
            (Some(u.to_string()), r)
        }
        None => (None, s),
    };
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let (h, after) = inner
            .split_once(']')
            .ok_or_else(|| "`[` without a closing `]`".to_string())?;
        let port = match after {
            "" => None,
            p => Some(parse_port(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("unexpected `{p}` after `]`"))?,
            )?),
        };
        (h.to_string(), port)
    } else if rest.matches(':').count() == 1 {
        let (h, p) = rest.split_once(':').expect("one colon");
        (h.to_string(), Some(parse_port(p)?))
    } else {
        (rest.to_string(), None)
    };
    if host.is_empty() {
        return Err("the host name is empty".into());
    }
    if host.starts_with('-') {
        return Err(format!("the host name `{host}` starts with `-`"));
    }
    Ok(Target { user, host, port })
}

fn parse_port(p: &str) -> std::result::Result<u16, String> {
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("`{p}` is not a port number (1-65535)")),
        Ok(n) => Ok(n),
    }
}

/// The local account: default ssh user, and where ~ points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalUser {
    pub name: String,
    pub home: PathBuf,
}

impl LocalUser {
    /// `$USER`/`$HOME`, else this uid's entry in /etc/passwd, else root and /root.
    pub fn current() -> LocalUser {
        let entry = passwd_entry();
        let name = std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .or_else(|| entry.as_ref().map(|e| e.0.clone()))
            .unwrap_or_else(|| "root".into());
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
            .or_else(|| entry.map(|e| e.1))
            .unwrap_or_else(|| PathBuf::from("/root"));
        LocalUser { name, home }
    }
}

fn passwd_entry() -> Option<(String, PathBuf)> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() }.to_string();
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 7 && f[2] == uid).then(|| (f[0].to_string(), PathBuf::from(f[5])))
    })
}

/// Which ssh-agent to ask (`IdentityAgent` in ~/.ssh/config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSocket {
    /// `$SSH_AUTH_SOCK`, if set.
    FromEnv,
    /// `IdentityAgent none`.
    Disabled,
    Path(PathBuf),
}

/// Everything needed to reach one host, after ~/.ssh/config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// What the manifest named (alias or host name), lowercased as ssh does.
    pub alias: String,
    /// The name or address to connect to (`HostName`, else the alias).
    pub hostname: String,
    pub port: u16,
    pub user: String,
    /// `IdentityFile`s (~ and %-tokens expanded), else the default key files.
    pub identity_files: Vec<PathBuf>,
    /// Whether `identity_files` came from the config (missing ones are then reported).
    pub identity_files_configured: bool,
    /// `UserKnownHostsFile`, else ~/.ssh/known_hosts and ~/.ssh/known_hosts2.
    /// New keys go to the first one.
    pub known_hosts_files: Vec<PathBuf>,
    /// `HostKeyAlias`: the name to look up in known_hosts instead of `hostname`.
    pub host_key_alias: Option<String>,
    pub agent: AgentSocket,
}

impl Resolved {
    /// The name under which known_hosts stores this host: `host` for port 22,
    /// `[host]:port` otherwise (as OpenSSH writes it).
    pub fn known_hosts_name(&self) -> String {
        let h = self
            .host_key_alias
            .as_deref()
            .unwrap_or(&self.hostname)
            .to_ascii_lowercase();
        if self.port == 22 {
            h
        } else {
            format!("[{h}]:{}", self.port)
        }
    }
}

/// Resolve `target` through the text of an ssh config file (`""` when there
/// is none). `Include`s are read relative to `local.home`/.ssh. A pure
/// function of its inputs otherwise; the error is the bare cause.
pub fn resolve(
    target: &str,
    config: &str,
    local: &LocalUser,
) -> std::result::Result<Resolved, String> {
    let t = parse_target(target)?;
    let alias = t.host.to_ascii_lowercase();
    let cfg = SshConfig::default()
        .home_dir(&local.home)
        .parse(
            &mut config.as_bytes(),
            ParseRule::ALLOW_UNKNOWN_FIELDS | ParseRule::ALLOW_UNSUPPORTED_FIELDS,
        )
        .map_err(|e| format!("~/.ssh/config cannot be parsed: {e}"))?;
    let p = cfg.query(&alias);
    let field = |name: &str| -> Option<Vec<String>> {
        p.unsupported_fields
            .get(name)
            .or_else(|| p.ignored_fields.get(name))
            .cloned()
            .filter(|v| !v.is_empty())
    };

    if let Some(jump) = p.proxy_jump.as_ref().filter(|j| !j.is_empty())
        && !jump.iter().all(|j| j.eq_ignore_ascii_case("none"))
    {
        return Err(format!(
            "~/.ssh/config sets ProxyJump {} for {alias}, which overlay does not support",
            jump.join(",")
        ));
    }
    if let Some(cmd) = field("proxycommand")
        && !(cmd.len() == 1 && cmd[0].eq_ignore_ascii_case("none"))
    {
        return Err(format!(
            "~/.ssh/config sets a ProxyCommand for {alias}, which overlay does not support"
        ));
    }

    let hostname = match &p.host_name {
        Some(h) => percent_host(h, &alias),
        None => alias.clone(),
    };
    let user = t
        .user
        .clone()
        .or_else(|| p.user.clone())
        .unwrap_or_else(|| local.name.clone());
    let port = t.port.or(p.port).unwrap_or(22);
    let tokens = Tokens {
        home: &local.home,
        local_user: &local.name,
        hostname: &hostname,
        remote_user: &user,
        port,
        alias: &alias,
    };

    let ssh_dir = local.home.join(".ssh");
    let (identity_files, identity_files_configured) = match &p.identity_file {
        Some(files) if !files.is_empty() => (
            files
                .iter()
                .filter(|f| f.as_os_str() != "none")
                .map(|f| tokens.expand_path(&f.to_string_lossy()))
                .collect(),
            true,
        ),
        _ => (
            DEFAULT_IDENTITIES.iter().map(|n| ssh_dir.join(n)).collect(),
            false,
        ),
    };
    let known_hosts_files = match field("userknownhostsfile") {
        Some(v) => v
            .iter()
            .filter(|f| !f.eq_ignore_ascii_case("none"))
            .map(|f| tokens.expand_path(f))
            .collect(),
        None => vec![ssh_dir.join("known_hosts"), ssh_dir.join("known_hosts2")],
    };
    let host_key_alias = field("hostkeyalias").map(|v| v[0].clone());
    let agent = match field("identityagent").map(|v| v[0].clone()) {
        None => AgentSocket::FromEnv,
        Some(a) if a.eq_ignore_ascii_case("none") => AgentSocket::Disabled,
        Some(a) if a == "SSH_AUTH_SOCK" || a == "$SSH_AUTH_SOCK" => AgentSocket::FromEnv,
        Some(a) => AgentSocket::Path(tokens.expand_path(&a)),
    };

    Ok(Resolved {
        alias,
        hostname,
        port,
        user,
        identity_files,
        identity_files_configured,
        known_hosts_files,
        host_key_alias,
        agent,
    })
}

/// `%h` and `%%` in HostName.
fn percent_host(s: &str, alias: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('h') => out.push_str(alias),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The ssh_config %-tokens overlay expands in file names.
struct Tokens<'a> {
    home: &'a Path,
    local_user: &'a str,
    hostname: &'a str,
    remote_user: &'a str,
    port: u16,
    alias: &'a str,
}

impl Tokens<'_> {
    fn expand_path(&self, s: &str) -> PathBuf {
        let s = if s == "~" {
            self.home.display().to_string()
        } else if let Some(rest) = s.strip_prefix("~/") {
            format!("{}/{rest}", self.home.display())
        } else {
            s.to_string()
        };
        let mut out = String::new();
        let mut it = s.chars();
        while let Some(c) = it.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match it.next() {
                Some('d') => out.push_str(&self.home.display().to_string()),
                Some('u') => out.push_str(self.local_user),
                Some('h') => out.push_str(self.hostname),
                Some('r') => out.push_str(self.remote_user),
                Some('p') => out.push_str(&self.port.to_string()),
                Some('n') => out.push_str(self.alias),
                Some('%') => out.push('%'),
                Some(o) => {
                    out.push('%');
                    out.push(o);
                }
                None => out.push('%'),
            }
        }
        PathBuf::from(out)
    }
}

// ---------------------------------------------------------------------------
// Connection
// ---------------------------------------------------------------------------

/// The parts of the local environment the transport reads; tests build their own.
#[derive(Debug, Clone)]
pub(crate) struct LocalEnv {
    pub user: LocalUser,
    /// ~/.ssh/config (need not exist).
    pub config_path: PathBuf,
    /// `$SSH_AUTH_SOCK`.
    pub agent_sock: Option<PathBuf>,
    pub agent_binary: PathBuf,
    pub global_known_hosts: Vec<PathBuf>,
}

impl LocalEnv {
    fn from_process() -> Result<LocalEnv> {
        let user = LocalUser::current();
        Ok(LocalEnv {
            config_path: user.home.join(".ssh").join("config"),
            agent_sock: std::env::var_os("SSH_AUTH_SOCK")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            agent_binary: super::agent_binary_path()?,
            global_known_hosts: GLOBAL_KNOWN_HOSTS.iter().map(PathBuf::from).collect(),
            user,
        })
    }
}

/// How messages name the host: the manifest name and, if different, the ssh target.
#[derive(Clone, Copy)]
struct Who<'a> {
    host: &'a str,
    target: &'a str,
}

impl fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host == self.target {
            write!(f, "{}", self.host)
        } else {
            write!(f, "{} (ssh {})", self.host, self.target)
        }
    }
}

/// Read ~/.ssh/config and resolve `who`'s target through it.
fn resolve_target(who: Who<'_>, env: &LocalEnv) -> Result<Resolved> {
    let config = match std::fs::read_to_string(&env.config_path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => {
            return Err(err!(
                hint = "fix the permissions of that file, or move it away",
                "Failed to read {} for {who}: {}",
                env.config_path.display(),
                crate::error::io_cause(&e)
            ));
        }
    };
    resolve(who.target, &config, &env.user).map_err(|cause| {
        let hint = if cause.starts_with("~/.ssh/config") {
            "overlay connects directly over TCP: fix that entry of ~/.ssh/config, or write the host's ssh value as [user@]host[:port] of an address reachable from here"
        } else {
            "write the host's ssh value as an alias from ~/.ssh/config or as [user@]host[:port]"
        };
        err!(hint = hint, "Failed to resolve the ssh target of {who}: {cause}")
    })
}

pub(crate) fn start_agent_with(
    host: &str,
    target: &str,
    opts: &ConnectOptions,
    env: &LocalEnv,
) -> Result<AgentPipe> {
    let who = Who { host, target };
    let r = resolve_target(who, env)?;
    let conn = connect(who, &r, opts, env)?;
    let remote = upload_agent(who, &conn, opts, env)?;
    exec_agent(who, conn, &remote)
}

/// An authenticated session.
struct Connected {
    session: Session,
    fd: RawFd,
    addr: SocketAddr,
}

fn connect(who: Who<'_>, r: &Resolved, opts: &ConnectOptions, env: &LocalEnv) -> Result<Connected> {
    let secs = fmt_secs(opts.timeout);
    let addrs: Vec<SocketAddr> = (r.hostname.as_str(), r.port)
        .to_socket_addrs()
        .map_err(|e| {
            err!(
                hint = "check the host name (HostName in ~/.ssh/config, or the manifest's ssh value) and DNS",
                "Failed to connect to {who}: cannot resolve {}: {e}",
                r.hostname
            )
        })?
        .collect();
    if addrs.is_empty() {
        return Err(err!(
            hint = "check the host name and DNS",
            "Failed to connect to {who}: {} has no address",
            r.hostname
        ));
    }

    let mut failures = Vec::new();
    let mut refused = false;
    let mut stream = None;
    for addr in &addrs {
        match TcpStream::connect_timeout(addr, opts.timeout.max(Duration::from_millis(1))) {
            Ok(s) => {
                stream = Some((s, *addr));
                break;
            }
            Err(e) => {
                let cause = match e.kind() {
                    io::ErrorKind::ConnectionRefused => {
                        refused = true;
                        "connection refused".to_string()
                    }
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                        format!("timed out after {secs}")
                    }
                    _ => e.to_string(),
                };
                failures.push(format!("{addr}: {cause}"));
            }
        }
    }
    let Some((tcp, addr)) = stream else {
        let hint = if refused {
            format!(
                "check that sshd runs on {} and listens on port {} (Port in ~/.ssh/config, or :PORT in the manifest)",
                r.hostname, r.port
            )
        } else {
            format!(
                "check that {} is up and reachable from here (VPN, firewall), or allow a longer connect timeout",
                r.hostname
            )
        };
        return Err(err!(
            hint = hint,
            "Failed to connect to {who} at {}",
            failures.join(", ")
        ));
    };
    let _ = tcp.set_nodelay(true);
    let fd = tcp.as_raw_fd();
    tcp_keepalive(fd);

    let fail = |what: &str, e: ssh2::Error| -> Error {
        if is_timeout(&e) {
            err!(
                hint = "check that an SSH server (not another service) listens on that port and is not overloaded",
                "Failed to {what} with {who} at {addr}: no answer within {secs}"
            )
        } else {
            err!(
                hint = "check the server's sshd logs; it may only offer algorithms libssh2 lacks",
                "Failed to {what} with {who} at {addr}: {}",
                e.message()
            )
        }
    };

    let mut session = Session::new().map_err(|e| fail("start an SSH session", e))?;
    session.set_tcp_stream(tcp);
    session.set_timeout(duration_ms(opts.timeout));
    set_algorithm_preferences(&session, r, env);
    session
        .handshake()
        .map_err(|e| fail("complete the SSH handshake", e))?;

    verify_host_key(who, &session, r, opts, env, addr)?;
    authenticate(who, &session, r, env, addr)?;
    Ok(Connected { session, fd, addr })
}

fn set_algorithm_preferences(session: &Session, r: &Resolved, env: &LocalEnv) {
    for m in [MethodType::CryptCs, MethodType::CryptSc] {
        if let Ok(supported) = session.supported_algs(m) {
            let mut prefs: Vec<&str> = CIPHER_PREFERENCE
                .iter()
                .copied()
                .filter(|c| supported.contains(c))
                .collect();
            for s in &supported {
                if !prefs.contains(s) && *s != "none" && !s.starts_with("arcfour") {
                    prefs.push(s);
                }
            }
            if !prefs.is_empty() {
                let _ = session.method_pref(m, &prefs.join(","));
            }
        }
    }
    // Like OpenSSH, ask first for the host key types known_hosts holds for
    // this host, so a host known by its RSA key is not reported as changed
    // because it also offers ed25519.
    let known = KnownHostsDb::load(r, env);
    let name = r.known_hosts_name();
    let mut wanted: Vec<&str> = Vec::new();
    for e in known.entries.iter().filter(|e| e.marker.is_none()) {
        if known.matches(session, e, &name) {
            for a in algorithms_for_key_type(&e.keytype) {
                if !wanted.contains(a) {
                    wanted.push(a);
                }
            }
        }
    }
    if wanted.is_empty() {
        return;
    }
    if let Ok(supported) = session.supported_algs(MethodType::HostKey) {
        let mut prefs: Vec<&str> = wanted
            .into_iter()
            .filter(|a| supported.contains(a))
            .collect();
        for s in &supported {
            if !prefs.contains(s) {
                prefs.push(s);
            }
        }
        let _ = session.method_pref(MethodType::HostKey, &prefs.join(","));
    }
}

fn algorithms_for_key_type(t: &str) -> &'static [&'static str] {
    match t {
        "ssh-ed25519" => &["ssh-ed25519"],
        "ecdsa-sha2-nistp256" => &["ecdsa-sha2-nistp256"],
        "ecdsa-sha2-nistp384" => &["ecdsa-sha2-nistp384"],
        "ecdsa-sha2-nistp521" => &["ecdsa-sha2-nistp521"],
        "ssh-rsa" => &["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"],
        "ssh-dss" => &["ssh-dss"],
        _ => &[],
    }
}

// ---------------------------------------------------------------------------
// Host keys
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct KhEntry {
    file: PathBuf,
    line: usize,
    /// `@revoked` or `@cert-authority`.
    marker: Option<String>,
    hosts: String,
    keytype: String,
    key: String,
}

struct KnownHostsDb {
    entries: Vec<KhEntry>,
    /// The files read, for messages.
    files: Vec<PathBuf>,
}

/// A valid key, only used to let libssh2 match hashed (`|1|...`) host names.
const PROBE_KEY: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";

impl KnownHostsDb {
    fn load(r: &Resolved, env: &LocalEnv) -> KnownHostsDb {
        let mut entries = Vec::new();
        let mut files = Vec::new();
        for f in r.known_hosts_files.iter().chain(&env.global_known_hosts) {
            if let Ok(text) = std::fs::read_to_string(f) {
                entries.extend(parse_known_hosts(f, &text));
                files.push(f.clone());
            }
        }
        KnownHostsDb { entries, files }
    }

    fn matches(&self, session: &Session, e: &KhEntry, name: &str) -> bool {
        if e.hosts.starts_with('|') {
            // Hashed: let libssh2 compute the HMAC.
            let Ok(mut kh) = session.known_hosts() else {
                return false;
            };
            let line = format!("{} ssh-ed25519 {PROBE_KEY}", e.hosts);
            if kh.read_str(&line, KnownHostFileKind::OpenSSH).is_err() {
                return false;
            }
            matches!(
                kh.check(name, b"not the probe key"),
                CheckResult::Match | CheckResult::Mismatch
            )
        } else {
            match_host_patterns(&e.hosts, name)
        }
    }
}

fn parse_known_hosts(file: &Path, text: &str) -> Vec<KhEntry> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut f = line.split_whitespace();
        let mut first = f.next();
        let marker = match first {
            Some(m) if m.starts_with('@') => {
                first = f.next();
                Some(m.to_string())
            }
            _ => None,
        };
        let (Some(hosts), Some(keytype), Some(key)) = (first, f.next(), f.next()) else {
            continue;
        };
        out.push(KhEntry {
            file: file.to_path_buf(),
            line: i + 1,
            marker,
            hosts: hosts.to_string(),
            keytype: keytype.to_string(),
            key: key.to_string(),
        });
    }
    out
}

/// OpenSSH's host pattern list: comma-separated, `*` and `?` wildcards,
/// `!` negates (a negated match rejects the whole line), case-insensitive.
fn match_host_patterns(patterns: &str, name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    let mut matched = false;
    for p in patterns.split(',') {
        let (neg, p) = match p.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, p),
        };
        if wildmatch(&p.to_ascii_lowercase(), &name) {
            if neg {
                return false;
            }
            matched = true;
        }
    }
    matched
}

fn wildmatch(pattern: &str, s: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = s.chars().collect();
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// The algorithm name at the start of an SSH public key blob.
fn key_type_of_blob(blob: &[u8]) -> Option<String> {
    let len = u32::from_be_bytes(blob.get(..4)?.try_into().ok()?) as usize;
    let name = blob.get(4..4 + len)?;
    String::from_utf8(name.to_vec()).ok()
}

/// `ssh-ed25519` -> `ED25519`, as OpenSSH prints key types.
fn key_type_label(t: &str) -> String {
    match t {
        "ssh-ed25519" => "ED25519".into(),
        "ssh-rsa" => "RSA".into(),
        "ssh-dss" => "DSA".into(),
        t if t.starts_with("ecdsa-") => "ECDSA".into(),
        t => t.to_string(),
    }
}

/// OpenSSH's fingerprint: `SHA256:` and unpadded base64 of the blob's sha256.
pub fn sha256_fingerprint(blob: &[u8]) -> String {
    let d = Sha256::digest(blob);
    format!(
        "SHA256:{}",
        base64_encode(d.as_slice()).trim_end_matches('=')
    )
}

fn verify_host_key(
    who: Who<'_>,
    session: &Session,
    r: &Resolved,
    opts: &ConnectOptions,
    env: &LocalEnv,
    addr: SocketAddr,
) -> Result<()> {
    let (blob, _) = session.host_key().ok_or_else(|| {
        err!(
            hint = "check the server's sshd logs",
            "Failed to check the host key of {who} at {addr}: the server sent none"
        )
    })?;
    let blob = blob.to_vec();
    let keytype = key_type_of_blob(&blob).unwrap_or_else(|| "unknown".into());
    let label = key_type_label(&keytype);
    let key64 = base64_encode(&blob);
    let fp = sha256_fingerprint(&blob);
    let name = r.known_hosts_name();
    let db = KnownHostsDb::load(r, env);

    let mut matched = false;
    let mut changed: Option<&KhEntry> = None;
    let mut other_types: Vec<&KhEntry> = Vec::new();
    for e in &db.entries {
        if !db.matches(session, e, &name) {
            continue;
        }
        match e.marker.as_deref() {
            Some("@revoked") if e.key == key64 => {
                return Err(err!(
                    hint = "ask the host's administrator; never remove a @revoked line to get past this",
                    "Refusing to connect to {who} at {addr}: its {label} host key {fp} is marked @revoked in {}:{}",
                    e.file.display(),
                    e.line
                ));
            }
            Some(_) => {}
            None if e.keytype == keytype && e.key == key64 => matched = true,
            None if e.keytype == keytype => {
                changed.get_or_insert(e);
            }
            None => other_types.push(e),
        }
    }
    if matched {
        return Ok(());
    }
    let remove_hint = |e: &KhEntry| {
        format!(
            "ssh-keygen -R {} -f {}",
            sh_quote(&name),
            sh_quote(&e.file.display().to_string())
        )
    };
    if let Some(e) = changed {
        return Err(err!(
            hint = format!(
                "someone may be intercepting the connection. Only if you know {} was reinstalled or re-keyed, remove the old key with `{}` and run again",
                r.hostname,
                remove_hint(e)
            ),
            "Refusing to connect to {who} at {addr}: the host key CHANGED. {}:{} holds another {label} key for {name}; the server now offers {label} key {fp}",
            e.file.display(),
            e.line
        ));
    }
    if let Some(e) = other_types.first() {
        return Err(err!(
            hint = format!(
                "if {} was re-keyed, remove the old entry with `{}` and run again (with --accept-new-host-key to record the new key)",
                r.hostname,
                remove_hint(e)
            ),
            "Refusing to connect to {who} at {addr}: {}:{} knows {name} by a {} key, but the server offers only {label} key {fp}",
            e.file.display(),
            e.line,
            key_type_label(&e.keytype)
        ));
    }

    // Not known at all.
    let Some(file) = r.known_hosts_files.first() else {
        return Err(err!(
            hint = "set UserKnownHostsFile in ~/.ssh/config to a file overlay can read and write",
            "Refusing to connect to {who} at {addr}: its host key {fp} is unknown and UserKnownHostsFile is none"
        ));
    };
    if !opts.accept_new_host_key {
        let looked = if db.files.is_empty() {
            format!("{} does not exist", file.display())
        } else {
            format!(
                "not in {}",
                db.files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return Err(err!(
            hint = format!(
                "verify that {fp} is the host's key (connect once with `{}`, or run `ssh-keygen -lf /etc/ssh/ssh_host_{}_key.pub` on the host), then run again with --accept-new-host-key",
                ssh_command_for(who.target, r),
                keytype_file_stem(&keytype)
            ),
            "Refusing to connect to {who} at {addr}: the host key of {name} is unknown ({looked}); the server offers {label} key {fp}"
        ));
    }
    append_known_host(file, &name, &keytype, &key64).map_err(|e| {
        err!(
            hint = "fix the permissions of that file or of ~/.ssh",
            "Failed to record the host key of {who} in {}: {}",
            file.display(),
            crate::error::io_cause(&e)
        )
    })?;
    eprintln!(
        "warning: {}: permanently added the {label} host key {fp} for {name} to {}",
        who.host,
        file.display()
    );
    Ok(())
}

fn keytype_file_stem(t: &str) -> &'static str {
    match t {
        "ssh-rsa" => "rsa",
        "ssh-dss" => "dsa",
        t if t.starts_with("ecdsa-") => "ecdsa",
        _ => "ed25519",
    }
}

/// What the user would type to connect with OpenSSH (for hints only).
fn ssh_command_for(target: &str, r: &Resolved) -> String {
    if !target.contains('@') && !target.contains(':') {
        return format!("ssh {target}");
    }
    if r.port == 22 {
        format!("ssh {}@{}", r.user, r.hostname)
    } else {
        format!("ssh -p {} {}@{}", r.port, r.user, r.hostname)
    }
}

/// Append one OpenSSH-format line, creating the file (and its directory, 0700).
fn append_known_host(file: &Path, name: &str, keytype: &str, key64: &str) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let needs_newline = match std::fs::read(file) {
        Ok(b) => !b.is_empty() && !b.ends_with(b"\n"),
        Err(_) => false,
    };
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(file)?;
    let line = format!(
        "{}{name} {keytype} {key64}\n",
        if needs_newline { "\n" } else { "" }
    );
    f.write_all(line.as_bytes())?;
    f.sync_all()
}

// ---------------------------------------------------------------------------
// Authentication
// ---------------------------------------------------------------------------

fn authenticate(
    who: Who<'_>,
    session: &Session,
    r: &Resolved,
    env: &LocalEnv,
    addr: SocketAddr,
) -> Result<()> {
    let user = &r.user;
    let timeout_err = |e: &ssh2::Error| {
        err!(
            hint = "the server is slow or overloaded; run again",
            "Failed to authenticate as {user} on {who} ({addr}): {}",
            if is_timeout(e) {
                "the server stopped answering".to_string()
            } else {
                e.message().to_string()
            }
        )
    };
    match session.auth_methods(user) {
        Ok(methods) => {
            if session.authenticated() {
                return Ok(());
            }
            if !methods.split(',').any(|m| m == "publickey") {
                return Err(err!(
                    hint = "overlay only uses public keys (ssh-agent or key files); enable PubkeyAuthentication in the server's sshd_config",
                    "Failed to authenticate as {user} on {who} ({addr}): the server does not accept public keys (it offers: {methods})"
                ));
            }
        }
        Err(e) => {
            if session.authenticated() {
                return Ok(());
            }
            return Err(timeout_err(&e));
        }
    }

    let mut tried: Vec<String> = Vec::new();
    let mut disconnected = false;
    let check_disconnect = |e: &ssh2::Error| {
        matches!(
            e.code(),
            ErrorCode::Session(
                libssh2_sys_codes::SOCKET_DISCONNECT
                    | libssh2_sys_codes::SOCKET_SEND
                    | libssh2_sys_codes::SOCKET_RECV
                    | libssh2_sys_codes::TIMEOUT
            )
        )
    };

    // 1. ssh-agent.
    let sock = match &r.agent {
        AgentSocket::Disabled => None,
        AgentSocket::Path(p) => Some(p.clone()),
        AgentSocket::FromEnv => env.agent_sock.clone(),
    };
    match &sock {
        None if r.agent == AgentSocket::Disabled => {
            tried.push("no ssh-agent (IdentityAgent none)".into())
        }
        None => tried.push("no ssh-agent (SSH_AUTH_SOCK is not set)".into()),
        Some(sock) => {
            let result = (|| -> std::result::Result<Vec<ssh2::PublicKey>, ssh2::Error> {
                let mut agent = session.agent()?;
                agent.set_identity_path(sock)?;
                agent.connect()?;
                agent.list_identities()?;
                let ids = agent.identities()?;
                for id in &ids {
                    match agent.userauth(user, id) {
                        Ok(()) => {
                            let _ = agent.disconnect();
                            return Ok(Vec::new());
                        }
                        Err(e) => {
                            if check_disconnect(&e) {
                                let _ = agent.disconnect();
                                return Err(e);
                            }
                        }
                    }
                }
                let _ = agent.disconnect();
                Ok(ids)
            })();
            if session.authenticated() {
                return Ok(());
            }
            match result {
                Ok(ids) if ids.is_empty() => tried.push(format!(
                    "ssh-agent at {} (it holds no keys)",
                    sock.display()
                )),
                Ok(ids) => {
                    let names: Vec<String> = ids
                        .iter()
                        .map(|id| {
                            let t = key_type_of_blob(id.blob())
                                .map(|t| key_type_label(&t))
                                .unwrap_or_default();
                            let c = id.comment();
                            if c.is_empty() {
                                format!("{t} {}", sha256_fingerprint(id.blob()))
                            } else {
                                format!("{t} {c}")
                            }
                        })
                        .collect();
                    tried.push(format!(
                        "ssh-agent keys {} (not accepted)",
                        names.join(", ")
                    ));
                }
                Err(e) if check_disconnect(&e) => disconnected = true,
                Err(e) => tried.push(format!(
                    "ssh-agent at {} (unusable: {})",
                    sock.display(),
                    e.message()
                )),
            }
        }
    }

    // 2. Key files.
    if !disconnected {
        for f in &r.identity_files {
            if !f.exists() {
                if r.identity_files_configured {
                    tried.push(format!("{} (missing)", f.display()));
                }
                continue;
            }
            if key_file_is_encrypted(f) {
                tried.push(format!(
                    "{} (passphrase-protected: load it with `ssh-add {}`)",
                    f.display(),
                    f.display()
                ));
                continue;
            }
            match session.userauth_pubkey_file(user, None, f, None) {
                Ok(()) if session.authenticated() => return Ok(()),
                Ok(()) => tried.push(format!("{} (not accepted)", f.display())),
                Err(e) if check_disconnect(&e) => {
                    tried.push(format!("{} (connection closed)", f.display()));
                    disconnected = true;
                    break;
                }
                Err(e) => {
                    let why = match e.code() {
                        ErrorCode::Session(libssh2_sys_codes::AUTHENTICATION_FAILED)
                        | ErrorCode::Session(libssh2_sys_codes::PUBLICKEY_UNVERIFIED) => {
                            "not accepted".to_string()
                        }
                        ErrorCode::Session(libssh2_sys_codes::FILE) => {
                            format!("unreadable key: {}", e.message())
                        }
                        _ => e.message().to_string(),
                    };
                    tried.push(format!("{} ({why})", f.display()));
                }
            }
        }
        if !r.identity_files_configured && !r.identity_files.iter().any(|f| f.exists()) {
            tried.push(format!(
                "no key file ({} do not exist)",
                r.identity_files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if disconnected {
        tried.push(
            "the server closed the connection (too many keys offered? see MaxAuthTries)".into(),
        );
    }
    Err(err!(
        hint = format!(
            "make sure one of these public keys is in ~{user}/.ssh/authorized_keys on {}, that the user is right (User in ~/.ssh/config, or user@ in the manifest), or load the key into ssh-agent with ssh-add",
            r.hostname
        ),
        "Failed to authenticate as {user} on {who} ({addr}): tried {}",
        tried.join("; ")
    ))
}

/// libssh2 error codes used here (the `ssh2` crate only exposes raw numbers).
mod libssh2_sys_codes {
    pub const SOCKET_SEND: i32 = -7;
    pub const TIMEOUT: i32 = -9;
    pub const SOCKET_DISCONNECT: i32 = -13;
    pub const FILE: i32 = -16;
    pub const AUTHENTICATION_FAILED: i32 = -18;
    pub const PUBLICKEY_UNVERIFIED: i32 = -19;
    pub const SOCKET_RECV: i32 = -43;
    pub const EAGAIN: i32 = -37;
}

fn is_timeout(e: &ssh2::Error) -> bool {
    matches!(e.code(), ErrorCode::Session(libssh2_sys_codes::TIMEOUT))
}

/// Whether a private key file needs a passphrase (OpenSSH or PEM format).
fn key_file_is_encrypted(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    if text.contains("ENCRYPTED") {
        return true; // "Proc-Type: 4,ENCRYPTED" or "BEGIN ENCRYPTED PRIVATE KEY"
    }
    let body: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    let Some(bytes) = base64_decode(&body) else {
        return false;
    };
    // "openssh-key-v1\0" then string ciphername.
    let Some(rest) = bytes.strip_prefix(b"openssh-key-v1\0") else {
        return false;
    };
    key_type_of_blob(rest).is_some_and(|cipher| cipher != "none")
}

// ---------------------------------------------------------------------------
// Upload
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct AgentDigest {
    hex: String,
    size: u64,
}

/// sha256 of the agent binary, computed once per process (per path).
fn agent_digest(path: &Path) -> Result<AgentDigest> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, AgentDigest>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = map.get(path) {
        return Ok(d.clone());
    }
    let fail = |e: io::Error| {
        err!(
            hint = "set OVERLAY_AGENT_BINARY to the path of a static overlay binary",
            "Failed to read the agent binary {}: {}",
            path.display(),
            crate::error::io_cause(&e)
        )
    };
    let mut f = std::fs::File::open(path).map_err(fail)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; UPLOAD_CHUNK];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(fail)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    let d = AgentDigest {
        hex: hex(h.finalize().as_slice()),
        size,
    };
    map.insert(path.to_path_buf(), d.clone());
    Ok(d)
}

/// Make sure `~/.cache/overlay/overlay-<hash>` on the host is this agent;
/// returns its absolute path there.
fn upload_agent(
    who: Who<'_>,
    conn: &Connected,
    opts: &ConnectOptions,
    env: &LocalEnv,
) -> Result<String> {
    let digest = agent_digest(&env.agent_binary).map_err(|e| Error {
        message: format!("{} (to start the agent on {who})", e.message),
        ..e
    })?;
    conn.session
        .set_timeout(duration_ms(opts.timeout.max(UPLOAD_OP_TIMEOUT)));
    let fail = |what: String, e: ssh2::Error| {
        err!(
            hint = "check that the home directory on that host is writable and not full, and that sshd allows SFTP (Subsystem sftp)",
            "Failed to upload the agent to {who}: {what}: {}",
            sftp_cause(&e)
        )
    };
    let sftp = conn
        .session
        .sftp()
        .map_err(|e| fail("cannot start SFTP".into(), e))?;
    let home = sftp
        .realpath(Path::new("."))
        .map_err(|e| fail("cannot find the home directory".into(), e))?;
    let dir = home.join(AGENT_DIR);
    let name = agent_name(&digest);
    let final_path = dir.join(&name);
    let final_str = final_path
        .to_str()
        .ok_or_else(|| {
            err!(
                hint = "give that account a home directory with a UTF-8 path",
                "Failed to upload the agent to {who}: the home directory {} is not UTF-8",
                home.display()
            )
        })?
        .to_string();

    // AGENT_DIR's parent (`~/.cache`) first, then AGENT_DIR.
    for d in [dir.parent().unwrap_or(&home).to_path_buf(), dir.clone()] {
        if matches!(sftp.stat(&d), Ok(st) if st.is_dir()) {
            continue;
        }
        if let Err(e) = sftp.mkdir(&d, 0o700) {
            match sftp.stat(&d) {
                Ok(st) if st.is_dir() => {}
                _ => return Err(fail(format!("cannot create {}", d.display()), e)),
            }
        }
    }
    // Nothing is run from a folder another user could write to; a file
    // that is not safe itself is replaced below.
    let owners = safe_agent_dir(who, &sftp, &home, &dir)?;
    if is_usable_agent(&sftp, &final_path, digest.size, owners) {
        return Ok(final_str);
    }

    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(".{name}.tmp-{}-{nonce:08x}", std::process::id()));
    let result = write_remote(who, &sftp, &env.agent_binary, &tmp).and_then(|()| {
        let chmod = ssh2::FileStat {
            size: None,
            uid: None,
            gid: None,
            perm: Some(0o755),
            atime: None,
            mtime: None,
        };
        sftp.setstat(&tmp, chmod)
            .map_err(|e| fail(format!("cannot make {} executable", tmp.display()), e))?;
        let flags = RenameFlags::OVERWRITE | RenameFlags::ATOMIC | RenameFlags::NATIVE;
        if sftp.rename(&tmp, &final_path, Some(flags)).is_err() {
            // SFTP v3 (OpenSSH) refuses to rename over an existing file.
            let _ = sftp.unlink(&final_path);
            if let Err(e) = sftp.rename(&tmp, &final_path, Some(flags)) {
                // Another controller may have put the same build there meanwhile.
                if !is_usable_agent(&sftp, &final_path, digest.size, owners) {
                    return Err(fail(
                        format!("cannot rename it to {}", final_path.display()),
                        e,
                    ));
                }
            }
        }
        Ok(())
    });
    // Gone after a successful rename; left over otherwise.
    let _ = sftp.unlink(&tmp);
    result?;
    if !is_usable_agent(&sftp, &final_path, digest.size, owners) {
        return Err(err!(
            hint = "check free space on that host and run again",
            "Failed to upload the agent to {who}: {} has the wrong size or mode after the upload",
            final_path.display()
        ));
    }
    Ok(final_str)
}

/// The owners a file on the agent's path may have: root and the owner of
/// the home directory (SFTP does not tell the login user's uid; the
/// agent's own check, `agent::selfcheck`, compares with it exactly).
#[derive(Debug, Clone, Copy)]
struct Owners {
    home: u32,
}

impl Owners {
    fn allow(self, uid: Option<u32>) -> bool {
        uid.is_some_and(|u| u == 0 || u == self.home)
    }
}

/// The check OpenSSH's `StrictModes` makes, over SFTP: `dir` and every
/// folder of its real path up to the home directory (or `/`) belong to the
/// home's owner or root and are not writable by group or others.
fn safe_agent_dir(who: Who<'_>, sftp: &Sftp, home: &Path, dir: &Path) -> Result<Owners> {
    let lost = |p: &Path, e: ssh2::Error| {
        err!(
            hint = "check that sshd allows SFTP (Subsystem sftp) and run again",
            "Failed to check {} on {who}: {}",
            p.display(),
            sftp_cause(&e)
        )
    };
    let home_st = sftp.stat(home).map_err(|e| lost(home, e))?;
    let owners = Owners {
        home: home_st.uid.unwrap_or(0),
    };
    let real = sftp.realpath(dir).map_err(|e| lost(dir, e))?;
    let home_real = sftp.realpath(home).unwrap_or_else(|_| home.to_path_buf());
    let show = |p: &Path| crate::text::quote(&p.to_string_lossy()).into_owned();
    for d in real.ancestors() {
        let st = sftp.stat(d).map_err(|e| lost(d, e))?;
        let mode = st.perm.unwrap_or(0);
        if !owners.allow(st.uid) {
            return Err(err!(
                hint = format!(
                    "on that host, remove {} (or give {} to the login user), then run again",
                    show(dir),
                    show(d)
                ),
                "Refusing to run the agent on {who} from {}: {} belongs to uid {}, neither the owner of {} nor root, so another user could replace the agent",
                show(dir),
                show(d),
                st.uid.unwrap_or(0),
                show(home)
            ));
        }
        if mode & 0o022 != 0 {
            return Err(err!(
                hint = format!(
                    "on that host, run `chmod go-w {}` (OpenSSH's StrictModes wants the same for ~/.ssh), then run again",
                    show(d)
                ),
                "Refusing to run the agent on {who} from {}: {} is writable by its group or others (mode {:04o}), so another user could replace the agent",
                show(dir),
                show(d),
                mode & 0o7777
            ));
        }
        if d == home_real {
            break;
        }
    }
    Ok(owners)
}

/// Whether `path` is this build, safe to run: a regular file (not a
/// symlink) of the right size, executable, owned by the user or root and
/// writable only by its owner.
fn is_usable_agent(sftp: &Sftp, path: &Path, size: u64, owners: Owners) -> bool {
    match sftp.lstat(path) {
        Ok(st) => {
            st.file_type() == FileType::RegularFile
                && st.size == Some(size)
                && st.perm.is_some_and(|p| p & 0o100 != 0 && p & 0o022 == 0)
                && owners.allow(st.uid)
        }
        Err(_) => false,
    }
}

fn write_remote(who: Who<'_>, sftp: &Sftp, local: &Path, remote: &Path) -> Result<()> {
    let mut src = std::fs::File::open(local).map_err(|e| {
        err!(
            hint = "set OVERLAY_AGENT_BINARY to the path of a static overlay binary",
            "Failed to read the agent binary {} to upload it to {who}: {}",
            local.display(),
            crate::error::io_cause(&e)
        )
    })?;
    let fail = |what: &str, cause: String| {
        err!(
            hint = "check that the home directory on that host is writable and not full",
            "Failed to upload the agent to {who}: {what} {}: {cause}",
            remote.display()
        )
    };
    let mut dst = sftp
        .open_mode(
            remote,
            OpenFlags::WRITE | OpenFlags::TRUNCATE | OpenFlags::EXCLUSIVE,
            0o700,
            OpenType::File,
        )
        .map_err(|e| fail("cannot create", sftp_cause(&e)))?;
    let mut buf = vec![0u8; UPLOAD_CHUNK];
    loop {
        let n = src.read(&mut buf).map_err(|e| {
            err!(
                hint = "set OVERLAY_AGENT_BINARY to the path of a static overlay binary",
                "Failed to read the agent binary {} to upload it to {who}: {}",
                local.display(),
                crate::error::io_cause(&e)
            )
        })?;
        if n == 0 {
            break;
        }
        dst.write_all(&buf[..n])
            .map_err(|e| fail("cannot write", e.to_string()))?;
    }
    dst.close()
        .map_err(|e| fail("cannot close", sftp_cause(&e)))?;
    Ok(())
}

fn sftp_cause(e: &ssh2::Error) -> String {
    match e.code() {
        ErrorCode::SFTP(2) => "no such file or directory".into(),
        ErrorCode::SFTP(3) => "permission denied".into(),
        ErrorCode::SFTP(14) => "no space left".into(),
        ErrorCode::Session(libssh2_sys_codes::TIMEOUT) => "timed out".into(),
        _ => e.message().to_string(),
    }
}

// ---------------------------------------------------------------------------
// The agent pipe
// ---------------------------------------------------------------------------

/// The session and the agent's channel; every libssh2 call goes through this lock.
struct Conn {
    session: Session,
    channel: Channel,
    fd: RawFd,
    eof_sent: bool,
    /// The connection was cut ([`super::Watch::cut`]): every call fails.
    cut: bool,
}

type Shared = Arc<Mutex<Conn>>;

fn exec_agent(who: Who<'_>, conn: Connected, remote: &str) -> Result<AgentPipe> {
    let Connected { session, fd, addr } = conn;
    let fail = |what: &str, e: ssh2::Error| {
        err!(
            hint = "check the server's sshd logs (MaxSessions, ForceCommand, a restricted shell?)",
            "Failed to start the agent on {who} ({addr}): {what}: {}",
            e.message()
        )
    };
    let mut channel = acking(&session, fd, || {
        session.channel_open("session", CHANNEL_WINDOW, CHANNEL_PACKET, None)
    })
    .map_err(|e| fail("cannot open a channel", e))?;
    let command = format!("{} agent", sh_quote(remote));
    acking(&session, fd, || channel.exec(&command))
        .map_err(|e| fail("the server refused to run it", e))?;

    let shared: Shared = Arc::new(Mutex::new(Conn {
        session,
        channel,
        fd,
        eof_sent: false,
        cut: false,
    }));
    let host = who.to_string();
    let remote = remote.to_string();
    let fin = shared.clone();
    let (probe, cut) = (shared.clone(), shared.clone());
    let watch = super::Watch::new(
        move || gone(&mut probe.lock().unwrap_or_else(|p| p.into_inner())),
        move || {
            // Wakes a reader or writer waiting on the socket at once (their
            // next libssh2 call fails), and sshd sees the connection end.
            // SAFETY: the session, which owns the socket, lives in `cut`.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            cut.lock().unwrap_or_else(|p| p.into_inner()).cut = true;
        },
    );
    Ok(AgentPipe {
        watch,
        reader: Box::new(PipeReader {
            shared: shared.clone(),
        }),
        writer: Box::new(PipeWriter { shared }),
        finish: Box::new(move || {
            let result = finish(&fin, &host, &remote);
            // The channel is done: dropping the writer later must not wait on it.
            fin.lock().unwrap_or_else(|p| p.into_inner()).eof_sent = true;
            result
        }),
    })
}

struct PipeReader {
    shared: Shared,
}

struct PipeWriter {
    shared: Shared,
}

impl Read for PipeReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        with_conn(&self.shared, READ_SLICE_MS, |c| {
            c.channel.stream(0).read(buf)
        })
    }
}

impl Write for PipeWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        with_conn(&self.shared, WRITE_SLICE_MS, |c| {
            if c.eof_sent {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "the agent's input is already closed",
                ));
            }
            match c.channel.write(buf) {
                // No room in the channel's window, or in the socket. libssh2
                // would wait for a window that a channel whose agent died
                // never opens again (it ignores the channel's close here),
                // so look: is the agent still there?
                Ok(0) => Err(blocked_write(c)),
                Err(e) if is_transient(&e) => Err(blocked_write(c)),
                r => r,
            }
        })
    }

    /// Data is on its way once `write` returns. (libssh2's channel flush
    /// would discard unread *incoming* data, so it is never called.)
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for PipeWriter {
    /// Closing the writer closes the agent's stdin, as with a local child.
    /// (Not bounded by a deadline: an abandoned half-sent packet would wedge
    /// the session; a dead peer ends it through the TCP timeouts.)
    fn drop(&mut self) {
        let _ = send_eof(&self.shared);
    }
}

/// A write that cannot go on now: `WouldBlock` (wait and try again) while
/// the agent may still read it, `BrokenPipe` once it is gone.
fn blocked_write(c: &mut Conn) -> io::Error {
    match gone(c) {
        Some(how) => io::Error::new(io::ErrorKind::BrokenPipe, format!("the agent {how}")),
        None => io::ErrorKind::WouldBlock.into(),
    }
}

/// Whether the agent at the other end is gone, without taking any of its
/// output: `Some(how)` ("was killed by signal 9 (KILL)") once sshd reported
/// its death or the end of its output, or the connection failed; `None`
/// while it may still run. Reads what has arrived on the socket (into
/// libssh2's queues), never waits.
fn gone(c: &mut Conn) -> Option<String> {
    if c.cut {
        return Some("was cut off".into());
    }
    if let Ok(s) = c.channel.exit_signal()
        && let Some(sig) = s.exit_signal
    {
        return Some(format!("was killed by signal {}", super::signal_name(&sig)));
    }
    // `eof()` hides an EOF behind unread output; wait_eof, non-blocking,
    // pumps the transport and looks at the flag itself.
    c.session.set_blocking(false);
    let r = c.channel.wait_eof();
    c.session.set_blocking(true);
    match r {
        Ok(()) => Some(match c.channel.exit_status() {
            Ok(status) if status != 0 => format!("exited with status {status}"),
            _ => "closed the connection".into(),
        }),
        Err(e) if e.code() == ErrorCode::Session(libssh2_sys_codes::EAGAIN) => None,
        Err(e) => Some(format!("lost the connection ({})", e.message())),
    }
}

fn send_eof(shared: &Shared) -> io::Result<()> {
    with_conn(shared, WRITE_SLICE_MS, |c| {
        if !c.eof_sent {
            c.channel.send_eof()?;
            c.eof_sent = true;
        }
        Ok(())
    })
}

/// Run `f` under the lock with libssh2 bounded to `slice_ms`; while it would
/// block, release the lock and wait on the socket, then call `f` again. Each
/// caller repeats its own call until it completes, as libssh2 requires of a
/// call that returned half-way.
fn with_conn<T>(
    shared: &Shared,
    slice_ms: u32,
    mut f: impl FnMut(&mut Conn) -> io::Result<T>,
) -> io::Result<T> {
    loop {
        let (fd, dirs) = {
            let mut c = shared.lock().unwrap_or_else(|p| p.into_inner());
            if c.cut {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the connection was cut",
                ));
            }
            c.session.set_timeout(slice_ms);
            match f(&mut c) {
                Err(e) if is_transient(&e) => (c.fd, c.session.block_directions()),
                other => {
                    // A reply that came in parts: acknowledge this one at
                    // once so sshd's next part is not held back (Nagle).
                    quick_ack(c.fd);
                    return other;
                }
            }
        };
        wait_socket(fd, dirs, IDLE_POLL_MS);
        quick_ack(fd);
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn wait_socket(fd: RawFd, dirs: BlockDirections, timeout_ms: i32) {
    let events = match dirs {
        BlockDirections::Outbound => libc::POLLOUT,
        BlockDirections::Both => libc::POLLIN | libc::POLLOUT,
        BlockDirections::Inbound | BlockDirections::None => libc::POLLIN,
    };
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd; the fd stays open while the session lives,
    // and the caller holds an Arc to it.
    unsafe {
        libc::poll(&mut pfd, 1, timeout_ms);
    }
}

/// Run a libssh2 call that waits for the server, acknowledging each TCP
/// segment as soon as it arrives (see [`quick_ack`]), within the session's
/// timeout. libssh2 reads the socket itself in blocking mode, so the call
/// runs non-blocking here, with the waiting done in this loop.
fn acking<T>(
    session: &Session,
    fd: RawFd,
    mut op: impl FnMut() -> std::result::Result<T, ssh2::Error>,
) -> std::result::Result<T, ssh2::Error> {
    // As in libssh2, a timeout of 0 means none.
    let deadline = match session.timeout() {
        0 => None,
        ms => Some(std::time::Instant::now() + Duration::from_millis(u64::from(ms))),
    };
    session.set_blocking(false);
    let r = loop {
        match op() {
            Err(e) if e.code() == ErrorCode::Session(libssh2_sys_codes::EAGAIN) => {
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    break Err(ssh2::Error::new(
                        ErrorCode::Session(libssh2_sys_codes::TIMEOUT),
                        "timed out waiting for the server",
                    ));
                }
                wait_socket(fd, session.block_directions(), 20);
                quick_ack(fd);
            }
            r => break r,
        }
    };
    session.set_blocking(true);
    r
}

/// Set an integer socket option (best effort).
fn set_sockopt(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) {
    // SAFETY: fd is an open socket; the option value is a c_int.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Acknowledge the next segments at once instead of up to 40 ms later.
///
/// After authentication OpenSSH's sshd sends an unsolicited packet (its host
/// keys, `hostkeys-00@openssh.com`) and then, without `TCP_NODELAY` on a
/// non-interactive session, holds its answer to our channel open (Nagle)
/// until that packet is acknowledged; with Linux's delayed ACK that stalled
/// every connection by ~44 ms. Quick-ACK mode is temporary in Linux, so it
/// is set just before the exchange it is for.
fn quick_ack(fd: RawFd) {
    set_sockopt(fd, libc::IPPROTO_TCP, libc::TCP_QUICKACK, 1);
}

fn tcp_keepalive(fd: RawFd) {
    let set = |level, name, value| set_sockopt(fd, level, name, value);
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, TCP_KEEPIDLE_SECS);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, TCP_KEEPINTVL_SECS);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, TCP_KEEPCNT);
    set(
        libc::IPPROTO_TCP,
        libc::TCP_USER_TIMEOUT,
        TCP_USER_TIMEOUT_MS,
    );
}

fn finish(shared: &Shared, who: &str, remote: &str) -> Result<String> {
    let lost = |e: io::Error| {
        err!(
            hint = "the connection dropped; run again",
            "Failed to wait for the agent on {who}: {e}"
        )
    };
    send_eof(shared)
        .or_else(|e| {
            // The agent may already have closed the channel.
            if e.kind() == io::ErrorKind::BrokenPipe {
                Ok(())
            } else {
                Err(e)
            }
        })
        .map_err(lost)?;
    // Discard unread output, then collect stderr until the agent is done.
    let mut buf = vec![0u8; 32768];
    loop {
        let n = with_conn(shared, READ_SLICE_MS, |c| {
            c.channel.stream(0).read(&mut buf)
        })
        .map_err(lost)?;
        if n == 0 {
            break;
        }
    }
    let mut stderr = Vec::new();
    loop {
        let n = with_conn(shared, READ_SLICE_MS, |c| {
            c.channel.stream(1).read(&mut buf)
        })
        .map_err(lost)?;
        if n == 0 {
            break;
        }
        if stderr.len() < (1 << 20) {
            stderr.extend_from_slice(&buf[..n]);
        }
    }
    with_conn(shared, WRITE_SLICE_MS, |c| {
        c.channel.wait_close().map_err(io::Error::from)
    })
    .map_err(lost)?;
    let (status, signal) = {
        let c = shared.lock().unwrap_or_else(|p| p.into_inner());
        let status = c.channel.exit_status().unwrap_or(-1);
        let signal = c.channel.exit_signal().ok().and_then(|s| s.exit_signal);
        c.session.set_timeout(1000);
        let _ = c.session.disconnect(None, "overlay done", None);
        (status, signal)
    };
    let text = String::from_utf8_lossy(&stderr).into_owned();
    let detail = text.trim();
    if let Some(sig) = signal {
        return Err(err!(
            hint = "check the host's logs (out of memory?) and run again",
            "The agent on {who} was killed by signal {}{}{detail}",
            super::signal_name(&sig),
            if detail.is_empty() { "" } else { ": " }
        ));
    }
    if status == crate::agent::selfcheck::EXIT_UNSAFE {
        // The agent refused to run from its folder: its message and hint.
        let said = detail
            .strip_prefix("overlay agent: not serving: ")
            .unwrap_or(detail);
        let (message, hint) = said.split_once("\nhint: ").unwrap_or((said, ""));
        return Err(err!(
            hint = if hint.is_empty() {
                format!("on that host, remove {remote} and check the modes of its folders")
            } else {
                hint.trim().to_string()
            },
            "Refusing to run the agent on {who}: {}",
            message.trim()
        ));
    }
    if status != 0 {
        let hint = match status {
            126 | 127 => format!(
                "{remote} could not be run on that host: is its home on a noexec mount, or is it another CPU architecture? (set OVERLAY_AGENT_BINARY to a matching static build)"
            ),
            _ => "run `overlay agent` on that host by hand to see why".into(),
        };
        return Err(err!(
            hint = hint,
            "The agent on {who} exited with status {status}{}{detail}",
            if detail.is_empty() { "" } else { ": " }
        ));
    }
    Ok(text)
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/// Quote for a POSIX shell: `'...'`, with `'` written as `'\''`.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn duration_ms(d: Duration) -> u32 {
    d.as_millis().clamp(1, u32::MAX as u128) as u32
}

fn fmt_secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        if c == b'=' {
            break;
        }
        if c.is_ascii_whitespace() {
            continue;
        }
        let v = B64.iter().position(|&x| x == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn local() -> LocalUser {
        LocalUser {
            name: "alice".into(),
            home: PathBuf::from("/home/alice"),
        }
    }

    #[test]
    fn parses_targets() {
        let t = |s: &str| parse_target(s).unwrap();
        assert_eq!(
            t("box"),
            Target {
                user: None,
                host: "box".into(),
                port: None
            }
        );
        assert_eq!(
            t("deploy@box.lan:2222"),
            Target {
                user: Some("deploy".into()),
                host: "box.lan".into(),
                port: Some(2222)
            }
        );
        assert_eq!(t("a@b@box").user.as_deref(), Some("a@b"));
        assert_eq!(
            t("[::1]:2200"),
            Target {
                user: None,
                host: "::1".into(),
                port: Some(2200)
            }
        );
        assert_eq!(t("root@[fe80::1]").host, "fe80::1");
        assert_eq!(t("fe80::1").port, None);
        assert_eq!(t("fe80::1").host, "fe80::1");
        for bad in [
            "",
            "  ",
            "@box",
            "box:",
            "box:x",
            "box:0",
            "box:70000",
            "[::1",
            "[::1]x",
            "-oProxyCommand=sh",
            "a b",
            "user@",
        ] {
            assert!(parse_target(bad).is_err(), "{bad:?} should be refused");
        }
    }

    const CONFIG: &str = "\
Host web
    HostName web.internal
    User deploy
    Port 2222
    IdentityFile ~/.ssh/web_key
    IdentityFile %d/.ssh/%r@%h
    UserKnownHostsFile ~/.ssh/kh_web /etc/kh_%n
    HostKeyAlias webalias
    IdentityAgent ~/.ssh/agent.sock

Host *.lan
    User lanuser
    HostName %h.example.org

Host jump
    ProxyJump bastion

Host pc
    ProxyCommand nc %h %p

Host noagent
    IdentityAgent none
    UserKnownHostsFile none

Host *
    ForwardAgent no
    SomeOptionNobodyKnows yes
    Port 22
";

    #[test]
    fn resolves_through_a_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, CONFIG).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let l = local();

        let r = resolve("web", &text, &l).unwrap();
        assert_eq!(r.hostname, "web.internal");
        assert_eq!((r.user.as_str(), r.port), ("deploy", 2222));
        assert_eq!(
            r.identity_files,
            vec![
                PathBuf::from("/home/alice/.ssh/web_key"),
                PathBuf::from("/home/alice/.ssh/deploy@web.internal"),
            ]
        );
        assert!(r.identity_files_configured);
        assert_eq!(
            r.known_hosts_files,
            vec![
                PathBuf::from("/home/alice/.ssh/kh_web"),
                PathBuf::from("/etc/kh_web")
            ]
        );
        assert_eq!(r.host_key_alias.as_deref(), Some("webalias"));
        assert_eq!(r.known_hosts_name(), "[webalias]:2222");
        assert_eq!(
            r.agent,
            AgentSocket::Path("/home/alice/.ssh/agent.sock".into())
        );

        // The manifest's user and port win over the config's.
        let r = resolve("root@WEB:2200", &text, &l).unwrap();
        assert_eq!(
            (r.user.as_str(), r.port, r.hostname.as_str()),
            ("root", 2200, "web.internal")
        );

        let r = resolve("box.lan", &text, &l).unwrap();
        assert_eq!(
            (r.user.as_str(), r.hostname.as_str()),
            ("lanuser", "box.lan.example.org")
        );

        // Nothing configured: local user, port 22, default key files and known_hosts.
        let r = resolve("10.0.0.7", &text, &l).unwrap();
        assert_eq!(
            (r.user.as_str(), r.port, r.hostname.as_str()),
            ("alice", 22, "10.0.0.7")
        );
        assert!(!r.identity_files_configured);
        assert_eq!(
            r.identity_files[0],
            PathBuf::from("/home/alice/.ssh/id_ed25519")
        );
        assert_eq!(r.identity_files.len(), 3);
        assert_eq!(
            r.known_hosts_files[0],
            PathBuf::from("/home/alice/.ssh/known_hosts")
        );
        assert_eq!(r.known_hosts_name(), "10.0.0.7");
        assert_eq!(r.agent, AgentSocket::FromEnv);

        let r = resolve("noagent", &text, &l).unwrap();
        assert_eq!(r.agent, AgentSocket::Disabled);
        assert!(r.known_hosts_files.is_empty());

        assert!(
            resolve("jump", &text, &l)
                .unwrap_err()
                .contains("ProxyJump")
        );
        assert!(
            resolve("pc", &text, &l)
                .unwrap_err()
                .contains("ProxyCommand")
        );
        assert!(resolve("box:x", &text, &l).is_err());
        // No config at all.
        let r = resolve("u@h:2", "", &l).unwrap();
        assert_eq!(
            (r.user.as_str(), r.hostname.as_str(), r.port),
            ("u", "h", 2)
        );
        assert_eq!(r.known_hosts_name(), "[h]:2");
    }

    #[test]
    fn matches_known_hosts_patterns() {
        assert!(match_host_patterns("box,10.0.0.1", "box"));
        assert!(match_host_patterns("BOX", "box"));
        assert!(match_host_patterns("*.lan", "a.lan"));
        assert!(!match_host_patterns("*.lan", "a.lan.evil"));
        assert!(match_host_patterns("[10.0.0.?]:2222", "[10.0.0.5]:2222"));
        assert!(!match_host_patterns("[box]:2222", "box"));
        assert!(!match_host_patterns("*.lan,!bad.lan", "bad.lan"));
        assert!(match_host_patterns("*.lan,!bad.lan", "good.lan"));
        assert!(wildmatch("a*b*c", "aXbYbZc"));
        assert!(!wildmatch("a*b", "aXbY"));

        let text = "# comment\n\nbox ssh-ed25519 AAAA one\n@revoked * ssh-rsa BBBB\n@cert-authority *.lan ssh-ed25519 CCCC\nbroken-line\n";
        let e = parse_known_hosts(Path::new("kh"), text);
        assert_eq!(e.len(), 3);
        assert_eq!(
            (
                e[0].line,
                e[0].hosts.as_str(),
                e[0].keytype.as_str(),
                e[0].key.as_str()
            ),
            (3, "box", "ssh-ed25519", "AAAA")
        );
        assert_eq!(e[1].marker.as_deref(), Some("@revoked"));
        assert_eq!(e[2].marker.as_deref(), Some("@cert-authority"));
    }

    #[test]
    fn helpers() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_decode("Zm9vYmE=").unwrap(), b"fooba");
        assert_eq!(
            base64_decode(PROBE_KEY).map(|b| key_type_of_blob(&b)),
            Some(Some("ssh-ed25519".into()))
        );
        assert_eq!(sh_quote("/home/o'brien/x"), r"'/home/o'\''brien/x'");
        let weird = "/tmp/a b'c\"$(x)`y`\\n";
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {}", sh_quote(weird)))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), weird);
        assert_eq!(percent_host("%h.x%%", "a"), "a.x%");
        assert_eq!(fmt_secs(Duration::from_secs(10)), "10 s");
        assert_eq!(fmt_secs(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(hex(&[0, 255, 16]), "00ff10");
    }

    #[test]
    fn detects_passphrase_protected_keys() {
        if !Path::new("/usr/bin/ssh-keygen").exists() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        for (name, pass) in [("plain", ""), ("enc", "secret")] {
            let st = std::process::Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", pass, "-f"])
                .arg(dir.path().join(name))
                .status()
                .unwrap();
            assert!(st.success());
        }
        assert!(!key_file_is_encrypted(&dir.path().join("plain")));
        assert!(key_file_is_encrypted(&dir.path().join("enc")));
    }

    // -----------------------------------------------------------------------
    // Against a real OpenSSH server. Run as root:
    //   cargo test --lib transport::ssh -- --ignored --nocapture
    // -----------------------------------------------------------------------

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

    #[test]
    fn against_real_sshd() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || !Path::new("/usr/sbin/sshd").exists() {
            eprintln!("skipped: needs root and /usr/sbin/sshd");
            return;
        }
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
        let _sshd = Kill(
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

        std::fs::write(d.join("echo.c"), ECHO_C).unwrap();
        run(Command::new("musl-gcc")
            .args(["-static", "-O2", "-o"])
            .arg(d.join("echo-agent"))
            .arg(d.join("echo.c")));

        let kh = ssh_dir.join("known_hosts");
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
            format!(
                "Host {alias}\n    HostName 127.0.0.9\n    Port {port}\n    User root\n{extra}\n"
            )
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
        let _cleanup = RemoveOnDrop(
            [remote.as_str(), "/root/.cache/overlay", "/root/.cache"]
                .into_iter()
                .filter(|p| !Path::new(p).exists())
                .map(PathBuf::from)
                .collect(),
        );

        // 1. Unknown host key: refused, with the OpenSSH fingerprint.
        let e = expect_err(start_agent_with("ct1", "box", &opts, &env));
        show("unknown host key", &e);
        assert!(
            e.message.contains("ct1 (ssh box)") && e.message.contains("unknown"),
            "{e:?}"
        );
        assert!(e.message.contains(&fp), "{e:?} vs {fp}");
        assert!(e.hint.as_deref().unwrap().contains("--accept-new-host-key"));
        assert!(!kh.exists());

        // 2. Accepted once: recorded in OpenSSH format, then trusted.
        let mut pipe = start_agent_with("ct1", "box", &accept, &env).unwrap();
        let line = std::fs::read_to_string(&kh).unwrap();
        assert!(
            line.starts_with(&format!("[127.0.0.9]:{port} ssh-ed25519 ")),
            "{line}"
        );
        run(Command::new("ssh-keygen")
            .arg("-F")
            .arg(format!("[127.0.0.9]:{port}"))
            .arg("-f")
            .arg(&kh));
        pipe.writer.write_all(b"hello agent").unwrap();
        pipe.writer.flush().unwrap();
        let mut got = [0u8; 11];
        pipe.reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello agent");
        drop(pipe.writer);
        assert_eq!((pipe.finish)().unwrap(), "echo done\n");
        let meta = std::fs::metadata(&remote).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o755);
        assert_eq!(
            meta.len(),
            std::fs::metadata(&env.agent_binary).unwrap().len()
        );
        let mtime = meta.modified().unwrap();

        // 3. Negotiated algorithms.
        let r = resolve(
            "box",
            &std::fs::read_to_string(&env.config_path).unwrap(),
            &env.user,
        )
        .unwrap();
        let conn = connect(
            Who {
                host: "ct1",
                target: "box",
            },
            &r,
            &opts,
            &env,
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

        // 4. Reuse: the second start does not upload again; the reader can
        //    wait while another thread writes; bulk data both ways at once.
        std::thread::sleep(Duration::from_millis(1100));
        let pipe = start_agent_with("ct1", "box", &opts, &env).unwrap();
        assert_eq!(
            std::fs::metadata(&remote).unwrap().modified().unwrap(),
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

        // 5. A damaged copy on the host is replaced (rename over an existing file).
        std::fs::write(&remote, b"truncated").unwrap();
        let pipe = start_agent_with("ct1", "box", &opts, &env).unwrap();
        assert_eq!(
            std::fs::metadata(&remote).unwrap().len(),
            std::fs::metadata(&env.agent_binary).unwrap().len()
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

        // 6. Changed host key: refused, even with --accept-new-host-key.
        for o in [&opts, &accept] {
            let e = expect_err(start_agent_with("ct2", "tampered", o, &env));
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
        let e = expect_err(start_agent_with("ct2", "rsaknown", &accept, &env));
        show("other key type", &e);
        assert!(e.message.contains("RSA key"), "{e:?}");
        // Hashed known_hosts entries are understood.
        std::fs::copy(&kh, ssh_dir.join("kh_hashed")).unwrap();
        run(Command::new("ssh-keygen")
            .arg("-H")
            .arg("-f")
            .arg(ssh_dir.join("kh_hashed")));
        assert!(
            std::fs::read_to_string(ssh_dir.join("kh_hashed"))
                .unwrap()
                .starts_with("|1|")
        );
        let pipe = start_agent_with("ct2", "hashed", &opts, &env).unwrap();
        drop(pipe.writer);
        assert_eq!((pipe.finish)().unwrap(), "echo done\n");

        // 7. Wrong keys: everything tried is listed.
        let e = expect_err(start_agent_with("ct3", "wrongkey", &opts, &env));
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

        // 8. ssh-agent.
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
            .arg(ssh_dir.join("id_ed25519"))
            .env("SSH_AUTH_SOCK", &sock));
        let with_agent = LocalEnv {
            agent_sock: Some(sock.clone()),
            ..env.clone()
        };
        let pipe = start_agent_with("ct4", "viaagent", &opts, &with_agent).unwrap();
        drop(pipe.writer);
        assert_eq!((pipe.finish)().unwrap(), "echo done\n");

        // 9. Closed port: refused at once.
        let closed = free_port();
        let e = expect_err(start_agent_with(
            "ct5",
            &format!("root@127.0.0.9:{closed}"),
            &accept,
            &env,
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
            &env,
        ));
        show("silent server", &e);
        assert!(e.message.contains("no answer within 1 s"), "{e:?}");
        holder.join().unwrap();
        let backlog = std::net::TcpListener::bind("127.0.0.9:0").unwrap();
        let e = expect_err(start_agent_with(
            "ct6",
            &format!("127.0.0.9:{}", backlog.local_addr().unwrap().port()),
            &short,
            &env,
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
            &env,
        ));
        show("SYN dropped", &e);
        assert!(e.message.contains("timed out after 1 s"), "{e:?}");
    }
}
