//! The ssh transport: libssh2 (the `ssh2` crate) connects to the host named by
//! the manifest's `ssh = "..."` value, checks its host key against
//! known_hosts, authenticates with ssh-agent or identity files, uploads this
//! exact agent build over SFTP when the host lacks it, and runs it on an exec
//! channel.
//!
//! The only command ever sent to the remote shell is
//! `'<home>/.cache/overlay/overlay-<hash>' agent`, built from the server's home
//! directory and a hex digest; no manifest value or file name goes into it.
//! With the manifest's `sudo` ([`agent_command`]) it is
//! `sudo -n -u '<user>' -- '<home>/.cache/overlay/overlay-<hash>' agent`,
//! where the user name was checked to be a POSIX user name
//! ([`crate::model::valid_user_name`]) here, whatever the manifest or plan
//! said. A sudo that wants a password, or none installed, is reported with
//! the sudoers line that would let it run (docs/sudo.md).
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
//!
//! The steps, one file each, in the order a start runs them:
//!
//! - `mod.rs` (this file): the public API ([`start_agent`],
//!   [`start_cached_agent`]), how messages name a host (`Who`) and small
//!   shared helpers;
//! - `config.rs`: the target (`[user@]host[:port]` or an alias) resolved
//!   through ~/.ssh/config ([`resolve`]), and the local environment read;
//! - `connect.rs`: TCP connect, socket options, the SSH handshake and
//!   algorithm preferences, then host key check and authentication;
//! - `jump.rs`: the stream to the host's SSH port through jump hosts
//!   (`ProxyJump`, the manifest's `proxy_jump`) or a `ProxyCommand`;
//! - `known_hosts.rs`: known_hosts files, host patterns, the host key
//!   check and recording a new key, fingerprints;
//! - `auth.rs`: public-key authentication through ssh-agent and key files;
//! - `upload.rs`: the agent's digest and its upload over SFTP, with the
//!   `StrictModes` check of its folder;
//! - `pipe.rs`: the running agent's channel as an [`AgentPipe`] (reader,
//!   writer, watch, finish);
//! - `real_sshd.rs`: the end-to-end test against a real sshd.

mod auth;
mod config;
mod connect;
mod jump;
mod known_hosts;
mod pipe;
#[cfg(test)]
mod real_sshd;
mod upload;

use std::fmt;
use std::time::Duration;

use ssh2::ErrorCode;

use super::{AgentPipe, ConnectOptions, EXIT_UNSAFE, Watch, agent_binary_path, signal_name};
use crate::error::{Error, Result};
use crate::model::SshDest;

pub(crate) use config::LocalEnv;
pub use config::{AgentSocket, LocalUser, Proxy, Resolved, Target, parse_target, resolve};
pub use known_hosts::sha256_fingerprint;

use config::resolve_target;
use connect::connect;
use pipe::exec_agent;
use upload::{agent_digest, agent_name, upload_agent};

/// Where agents are kept, relative to the home directory.
pub const AGENT_DIR: &str = ".cache/overlay";

/// Connect to `dest` (an alias from ~/.ssh/config or `[user@]host[:port]`,
/// through its jump hosts if any), make sure this agent build is on the
/// host, and start `overlay agent` there. `host` is the manifest's host
/// name, used in every message. `sudo`: run it as that user through
/// `sudo -n` (the manifest's `sudo`).
pub fn start_agent(
    host: &str,
    dest: &SshDest,
    sudo: Option<&str>,
    opts: &ConnectOptions,
) -> Result<AgentPipe> {
    let env = LocalEnv::from_process().map_err(|e| e.context(format_args!("on {host}")))?;
    start_agent_via(host, dest, sudo, opts, &env)
}

/// Connect to `dest` and start the agent this build would have uploaded
/// (`~/.cache/overlay/overlay-<digest>` there) without checking that it is
/// there: no SFTP session, which costs ~50 ms per host. When the agent then
/// does not answer, the caller falls back to [`start_agent`]. Connection
/// and host-key errors are returned as they are.
pub fn start_cached_agent(
    host: &str,
    dest: &SshDest,
    sudo: Option<&str>,
    opts: &ConnectOptions,
) -> Result<AgentPipe> {
    let env = LocalEnv::from_process().map_err(|e| e.context(format_args!("on {host}")))?;
    let who = Who {
        host,
        target: &dest.target,
    };
    let r = resolve_target(who, dest.proxy_jump.as_deref(), &env)?;
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
    let run = AgentRun {
        path: format!("{AGENT_DIR}/{}", agent_name(&digest)),
        sudo,
        login: &r.user,
    };
    exec_agent(who, conn, &run)
}

