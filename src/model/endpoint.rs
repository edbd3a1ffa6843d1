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
    #[test]
    fn user_names() {
        for ok in ["root", "ops", "svc-gpu.1", "_x", "a_b"] {
            assert!(super::valid_user_name(ok), "{ok}");
        }
        for bad in ["", "-u", "a b", "a;b", "$(x)", "o'b", "é", &"x".repeat(33)] {
            assert!(!super::valid_user_name(bad), "{bad}");
        }
    }
}
