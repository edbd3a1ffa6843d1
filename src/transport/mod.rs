//! Transports: how the controller reaches a host and starts `overlay agent`
//! there. `local` runs the agent as a child process on this machine; `ssh`
//! opens an exec channel through libssh2 (the `ssh2` crate), uploading the
//! agent binary first when the host lacks this exact build.
//!
//! Each running agent comes with a [`Watch`], through which another thread
//! can tell that it died, or cut it off, without touching its output.
//!
//! A transport only moves bytes. It never builds a shell command from a file
//! name or a manifest value: everything the agent does is asked for through
//! the framed protocol in [`crate::protocol`].

pub mod local;
pub mod openssh;
pub mod ssh;

use std::io::{Read, Write};
use std::sync::Arc;

use crate::error::Result;
use crate::model::Endpoint;

/// What each end of an agent pipe asks for its pipe buffers (the agent for
/// its stdin and stdout, the local transport for the child's): a stream
/// moves in 1 MiB frames (`/proc/sys/fs/pipe-max-size`, 1 MiB by default,
/// is the unprivileged limit).
pub const PIPE_SIZE: usize = 1 << 20;

/// Exit status of an agent that refuses to run from an unsafe place
/// (`EX_CONFIG` of sysexits.h; `agent::selfcheck` exits with it): the ssh
/// transport then reports its message and hint instead of a bare status.
pub const EXIT_UNSAFE: i32 = 78;

/// Options that apply to every connection.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Bound on TCP connect and the SSH handshake.
    pub timeout: std::time::Duration,
    /// Trust (and record) a host key seen for the first time. Never trusts a changed key.
    pub accept_new_host_key: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            timeout: std::time::Duration::from_secs(10),
            accept_new_host_key: false,
        }
    }
}

/// A running agent: a byte pipe to its stdin/stdout and a way to finish.
pub struct AgentPipe {
    pub reader: Box<dyn Read + Send>,
    pub writer: Box<dyn Write + Send>,
    /// Called after the client said goodbye; waits for the agent to exit and
    /// returns anything it wrote on stderr.
    pub finish: Box<dyn FnOnce() -> Result<String> + Send>,
    /// Looks after the agent from another thread (see [`Watch`]).
    pub watch: Watch,
}

/// A handle on a running agent that another thread may hold: it tells,
/// without reading anything the agent sent or waiting, whether the agent is
/// known to be gone, and it can cut the connection so that whatever waits on
/// the agent (a read, a write, `finish`) returns at once with an error.
///
/// The controller keeps one on each host while a stream runs, so that a
/// wait on one host never outlives the agent at the other end
/// (docs/design.md, "A dead peer is noticed").
#[derive(Clone)]
pub struct Watch {
    gone: Arc<dyn Fn() -> Option<String> + Send + Sync>,
    cut: Arc<dyn Fn() + Send + Sync>,
}

impl Watch {
    pub fn new(
        gone: impl Fn() -> Option<String> + Send + Sync + 'static,
        cut: impl Fn() + Send + Sync + 'static,
    ) -> Watch {
        Watch {
            gone: Arc::new(gone),
            cut: Arc::new(cut),
        }
    }

    /// What ended the agent or its connection ("was killed by signal 9
    /// (KILL)", "closed the connection", ...), once that is known; `None`
    /// while it may still be running.
    pub fn gone(&self) -> Option<String> {
        (self.gone)()
    }

    /// Drop the connection to the agent without waiting for anything: the
    /// agent sees its input end (and, over SSH, its session close); a local
    /// agent is killed.
    pub fn cut(&self) {
        (self.cut)()
    }
}

/// Signals by the name SSH reports (without `SIG`) and number (Linux).
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", 1),
    ("INT", 2),
    ("QUIT", 3),
    ("ILL", 4),
    ("TRAP", 5),
    ("ABRT", 6),
    ("BUS", 7),
    ("FPE", 8),
    ("KILL", 9),
    ("USR1", 10),
    ("SEGV", 11),
    ("USR2", 12),
    ("PIPE", 13),
    ("ALRM", 14),
    ("TERM", 15),
    ("XCPU", 24),
    ("XFSZ", 25),
];

/// How a signal that ended an agent is named in messages: `9 (KILL)`,
/// from the name SSH reports.
pub fn signal_name(name: &str) -> String {
    match SIGNALS.iter().find(|(n, _)| *n == name) {
        Some((n, num)) => format!("{num} ({n})"),
        None => name.to_string(),
    }
}

/// The same from a signal number (the local transport).
pub fn signal_number(num: i32) -> String {
    match SIGNALS.iter().find(|(_, n)| *n == num) {
        Some((name, _)) => format!("{num} ({name})"),
        None => num.to_string(),
    }
}
/// Start an agent on `host` (the manifest's host name, used in messages),
/// as the user `sudo` through `sudo -n` when given (docs/sudo.md).
pub fn start_agent(
    host: &str,
    endpoint: &Endpoint,
    sudo: Option<&str>,
    opts: &ConnectOptions,
) -> Result<AgentPipe> {
    match endpoint {
        Endpoint::Local => local::start_agent(host, sudo),
        Endpoint::Ssh(target) => ssh::start_agent(host, target, sudo, opts),
    }
}

/// The bytes of the agent executable to upload: this very binary, which is
/// built static (musl) so that it runs on older distributions too.
/// `OVERLAY_AGENT_BINARY` overrides it (for a controller built against glibc).
pub fn agent_binary_path() -> Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("OVERLAY_AGENT_BINARY") {
        return Ok(p.into());
    }
    std::env::current_exe().map_err(|e| {
        crate::err!(
            hint = "set OVERLAY_AGENT_BINARY to the path of a static overlay binary",
            "Failed to locate the running overlay binary: {e}"
        )
    })
}
