//! Generations and the journal, on the target host. A generation is one
//! apply: `<venv>/.overlay/generations/<id>/` holds its change list, the
//! listing from before it, the append-only journal, the staged new files and
//! the backup of the old ones. Every step of the switch is written to the
//! journal (and fsynced) *before* it is done, and every step is a rename on
//! one file system, so after a crash at any moment each path is either fully
//! old or fully new, and the journal says which steps may have happened.
//!
//! Undo and redo both look at the file system to see whether a journalled
//! step took effect, so each can itself be interrupted and run again.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, Write};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::agent::protocol::{Entry, FileStamp, HashMode, Kind};
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::{Counters, Venv};
use crate::plan::Action;

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
    pub status: Status,
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
}

/// Journal records. Intents (`Move`, `Place`, `Mkdir`, `Rmdir`) are written
/// before the step they name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Record {
    Prepared,
    Staged,
    Move { i: usize },
    Place { i: usize },
    Mkdir { dir: String },
    Rmdir { dir: String, mode: u32 },
    Switched,
    Checked,
    Complete,
    RollbackBegin,
    RolledBack,
}

/// The change list and metadata, written once at prepare.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub source: String,
    pub target: String,
    pub plan_created: u64,
    pub backup: bool,
    /// See [`PrepareRequest::same_owner`].
    #[serde(default)]
    pub same_owner: bool,
    /// The content hash of every digest in this generation. Generations
    /// from before BLAKE3 have none recorded and used sha256.
    #[serde(default = "sha256_name")]
    pub digest: String,
    pub changes: Vec<GenChange>,
}

/// The content hash this version writes and checks.
pub const DIGEST: &str = "blake3";

fn sha256_name() -> String {
    "sha256".into()
}

/// The `.overlay` state of one venv, locked for the lifetime of this value.
pub struct State {
    pub venv: Venv,
    /// Canonical venv root: every write lands below it.
    root: PathBuf,
    dir: PathBuf,
    _lock: File,
}

