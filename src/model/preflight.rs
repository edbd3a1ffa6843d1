//! Predicted breakage: a [`Problem`] found by a [`Check`], and the target's
//! part of the loader check ([`PreflightRequest`], [`PreflightReport`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::ElfInfo;

/// Which check found a problem.
#[derive(
    Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "lowercase")]
pub enum Check {
    #[default]
    Requirements,
    Cuda,
    Elf,
    /// The target's NVIDIA driver and GPUs against the CUDA code.
    Gpu,
}

/// One predicted failure.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
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
    /// In an optional plugin: a shared object that no extension module
    /// reaches through `DT_NEEDED` (something may `dlopen` it later, or
    /// never); `plan` lists these only with `-v`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// What problems of the same cause share, for grouping them in the
    /// output: the missing soname (`needs libX.so.1`), the undefined symbol,
    /// the unmet requirement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
}

impl Problem {
    /// New (not pre-existing) and not in an optional plugin: what `--strict`
    /// and the summary's count are about.
    pub fn is_new(&self) -> bool {
        !self.preexisting && !self.optional
    }
}

/// What the target agent needs to predict loader failures after the overlay.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreflightRequest {
    pub venv: String,
    /// Shared objects (relative to site-packages; named like one, or ELF by
    /// content) the overlay adds or replaces, with their ELF facts from the
    /// source (`None`: not an ELF object). Other files do not concern the
    /// loader: the controller leaves them out and the target skips them.
    pub placed: Vec<(String, Option<ElfInfo>)>,
    /// Shared objects the overlay deletes (other paths are skipped).
    pub deleted: Vec<String>,
    /// Absolute directories, from the manifest's `[verify] env.LD_LIBRARY_PATH`.
    pub ld_library_path: Vec<String>,
    /// Top-level package directories of distributions that import torch:
    /// for objects below them, what torch preloads counts as loaded. Read
    /// only when `imported_first` is empty (a controller that predates it).
    pub torch_users: Vec<String>,
    /// Top-level package directory -> the top-level directories of the
    /// distributions its distribution requires (directly or not) and of its
    /// own: importing it has imported those first, so their `_C` extension
    /// modules (and `lib/lib<top>_global_deps.so`, loaded `RTLD_GLOBAL`, as
    /// torch does) are already loaded when its own extensions load.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub imported_first: BTreeMap<String, Vec<String>>,
    /// Check every shared object of the venv as it stands, not only those
    /// the overlay brings or disturbs (`overlay doctor`; `placed` and
    /// `deleted` are then empty).
    #[serde(default)]
    pub whole: bool,
    /// The target's NVIDIA driver and GPUs (from its scan): every object
    /// with GPU code after the overlay is checked against them. `None`:
    /// no GPU check (a controller that predates it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<super::Machine>,
}

/// One ELF problem the target predicts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct ElfFinding {
    /// The root that fails to load (relative to site-packages): the
    /// extension module an import loads, or the plugin.
    pub file: String,
    /// What goes wrong; names the object with the unmet need when it is not
    /// `file` itself (`"lib/x.so (loaded by file): needs ..."`).
    pub reason: String,
    /// The grouping key (see [`Problem::cause`]).
    pub cause: String,
    /// `file` is an optional plugin (no extension module reaches it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// The venv as it is has this very problem already.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preexisting: bool,
    /// The load model's "needs PACKAGE imported first": every problem of
    /// `file` is an undefined symbol, and each of them is defined by a
    /// shared object under another top-level package directory of the
    /// venv (these, sorted; see docs/preflight.md). Then this is the
    /// root's one finding, and not a problem: the module is imported only
    /// after those packages (cuda-core's torch bridge needs torch's
    /// `aoti_torch_*`). Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub imported_first: Vec<String>,
    /// The library not found, when that is the problem (`needs X, which
    /// is not found`): `overlay doctor` tells a system library that no
    /// distribution ships from a venv's own missing one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_library: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PreflightReport {
    pub problems: Vec<ElfFinding>,
    /// CUDA runtime majors each shared object needs after the overlay.
    pub cudart: BTreeMap<String, BTreeSet<u32>>,
    /// Shared objects checked.
    pub checked: u64,
    /// The GPU check's kernel findings: an object with no code for a GPU
    /// of the target (`cause` names the GPU kind).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu: Vec<ElfFinding>,
}
