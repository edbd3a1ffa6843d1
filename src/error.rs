//! The one error type of the library: a message that names the host, path or
//! manifest line, plus a hint that says what to do next.
//!
//! Messages follow the form `Failed to <verb> <object> on <host>: <cause>`;
//! the CLI prints them as `error: ...` followed by `hint: ...`.

use std::fmt;

/// An error with an optional hint for the user.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Error {
    pub message: String,
    pub hint: Option<String>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(message: impl Into<String>) -> Self {
        Error {
            message: message.into(),
            hint: None,
        }
    }

    /// Attach (or replace) the hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Prefix the message with context, e.g. `on ct200`.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// Shorthand: `bail!(hint = "...", "format {}", args)`.
#[macro_export]
macro_rules! err {
    (hint = $hint:expr, $($arg:tt)*) => { $crate::error::Error::new(format!($($arg)*)).hint($hint) };
    ($($arg:tt)*) => { $crate::error::Error::new(format!($($arg)*)) };
}

/// Describe an I/O error in words a user understands.
pub fn io_cause(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}
