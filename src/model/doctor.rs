//! `overlay doctor`: what is asked of a host's venv ([`DoctorRequest`]),
//! what is found ([`Finding`], one of a [`FindingKind`]) and the whole
//! answer ([`DoctorReport`]); and the source's own-RECORD check that `plan`
//! notes ([`RecordCheckRequest`]).

use serde::{Deserialize, Serialize};

/// Check a venv as it stands, without a source.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DoctorRequest {
    pub venv: String,
    /// The directories of the manifest's `[verify] env.LD_LIBRARY_PATH`
    /// (`{venv}` and `{site_packages}` are expanded on the host).
    #[serde(default)]
    pub ld_library_path: Vec<String>,
    /// The manifest's `[preflight] cuda_family`.
    #[serde(default)]
    pub cuda_family: Vec<String>,
}

/// Check the files of some distributions against their own RECORD (the
/// source's carried dists, for `plan`'s note).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RecordCheckRequest {
    pub venv: String,
    /// Their dist-info directories, relative to site-packages (the
    /// findings name each distribution by its dist-info).
    pub dist_infos: Vec<String>,
    /// Only these RECORD rows (paths as RECORD writes them); empty: all.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Hash only files up to this size (larger ones get the size and ELF
    /// checks); `None`: hash every file.
    pub max_hash_bytes: Option<u64>,
}

/// What kind of problem a finding is, in the report's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    /// A shared object cut short: a segment lies past the end of the file.
    Damaged,
    /// Size or hash differs from RECORD.
    Changed,
    /// Listed in RECORD, not on disk.
    Missing,
    /// Under a distribution's package directory, listed by no RECORD.
    Extra,
    /// Two or more dist-infos of one distribution.
    DuplicateDistInfo,
    /// Compiled bytecode that does not match its source, or whose source is gone.
    StaleBytecode,
    /// A `bin/` script whose `#!` interpreter is missing or another venv's.
    BrokenShebang,
    /// A `Requires-Dist` not satisfied.
    Requirement,
    /// Packages that link together disagree on the CUDA major.
    Cuda,
    /// A shared object that cannot be loaded.
    Elf,
}

impl FindingKind {
    pub const ALL: [FindingKind; 10] = [
        FindingKind::Damaged,
        FindingKind::Changed,
        FindingKind::Missing,
        FindingKind::Extra,
        FindingKind::DuplicateDistInfo,
        FindingKind::StaleBytecode,
        FindingKind::BrokenShebang,
        FindingKind::Requirement,
        FindingKind::Cuda,
        FindingKind::Elf,
    ];

    /// The report's heading for this kind.
    /// The kind in a count ("2 changed, 1 extra").
    pub fn short(self) -> &'static str {
        match self {
            FindingKind::Changed => "changed",
            FindingKind::Missing => "missing",
            FindingKind::Extra => "extra",
            other => other.heading(),
        }
    }

    pub fn heading(self) -> &'static str {
        match self {
            FindingKind::Damaged => "damaged",
            FindingKind::Changed => "changed (differs from RECORD)",
            FindingKind::Missing => "missing (listed in RECORD)",
            FindingKind::Extra => "extra (in no RECORD)",
            FindingKind::DuplicateDistInfo => "duplicate dist-info",
            FindingKind::StaleBytecode => "stale bytecode",
            FindingKind::BrokenShebang => "broken shebang",
            FindingKind::Requirement => "requirement",
            FindingKind::Cuda => "cuda",
            FindingKind::Elf => "elf",
        }
    }
}

/// One problem found in the venv.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// The distribution it concerns, if known (its name as METADATA spells it).
    pub dist: Option<String>,
    /// The file or directory, relative to site-packages (`../../../bin/x`
    /// for scripts), if any.
    pub path: Option<String>,
    pub reason: String,
}

/// The answer to a [`DoctorRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoctorReport {
    pub venv: String,
    /// Distributions (dist-info directories) checked.
    pub dists: u64,
    /// RECORD entries checked.
    pub files: u64,
    /// Files whose sha256 was read now (the rest came from the hash cache).
    pub hashed: u64,
    /// Files whose sha256 the cache still vouched for.
    pub cached: u64,
    /// Shared objects whose loading was checked (the preflight's ELF check).
    pub elf_checked: u64,
    /// Sorted by kind, distribution, path.
    pub findings: Vec<Finding>,
}
