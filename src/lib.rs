//! overlay: repair or upgrade a Python virtualenv on one host by overlaying
//! package sets from a working venv on another host, over SSH.
//!
//! The library holds everything; `main.rs` is a thin CLI over it. The
//! modules sit in layers, lowest first; a module uses only its own layer
//! and those below (`tests/layers.rs` checks it, docs/design.md#layout
//! explains it):
//!
//! | layer | module | owns |
//! | ----- | ------ | ---- |
//! | foundation | [`error`] | the error type: kind (one per exit code), message, cause, hint |
//! | | [`text`] | terminal-safe quoting and escaping, hex, timestamps |
//! | | [`beneath`] | fd-relative, no-follow file operations inside one directory |
//! | | [`interrupt`] | Ctrl-C and SIGTERM on the controller: a flag an apply reads to stop cleanly |
//! | model | [`model`] | the data that travels or is stored (entries, dists, sets, generations, reports) |
//! | pure logic | [`protocol`] | requests, responses and their bounded framing |
//! | | [`manifest`] | `overlay.toml`: hosts, sets, preflight and verify settings |
//! | | [`plan`] | the set semantics: what to add, replace and delete |
//! | | [`report`] | the plan as text for people |
//! | | [`validate`] | the target's own check of a prepare request |
//! | host side | [`bundle`] | the bundle file of `overlay pack`: write, check, unpack |
//! | | [`hashcache`] | BLAKE3 digests remembered by file stamp |
//! | | [`inventory`] | finding the venv, scanning dists, stat and hash of paths, the host's NVIDIA driver and GPUs |
//! | | [`journal`] | generations: prepare, switch, commit, undo, history, prune |
//! | | [`stream`] | the file stream: the source's send half, the target's receive half |
//! | | [`verify`] | the smoke test run with the venv's interpreter |
//! | | [`preflight`] | breakage predicted from requirements, CUDA majors, ELF facts and the GPU code against the driver and GPUs |
//! | | [`doctor`] | a venv checked as it stands: RECORD, damage, bytecode, shebangs, preflight |
//! | | [`running`] | the processes that run from a venv, found in `/proc` by device and inode |
//! | transport | [`transport`] | starting an agent: local child, SSH (libssh2), OpenSSH |
//! | client | [`client`] | a typed client of one agent |
//! | agent, operations | [`agent`] | the agent: serve loop and one handler per request |
//! | | [`ops`] | the controller's operations on one target: plan, apply, rollback, history, prune, verify, doctor, pack |
//! | fleet | [`fleet`] | many targets at once: plans of many, rollouts (canary, max-fail), the fan-out of one read of the source, plans from a bundle |
//!
//! The binary adds `cli` (arguments), `progress` (bars and status on
//! stderr) and `commands` (one thin file per command family).

pub mod agent;
pub mod beneath;
pub mod bundle;
pub mod client;
pub mod doctor;
pub mod error;
pub mod fleet;
pub mod hashcache;
pub mod interrupt;
pub mod inventory;
pub mod journal;
pub mod manifest;
pub mod model;
pub mod ops;
pub mod plan;
pub mod preflight;
pub mod protocol;
pub mod report;
pub mod running;
pub mod stream;
pub mod text;
pub mod transport;
pub mod validate;
pub mod verify;
