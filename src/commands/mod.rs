//! The commands: each takes the parsed arguments, calls the library and
//! prints. Each module serves one command family and returns an exit code:
//! `plan::run`, `apply::run`, `verify::run`, and `rollback::{rollback,
//! history, prune}` (the generation commands).

pub mod apply;
pub mod plan;
pub mod rollback;
pub mod verify;
