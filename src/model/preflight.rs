//! Predicted breakage: a [`Problem`] found by a [`Check`], and the target's
//! part of the loader check ([`PreflightRequest`], [`PreflightReport`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::ElfInfo;

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
    /// The target has this problem already, before the overlay.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preexisting: bool,
}

/// What the target agent needs to predict loader failures after the overlay.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreflightRequest {
    pub venv: String,
    /// Paths (relative to site-packages) the overlay adds or replaces, with
    /// their ELF facts from the source (`None`: not an ELF object).
    pub placed: Vec<(String, Option<ElfInfo>)>,
    /// Paths the overlay deletes.
    pub deleted: Vec<String>,
    /// Absolute directories, from the manifest's `[verify] env.LD_LIBRARY_PATH`.
    pub ld_library_path: Vec<String>,
    /// Top-level package directories of distributions that import torch:
    /// for objects below them, what torch preloads counts as loaded.
    pub torch_users: Vec<String>,
    /// Check every shared object of the venv as it stands, not only those
    /// the overlay brings or disturbs (`overlay doctor`; `placed` and
    /// `deleted` are then empty).
    #[serde(default)]
    pub whole: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PreflightReport {
    /// (object relative to site-packages, reason).
    pub problems: Vec<(String, String)>,
    /// CUDA runtime majors each shared object needs after the overlay.
    pub cudart: BTreeMap<String, BTreeSet<u32>>,
    /// Shared objects checked.
    pub checked: u64,
}
