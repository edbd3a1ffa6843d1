//! Reaching a host's SSH port ([`reach`]): a TCP connection from here, or,
//! as `ProxyJump` and `ProxyCommand` in ~/.ssh/config (or the manifest's
//! `proxy_jump`) ask, a byte stream through jump hosts or a command.
//!
//! - **Jump hosts** (`-J a,b` syntax, first hop first): the last hop is
//!   itself connected as any host is, through the hops before it (the
//!   first one directly, or as its own ~/.ssh/config entry says), with its
//!   host key checked against known_hosts under its own name and port and
//!   `--accept-new-host-key` applying to it as to the target. On that
//!   session a `direct-tcpip` channel is opened to the target's `HostName`
//!   and port (resolved by the jump host, as `ssh -J` does). libssh2 runs
//!   a session over a socket, so the target's session gets one end of a
//!   Unix socket pair, and a thread (the pump) moves bytes between the
//!   other end and the channel. The pump owns the jump host's session: it
//!   is the only thread that touches it, in non-blocking mode. When the
//!   target's session closes its end (or is cut), the pump closes the
//!   channel and the jump session; when the jump host or the channel
//!   fails, the pump closes its end and the target's session sees its
//!   connection end.
//! - **ProxyCommand**: run with `sh -c 'exec COMMAND'` after ssh's
//!   %-tokens are expanded (ssh runs it through the user's shell the same
//!   way; it is the user's own configuration, never a manifest value), its
//!   stdin and stdout one end of a socket pair, its stderr kept (the last
//!   4 KiB) for the error message when the handshake fails.
//!
//! A dead peer: the first hop's TCP socket has the keepalive and
//! `TCP_USER_TIMEOUT` of a direct connection, so a jump host or network
//! that goes silent ends the jump session within about 30 s; the pump then
//! closes the target's socket and every wait on the agent ends. A target
//! that goes silent *behind* a live jump host is seen only through the
//! jump host's own TCP connection to it (its kernel's retransmission
//! timeout, while data is unacknowledged); no SSH-level keepalive is sent
//! on the target's session (see `connect.rs`). docs/bastions.md says the
//! same.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::ops::ControlFlow;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ssh2::{BlockDirections, Channel, ErrorCode, Session};

use super::config::{LocalEnv, Proxy, Resolved, read_config, resolve_in};
use super::connect::{Carrier, Reached, Route, connect_hop, quick_ack, tcp_connect};
use super::libssh2_sys_codes as codes;
use super::{ConnectOptions, Who};
use crate::err;
use crate::error::Result;

/// Hosts chained deeper than this are refused: a `ProxyJump` loop in
/// ~/.ssh/config would otherwise never end.
const MAX_HOPS: usize = 8;
/// The most the pump reads at once, either way.
const PUMP_BUF: usize = 256 * 1024;
/// How long the pump sleeps at most between looks at a quiet connection
/// (it wakes at once when either side has something).
const PUMP_POLL_MS: i32 = 500;
/// How much of a ProxyCommand's stderr is kept.
const SAID_MAX: usize = 4096;

/// The stream to a host's SSH port and how it got there.
pub(super) struct Carried {
    pub(super) stream: Carrier,
    pub(super) route: Route,
    /// A ProxyCommand's stderr.
    pub(super) said: Option<Said>,
}

/// Open the byte stream to `r`'s SSH port, as `r.proxy` says. `depth` is
/// how many jump hosts away from the target `r` is.
pub(super) fn reach(
    who: Who<'_>,
    r: &Resolved,
    opts: &ConnectOptions,
    env: &LocalEnv,
    depth: usize,
) -> Result<Carried> {
    match &r.proxy {
        Proxy::Direct => {
            let Reached { tcp, addr } = tcp_connect(who, r, opts)?;
            Ok(Carried {
                stream: Carrier::Tcp(tcp),
                route: Route::Direct(addr),
                said: None,
            })
        }
        Proxy::Jump(hops) => through_jump(who, r, hops, opts, env, depth),
        Proxy::Command(cmd) => through_command(who, r, cmd),
    }
}

