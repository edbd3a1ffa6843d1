//! Reaching the host: TCP connect to each address of the resolved host
//! name in turn (with keepalive and `TCP_USER_TIMEOUT` set on the socket),
//! or a stream through jump hosts or a `ProxyCommand` ([`super::jump`]),
//! the SSH handshake with our cipher and host key algorithm preferences,
//! then the host key check ([`super::known_hosts`]) and authentication
//! ([`super::auth`]). Also the other socket options the agent pipe uses
//! ([`quick_ack`]).

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use ssh2::{MethodType, Session};

use super::auth::authenticate;
use super::config::{LocalEnv, Resolved};
use super::known_hosts::{known_key_types, verify_host_key};
use super::{ConnectOptions, Who, duration_ms, fmt_secs, is_timeout};
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
/// TCP keepalive and user timeout, so that a host or network that goes
/// silent ends the connection within about 30 s, even while it waits on an
/// agent hashing for minutes (the peer's kernel answers the probes, so a
/// busy agent is never taken for a dead one). libssh2's own keepalive is not
/// used: it is a packet like any other, sent under the session lock by
/// whichever thread holds it, and one left half-sent when that call gives
/// up wedges the session; the kernel's probes need no thread and no lock.
/// A dead agent or sshd is seen sooner, from the channel itself (see
/// [`super::pipe`]). docs/design.md, "A dead peer is noticed".
const TCP_KEEPIDLE_SECS: i32 = 10;
const TCP_KEEPINTVL_SECS: i32 = 5;
const TCP_KEEPCNT: i32 = 4;
const TCP_USER_TIMEOUT_MS: i32 = 30_000;

/// An authenticated session.
pub(super) struct Connected {
    pub(super) session: Session,
    /// The socket the session reads and writes: the TCP connection, or
    /// this end of the socket pair of a jump or `ProxyCommand`.
    pub(super) fd: RawFd,
    /// Where the session goes, for messages.
    pub(super) addr: Route,
}

/// How a session reached its host, for messages: `10.0.0.5:22`, or
/// `10.0.0.5:22 through jump host bastion`.
#[derive(Debug, Clone)]
pub(super) enum Route {
    Direct(SocketAddr),
    /// `to` (`host:port`, as the jump host resolves it) through the jump host `via`.
    Jump {
        to: String,
        via: String,
    },
    /// `to` (`host:port`) through a `ProxyCommand`.
    Command {
        to: String,
    },
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Route::Direct(a) => write!(f, "{a}"),
            Route::Jump { to, via } => write!(f, "{to} through jump host {via}"),
            Route::Command { to } => write!(f, "{to} through its ProxyCommand"),
        }
    }
}

/// The byte stream a session runs over.
pub(super) enum Carrier {
    Tcp(TcpStream),
    /// One end of a socket pair: the other is pumped into a jump host's
    /// `direct-tcpip` channel, or is a `ProxyCommand`'s stdin and stdout.
    Pair(UnixStream),
}

impl AsRawFd for Carrier {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Carrier::Tcp(t) => t.as_raw_fd(),
            Carrier::Pair(u) => u.as_raw_fd(),
        }
    }
}

/// Connect to `r`, check its host key and authenticate.
pub(super) fn connect(
    who: Who<'_>,
    r: &Resolved,
    opts: &ConnectOptions,
    env: &LocalEnv,
) -> Result<Connected> {
    connect_hop(who, r, opts, env, 0)
}

/// [`connect`] for a host `depth` jump hosts away from the target.
pub(super) fn connect_hop(
    who: Who<'_>,
    r: &Resolved,
    opts: &ConnectOptions,
    env: &LocalEnv,
    depth: usize,
) -> Result<Connected> {
    let secs = fmt_secs(opts.timeout);
    let super::jump::Carried {
        stream,
        route: addr,
        said,
    } = super::jump::reach(who, r, opts, env, depth)?;
    let fd = stream.as_raw_fd();
    if let Carrier::Tcp(tcp) = &stream {
        let _ = tcp.set_nodelay(true);
        tcp_keepalive(fd);
    }

    let fail = |what: &str, e: ssh2::Error| -> Error {
        // What a ProxyCommand said on stderr before it failed.
        let said = said.as_ref().map(|s| s.wait()).unwrap_or_default();
        if !said.is_empty() {
            return err!(
                hint = "fix the ProxyCommand in ~/.ssh/config (run it by hand to see it connect)",
                "Failed to {what} with {who} at {addr}: {}; the ProxyCommand said: {said}",
                e.message()
            );
        }
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
    session.set_tcp_stream(stream);
    session.set_timeout(duration_ms(opts.timeout));
    set_algorithm_preferences(&session, r, env);
    session
        .handshake()
        .map_err(|e| fail("complete the SSH handshake", e))?;

    verify_host_key(who, &session, r, opts, env, &addr)?;
    authenticate(who, &session, r, env, &addr)?;
    Ok(Connected { session, fd, addr })
}

/// A TCP connection to one of the host's addresses.
pub(super) struct Reached {
    pub(super) tcp: TcpStream,
    pub(super) addr: SocketAddr,
}

/// Connect to the first address of `r.hostname` that answers within the
/// timeout; the error lists every address tried and why it failed.
pub(super) fn tcp_connect(who: Who<'_>, r: &Resolved, opts: &ConnectOptions) -> Result<Reached> {
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
    Ok(Reached { tcp, addr })
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
    let mut wanted: Vec<&str> = Vec::new();
    for t in known_key_types(session, r, env) {
        for a in algorithms_for_key_type(&t) {
            if !wanted.contains(a) {
                wanted.push(a);
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
pub(super) fn quick_ack(fd: RawFd) {
    set_sockopt(fd, libc::IPPROTO_TCP, libc::TCP_QUICKACK, 1);
}

/// Keepalive probes and a user timeout (see [`TCP_KEEPIDLE_SECS`]).
pub(super) fn tcp_keepalive(fd: RawFd) {
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
