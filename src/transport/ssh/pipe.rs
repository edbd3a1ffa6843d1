//! The running agent: `'<path>' agent` on an exec channel (through
//! `sudo -n` when the manifest says `sudo`), given to the caller as an
//! [`AgentPipe`]. A sudo that refuses to run it without a password, or is
//! not installed, is reported with the sudoers line it needs
//! ([`sudo_refusal`]). Its reader and writer share one libssh2
//! session behind a lock ([`Conn`]) that neither holds while it waits for
//! the network ([`with_conn`]), so one thread may block in `read` while
//! another writes. A write that finds no room asks whether the agent is
//! [`gone`]; the pipe's [`Watch`] asks the same from another thread, or
//! cuts the connection; [`finish`] collects the agent's stderr and exit.

use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ssh2::{BlockDirections, Channel, ErrorCode, Session};

use super::connect::{Connected, quick_ack};
use super::libssh2_sys_codes as codes;
use super::{AGENT_DIR, AgentPipe, AgentRun, EXIT_UNSAFE, Watch, Who, agent_command, signal_name};
use crate::err;
use crate::error::Result;

/// Receive window of the agent channel and the largest packet we accept.
const CHANNEL_WINDOW: u32 = 16 * 1024 * 1024;
const CHANNEL_PACKET: u32 = 32768;
/// Once the agent runs, a libssh2 call holds the session at most this long
/// before it lets the other side of the pipe in; the caller never sees these
/// slices, only data, EOF or a real error.
const READ_SLICE_MS: u32 = 2;
const WRITE_SLICE_MS: u32 = 20;
/// How long a waiting reader or writer sleeps on the socket between attempts.
const IDLE_POLL_MS: i32 = 50;

/// The session and the agent's channel; every libssh2 call goes through this lock.
struct Conn {
    session: Session,
    channel: Channel,
    fd: RawFd,
    eof_sent: bool,
    /// The connection was cut ([`Watch::cut`]): every call fails.
    cut: bool,
}

type Shared = Arc<Mutex<Conn>>;

