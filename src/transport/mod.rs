//! Transports: how the controller reaches a host and starts `overlay agent`
//! there. `local` runs the agent as a child process on this machine; `ssh`
//! opens an exec channel through libssh2 (the `ssh2` crate), uploading the
//! agent binary first when the host lacks this exact build.
//!
//! A transport only moves bytes. It never builds a shell command from a file
//! name or a manifest value: everything the agent does is asked for through
//! the framed protocol in [`crate::agent::protocol`].

pub mod local;
pub mod openssh;
pub mod ssh;

use std::io::{Read, Write};

use crate::error::Result;

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
}

/// Where a host lives, as written in the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// This machine: the agent runs as a child process.
    Local,
    /// `ssh = "..."`: an alias from ~/.ssh/config or `[user@]host[:port]`.
    Ssh(String),
}

/// Start an agent on `host` (the manifest's host name, used in messages).
pub fn start_agent(host: &str, endpoint: &Endpoint, opts: &ConnectOptions) -> Result<AgentPipe> {
    match endpoint {
        Endpoint::Local => local::start_agent(host),
        Endpoint::Ssh(target) => ssh::start_agent(host, target, opts),
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
