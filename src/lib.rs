//! overlay: repair or upgrade a Python virtualenv on one host by overlaying
//! package sets from a working venv on another host, over SSH.
//!
//! The library holds everything; `main.rs` is a thin CLI over it.

pub mod agent;
pub mod beneath;
pub mod client;
pub mod error;
pub mod hashcache;
pub mod inventory;
pub mod journal;
pub mod manifest;
pub mod model;
pub mod plan;
pub mod preflight;
pub mod protocol;
pub mod report;
pub mod stream;
pub mod text;
pub mod transport;
pub mod validate;
pub mod verify;
