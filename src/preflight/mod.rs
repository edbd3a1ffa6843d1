//! Prediction of breakage before apply: what would fail to import on the
//! target after the overlay. Three checks, each in its own module:
//! [`requirements`] (every `Requires-Dist` satisfied, markers and extras
//! evaluated for the target), [`cuda`] (packages that link together agree on
//! the CUDA major) and [`elf`] (every shared object the overlay brings or
//! disturbs can be loaded: DT_NEEDED, version needs, undefined symbols).
//!
//! The checks read facts, they never run the loader or the interpreter.

pub mod cuda;
pub mod elf;
pub mod requirements;

use serde::{Deserialize, Serialize};

/// Which check found a problem.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Check {
    Requirements,
    Cuda,
    Elf,
}

/// One predicted failure.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    pub check: Check,
    /// The distribution affected, if known.
    pub dist: Option<String>,
    /// The file affected (relative to site-packages), if any.
    pub file: Option<String>,
    pub reason: String,
}
