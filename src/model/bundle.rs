//! A bundle's index (`overlay pack`, docs/pack.md): what the bundle holds,
//! stored as its first member. Paths are relative to the venv, sorted.

use serde::{Deserialize, Serialize};

/// Version of the bundle format; a reader refuses any other.
pub const BUNDLE_FORMAT: u32 = 1;

/// The index of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleIndex {
    pub format: u32,
    /// The source's interpreter `major.minor`, e.g. `3.11`.
    pub python: String,
    /// The source's site-packages relative to its venv.
    pub site_packages: String,
    /// The source host's manifest name and venv (scripts' shebangs name it).
    pub source_host: String,
    pub source_venv: String,
    /// The manifest's sets (those packed), `[verify]` and `[preflight]`, as TOML.
    pub manifest: String,
    /// The packed sets' names, in the manifest's order.
    pub sets: Vec<String>,
    /// The distributions the bundle carries.
    pub dists: Vec<BundleDist>,
    /// Every file, symlink and directory, sorted by path.
    pub entries: Vec<BundleEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleDist {
    pub name: String,
    pub version: String,
    /// The dist-info directory, relative to site-packages.
    pub dist_info: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleEntry {
    /// Relative to the venv.
    pub path: String,
    pub kind: BundleKind,
    /// The distribution whose RECORD lists it, if one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum BundleKind {
    File {
        size: u64,
        mode: u32,
        /// BLAKE3, lowercase hex, of the bytes as stored.
        blake3: String,
    },
    Symlink {
        target: String,
    },
    Dir {
        mode: u32,
    },
}