/// [`start_agent`] with the local environment given (tests build their own).
#[cfg(test)]
pub(crate) fn start_agent_with(
    host: &str,
    target: &str,
    opts: &ConnectOptions,
    env: &LocalEnv,
) -> Result<AgentPipe> {
    start_agent_via(host, &SshDest::new(target), None, opts, env)
}

/// [`start_agent`] with the local environment given.
pub(crate) fn start_agent_via(
    host: &str,
    dest: &SshDest,
    sudo: Option<&str>,
    opts: &ConnectOptions,
    env: &LocalEnv,
) -> Result<AgentPipe> {
    let who = Who {
        host,
        target: &dest.target,
    };
    let r = resolve_target(who, dest.proxy_jump.as_deref(), env)?;
    let conn = connect(who, &r, opts, env)?;
    let path = upload_agent(who, &conn, opts, env)?;
    let run = AgentRun {
        path,
        sudo,
        login: &r.user,
    };
    exec_agent(who, conn, &run)
}

/// How the agent is run on the host.
struct AgentRun<'a> {
    /// Its file: absolute, or relative to the login directory.
    path: String,
    /// The user to run it as through `sudo -n`, if any.
    sudo: Option<&'a str>,
    /// The login user (for the sudoers line in messages).
    login: &'a str,
}

/// The one command sent to the remote shell to start the agent of `run`:
/// `'<path>' agent`, or through sudo
/// `sudo -n -u '<user>' -- '<absolute path>' agent` (a relative path is
/// made absolute with the login shell's `$HOME`, as sudoers rules name
/// absolute paths). A user name that is not a POSIX user name is refused
/// here, whatever the manifest or plan said.
fn agent_command(who: Who<'_>, run: &AgentRun<'_>) -> Result<String> {
    let Some(user) = run.sudo else {
        return Ok(format!("{} agent", sh_quote(&run.path)));
    };
    if !crate::model::valid_user_name(user) {
        return Err(crate::err!(
            kind = Usage,
            hint = "set `sudo = true` or `sudo = \"USER\"` with a plain user name in the host's [hosts] table, then plan again",
            "Refusing to run the agent on {who} through sudo as {user:?}: not a user name"
        ));
    }
    let path = if run.path.starts_with('/') {
        sh_quote(&run.path)
    } else {
        format!("\"$HOME\"/{}", sh_quote(&run.path))
    };
    Ok(format!("sudo -n -u {} -- {path} agent", sh_quote(user)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(sh_quote("/home/o'brien/x"), r"'/home/o'\''brien/x'");
        let weird = "/tmp/a b'c\"$(x)`y`\\n";
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf %s {}", sh_quote(weird)))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), weird);
        assert_eq!(fmt_secs(Duration::from_secs(10)), "10 s");
        assert_eq!(fmt_secs(Duration::from_millis(1500)), "1.5 s");
    }

    #[test]
    fn agent_commands() {
        let who = Who {
            host: "h",
            target: "h",
        };
        let run = |path: &str, sudo: Option<&'static str>| {
            agent_command(
                who,
                &AgentRun {
                    path: path.into(),
                    sudo,
                    login: "ops",
                },
            )
        };
        assert_eq!(run("/h/a", None).unwrap(), "'/h/a' agent");
        assert_eq!(
            run("/home/ops/.cache/overlay/overlay-ab", Some("root")).unwrap(),
            "sudo -n -u 'root' -- '/home/ops/.cache/overlay/overlay-ab' agent"
        );
        assert_eq!(
            run(".cache/overlay/overlay-ab", Some("svc")).unwrap(),
            "sudo -n -u 'svc' -- \"$HOME\"/'.cache/overlay/overlay-ab' agent"
        );
        let e = run("/a", Some("x'; rm -rf /")).unwrap_err();
        assert!(e.message.contains("not a user name"), "{}", e.message);
    }
}