/// `host:port` as ssh writes it (IPv6 addresses in brackets).
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Connect to the last of `hops` (through the ones before it), open a
/// `direct-tcpip` channel from there to `r`, and pump it to a socket pair.
fn through_jump(
    who: Who<'_>,
    r: &Resolved,
    hops: &[String],
    opts: &ConnectOptions,
    env: &LocalEnv,
    depth: usize,
) -> Result<Carried> {
    let Some((last, before)) = hops.split_last() else {
        return Err(err!(
            kind = Usage,
            hint = "give ProxyJump (or proxy_jump) one or more hosts",
            "Failed to connect to {who}: its jump host list is empty"
        ));
    };
    if depth + hops.len() > MAX_HOPS {
        return Err(err!(
            kind = Usage,
            hint =
                "check ~/.ssh/config for a ProxyJump loop (a jump host whose own entry jumps back)",
            "Failed to connect to {who}: more than {MAX_HOPS} jump hosts in a row"
        ));
    }
    let to = host_port(&r.hostname, r.port);
    let label = format!("jump host {last} (on the way to {})", who.host);
    let hop = Who {
        host: &label,
        target: last,
    };
    let config = read_config(hop, env)?;
    let mut hr = resolve_in(
        hop,
        None,
        &config,
        env,
        "write each jump host as [user@]host[:port] or an alias from ~/.ssh/config",
    )?;
    if !before.is_empty() {
        // `-J a,b`: b is reached through a (whatever b's own entry says).
        hr.proxy = Proxy::Jump(before.to_vec());
    }
    let conn = connect_hop(hop, &hr, opts, env, depth + 1)?;
    let channel = conn
        .session
        .channel_direct_tcpip(&r.hostname, r.port, None)
        .map_err(|e| {
            err!(
                kind = Connection,
                hint = format!(
                    "check that {last} reaches {to} (is sshd running on the target? HostName and Port of {} as {last} sees them) and that its sshd allows forwarding (AllowTcpForwarding)",
                    who.target
                ),
                "Failed to connect to {who} at {to} through jump host {last}: {}",
                e.message()
            )
        })?;
    let (ours, theirs) = UnixStream::pair().map_err(|e| {
        err!("Failed to connect to {who} through jump host {last}: cannot make a socket pair: {e}")
    })?;
    let jump_fd = conn.fd;
    let session = conn.session;
    std::thread::Builder::new()
        .name(format!("jump {last}"))
        .spawn(move || pump(session, channel, theirs, jump_fd))
        .map_err(|e| {
            err!("Failed to connect to {who} through jump host {last}: cannot start a thread: {e}")
        })?;
    Ok(Carried {
        stream: Carrier::Pair(ours),
        route: Route::Jump {
            to,
            via: last.clone(),
        },
        said: None,
    })
}

/// Run `cmd` (ssh's %-tokens already expanded) with `sh -c`, its stdin and
/// stdout one end of a socket pair.
fn through_command(who: Who<'_>, r: &Resolved, cmd: &str) -> Result<Carried> {
    let to = host_port(&r.hostname, r.port);
    let fail = |what: &str, e: io::Error| {
        err!(
            kind = Connection,
            hint = "fix the ProxyCommand in ~/.ssh/config (run it by hand to see it connect)",
            "Failed to connect to {who} at {to} through its ProxyCommand `{cmd}`: {what}: {e}"
        )
    };
    let (ours, theirs) = UnixStream::pair().map_err(|e| fail("cannot make a socket pair", e))?;
    let theirs_out = theirs
        .try_clone()
        .map_err(|e| fail("cannot make a socket pair", e))?;
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!("exec {cmd}"))
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::from(OwnedFd::from(theirs_out)))
        .stderr(Stdio::piped())
        // Its own process group: a terminal's Ctrl-C reaches only overlay,
        // which then tells the target to stop through this connection.
        .process_group(0)
        .spawn()
        .map_err(|e| fail("cannot run /bin/sh", e))?;
    let text = Arc::new(Mutex::new(Vec::new()));
    let (done_tx, done) = mpsc::channel();
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let keep = text.clone();
    std::thread::Builder::new()
        .name("proxycommand".into())
        .spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut t = keep.lock().unwrap_or_else(|p| p.into_inner());
                t.extend_from_slice(&buf[..n]);
                if t.len() > SAID_MAX {
                    let cut = t.len() - SAID_MAX;
                    t.drain(..cut);
                }
            }
            // Reap it; it ends when the session closes its socket.
            let _ = child.wait();
            let _ = done_tx.send(());
        })
        .map_err(|e| fail("cannot start a thread", e))?;
    Ok(Carried {
        stream: Carrier::Pair(ours),
        route: Route::Command { to },
        said: Some(Said { text, done }),
    })
}

/// What a ProxyCommand wrote on stderr.
pub(super) struct Said {
    text: Arc<Mutex<Vec<u8>>>,
    /// Signalled once the command has exited and its stderr is all read.
    done: mpsc::Receiver<()>,
}

impl Said {
    /// Its stderr so far, trimmed, after waiting a moment for it to end
    /// (a command that failed has usually exited by the time its session
    /// fails).
    pub(super) fn wait(&self) -> String {
        let _ = self.done.recv_timeout(Duration::from_secs(2));
        let t = self.text.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&t).trim().replace('\n', "; ")
    }
}

