//! A bundle's index (`overlay pack`, docs/pack.md): what the bundle holds,
//! stored as its first member. Paths are relative to the venv, sorted.
//! Beside the entries it carries what the source's agent said of them when
//! they were packed ([`SourceFacts`]), so that a bundle read in place
//! answers a planner as the live source would (`crate::bundle::source`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Dist, ElfInfo, Finding};

/// Version of the bundle format; a reader refuses any other (2: the
/// index carries [`SourceFacts`]).
pub const BUNDLE_FORMAT: u32 = 2;

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
    /// What the source's agents said of the packed files.
    pub facts: SourceFacts,
}

/// What the source's agents answered at pack time that the entries do not
/// say: the packed distributions as their scan found them, the ELF facts
/// of the packed shared objects and the packed files that differ from their
/// own RECORD. A bundle read in place answers `Scan`, `ElfInfo` and
/// `RecordCheck` from these (docs/design.md, "Sources"); they are the
/// source's word, vouched for by the bundle's hash, as the files are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceFacts {
    /// The source interpreter's full version (`pyvenv.cfg`), for markers.
    pub python_full: String,
    /// The packed distributions, as the source's scan found them, sorted by
    /// dist-info.
    pub dists: Vec<Dist>,
    /// ELF facts of the packed shared objects (paths relative to
    /// site-packages); one that is no ELF object is absent.
    pub elf: BTreeMap<String, ElfInfo>,
    /// Whether the source checked the packed files against their RECORD
    /// (`record` is then what it found).
    pub record_checked: bool,
    /// The packed files that differ from their own RECORD.
    pub record: Vec<Finding>,
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
