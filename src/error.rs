//! The one error type of the crate: what failed (a message that names the
//! host, path or manifest line), why (an optional cause), what to do next
//! (a hint), and what kind of failure it is, which decides the exit code.
//!
//! Messages follow the form `Failed to <verb> <object> on <host>`, with the
//! cause after a colon; the CLI prints them as `error: ...` followed by
//! `hint: ...`. Errors travel from agents to the controller whole, kind
//! included, so a target's "venv is locked" exits as a conflict on the
//! controller too.
//!
//! **Kinds.** Every error has an [`ErrorKind`]. A site says its kind with
//! `err!(kind = Drift, ...)`; a site that says none gets its module's
//! kind from [`ErrorKind::of_module`], the one table that maps the parts of
//! the crate to what their failures usually mean (the transport's are
//! connection failures, the manifest's are usage errors, the journal's are
//! file operations on a host, ...). The exit codes are listed in
//! docs/exit-codes.md and here in [`ErrorKind::exit_code`].

use std::fmt;

use serde::{Deserialize, Serialize};

/// Success.
pub const EXIT_OK: u8 = 0;
/// `plan --check` found something to change.
pub const EXIT_CHANGES: u8 = 1;
/// `doctor` found problems (the same number as [`EXIT_CHANGES`]: both say
/// "there is something to act on", never an error).
pub const EXIT_PROBLEMS: u8 = 1;

/// What kind of failure an error is: one per exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// Bad arguments, a bad manifest, an unknown host or set, a plan file
    /// that cannot be read or does not fit. Fix the command or the file.
    Usage,
    /// The `[verify]` check ran and failed.
    VerifyFailed,
    /// A host cannot be reached, logged in to, or its agent started; or the
    /// connection or the agent died mid-operation.
    Connection,
    /// A key is not trusted: a host key is unknown, or differs from the
    /// one in known_hosts; or a bundle's signature is missing, or not by a
    /// key its allowed_signers file trusts, or does not sign it.
    HostKey,
    /// The target or source changed since the plan: plan again.
    Drift,
    /// The venv's state forbids the operation now: locked by another
    /// operation, an unfinished generation, nothing to roll back, a
    /// generation without backup, edits that a rollback would overwrite.
    Conflict,
    /// The operation would break the target, so it was not started: a strict
    /// plan with predicted problems, different Python versions, a damaged
    /// distribution, not enough space.
    Refused,
    /// A file operation failed on a host (permissions, a full disk, I/O).
    #[default]
    Host,
    /// A peer sent something invalid or unexpected: a damaged or hostile
    /// stream or plan, an unknown protocol version.
    Protocol,
    /// A command over several targets (`apply` of a plan of many,
    /// `rollback`/`history`/`verify` of several hosts) did not succeed on
    /// every one: the failed targets are listed, each with its own error.
    TargetsFailed,
    /// A bug in overlay.
    Internal,
    /// Ctrl-C or SIGTERM stopped the operation; the message says where
    /// the target stands (`crate::interrupt`).
    Interrupted,
}

impl ErrorKind {
    /// The process exit code for this kind (docs/exit-codes.md).
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::Usage => 2,
            ErrorKind::VerifyFailed => 3,
            ErrorKind::Connection => 4,
            ErrorKind::HostKey => 5,
            ErrorKind::Drift => 6,
            ErrorKind::Conflict => 7,
            ErrorKind::Refused => 8,
            ErrorKind::Host => 9,
            ErrorKind::Protocol => 10,
            ErrorKind::TargetsFailed => 11,
            ErrorKind::Internal => 70,
            ErrorKind::Interrupted => crate::interrupt::EXIT_INTERRUPTED,
        }
    }

    /// Every kind, in exit-code order (for docs and tests).
    pub const ALL: [ErrorKind; 12] = [
        ErrorKind::Usage,
        ErrorKind::VerifyFailed,
        ErrorKind::Connection,
        ErrorKind::HostKey,
        ErrorKind::Drift,
        ErrorKind::Conflict,
        ErrorKind::Refused,
        ErrorKind::Host,
        ErrorKind::Protocol,
        ErrorKind::TargetsFailed,
        ErrorKind::Internal,
        ErrorKind::Interrupted,
    ];

    /// The kind of an error raised in `module` (a `module_path!()`) that
    /// names none: what failures of that part of the crate usually are.
    pub fn of_module(module: &str) -> ErrorKind {
        let mut parts = module.split("::");
        let _crate = parts.next();
        let top = parts.next().unwrap_or("");
        match top {
            "transport" | "client" => ErrorKind::Connection,
            "manifest" | "commands" | "cli" | "ops" | "fleet" => ErrorKind::Usage,
            "protocol" | "validate" => ErrorKind::Protocol,
            "plan" | "preflight" => ErrorKind::Refused,
            _ => ErrorKind::Host,
        }
    }
}

