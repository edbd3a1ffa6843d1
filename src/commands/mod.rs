//! The commands: each parses its arguments into an operation's options,
//! calls that one operation (`overlay::ops`), prints its report (text, or
//! `--json`) and returns the exit code. One module per command; commands
//! never import each other (what they share is in `crate::cli` and
//! `crate::progress`).

pub mod apply;
pub mod completions;
pub mod doctor;
pub mod history;
pub mod man;
pub mod pack;
pub mod plan;
pub mod prune;
pub mod rollback;
pub mod sign;
pub mod verify;
