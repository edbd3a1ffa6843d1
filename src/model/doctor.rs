//! `overlay doctor`: what is asked of a host's venv ([`DoctorRequest`]),
//! what is found ([`Finding`], one of a [`FindingKind`], a problem or a
//! note of a [`NoteKind`]: [`FindingClass`]) and the whole answer
//! ([`DoctorReport`]); and the source's own-RECORD check that `plan` notes
//! ([`RecordCheckRequest`]).

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
    /// The host's NVIDIA driver is too old for a CUDA runtime of the venv,
    /// or a CUDA library has no code for one of its GPUs.
    Gpu,
}

impl FindingKind {
    pub const ALL: [FindingKind; 11] = [
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
        FindingKind::Gpu,
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
            FindingKind::Gpu => "gpu",
        }
    }
}

/// Whether a finding is damage (exit 1) or what a healthy venv shows too.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum FindingClass {
    /// Something that breaks, or that neither pip nor overlay did.
    #[default]
    Problem,
    /// Works as designed; shown, counted, and never a failure.
    Note,
}

/// What a note is (docs/doctor.md, "Problems and notes"), in the report's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoteKind {
    /// An extension module whose undefined symbols another package's
    /// shared objects define: it is imported after that package.
    ImportedFirst,
    /// An extension module that needs a system library no distribution
    /// ships and the host lacks, while its distribution's other extension
    /// modules load: an optional backend the package falls back from.
    OptionalBackend,
    /// Bytecode RECORD lists that is not on disk: Python writes it again.
    RegenerableBytecode,
    /// A data file (not code) that differs from RECORD: a CA bundle or a
    /// config the site edits on purpose.
    EditedData,
}

impl NoteKind {
    pub const ALL: [NoteKind; 4] = [
        NoteKind::ImportedFirst,
        NoteKind::OptionalBackend,
        NoteKind::RegenerableBytecode,
        NoteKind::EditedData,
    ];

    /// The summary's words for `n` notes of this kind ("2 data files
    /// edited"); `first`: the packages imported-first notes name.
    pub fn counted(self, n: usize, first: &str) -> String {
        let one = n == 1;
        let pick = |a: &'static str, b: &'static str| if one { a } else { b };
        match self {
            NoteKind::ImportedFirst => format!(
                "{n} {} {} imported first",
                pick("extension needs", "extensions need"),
                if first.is_empty() {
                    "another package"
                } else {
                    first
                }
            ),
            NoteKind::OptionalBackend => format!(
                "{n} {}",
                pick(
                    "optional backend without its system library",
                    "optional backends without their system library"
                )
            ),
            NoteKind::RegenerableBytecode => format!(
                "{n} {} regenerable",
                pick("bytecode file", "bytecode files")
            ),
            NoteKind::EditedData => format!("{n} {} edited", pick("data file", "data files")),
        }
    }

    /// The heading of this kind's notes in the full (`-v`) listing.
    pub fn heading(self) -> &'static str {
        match self {
            NoteKind::ImportedFirst => "needs another package imported first",
            NoteKind::OptionalBackend => "optional backend without its system library",
            NoteKind::RegenerableBytecode => "regenerable bytecode (listed in RECORD, absent)",
            NoteKind::EditedData => "edited data file (differs from RECORD, not code)",
        }
    }
}

/// One thing found in the venv: a problem, or a note.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// The distribution it concerns, if known (its name as METADATA spells it).
    pub dist: Option<String>,
    /// The file or directory, relative to site-packages (`../../../bin/x`
    /// for scripts), if any.
    pub path: Option<String>,
    pub reason: String,
    /// A problem (the default; what an older agent sends) or a note.
    #[serde(default)]
    pub class: FindingClass,
    /// What kind of note, for a note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<NoteKind>,
    /// For an [`NoteKind::ImportedFirst`] note: the packages (top-level
    /// import names) to be imported first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub imported_first: Vec<String>,
}

impl Finding {
    /// A problem of `kind`.
    pub fn problem(
        kind: FindingKind,
        dist: Option<String>,
        path: Option<String>,
        reason: String,
    ) -> Self {
        Finding {
            kind,
            dist,
            path,
            reason,
            class: FindingClass::Problem,
            note: None,
            imported_first: Vec::new(),
        }
    }

    /// This finding, as a note of `note`.
    pub fn into_note(self, note: NoteKind) -> Self {
        Finding {
            class: FindingClass::Note,
            note: Some(note),
            ..self
        }
    }

    pub fn is_problem(&self) -> bool {
        self.class == FindingClass::Problem
    }
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
    /// Problems and notes ([`Finding::class`]), sorted by kind,
    /// distribution, path.
    pub findings: Vec<Finding>,
    /// The host's NVIDIA driver and GPUs, which the GPU check judged.
    #[serde(default)]
    pub machine: super::Machine,
}

impl DoctorReport {
    /// The findings that are problems (what makes `doctor` exit 1).
    pub fn problems(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.is_problem())
    }

    /// The findings that are notes.
    pub fn notes(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| !f.is_problem())
    }
}