/// A test hook: `OVERLAY_TEST_STOP_AFTER=N` makes the agent exit abruptly
/// after writing its N-th journal record (crash-safety tests).
/// The receiving end of a direct stream (`Request::Receive`): the prepared
/// generation `id` of the venv at `venv_root`, and the venv's root. The lock
/// is held by the controller's own agent, which waits for this stream; this
/// side takes no lock but accepts only a generation that is prepared and
/// not yet staged into, so it never writes anywhere but an empty staging
/// folder of the venv's own state directory.
pub fn open_for_receive(venv_root: &str, id: &str) -> Result<(PathBuf, Generation)> {
    let bad = || {
        err!(
            hint =
                "this request comes only from overlay's own source agent during `apply --direct`",
            "No prepared generation {id:?} to receive into in {venv_root}"
        )
    };
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(bad());
    }
    let venv = Venv::open(venv_root)?;
    let root = fs::canonicalize(&venv.root).map_err(io(format_args!("resolve {venv_root}")))?;
    let dir = root.join(STATE_DIR).join("generations").join(id);
    let meta: Meta = fs::read_to_string(dir.join("meta.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(bad)?;
    let records = read_journal(&dir.join("journal"))?;
    let g = Generation { dir, meta, records };
    let staging = g.dir.join("staging");
    let empty = fs::symlink_metadata(&staging).is_ok_and(|m| m.is_dir())
        && fs::read_dir(&staging).is_ok_and(|mut rd| rd.next().is_none());
    if g.status() != Status::Prepared || !empty {
        return Err(bad());
    }
    Ok((root, g))
}

/// Switch steps whose journal records share one fsync.
pub const SWITCH_BATCH: usize = 256;

fn crash_hook() {
    use std::sync::atomic::{AtomicU64, Ordering};
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

fn fsync_dir(p: &Path) {
    if let Ok(f) = File::open(p) {
        let _ = f.sync_all();
    }
}

fn lexists(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok()
}

impl State {
    /// Open (creating) the state directory and take its lock.
    pub fn open(venv_root: &str) -> Result<State> {
        let venv = Venv::open(venv_root)?;
        let root = fs::canonicalize(&venv.root).map_err(io(format_args!("resolve {venv_root}")))?;
        let dir = root.join(STATE_DIR);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join("generations"))
            .map_err(io(format_args!("create {}", dir.display())))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .map_err(io(format_args!("open {}/lock", dir.display())))?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(100))
                }
                Err(_) => {
                    return Err(err!(
                        hint = "wait for the other overlay apply or rollback to finish, then run again",
                        "Another overlay operation holds the lock on {}",
                        dir.display()
                    ));
                }
            }
        }
        Ok(State {
            venv,
            root,
            dir,
            _lock: lock,
        })
    }

    fn gen_dir(&self, id: &str) -> PathBuf {
        self.dir.join("generations").join(id)
    }

    /// Generation ids, oldest first.
    pub fn generation_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = fs::read_dir(self.dir.join("generations"))
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().join("meta.json").exists())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    }

    pub fn load(&self, id: &str) -> Result<Generation> {
        let dir = self.gen_dir(id);
        let text = fs::read_to_string(dir.join("meta.json")).map_err(|e| {
            err!(
                hint = "run `overlay history HOST` to list generations",
                "No generation {id} in {}: {}",
                self.dir.display(),
                io_cause(&e)
            )
        })?;
        let meta: Meta = serde_json::from_str(&text)
            .map_err(|e| err!("{}/meta.json is damaged: {e}", dir.display()))?;
        let records = read_journal(&dir.join("journal"))?;
        Ok(Generation { dir, meta, records })
    }

    /// Where a site-packages-relative path lives, refusing `..` escapes and
    /// parents that are symlinks (a write must never follow one out of the venv).
    pub fn target_path(&self, path: &str) -> Result<PathBuf> {
        let (_, rel) = self.venv.resolve(path)?;
        let mut cur = self.root.clone();
        let parts: Vec<&str> = rel.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            cur.push(part);
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(err!(
                        hint = "overlay never writes through a symlink; replace the link with a directory or leave the path out",
                        "Refusing to write {path}: {} is a symlink",
                        cur.display()
                    ));
                }
                Ok(m) if !m.is_dir() => {
                    return Err(err!(
                        "Refusing to write {path}: {} is not a directory",
                        cur.display()
                    ));
                }
                _ => {}
            }
        }
        Ok(self.root.join(rel))
    }

    fn backup_path(&self, g: &Generation, path: &str) -> Result<PathBuf> {
        let (_, rel) = self.venv.resolve(path)?;
        Ok(g.dir.join("backup").join(rel))
    }

    /// Open a new generation after checking the plan's preconditions.
    pub fn prepare(&self, req: &PrepareRequest, counters: &Counters) -> Result<Generation> {
        // Preconditions: what we replace or delete is as the plan saw it; what we add is absent.
        // Hash only where the plan did (and the small bytecode files); elsewhere
        // the stamp tells whether the file changed since the plan.
        let hashed: Vec<bool> = req
            .changes
            .iter()
            .map(|c| c.bytecode || c.target.as_ref().is_some_and(|t| t.digest().is_some()))
            .collect();
        let now_entries = stat_mixed(
            &req.venv,
            &req.changes
                .iter()
                .map(|c| c.path.clone())
                .collect::<Vec<_>>(),
            &hashed,
            counters,
        )?;
        let mut drift = Vec::new();
        for (c, e) in req.changes.iter().zip(&now_entries) {
            self.target_path(&c.path)?;
            if c.bytecode {
                continue;
            }
            let ok = match (&c.action, &c.target) {
                (Action::Add, _) => !e.kind.exists(),
                (_, Some(t)) => t.unchanged_in(&e.kind),
                (_, None) => false,
            };
            if !ok {
                drift.push(c.path.clone());
            }
        }
        if !drift.is_empty() {
            let shown: Vec<&str> = drift.iter().take(5).map(String::as_str).collect();
            return Err(err!(
                hint = "the target changed since the plan was made; run `overlay plan` again, then apply the new plan",
                "The target venv {} has drifted since the plan: {} path{} ({}{})",
                req.venv,
                drift.len(),
                if drift.len() == 1 {
                    " differs"
                } else {
                    "s differ"
                },
                shown.join(", "),
                if drift.len() > 5 { ", ..." } else { "" }
            ));
        }
        // Free space: new files are staged in full before anything is switched.
        let need: u64 = req
            .changes
            .iter()
            .filter(|c| c.action != Action::Delete)
            .map(|c| c.source.as_ref().map_or(0, Kind::size))
            .sum();
        let free = free_bytes(&self.dir)?;
        let margin = 16 << 20;
        // Test hook: OVERLAY_TEST_SKIP_SPACE_CHECK lets the disk fill up while staging.
        if need + margin > free && std::env::var_os("OVERLAY_TEST_SKIP_SPACE_CHECK").is_none() {
            return Err(err!(
                hint = "free space on that file system, then run `overlay apply` again",
                "Not enough space for the apply in {}: {} bytes needed (plus {} margin), {} free",
                self.root.display(),
                need,
                margin,
                free
            ));
        }
        let created = now();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let id = format!(
            "{}-{:04x}",
            format_time(created),
            (nanos ^ std::process::id()) & 0xffff
        );
        let dir = self.gen_dir(&id);
        // Not recursive: an existing directory of that name is an error, never reused.
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io(format_args!("create {}", dir.display())))?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dir.join("staging"))
            .map_err(io(format_args!("create {}", dir.display())))?;
        let meta = Meta {
            id: id.clone(),
            created,
            source: req.source.clone(),
            target: req.target.clone(),
            plan_created: req.plan_created,
            backup: req.backup,
            same_owner: req.same_owner,
            digest: DIGEST.into(),
            // No setuid, setgid or sticky bit comes in, whatever the plan
            // says: the stage writes modes masked to 0o777, and the check
            // after the switch compares with these.
            changes: req
                .changes
                .iter()
                .cloned()
                .map(|mut c| {
                    if let Some(Kind::File { mode, .. }) = &mut c.source {
                        *mode &= 0o777;
                    }
                    c
                })
                .collect(),
        };
        write_synced(
            &dir.join("before.json"),
            &serde_json::to_vec(&now_entries).expect("serializes"),
        )?;
        write_synced(
            &dir.join("meta.json"),
            &serde_json::to_vec_pretty(&meta).expect("serializes"),
        )?;
        fsync_dir(&dir);
        let mut g = Generation {
            dir,
            meta,
            records: Vec::new(),
        };
        g.append(Record::Prepared)?;
        Ok(g)
    }

    /// Switch the staged files into place (or continue an interrupted switch).
    ///
    /// The journal is written ahead in batches: the records of up to
    /// [`SWITCH_BATCH`] steps are made durable with one fsync, then the steps
    /// are taken. Undo and redo look at the file system to tell a recorded
    /// step that was taken from one that was not, so a crash anywhere in a
    /// batch is recovered like a crash between two single steps.
    pub fn switch(&self, g: &mut Generation) -> Result<u64> {
        enum Step {
            Move { target: PathBuf, backup: PathBuf },
            Mkdir(PathBuf),
            Place { staged: PathBuf, target: PathBuf },
        }
        let changes = g.meta.changes.clone();
        let mut created_dirs: BTreeSet<PathBuf> = BTreeSet::new();
        let mut changed = 0;
        let indices: Vec<usize> = (0..changes.len()).collect();
        for batch in indices.chunks(SWITCH_BATCH) {
            let mut records = Vec::new();
            let mut steps = Vec::new();
            for &i in batch {
                let c = &changes[i];
                let target = self.target_path(&c.path)?;
                let staged = g.dir.join("staging").join(i.to_string());
                let backup = self.backup_path(g, &c.path)?;
                if c.action != Action::Add
                    && lexists(&target)
                    && !lexists(&backup)
                    && !(c.action == Action::Replace && !lexists(&staged) && g.placed(i))
                {
                    records.push(Record::Move { i });
                    steps.push(Step::Move {
                        target: target.clone(),
                        backup,
                    });
                }
                if c.action != Action::Delete && lexists(&staged) {
                    // Create missing parents, journalled so that rollback removes them.
                    let mut missing = Vec::new();
                    let mut p = target.parent();
                    while let Some(dir) = p {
                        if dir == self.root || created_dirs.contains(dir) || lexists(dir) {
                            break;
                        }
                        missing.push(dir.to_path_buf());
                        p = dir.parent();
                    }
                    for dir in missing.into_iter().rev() {
                        let rel = dir
                            .strip_prefix(&self.root)
                            .expect("below root")
                            .to_string_lossy()
                            .into_owned();
                        records.push(Record::Mkdir { dir: rel });
                        created_dirs.insert(dir.clone());
                        steps.push(Step::Mkdir(dir));
                    }
                    records.push(Record::Place { i });
                    steps.push(Step::Place { staged, target });
                }
                changed += 1;
            }
            g.append_all(records)?;
            for step in steps {
                match step {
                    Step::Move { target, backup } => {
                        if let Some(parent) = backup.parent() {
                            fs::create_dir_all(parent)
                                .map_err(io(format_args!("create {}", parent.display())))?;
                        }
                        fs::rename(&target, &backup)
                            .map_err(io(format_args!("move {} to the backup", target.display())))?;
                    }
                    Step::Mkdir(dir) => {
                        fs::create_dir(&dir)
                            .map_err(io(format_args!("create {}", dir.display())))?;
                    }
                    Step::Place { staged, target } => {
                        fs::rename(&staged, &target)
                            .map_err(io(format_args!("put {} in place", target.display())))?;
                    }
                }
                crash_hook();
            }
        }
        // Remove directories the deletes left empty, deepest first.
        let site = self.root.join(&self.venv.site_rel);
        let mut dirs: BTreeSet<PathBuf> = BTreeSet::new();
        for c in changes.iter().filter(|c| c.action == Action::Delete) {
            let mut p = self.target_path(&c.path)?.parent().map(Path::to_path_buf);
            while let Some(dir) = p {
                if dir == site || dir == self.root || !dir.starts_with(&self.root) {
                    break;
                }
                dirs.insert(dir.clone());
                p = dir.parent().map(Path::to_path_buf);
            }
        }
        let mut dirs: Vec<PathBuf> = dirs.into_iter().collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            let Ok(meta) = fs::symlink_metadata(&dir) else {
                continue;
            };
            if !meta.is_dir() || fs::read_dir(&dir).map_or(true, |mut rd| rd.next().is_some()) {
                continue;
            }
            let rel = dir
                .strip_prefix(&self.root)
                .expect("below root")
                .to_string_lossy()
                .into_owned();
            g.append(Record::Rmdir {
                dir: rel,
                mode: meta.permissions().mode() & 0o7777,
            })?;
            fs::remove_dir(&dir).map_err(io(format_args!("remove empty {}", dir.display())))?;
        }
        // Make the renames durable: every directory that gained or lost an entry.
        let mut parents: BTreeSet<PathBuf> = BTreeSet::new();
        for c in &changes {
            if let Some(p) = self.target_path(&c.path)?.parent() {
                parents.insert(p.to_path_buf());
            }
        }
        parents.insert(site.clone());
        for p in &parents {
            fsync_dir(p);
        }
        g.append(Record::Switched)?;
        Ok(changed)
    }

    /// Check every changed path against the plan: a file switched in from
    /// staging must be the very inode that was written and hashed there,
    /// unchanged since (its stamp); anything else is re-hashed.
    pub fn check(&self, g: &mut Generation, counters: &Counters) -> Result<()> {
        let paths: Vec<String> = g.meta.changes.iter().map(|c| c.path.clone()).collect();
        let hash: Vec<bool> = g
            .meta
            .changes
            .iter()
            .map(|c| c.action != Action::Delete && c.staged.is_none())
            .collect();
        let now = stat_mixed(&self.venv.root.to_string_lossy(), &paths, &hash, counters)?;
        let bad: Vec<&str> = g
            .meta
            .changes
            .iter()
            .zip(&now)
            .filter(|(c, e)| match (c.action, &c.staged, &c.source, &e.kind) {
                (Action::Delete, ..) => e.kind.exists(),
                (
                    _,
                    Some(st),
                    Some(Kind::File { size, mode, .. }),
                    Kind::File {
                        size: s2,
                        mode: m2,
                        stamp: Some(now),
                        ..
                    },
                ) => !(size == s2 && mode == m2 && st.same_inode_unchanged(now)),
                _ => !c.source.as_ref().is_some_and(|s| s.same_as(&e.kind)),
            })
            .map(|(c, _)| c.path.as_str())
            .collect();
        if !bad.is_empty() {
            return Err(err!(
                "After the switch, {} path{} not match the plan: {}",
                bad.len(),
                if bad.len() == 1 { " does" } else { "s do" },
                bad.iter().take(5).copied().collect::<Vec<_>>().join(", ")
            ));
        }
        g.append(Record::Checked)
    }

    /// Mark complete; drop the backup unless asked to keep it; prune.
    pub fn commit(&self, g: &mut Generation, keep: Option<usize>) -> Result<Vec<String>> {
        g.append(Record::Complete)?;
        let _ = fs::remove_dir_all(g.dir.join("staging"));
        if !g.meta.backup {
            let _ = fs::remove_dir_all(g.dir.join("backup"));
        }
        match keep {
            // Never prune the generation just made.
            Some(n) => self.prune(n.max(1)),
            None => Ok(Vec::new()),
        }
    }

    /// Undo a generation, whatever state it is in. The backup folder is
    /// kept until [`State::finish_undo`] has verified the result.
    pub fn undo(&self, g: &mut Generation) -> Result<Undone> {
        let mut out = Undone::default();
        if g.status() == Status::RolledBack {
            return Ok(out);
        }
        if g.meta.digest != DIGEST {
            return Err(err!(
                hint = "roll it back with the overlay version that applied it (its agent stays in ~/.cache/overlay on the host)",
                "Generation {} in {} records {} digests; this overlay checks {DIGEST} and cannot verify it",
                g.meta.id,
                self.root.display(),
                g.meta.digest
            ));
        }
        if g.status() == Status::Complete && !g.meta.backup {
            return Err(err!(
                hint = "only generations applied with --backup can be rolled back",
                "Generation {} was applied without --backup; its old files were not kept",
                g.meta.id
            ));
        }
        g.append(Record::RollbackBegin)?;
        let undone = g.dir.join("undone");
        // Bytecode compiled from the new .py files since the switch would be
        // stale once the old ones are back (same size and mtime is possible):
        // remove it; the backup brings back the old bytecode.
        let journalled: BTreeSet<&str> = g
            .meta
            .changes
            .iter()
            .filter(|c| c.bytecode)
            .map(|c| c.path.as_str())
            .collect();
        for c in g
            .meta
            .changes
            .iter()
            .filter(|c| !c.bytecode && c.path.ends_with(".py"))
        {
            let target = self.target_path(&c.path)?;
            let (Some(dir), Some(stem)) = (
                target.parent(),
                c.path
                    .rsplit('/')
                    .next()
                    .and_then(|f| f.strip_suffix(".py")),
            ) else {
                continue;
            };
            let want = format!("{stem}.");
            for e in fs::read_dir(dir.join("__pycache__"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let name = e.file_name().to_string_lossy().into_owned();
                let rel = match c.path.rsplit_once('/') {
                    Some((d, _)) => format!("{d}/__pycache__/{name}"),
                    None => format!("__pycache__/{name}"),
                };
                if name.starts_with(&want)
                    && name.ends_with(".pyc")
                    && !journalled.contains(rel.as_str())
                {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        let records = g.records.clone();
        for r in records.iter().rev() {
            match r {
                Record::Place { i } => {
                    let c = &g.meta.changes[*i];
                    let target = self.target_path(&c.path)?;
                    let staged = g.dir.join("staging").join(i.to_string());
                    if !lexists(&staged) && lexists(&target) {
                        // A file edited since the apply is kept (in undone/), never lost.
                        if let Some(Kind::File {
                            blake3: Some(want), ..
                        }) = &c.source
                        {
                            let now =
                                crate::inventory::hash_file(&target, None, &Counters::default())
                                    .ok();
                            if now.is_some_and(|(_, h)| &h != want) {
                                out.edited.push(c.path.clone());
                            }
                        }
                        fs::create_dir_all(&undone).map_err(io("create the undo folder"))?;
                        fs::rename(&target, undone.join(i.to_string()))
                            .map_err(io(format_args!("remove {}", target.display())))?;
                        out.removed += 1;
                    }
                }
                Record::Move { i } => {
                    let c = &g.meta.changes[*i];
                    let target = self.target_path(&c.path)?;
                    let backup = self.backup_path(g, &c.path)?;
                    if c.bytecode && lexists(&backup) && lexists(&target) {
                        // Bytecode written since the switch, where the old one goes back.
                        let _ = fs::remove_file(&target);
                    }
                    if lexists(&backup) && !lexists(&target) {
                        if let Some(parent) = target.parent() {
                            fs::create_dir_all(parent)
                                .map_err(io(format_args!("re-create {}", parent.display())))?;
                        }
                        fs::rename(&backup, &target)
                            .map_err(io(format_args!("restore {}", target.display())))?;
                        out.restored += 1;
                    }
                }
                Record::Mkdir { dir } => {
                    let _ = fs::remove_dir(self.root.join(dir));
                }
                Record::Rmdir { dir, mode } => {
                    let d = self.root.join(dir);
                    if !lexists(&d) {
                        fs::DirBuilder::new()
                            .mode(*mode)
                            .create(&d)
                            .map_err(io(format_args!("re-create {}", d.display())))?;
                        let _ = fs::set_permissions(&d, fs::Permissions::from_mode(*mode));
                    }
                }
                _ => {}
            }
        }
        fsync_dir(&self.root.join(&self.venv.site_rel));
        g.append(Record::RolledBack)?;
        let _ = fs::remove_dir_all(g.dir.join("staging"));
        Ok(out)
    }

    /// Check an undone generation against the listing from before it; only
    /// then drop its backup (and the files taken out, unless edited since).
    pub fn finish_undo(&self, g: &Generation, undone: &Undone, counters: &Counters) -> Result<u64> {
        let n = self.verify_before(g, counters)?;
        let _ = fs::remove_dir_all(g.dir.join("backup"));
        if undone.edited.is_empty() {
            let _ = fs::remove_dir_all(g.dir.join("undone"));
        }
        Ok(n)
    }

    /// Compare the touched paths with the listing from before the apply.
    pub fn verify_before(&self, g: &Generation, counters: &Counters) -> Result<u64> {
        let text = fs::read(g.dir.join("before.json"))
            .map_err(io("read the listing from before the apply"))?;
        let before: Vec<Entry> =
            serde_json::from_slice(&text).map_err(|e| err!("before.json is damaged: {e}"))?;
        let paths: Vec<String> = before.iter().map(|e| e.path.clone()).collect();
        let hashed: Vec<bool> = before.iter().map(|e| e.kind.digest().is_some()).collect();
        let now = stat_mixed(&self.venv.root.to_string_lossy(), &paths, &hashed, counters)?;
        let bad: Vec<&str> = before
            .iter()
            .zip(&now)
            .filter(|(b, n)| !b.kind.restored_in(&n.kind))
            .map(|(b, _)| b.path.as_str())
            .collect();
        if !bad.is_empty() {
            return Err(err!(
                "After the rollback, {} path{} from before the apply: {}",
                bad.len(),
                if bad.len() == 1 {
                    " differs"
                } else {
                    "s differ"
                },
                bad.iter().take(5).copied().collect::<Vec<_>>().join(", ")
            )
            .hint(format!(
                "inspect these paths; the generation's journal is kept in {}",
                g.dir.display()
            )));
        }
        Ok(paths.len() as u64)
    }

    /// The unfinished generation, if any (at most one: the lock serializes).
    pub fn unfinished(&self) -> Result<Option<Generation>> {
        for id in self.generation_ids().into_iter().rev() {
            let g = self.load(&id)?;
            if !matches!(g.status(), Status::Complete | Status::RolledBack) {
                return Ok(Some(g));
            }
        }
        Ok(None)
    }

    /// Finish an interrupted generation: roll it back, or resume the switch
    /// when its files were all staged. Returns its id and what was done.
    pub fn recover(&self, resume: bool, counters: &Counters) -> Result<Option<(String, String)>> {
        let Some(mut g) = self.unfinished()? else {
            return Ok(None);
        };
        let id = g.meta.id.clone();
        let status = g.status();
        let rolling_back = g.records.contains(&Record::RollbackBegin);
        if resume && !rolling_back {
            if matches!(status, Status::Prepared) {
                return Err(err!(
                    hint = "run `overlay apply` without --resume: the interrupted generation is discarded, then applied anew",
                    "Generation {id} was interrupted while its files were still streaming; it cannot be resumed"
                ));
            }
            if matches!(status, Status::Staged | Status::Switching) {
                self.switch(&mut g)?;
            }
            self.check(&mut g, counters)?;
            self.commit(&mut g, None)?;
            return Ok(Some((
                id.clone(),
                format!("resumed and completed the interrupted generation {id}"),
            )));
        }
        if matches!(status, Status::Prepared | Status::Staged) {
            // Nothing in the venv changed: drop the generation entirely.
            fs::remove_dir_all(&g.dir).map_err(io(format_args!("remove {}", g.dir.display())))?;
            return Ok(Some((
                id.clone(),
                format!("discarded the interrupted generation {id} (nothing had been switched)"),
            )));
        }
        let undone = self.undo(&mut g)?;
        let n = self.finish_undo(&g, &undone, counters)?;
        let what = if rolling_back {
            "finished the interrupted rollback of"
        } else {
            "rolled back the interrupted generation"
        };
        Ok(Some((
            id,
            format!(
                "{what} {}; {n} paths match the listing from before it",
                g.meta.id
            ),
        )))
    }

    /// Roll back the newest complete generations down to and including `to`.
    pub fn rollback(&self, to: Option<&str>, counters: &Counters) -> Result<RollbackReport> {
        let mut report = RollbackReport::default();
        if let Some((id, msg)) = self.recover(false, counters)? {
            // An interrupted apply is what the user wants undone: stop there.
            report.generations.push(id);
            report.recovered = Some(msg);
            return Ok(report);
        }
        let live: Vec<String> = self
            .generation_ids()
            .into_iter()
            .filter(|id| self.load(id).is_ok_and(|g| g.status() == Status::Complete))
            .collect();
        let Some(newest) = live.last().cloned() else {
            return Err(err!(
                hint = "`overlay history HOST` lists generations",
                "Nothing to roll back in {}: no applied generation",
                self.root.display()
            ));
        };
        let to = to.map(str::to_string).unwrap_or(newest);
        if !live.contains(&to) {
            return Err(err!(
                hint = "`overlay history HOST` lists generations that can be rolled back",
                "Generation {to} is not an applied generation in {}",
                self.root.display()
            ));
        }
        for id in live.iter().rev() {
            let g = self.load(id)?;
            if !g.meta.backup {
                return Err(err!(
                    hint = "only generations applied with --backup can be rolled back",
                    "Generation {id} was applied without --backup; rollback stops before it"
                ));
            }
            if id == &to {
                break;
            }
        }
        for id in live.iter().rev() {
            let mut g = self.load(id)?;
            let undone = self.undo(&mut g)?;
            report.restored += undone.restored;
            report.removed += undone.removed;
            report.verified += self.finish_undo(&g, &undone, counters)?;
            if !undone.edited.is_empty() {
                report.kept_edited.push(format!(
                    "{} (edited since the apply; kept in {})",
                    undone.edited.join(", "),
                    g.dir.join("undone").display()
                ));
            }
            report.generations.push(id.clone());
            if id == &to {
                break;
            }
        }
        Ok(report)
    }

    pub fn history(&self) -> Result<Vec<GenerationInfo>> {
        self.generation_ids()
            .iter()
            .map(|id| self.load(id).map(|g| g.info()))
            .collect()
    }

    /// Keep the newest `keep` generations (of those not unfinished).
    pub fn prune(&self, keep: usize) -> Result<Vec<String>> {
        let ids: Vec<String> = self
            .generation_ids()
            .into_iter()
            .filter(|id| {
                self.load(id)
                    .is_ok_and(|g| matches!(g.status(), Status::Complete | Status::RolledBack))
            })
            .collect();
        let mut removed = Vec::new();
        if ids.len() > keep {
            for id in &ids[..ids.len() - keep] {
                let d = self.gen_dir(id);
                fs::remove_dir_all(&d).map_err(io(format_args!("remove {}", d.display())))?;
                removed.push(id.clone());
            }
        }
        Ok(removed)
    }

    /// Discard a prepared generation (nothing switched).
    pub fn discard(&self, g: Generation) -> Result<()> {
        fs::remove_dir_all(&g.dir).map_err(io(format_args!("remove {}", g.dir.display())))
    }
}

/// What an undo did.
#[derive(Debug, Default)]
pub struct Undone {
    pub restored: u64,
    pub removed: u64,
    /// Files the apply placed that were edited since; kept in `<generation>/undone/`.
    pub edited: Vec<String>,
}

/// An opened generation with its journal.
pub struct Generation {
    pub dir: PathBuf,
    pub meta: Meta,
    pub records: Vec<Record>,
}

impl Generation {
    /// Append records with one fsync, before the steps they name are taken.
    pub fn append_all(&mut self, rs: Vec<Record>) -> Result<()> {
        if rs.is_empty() {
            return Ok(());
        }
        let path = self.dir.join("journal");
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io(format_args!("open {}", path.display())))?;
        let mut lines = Vec::new();
        for r in &rs {
            serde_json::to_writer(&mut lines, r).expect("serializes");
            lines.push(b'\n');
        }
        f.write_all(&lines)
            .map_err(io(format_args!("write {}", path.display())))?;
        f.sync_data()
            .map_err(io(format_args!("sync {}", path.display())))?;
        self.records.extend(rs);
        crash_hook();
        Ok(())
    }

    /// Append a record and fsync before the step it names is taken.
    pub fn append(&mut self, r: Record) -> Result<()> {
        self.append_all(vec![r])
    }

    /// After staging: check the hashes the target computed while writing
    /// against those the source computed while reading, for files the plan
    /// had not hashed, and record them and the staged files' stamps
    /// (fsynced) for the checks after the switch.
    pub fn record_hashes(
        &mut self,
        written: &[crate::apply::Written],
        source: &[(usize, String)],
    ) -> Result<()> {
        let source: std::collections::HashMap<usize, &str> =
            source.iter().map(|(i, h)| (*i, h.as_str())).collect();
        let mut changed = false;
        for (i, digest, stamp) in written {
            let c = self
                .meta
                .changes
                .get_mut(*i)
                .ok_or_else(|| err!("no change {i} in the generation"))?;
            c.staged = Some(*stamp);
            changed = true;
            if let Some(Kind::File { blake3, .. }) = &mut c.source
                && blake3.is_none()
            {
                if source.get(i).copied() != Some(digest.as_str()) {
                    return Err(err!(
                        hint = "run `overlay apply` again; if it repeats, check the network and the source disk",
                        "{} arrived damaged: the target wrote blake3 {digest}, the source read {}",
                        c.path,
                        source.get(i).copied().unwrap_or("nothing")
                    ));
                }
                *blake3 = Some(digest.clone());
                changed = true;
            }
        }
        if changed {
            write_synced(
                &self.dir.join("meta.json"),
                &serde_json::to_vec_pretty(&self.meta).expect("serializes"),
            )?;
        }
        Ok(())
    }

    fn placed(&self, i: usize) -> bool {
        self.records.contains(&Record::Place { i })
    }

    pub fn status(&self) -> Status {
        let mut s = Status::Prepared;
        for r in &self.records {
            s = match r {
                Record::Prepared => Status::Prepared,
                Record::Staged => Status::Staged,
                Record::Move { .. }
                | Record::Place { .. }
                | Record::Mkdir { .. }
                | Record::Rmdir { .. } => Status::Switching,
                Record::Switched => Status::Switching,
                Record::Checked => Status::Switched,
                Record::Complete => Status::Complete,
                Record::RollbackBegin => Status::Switching,
                Record::RolledBack => Status::RolledBack,
            };
        }
        s
    }

    pub fn info(&self) -> GenerationInfo {
        let count = |a: Action| {
            self.meta
                .changes
                .iter()
                .filter(|c| c.action == a && !c.bytecode)
                .count() as u64
        };
        GenerationInfo {
            id: self.meta.id.clone(),
            created: self.meta.created,
            source: self.meta.source.clone(),
            adds: count(Action::Add),
            replaces: count(Action::Replace),
            deletes: count(Action::Delete),
            bytes: self
                .meta
                .changes
                .iter()
                .filter_map(|c| c.source.as_ref())
                .map(Kind::size)
                .sum(),
            backup_bytes: du(&self.dir.join("backup")),
            backup: self.meta.backup,
            status: self.status(),
        }
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

fn read_journal(path: &Path) -> Result<Vec<Record>> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(err!("Failed to read {}: {}", path.display(), io_cause(&e))),
    };
    let mut out = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        let line = line.map_err(io(format_args!("read {}", path.display())))?;
        // A torn last line (crash mid-write) is ignored: its step never started.
        match serde_json::from_str(&line) {
            Ok(r) => out.push(r),
            Err(_) => break,
        }
    }
    Ok(out)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).map_err(io(format_args!("create {}", path.display())))?;
    f.write_all(bytes)
        .map_err(io(format_args!("write {}", path.display())))?;
    f.sync_all()
        .map_err(io(format_args!("sync {}", path.display())))
}

/// Bytes free for an unprivileged... (root may use reserved blocks, but we don't count on it).
pub fn free_bytes(p: &Path) -> Result<u64> {
    let s = rustix::fs::statvfs(p)
        .map_err(|e| err!("Failed to read free space of {}: {e}", p.display()))?;
    Ok(s.f_bavail * s.f_frsize)
}

fn du(p: &Path) -> u64 {
    walkdir::WalkDir::new(p)
        .into_iter()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// `YYYYMMDDTHHMMSSZ` from seconds since the epoch (UTC).
pub fn format_time(secs: u64) -> String {
    let days = secs / 86400;
    let rem = secs % 86400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_format() {
        assert_eq!(format_time(0), "19700101T000000Z");
        assert_eq!(format_time(1_796_043_722), "20261130T130202Z");
    }
}
