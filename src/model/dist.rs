//! What a scan reports of a venv: its installed distributions ([`Dist`]),
//! the files matched by the sets' globs and the host facts markers need.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanReport {
    pub venv: String,
    /// site-packages relative to the venv, e.g. `lib/python3.11/site-packages`.
    pub site_packages: String,
    /// Interpreter `major.minor`, e.g. `3.11`.
    pub python: String,
    pub dists: Vec<Dist>,
    /// For each requested file glob, in request order, the matching paths.
    pub globs: Vec<Vec<String>>,
    #[serde(default)]
    pub facts: Facts,
    /// The host's NVIDIA driver and GPUs (unknown for a bundle's source).
    #[serde(default)]
    pub machine: super::Machine,
}

/// One installed distribution (a `*.dist-info` directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dist {
    pub name: String,
    /// PEP 503-normalized name.
    pub normalized: String,
    pub version: String,
    /// The true build, e.g. `2.11.0+cu130` from `torch/version.py`, when it
    /// says more than the dist-info's version.
    pub build: Option<String>,
    /// The dist-info directory, relative to site-packages.
    pub dist_info: String,
    /// Paths relative to site-packages: RECORD's entries (without
    /// `__pycache__`) plus every file inside the dist-info directory.
    pub files: Vec<String>,
    /// Why RECORD or METADATA could not be read, if so.
    pub problem: Option<String>,
    /// METADATA `Requires-Dist` lines, verbatim.
    #[serde(default)]
    pub requires_dist: Vec<String>,
    /// METADATA `Provides-Extra`.
    #[serde(default)]
    pub provides_extra: Vec<String>,
    /// The CUDA version a `<pkg>/version.py` declares (`cuda = '13.0'`).
    #[serde(default)]
    pub cuda: Option<String>,
}

#[cfg(test)]
impl Dist {
    /// A distribution for unit tests: `name` `version` and nothing else.
    pub(crate) fn for_test(name: &str, version: &str) -> Dist {
        Dist {
            name: name.into(),
            normalized: super::normalize_name(name),
            version: version.into(),
            build: None,
            dist_info: format!("{name}-{version}.dist-info"),
            files: vec![],
            problem: None,
            requires_dist: vec![],
            provides_extra: vec![],
            cuda: None,
        }
    }
}

/// What the agent knows of its host, for evaluating markers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    /// `version` from pyvenv.cfg, e.g. `3.11.2`.
    pub python_full: String,
    /// `uname -m`, `-r`, `-v`.
    pub machine: String,
    pub release: String,
    pub kernel_version: String,
}
