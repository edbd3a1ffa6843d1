//! Where a host lives, as the manifest says: this machine or an SSH
//! destination (reached directly or through jump hosts).

/// Where a host lives, as written in the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// This machine: the agent runs as a child process.
    Local,
    /// `ssh = "..."` (and `proxy_jump`, if any).
    Ssh(SshDest),
}

/// An SSH destination as the manifest gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshDest {
    /// `ssh = "..."`: an alias from ~/.ssh/config or `[user@]host[:port]`.
    pub target: String,
    /// `proxy_jump = "..."`: the jump hosts, in ssh's `-J` syntax
    /// (`[user@]host[:port]` or aliases, comma-separated, first hop first).
    /// Overrides a `ProxyJump`/`ProxyCommand` of ~/.ssh/config for the target.
    pub proxy_jump: Option<String>,
}

impl SshDest {
    /// A destination reached as ~/.ssh/config says (no manifest jump).
    pub fn new(target: impl Into<String>) -> SshDest {
        SshDest {
            target: target.into(),
            proxy_jump: None,
        }
    }
}

/// The hops of a `proxy_jump` value (ssh's `-J` syntax), first hop first:
/// comma-separated `[user@]host[:port]` or ~/.ssh/config aliases. Refuses
/// an empty hop, white space, and a hop that starts with `-` (it would read
/// as an option to an `ssh` client); the transport parses each hop further.
pub fn jump_hops(spec: &str) -> Result<Vec<String>, String> {
    if spec.trim().is_empty() {
        return Err("is empty: give one or more hosts, as `user@jump:port,other`".into());
    }
    let mut hops = Vec::new();
    for hop in spec.split(',') {
        if hop.is_empty() {
            return Err("has an empty hop: separate hosts with one comma".into());
        }
        if hop.starts_with('-') || hop.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "has a bad hop {hop:?}: each hop is [user@]host[:port] or an alias from ~/.ssh/config"
            ));
        }
        hops.push(hop.to_string());
    }
    Ok(hops)
}

/// Whether `name` may be the user of a host's `sudo` (the manifest's
/// `sudo = "user"`, or a plan's record of it): a POSIX portable user name
/// (letters, digits, `.`, `_`, `-`, not starting with `-`, at most 32
/// characters). It goes into a remote command line, so nothing else is
/// ever accepted.
pub fn valid_user_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_jump_lists() {
        assert_eq!(jump_hops("bastion").unwrap(), ["bastion"]);
        assert_eq!(
            jump_hops("u@j1:2222,j2").unwrap(),
            ["u@j1:2222".to_string(), "j2".into()]
        );
        for bad in ["", " ", "a,,b", "a,", "-oProxyCommand=x", "a b", "a,\tb"] {
            assert!(jump_hops(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn user_names() {
        for ok in ["root", "ops", "svc-gpu.1", "_x", "a_b"] {
            assert!(valid_user_name(ok), "{ok}");
        }
        for bad in ["", "-u", "a b", "a;b", "$(x)", "o'b", "é", &"x".repeat(33)] {
            assert!(!valid_user_name(bad), "{bad}");
        }
    }
}
