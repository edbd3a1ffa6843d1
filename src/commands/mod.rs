//! One module per command, each with `run(global, args) -> Result<exit code>`.

pub mod apply;
pub mod plan;
pub mod rollback;
pub mod verify;
