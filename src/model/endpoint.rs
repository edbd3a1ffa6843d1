//! Where a host lives, as the manifest says: this machine or an SSH
//! destination.

/// Where a host lives, as written in the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// This machine: the agent runs as a child process.
    Local,
    /// `ssh = "..."`: an alias from ~/.ssh/config or `[user@]host[:port]`.
    Ssh(String),
}
