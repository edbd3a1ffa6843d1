//! A generation as it travels and is listed: the plan's [`Action`]s, the
//! [`GenChange`]s of a [`PrepareRequest`], the distribution versions it
//! moves between ([`Transition`]), what `history` shows
//! ([`GenerationInfo`]) and what a rollback did ([`RollbackReport`]).

use serde::{Deserialize, Serialize};

use super::{FileStamp, Kind, LaterChanges};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Add,
    Replace,
    Delete,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Add => "add",
            Action::Replace => "replace",
            Action::Delete => "delete",
        }
    }
}

/// A distribution's version before and after (`None`: absent): a line of
/// the plan's version column, and what a generation records.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Transition {
    pub name: String,
    pub from: Option<String>,
    pub to: Option<String>,
}

impl Transition {
    /// The version changes (an install, an upgrade or a removal).
    pub fn changes(&self) -> bool {
        self.from != self.to
    }
}

/// The state directory inside the venv (a sibling of `bin/` and `lib/`).
pub const STATE_DIR: &str = ".overlay";

/// One path the generation changes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GenChange {
    /// Relative to site-packages, as in the plan.
    pub path: String,
    pub action: Action,
    /// What the source has (add, replace).
    pub source: Option<Kind>,
    /// What the plan saw on the target (replace, delete).
    pub target: Option<Kind>,
    /// Stale bytecode deleted with its `.py`: may have vanished or been rewritten since the plan.
    #[serde(default)]
    pub bytecode: bool,
    /// The staged file as written and hashed (device, inode, mtime): after
    /// the switch the same inode must sit at `path`, unchanged, which
    /// proves its content without reading it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged: Option<FileStamp>,
}

impl GenChange {
    /// An add of `source` at `path` (site-packages-relative).
    pub fn add(path: &str, source: Kind) -> GenChange {
        GenChange {
            path: path.into(),
            action: Action::Add,
            source: Some(source),
            target: None,
            bytecode: false,
            staged: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PrepareRequest {
    pub venv: String,
    pub source: String,
    pub target: String,
    pub plan_created: u64,
    pub changes: Vec<GenChange>,
    pub backup: bool,
    /// An unfinished generation is resumed rather than rolled back.
    pub resume: bool,
    /// As root: staged files keep the source's uid/gid (`apply
    /// --same-owner`) instead of taking the owner of what they replace.
    #[serde(default)]
    pub same_owner: bool,
    /// The plan's distribution versions before and after, each name once,
    /// recorded with the generation for `history`.
    #[serde(default)]
    pub versions: Vec<Transition>,
    /// The source rewrote its scripts' shebangs from its venv to this one:
    /// the target rewrites those scripts' RECORD rows to match
    /// (`journal::records`), as pip records the script it wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shebang: Option<super::ShebangRewrite>,
    /// Where the files come from, recorded with the generation for
    /// `history` (none from older controllers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<super::Provenance>,
    /// The target's NVIDIA driver and GPUs as the plan read them,
    /// recorded with the generation (what the GPU check judged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<super::Machine>,
    /// Go on while processes run from the venv (`apply --allow-running`);
    /// without it the target refuses before anything is written.
    #[serde(default)]
    pub allow_running: bool,
}

/// How a generation's staged files and renames were made durable
/// (`journal::durable`): one `syncfs` of the file system, or an fsync per
/// file and per directory.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Barrier {
    /// One `syncfs(2)` of the file system (ext4, XFS, btrfs, ...).
    Syncfs,
    /// An fsync per file and per directory (FUSE, NFS, unknown).
    Fsync,
}

impl Barrier {
    /// Its name, as JSON spells it (`syncfs`, `fsync`).
    pub fn name(self) -> &'static str {
        match self {
            Barrier::Syncfs => "syncfs",
            Barrier::Fsync => "fsync",
        }
    }

    /// In words, for messages.
    pub fn words(self) -> &'static str {
        match self {
            Barrier::Syncfs => "one syncfs of the file system",
            Barrier::Fsync => "an fsync per file and per directory",
        }
    }
}

/// The file system a generation was written on, and its [`Barrier`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Durability {
    /// Its type (`ext4`, `fuse`, or the hex `f_type`); with the state
    /// folder's after a comma when that is another.
    pub fs: String,
    pub barrier: Barrier,
}

/// What `overlay history` shows for a generation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GenerationInfo {
    pub id: String,
    pub created: u64,
    pub source: String,
    pub adds: u64,
    pub replaces: u64,
    pub deletes: u64,
    /// Bytes of new files the generation brought.
    pub bytes: u64,
    /// Bytes held in its backup folder.
    pub backup_bytes: u64,
    pub backup: bool,
    /// The distributions' versions before and after, as the plan saw them
    /// (none for generations made before overlay recorded them).
    #[serde(default)]
    pub versions: Vec<Transition>,
    /// Where its files came from (none for generations made before
    /// overlay recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<super::Provenance>,
    /// The target's NVIDIA driver and GPUs when it was planned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<super::Machine>,
    /// The venv's file system and the barrier chosen for it (none for
    /// generations made before overlay recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<Durability>,
    pub status: Status,
    /// Why the generation's state cannot be read (status `damaged`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub damaged: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Opened; files may be staging. Nothing in the venv changed yet.
    Prepared,
    /// All new files staged; nothing in the venv changed yet.
    Staged,
    /// Interrupted in the middle of the switch.
    Switching,
    /// Switched and checked, not yet committed.
    Switched,
    Complete,
    RolledBack,
    /// Its meta.json or journal cannot be read or fails validation.
    Damaged,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RollbackReport {
    /// Generations rolled back, newest first.
    pub generations: Vec<String>,
    /// Set when the rollback finished an interrupted apply instead.
    pub recovered: Option<String>,
    /// Files placed by the apply and edited since: kept, not deleted.
    pub kept_edited: Vec<String>,
    pub restored: u64,
    pub removed: u64,
    /// Paths checked against the listing from before the apply.
    pub verified: u64,
    /// What changed since the apply in the generations' files and
    /// distributions (none: nothing, or a generation too old to say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub later: Option<LaterChanges>,
    /// Refused because of `later` (no `--force`): nothing was changed.
    #[serde(default)]
    pub refused: bool,
    /// With `--force`: dist-info directories added since the apply for the
    /// generations' distributions, moved out with the files only their
    /// RECORD lists (a second version of a restored distribution).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub displaced: Vec<String>,
    /// Where `displaced` went (a folder in the state folder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub displaced_to: Option<String>,
    /// With `--force`: what the rollback could not make consistent, in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inconsistent: Vec<String>,
    /// With `--allow-running`: the processes that ran from the venv and
    /// still run, with the files the rollback replaced loaded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub running: Vec<super::VenvProcess>,
}
