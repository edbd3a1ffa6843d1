//! Generations and the journal, on the target host. A generation is one
//! apply: `<venv>/.overlay/generations/<id>/` holds its change list, the
//! listing from before it, the append-only journal, the staged new files and
//! the backup of the old ones. Every step of the switch is written to the
//! journal (and fsynced) *before* it is done, and every step is a rename on
//! one file system, so after a crash at any moment each path is either fully
//! old or fully new, and the journal says which steps may have happened.
//!
//! Every write is fd-relative: [`State`] opens the venv root once (a
//! [`Beneath`]) and every path operation — stage lookups, moves to the
//! backup, mkdir, place, rmdir, undo, redo, commit, prune, discard, and the
//! state files themselves — goes through it, so a symlink anywhere in a
//! parent chain is refused at the moment of the write, whatever the tree
//! held when the change list was checked. Nothing is ever written outside
//! the venv root.
//!
//! Shape changes: [`State::prepare`] refuses a change list that would write
//! below a path the same list turns into a file or symlink (or deletes as a
//! directory), and any change path inside `.overlay`. A directory replaced
//! by a file or symlink is switched last: its planned children are moved to
//! the backup first, then the directory (with whatever unplanned content is
//! left, e.g. `__pycache__`) is moved whole to `whole/<index>`, then the new
//! entry is placed; undo puts the directory back whole. A file standing
//! where the source has a directory (the source has files below it) is moved
//! to the backup first (an *aside* change the agent adds), then the
//! directory is created.
//!
//! Undo and redo both look at the file system to see whether a journalled
//! step took effect, so each can itself be interrupted and run again. What
//! is read back (meta.json, the journal) is validated before it is acted
//! on: change paths and journalled directories must be plain venv-relative
//! paths outside `.overlay`, indices must exist; a damaged or planted file is
//! an error naming the generation and the file, never an action. State files
//! are written whole ([`Beneath::write_atomic`]: temp, fsync, rename), mode
//! 0600 in 0700 directories.
//!
//! The files, one job each:
//! - `format.rs`: the on-disk format of one generation — [`Record`],
//!   [`Meta`], [`Generation`]: reading, validating and writing meta.json,
//!   the journal and before.json.
//! - `state.rs`: the state folder and its lock, generation ids, loading,
//!   history, prune and discard; the receiving end's open.
//! - `prepare.rs`: checking a change list's shape and preconditions, and
//!   opening a new generation.
//! - `switch.rs`: the journalled switch, the check after it, commit.
//! - `undo.rs`: undoing one generation step by step, and checking the
//!   result against before.json.
//! - `rollback.rs`: finishing an interrupted generation (recover) and
//!   rolling back complete ones.
//! - `guard.rs`: the listing after an apply (after.json), what changed
//!   since, checked before a rollback, and one dist-info per distribution
//!   after a forced one.
//! - `space.rs`: free space and disk usage.
//! - `records.rs`: the staged RECORD rows of scripts whose shebang the
//!   source rewrote, made to describe the scripts placed (as pip's do).
//!
//! This file holds [`State`] and the small helpers every step shares.

pub mod durable;
mod format;
mod guard;
mod prepare;
mod records;
mod rollback;
mod space;
mod state;
mod switch;
mod undo;

#[cfg(test)]
mod property;
#[cfg(test)]
mod tests_support;

pub use format::{DIGEST, Generation, Meta, Record};
pub use guard::After;
pub use space::free_bytes;
pub use state::open_for_receive;
pub use switch::SWITCH_BATCH;
pub use undo::Undone;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::beneath::{Beneath, is_refused};
use crate::err;
use crate::error::{Error, Result, io_cause};
use crate::inventory::{Counters, Venv};
use crate::model::{Entry, HashMode, STATE_DIR};

/// The `.overlay` state of one venv, locked for the lifetime of this value.
pub struct State {
    pub venv: Venv,
    /// Canonical venv root, for messages: every write goes through `fs`.
    root: PathBuf,
    /// The venv root, opened once: every path operation is relative to it.
    fs: Beneath,
    /// The state folder, `<root>/.overlay`, for messages.
    dir: PathBuf,
    /// The locked `.overlay/lock`, held while this value lives (`None`:
    /// opened to read only, by a user who may not open it).
    _lock: Option<File>,
    /// Test hook: fail with an error after this many switch or undo steps.
    stop_after: AtomicU64,
}

/// Where the generations live, relative to the venv root.
const GENERATIONS: &str = ".overlay/generations";

/// Whether a venv-relative path is overlay's own state (or above it).
fn is_state(rel: &str) -> bool {
    rel == STATE_DIR || rel.starts_with(".overlay/")
}

/// How many threads share file-system work on `items` independent entries
/// (the local route's copies, an undo's removals): one per core, at most 8
/// (the queue depth a GPU server's NVMe rewards), never more than the
/// entries, at least one.
pub fn fs_lanes(items: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get().min(8))
        .min(items)
        .max(1)
}

/// A generation id as this agent makes them: `[0-9A-Za-z-]+`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

/// The proper ancestors of a normalized relative path, shallowest first.
fn ancestors(rel: &str) -> impl Iterator<Item = &str> {
    rel.match_indices('/').map(move |(i, _)| &rel[..i])
}

fn parent_of(rel: &str) -> &str {
    rel.rfind('/').map_or("", |i| &rel[..i])
}

/// A test hook: `OVERLAY_TEST_STOP_AFTER=N` makes the agent exit abruptly
/// after writing its N-th journal record (crash-safety tests).
fn crash_hook() {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    if let Some(n) = std::env::var("OVERLAY_TEST_STOP_AFTER")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        && COUNT.fetch_add(1, Ordering::SeqCst) + 1 >= n
    {
        std::process::exit(137);
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> crate::error::Error {
    move |e| err!("Failed to {what}: {}", io_cause(&e))
}

/// An I/O failure on `shown`; a refused symlink in its chain says so.
fn fs_err(what: &str, shown: &Path, e: &std::io::Error) -> Error {
    if is_refused(e) {
        err!(
            hint = "overlay never writes through a symlink; `overlay rollback HOST` restores what this generation changed",
            "Failed to {what} {}: a symlink in its path was refused",
            shown.display()
        )
    } else {
        err!("Failed to {what} {}: {}", shown.display(), io_cause(e))
    }
}

/// Stat `paths`, hashing those marked in `hash`; entries come back in order.
fn stat_mixed(
    venv: &str,
    paths: &[String],
    hash: &[bool],
    counters: &Counters,
) -> Result<Vec<Entry>> {
    let (with, without): (Vec<usize>, Vec<usize>) = (0..paths.len()).partition(|i| hash[*i]);
    let pick = |idx: &[usize]| -> Vec<String> { idx.iter().map(|i| paths[*i].clone()).collect() };
    let a = crate::inventory::stat(venv, &pick(&with), HashMode::All, None, false, counters)?;
    let b = crate::inventory::stat(venv, &pick(&without), HashMode::None, None, false, counters)?;
    let mut out: Vec<Option<Entry>> = vec![None; paths.len()];
    for (i, e) in with.into_iter().zip(a).chain(without.into_iter().zip(b)) {
        out[i] = Some(e);
    }
    Ok(out
        .into_iter()
        .map(|e| e.expect("every path stat'ed"))
        .collect())
}
