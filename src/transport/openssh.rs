//! The direct route (`overlay apply --direct`): a source agent reaches the
//! target with the source host's own OpenSSH client, so the stream crosses
//! the network once, source to target, as `scp` does between two remote
//! hosts. The controller never sees the bytes; it only hands the source the
//! destination and the path of the agent already running on the target.
//!
//! Credentials are the source host's: its `~/.ssh/config`, keys, ssh-agent
//! and `known_hosts`. The client runs with `BatchMode=yes`, so it never
//! prompts, and with the host key checking the source's configuration asks
//! for (OpenSSH's default refuses an unknown or changed key in batch mode).
//! `ssh` is run without a local shell; the one remote command is the agent's
//! path (reported by that agent itself) and the word `agent`, quoted.
//!
//! The destination goes to `ssh` as its own arguments ([`ssh_args`]): an
//! alias of the source's ~/.ssh/config as it is, `user@host:port` as `-l
//! user -p port host` (ssh itself takes no port in a destination), and jump
//! hosts as `-J` (ssh then checks their host keys in the source's
//! known_hosts, and reaches them as the source's ~/.ssh/config says).

use std::process::Command;

use crate::error::Result;

use super::AgentPipe;

/// Where the source's `ssh` goes.
#[derive(Debug, Clone, Copy)]
pub struct Dest<'a> {
    /// `[user@]host[:port]` or an alias of the source's ~/.ssh/config.
    pub ssh: &'a str,
    /// Jump hosts (`-J`): `[user@]host[:port]` or aliases, comma-separated.
    pub proxy_jump: Option<&'a str>,
}

/// The arguments that name `dest` to OpenSSH's `ssh`, ending with `--` and
/// the host: `[-J JUMPS] [-l USER] [-p PORT] -- HOST`.
pub fn ssh_args(dest: &Dest<'_>) -> std::result::Result<Vec<String>, String> {
    let t = super::ssh::parse_target(dest.ssh)
        .map_err(|why| format!("{:?} is not [user@]host[:port]: {why}", dest.ssh))?;
    let mut args = Vec::new();
    if let Some(j) = dest.proxy_jump {
        let hops = crate::model::jump_hops(j).map_err(|why| format!("proxy_jump {j:?} {why}"))?;
        args.push("-J".to_string());
        args.push(hops.join(","));
    }
    if let Some(u) = t.user {
        args.push("-l".into());
        args.push(u);
    }
    if let Some(p) = t.port {
        args.push("-p".into());
        args.push(p.to_string());
    }
    args.push("--".into());
    args.push(t.host);
    Ok(args)
}

/// Start `<agent> agent` on `dest` through the local `ssh` client.
pub fn start_agent(
    host: &str,
    dest: &Dest<'_>,
    agent: &str,
    timeout: std::time::Duration,
) -> Result<AgentPipe> {
    let mut cmd = Command::new("ssh");
    // With AES in hardware, AES-GCM is the fastest cipher OpenSSH offers
    // (0.75 GB/s against chacha20's 0.47 here); the list keeps chacha20
    // and the CTR modes, which every OpenSSH since 6.5 has, as fallbacks.
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("aes") {
        cmd.args([
            "-o",
            "Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr,aes256-ctr",
        ]);
    }
    let dest_args = ssh_args(dest).map_err(|why| {
        crate::err!(
            kind = Usage,
            hint = "set the target's `direct_ssh` in the manifest to a destination the source's ssh knows",
            "Failed to run ssh on the source for {host}: {why}"
        )
    })?;
    cmd.args([
        "-o",
        "BatchMode=yes",
        "-o",
        &format!("ConnectTimeout={}", timeout.as_secs().max(1)),
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=8",
        "-T",
        "-e",
        "none",
    ]);
    cmd.args(&dest_args);
    cmd.arg(format!("{} agent", sh_quote(agent)));
    super::local::spawn(host, cmd)
}

/// Quote for a POSIX shell (the remote side of `ssh` runs one).
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::{Dest, ssh_args};

    #[test]
    fn quotes() {
        assert_eq!(super::sh_quote("/a b/c'd"), "'/a b/c'\\''d'");
    }

    #[test]
    fn destinations_become_ssh_arguments() {
        let args = |ssh, proxy_jump| ssh_args(&Dest { ssh, proxy_jump }).unwrap().join(" ");
        assert_eq!(args("ct200", None), "-- ct200");
        assert_eq!(
            args("root@127.0.0.1:2299", None),
            "-l root -p 2299 -- 127.0.0.1"
        );
        assert_eq!(args("[::1]:2200", None), "-p 2200 -- ::1");
        assert_eq!(
            args("deploy@gpu7", Some("me@bastion:2222,inner")),
            "-J me@bastion:2222,inner -l deploy -- gpu7"
        );
        for bad in ["-oProxyCommand=sh", "a b", "box:x"] {
            assert!(
                ssh_args(&Dest {
                    ssh: bad,
                    proxy_jump: None
                })
                .is_err(),
                "{bad}"
            );
        }
        assert!(
            ssh_args(&Dest {
                ssh: "box",
                proxy_jump: Some("-x")
            })
            .is_err()
        );
    }
}