pub(super) fn exec_agent(who: Who<'_>, conn: Connected, run: &AgentRun<'_>) -> Result<AgentPipe> {
    let command = agent_command(who, run)?;
    let remote = run.path.as_str();
    let sudo = run.sudo.map(|user| SudoRun {
        user: user.to_string(),
        login: run.login.to_string(),
        dir: match remote.rsplit_once('/') {
            Some((dir, _)) if remote.starts_with('/') => dir.to_string(),
            _ => format!("/home/{}/{AGENT_DIR}", run.login),
        },
    });
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
    let watch = Watch::new(
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
            let result = finish(&fin, &host, &remote, sudo.as_ref());
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
        return Some(format!("was killed by signal {}", signal_name(&sig)));
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
        Err(e) if e.code() == ErrorCode::Session(codes::EAGAIN) => None,
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
            Err(e) if e.code() == ErrorCode::Session(codes::EAGAIN) => {
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    break Err(ssh2::Error::new(
                        ErrorCode::Session(codes::TIMEOUT),
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

/// Close the agent's input, wait for it to exit, and tell how it ended.
fn finish(shared: &Shared, who: &str, remote: &str, sudo: Option<&SudoRun>) -> Result<String> {
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
    let end = {
        let c = shared.lock().unwrap_or_else(|p| p.into_inner());
        let status = c.channel.exit_status().unwrap_or(-1);
        let signal = c.channel.exit_signal().ok().and_then(|s| s.exit_signal);
        c.session.set_timeout(1000);
        let _ = c.session.disconnect(None, "overlay done", None);
        AgentEnd {
            status,
            signal,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        }
    };
    if let Some(e) = sudo.and_then(|s| sudo_refusal(who, s, &end)) {
        return Err(e);
    }
    agent_outcome(who, remote, end)
}

/// The agent was started through `sudo -n -u USER`.
struct SudoRun {
    user: String,
    /// The login user, who runs sudo.
    login: String,
    /// The agent's folder on the host (absolute).
    dir: String,
}

/// The error for an agent that sudo did not start: sudo wanted a password
/// (`-n` makes it say so and exit 1 instead of asking), the login user may
/// not run it, or there is no sudo; `None` when sudo is not what failed.
fn sudo_refusal(who: &str, s: &SudoRun, end: &AgentEnd) -> Option<crate::error::Error> {
    let said = end.stderr.trim();
    let sudo_said = said
        .lines()
        .any(|l| l.starts_with("sudo:") || l.starts_with("Sorry, user "));
    let sudoers = format!("{} ALL=({}) NOPASSWD: {}/overlay-*", s.login, s.user, s.dir);
    let line = said.lines().find(|l| l.contains("sudo")).unwrap_or(said);
    if end.status == 1
        && sudo_said
        && (said.contains("password is required")
            || said.contains("a terminal is required")
            || said.contains("not allowed to execute")
            || said.contains("not in the sudoers file")
            || said.contains("may not run sudo"))
    {
        let why = if said.contains("password") || said.contains("terminal") {
            "sudo needs a password"
        } else {
            "sudo does not allow it"
        };
        return Some(err!(
            kind = Connection,
            hint = format!(
                "add to sudoers on that host (visudo -f /etc/sudoers.d/overlay): {sudoers}   (or remove `sudo` from this host in the manifest to run as {})",
                s.login
            ),
            "Failed to start the agent on {who} as {} through sudo: {why} for user {} ({line})",
            s.user,
            s.login
        ));
    }
    if end.status == 127 && said.contains("sudo") && said.contains("not found") {
        return Some(err!(
            kind = Connection,
            hint = format!(
                "install sudo on that host and add to sudoers: {sudoers}; or remove `sudo` from this host in the manifest"
            ),
            "Failed to start the agent on {who} through sudo: sudo is not installed there ({line})"
        ));
    }
    None
}

/// How the agent ended.
struct AgentEnd {
    /// Its exit status (-1 when sshd sent none).
    status: i32,
    /// The signal that killed it, as SSH names it (`KILL`).
    signal: Option<String>,
    /// What it wrote on stderr (at most 1 MiB).
    stderr: String,
}

/// The agent's stderr when it exited 0; else an error that says why it ended.
fn agent_outcome(who: &str, remote: &str, end: AgentEnd) -> Result<String> {
    let AgentEnd {
        status,
        signal,
        stderr: text,
    } = end;
    let detail = text.trim();
    if let Some(sig) = signal {
        return Err(err!(
            hint = "check the host's logs (out of memory?) and run again",
            "The agent on {who} was killed by signal {}{}{detail}",
            signal_name(&sig),
            if detail.is_empty() { "" } else { ": " }
        ));
    }
    if status == EXIT_UNSAFE {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(status: i32, stderr: &str) -> AgentEnd {
        AgentEnd {
            status,
            signal: None,
            stderr: stderr.into(),
        }
    }

    #[test]
    fn sudo_refusals_name_the_sudoers_line() {
        let s = SudoRun {
            user: "root".into(),
            login: "ops".into(),
            dir: "/home/ops/.cache/overlay".into(),
        };
        let line = "ops ALL=(root) NOPASSWD: /home/ops/.cache/overlay/overlay-*";
        let e = sudo_refusal("ct200", &s, &ended(1, "sudo: a password is required\n")).unwrap();
        assert!(
            e.message
                .contains("ct200 as root through sudo: sudo needs a password for user ops"),
            "{}",
            e.message
        );
        assert!(e.hint.as_deref().unwrap().contains(line), "{e:?}");
        let e = sudo_refusal(
            "ct200",
            &s,
            &ended(
                1,
                "Sorry, user ops is not allowed to execute '/x agent' as root on ct200.\n",
            ),
        )
        .unwrap();
        assert!(
            e.message.contains("sudo does not allow it"),
            "{}",
            e.message
        );
        let e = sudo_refusal("ct200", &s, &ended(127, "sh: 1: sudo: not found\n")).unwrap();
        assert!(e.message.contains("sudo is not installed"), "{}", e.message);
        assert!(e.hint.as_deref().unwrap().contains(line), "{e:?}");
        // The agent's own failures are not sudo's.
        assert!(sudo_refusal("ct200", &s, &ended(1, "overlay agent: bad input\n")).is_none());
        assert!(sudo_refusal("ct200", &s, &ended(0, "")).is_none());
    }
}