/// An error with its kind, an optional cause and an optional hint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Error {
    #[serde(default)]
    pub kind: ErrorKind,
    pub message: String,
    /// Why, when the message does not say: a lower-level error in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    pub hint: Option<String>,
    /// Set by a source on the direct route whose `ssh` could not reach the
    /// target (not started, refused, timed out, key or host key refused),
    /// so nothing was sent: ssh's reason. `apply` may take the relay then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreached: Option<String>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of kind [`ErrorKind::Host`]; `err!` picks the kind for you.
    pub fn new(message: impl Into<String>) -> Self {
        Error {
            kind: ErrorKind::default(),
            message: message.into(),
            cause: None,
            hint: None,
            unreached: None,
        }
    }

    /// Set the kind.
    pub fn kind(mut self, kind: ErrorKind) -> Self {
        self.kind = kind;
        self
    }

    /// Attach (or replace) the hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Attach the cause: shown after the message, following a colon.
    pub fn cause(mut self, cause: impl fmt::Display) -> Self {
        self.cause = Some(cause.to_string());
        self
    }

    /// Attach an I/O error as the cause, in words a user understands.
    pub fn because(self, e: &std::io::Error) -> Self {
        self.cause(io_cause(e))
    }

    /// Prefix the message with context, e.g. `on ct200`.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(c) = &self.cause {
            write!(f, ": {c}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// Make an [`Error`]: `err!(kind = Drift, hint = "...", "format {}", args)`;
/// `kind` and `hint` are optional, in that order. Without a kind the
/// error takes its module's ([`ErrorKind::of_module`]).
#[macro_export]
macro_rules! err {
    (kind = $kind:ident, hint = $hint:expr, $($arg:tt)*) => {
        $crate::error::Error::new(format!($($arg)*))
            .kind($crate::error::ErrorKind::$kind)
            .hint($hint)
    };
    (kind = $kind:ident, $($arg:tt)*) => {
        $crate::error::Error::new(format!($($arg)*)).kind($crate::error::ErrorKind::$kind)
    };
    (hint = $hint:expr, $($arg:tt)*) => {
        $crate::error::Error::new(format!($($arg)*))
            .kind($crate::error::ErrorKind::of_module(module_path!()))
            .hint($hint)
    };
    ($($arg:tt)*) => {
        $crate::error::Error::new(format!($($arg)*))
            .kind($crate::error::ErrorKind::of_module(module_path!()))
    };
}

/// Describe an I/O error in words a user understands.
pub fn io_cause(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_exit_code() {
        let mut codes: Vec<u8> = ErrorKind::ALL.iter().map(|k| k.exit_code()).collect();
        codes.extend([EXIT_OK, EXIT_CHANGES]);
        let n = codes.len();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), n, "{codes:?}");
    }

    #[test]
    fn a_site_without_a_kind_takes_its_modules() {
        assert_eq!(
            ErrorKind::of_module("overlay::transport::ssh"),
            ErrorKind::Connection
        );
        assert_eq!(ErrorKind::of_module("overlay::manifest"), ErrorKind::Usage);
        assert_eq!(ErrorKind::of_module("overlay::journal"), ErrorKind::Host);
        assert_eq!(err!("x").kind, ErrorKind::Host); // crate::error
        assert_eq!(err!(kind = Drift, "x").kind, ErrorKind::Drift);
        let e = err!(kind = Conflict, hint = "wait", "locked {}", 1);
        assert_eq!(
            (e.kind, e.hint.as_deref()),
            (ErrorKind::Conflict, Some("wait"))
        );
    }

    #[test]
    fn the_cause_follows_the_message() {
        let e = err!("Failed to read x").cause("permission denied");
        assert_eq!(e.to_string(), "Failed to read x: permission denied");
    }
}