/// Move bytes between `local` (our end of the socket pair) and `channel`
/// on the jump host's `session` until either side ends; then close both.
/// The only user of `session`, which runs non-blocking here.
fn pump(session: Session, mut channel: Channel, local: UnixStream, jump_fd: RawFd) {
    session.set_blocking(false);
    if local.set_nonblocking(true).is_err() {
        return;
    }
    let mut buf = vec![0u8; PUMP_BUF];
    let mut p = Pumped::default();
    while let ControlFlow::Continue(up_moved) = p.up(&local, &mut channel, &mut buf) {
        if p.eof_sent {
            break;
        }
        let ControlFlow::Continue(down_moved) = p.down(&local, &mut channel, &mut buf) else {
            break;
        };
        if up_moved || down_moved {
            continue;
        }
        wait_either(
            &session,
            jump_fd,
            &local,
            p.up_at == p.up.len() && !p.local_eof,
            p.down_at < p.down.len(),
        );
        quick_ack(jump_fd);
    }
    // Tell the target's session at once (if it is still there), then close
    // the channel and the jump session, without waiting long on either.
    let _ = local.shutdown(Shutdown::Both);
    drop(local);
    session.set_blocking(true);
    session.set_timeout(1000);
    let _ = channel.close();
    drop(channel);
    let _ = session.disconnect(None, "overlay done", None);
}

/// Where [`pump`] is in each direction. Each step returns whether it moved
/// anything, or `Break` when the pump must stop.
#[derive(Default)]
struct Pumped {
    /// Bytes read from one side and not yet written to the other.
    up: Vec<u8>,
    up_at: usize,
    down: Vec<u8>,
    down_at: usize,
    /// The target's session closed its end: nothing more to carry.
    local_eof: bool,
    eof_sent: bool,
    /// The channel's far end closed: our end's writing side is shut.
    remote_eof: bool,
}

impl Pumped {
    /// Our socket -> channel, and the channel's EOF once our end closed.
    fn up(
        &mut self,
        mut local: &UnixStream,
        channel: &mut Channel,
        buf: &mut [u8],
    ) -> ControlFlow<(), bool> {
        let mut moved = false;
        if self.up_at == self.up.len() && !self.local_eof {
            match local.read(buf) {
                Ok(0) => {
                    self.local_eof = true;
                    moved = true;
                }
                Ok(n) => {
                    self.up.clear();
                    self.up.extend_from_slice(&buf[..n]);
                    self.up_at = 0;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => moved = true,
                Err(_) => return ControlFlow::Break(()),
            }
        }
        if self.up_at < self.up.len() {
            // After a would-block libssh2 wants the same data again: `up`
            // is not touched until it is all written.
            match channel.write(&self.up[self.up_at..]) {
                Ok(n) => {
                    self.up_at += n;
                    moved |= n > 0;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return ControlFlow::Break(()),
            }
        }
        if self.local_eof && self.up_at == self.up.len() && !self.eof_sent {
            match channel.send_eof() {
                Ok(()) => self.eof_sent = true,
                Err(e) if e.code() == ErrorCode::Session(codes::EAGAIN) => {}
                Err(_) => return ControlFlow::Break(()),
            }
        }
        ControlFlow::Continue(moved)
    }

    /// Channel -> our socket, and our socket's writing side shut once the
    /// channel's far end closed.
    fn down(
        &mut self,
        mut local: &UnixStream,
        channel: &mut Channel,
        buf: &mut [u8],
    ) -> ControlFlow<(), bool> {
        let mut moved = false;
        if self.down_at == self.down.len() && !self.remote_eof {
            match channel.read(buf) {
                Ok(0) => {
                    if channel.eof() {
                        self.remote_eof = true;
                        let _ = local.shutdown(Shutdown::Write);
                        moved = true;
                    }
                }
                Ok(n) => {
                    self.down.clear();
                    self.down.extend_from_slice(&buf[..n]);
                    self.down_at = 0;
                    moved = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return ControlFlow::Break(()),
            }
        }
        if self.down_at < self.down.len() {
            match local.write(&self.down[self.down_at..]) {
                Ok(n) => {
                    self.down_at += n;
                    moved |= n > 0;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => moved = true,
                Err(_) => return ControlFlow::Break(()),
            }
        }
        ControlFlow::Continue(moved)
    }
}

/// Sleep until the jump host's socket or ours has something for the pump
/// (or [`PUMP_POLL_MS`] passed).
fn wait_either(
    session: &Session,
    jump_fd: RawFd,
    local: &UnixStream,
    want_in: bool,
    want_out: bool,
) {
    let jump_events = match session.block_directions() {
        BlockDirections::Outbound | BlockDirections::Both => libc::POLLIN | libc::POLLOUT,
        BlockDirections::Inbound | BlockDirections::None => libc::POLLIN,
    };
    let mut local_events = 0;
    if want_in {
        local_events |= libc::POLLIN;
    }
    if want_out {
        local_events |= libc::POLLOUT;
    }
    let mut fds = [
        libc::pollfd {
            fd: jump_fd,
            events: jump_events,
            revents: 0,
        },
        libc::pollfd {
            fd: local.as_raw_fd(),
            events: local_events,
            revents: 0,
        },
    ];
    // SAFETY: two valid pollfds; both fds stay open while the pump runs.
    unsafe {
        libc::poll(fds.as_mut_ptr(), 2, PUMP_POLL_MS);
    }
}
