//! The state folder of one venv, `<venv>/.overlay/`: opening it (the venv
//! root once, as a [`Beneath`]) and taking its lock, generation ids,
//! loading a generation, history, prune and discard. Also the receiving
//! end of a direct stream, which opens one prepared generation without
//! the lock. A user who may read but not write the state folder opens it
//! to read only ([`State::open_to_read`], for `history`): nothing is
//! created, and the lock is shared, or not taken when it cannot be opened.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::format::{Generation, read_journal, status_of};
use super::space::du;
use super::{GENERATIONS, State, fs_err, io, valid_id};
use crate::beneath::Beneath;
use crate::err;
use crate::error::Result;
use crate::inventory::Venv;
use crate::model::{GenerationInfo, STATE_DIR, Status};

/// A venv opened for its state: the venv, its canonical root, and the root
/// opened once for every path operation.
struct OpenedRoot {
    venv: Venv,
    root: PathBuf,
    fs: Beneath,
}

/// Open the venv at `venv_root` and its root directory.
fn open_root(venv_root: &str) -> Result<OpenedRoot> {
    let venv = Venv::open(venv_root)?;
    let root =
        std::fs::canonicalize(&venv.root).map_err(io(format_args!("resolve {venv_root}")))?;
    let fs = Beneath::open(&root).map_err(io(format_args!("open {}", root.display())))?;
    Ok(OpenedRoot { venv, root, fs })
}

/// Take the exclusive lock on `lock` (the state folder `dir`'s lock
/// file), waiting up to ten seconds for another overlay operation; `op`:
/// `NonBlockingLockShared` for a reader.
fn take_lock(lock: &File, dir: &Path, op: rustix::fs::FlockOperation) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match rustix::fs::flock(lock, op) {
            Ok(()) => return Ok(()),
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100))
            }
            Err(_) => {
                return Err(err!(
                    kind = Conflict,
                    hint = "wait for the other overlay apply or rollback to finish, then run again",
                    "Another overlay operation holds the lock on {}",
                    dir.display()
                ));
            }
        }
    }
}

/// The receiving end of a direct stream (`Request::Receive`): the prepared
/// generation `id` of the venv at `venv_root` (its `root` is the venv's). The lock
/// is held by the controller's own agent, which waits for this stream; this
/// side takes no lock but accepts only a generation that is prepared and
/// not yet staged into, so it never writes anywhere but an empty staging
/// folder of the venv's own state directory. One of several lanes
/// (`lane`) accepts a staging folder that others fill at the same time,
/// only if the agent holding the lock opened the generation to that many
/// ([`Generation::open_lanes`]).
pub fn open_for_receive(venv_root: &str, id: &str, lane: Option<u32>) -> Result<Generation> {
    let bad = || {
        err!(
            kind = Protocol,
            hint =
                "this request comes only from overlay's own source agent during `apply --direct`",
            "No prepared generation {id:?} to receive into in {venv_root}"
        )
    };
    if !valid_id(id) {
        return Err(bad());
    }
    let OpenedRoot { venv, root, fs } = open_root(venv_root)?;
    let g = Generation::open(&venv, &fs, &root, id).map_err(|_| bad())?;
    let ready = match lane {
        None => g.fs.is_empty_dir("staging").unwrap_or(false),
        Some(k) => g.lanes().is_some_and(|n| k < n),
    };
    if g.status() != Status::Prepared || !ready {
        return Err(bad());
    }
    Ok(g)
}

/// The file of a generation that says how many lanes may fill its staging
/// folder at once.
const LANES: &str = "lanes";

impl Generation {
    /// Let `count` receiving agents (`Receive` with a lane) fill this
    /// prepared generation's staging folder side by side. Called by the
    /// agent that holds the lock; what they stage is checked together
    /// afterwards (`StagedDirect`).
    pub fn open_lanes(&self, count: u32) -> Result<()> {
        if self.status() != Status::Prepared {
            return Err(err!(
                kind = Protocol,
                "generation {} is not prepared: its lanes cannot be opened",
                self.meta.id
            ));
        }
        self.fs
            .write_atomic(LANES, count.to_string().as_bytes(), 0o600)
            .map_err(|e| fs_err("write", &self.dir.join(LANES), &e))
    }

    /// How many lanes this generation was opened to, if any.
    fn lanes(&self) -> Option<u32> {
        let bytes = self.fs.read(LANES, 16).ok()?;
        std::str::from_utf8(&bytes).ok()?.trim().parse().ok()
    }
}

impl State {
    /// Open (creating) the state directory and take its lock.
    pub fn open(venv_root: &str) -> Result<State> {
        let OpenedRoot { venv, root, fs } = open_root(venv_root)?;
        let dir = root.join(STATE_DIR);
        fs.create_dir_all(GENERATIONS, 0o700).map_err(|e| {
            fs_err("create", &dir.join("generations"), &e).hint(format!(
                "{} must be overlay's own directory; move whatever is there aside",
                dir.display()
            ))
        })?;
        let lock = fs
            .open_append(".overlay/lock", 0o600)
            .map_err(|e| fs_err("open", &dir.join("lock"), &e))?;
        take_lock(
            &lock,
            &dir,
            rustix::fs::FlockOperation::NonBlockingLockExclusive,
        )?;
        Ok(State {
            venv,
            root,
            fs,
            dir,
            _lock: Some(lock),
            stop_after: AtomicU64::new(u64::MAX),
        })
    }

    /// Open the state directory to read it only, for a user who may not
    /// write it (`history` without sudo): nothing is created (a venv
    /// without one has no generations); the lock is taken shared, so no
    /// apply or rollback runs meanwhile, or, when this user may not open
    /// the lock file, not at all (such a reader cannot hold writers off;
    /// a generation changing as it is read is listed as damaged). Never
    /// used for anything that writes.
    pub fn open_to_read(venv_root: &str) -> Result<State> {
        let OpenedRoot { venv, root, fs } = open_root(venv_root)?;
        let dir = root.join(STATE_DIR);
        match fs.list(GENERATIONS) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fs_err("read", &dir.join("generations"), &e)),
        }
        let lock = match fs.open_read(".overlay/lock") {
            Ok(lock) => {
                take_lock(
                    &lock,
                    &dir,
                    rustix::fs::FlockOperation::NonBlockingLockShared,
                )?;
                Some(lock)
            }
            Err(_) => None,
        };
        Ok(State {
            venv,
            root,
            fs,
            dir,
            _lock: lock,
            stop_after: AtomicU64::new(u64::MAX),
        })
    }

    /// Test hook: the switch and undo stop with an error after `n` more steps.
    #[cfg(test)]
    pub(crate) fn stop_after(&self, n: u64) {
        self.stop_after.store(n, Ordering::SeqCst);
    }

    /// Count one switch or undo step against the test hook.
    pub(super) fn step_hook(&self) -> Result<()> {
        // One step at a time, whichever thread takes it.
        let taken = self
            .stop_after
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| match left {
                u64::MAX => Some(left),
                0 => None,
                n => Some(n - 1),
            });
        match taken {
            Ok(_) => Ok(()),
            Err(_) => Err(err!("stopped by the test hook")),
        }
    }

    /// A venv-relative path as shown in messages.
    pub(super) fn shown(&self, rel: &str) -> PathBuf {
        self.fs.shown(rel)
    }

    /// Generation `id`'s folder, for messages.
    pub(super) fn gen_dir(&self, id: &str) -> PathBuf {
        self.dir.join("generations").join(id)
    }

    /// Generation ids (directories with a meta.json or a journal), oldest first.
    pub fn generation_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .fs
            .list(GENERATIONS)
            .unwrap_or_default()
            .into_iter()
            .filter(|id| valid_id(id))
            .filter(|id| {
                self.fs.exists(&format!("{GENERATIONS}/{id}/meta.json"))
                    || self.fs.exists(&format!("{GENERATIONS}/{id}/journal"))
            })
            .collect();
        ids.sort();
        ids
    }

    /// Open generation `id` (validated); an id this agent never makes is
    /// refused before any path is built from it.
    pub fn load(&self, id: &str) -> Result<Generation> {
        if !valid_id(id) {
            return Err(err!(
                kind = Conflict,
                hint = "run `overlay history HOST` to list generations",
                "No generation {id:?} in {}",
                self.dir.display()
            ));
        }
        Generation::open(&self.venv, &self.fs, &self.root, id)
    }

    /// The status the journal alone gives (for a generation whose meta.json
    /// is damaged); `None` if the journal cannot be read either.
    pub(super) fn journal_status(&self, id: &str) -> Option<Status> {
        let fs = self.fs.dir(&format!("{GENERATIONS}/{id}")).ok()?;
        let records = read_journal(&fs).ok()?;
        Some(status_of(&records))
    }

    /// Every generation, oldest first; one whose state cannot be read is
    /// listed as damaged, with why.
    pub fn history(&self) -> Result<Vec<GenerationInfo>> {
        Ok(self
            .generation_ids()
            .iter()
            .map(|id| match self.load(id) {
                Ok(g) => g.info(),
                Err(e) => GenerationInfo {
                    id: id.clone(),
                    created: 0,
                    source: String::new(),
                    adds: 0,
                    replaces: 0,
                    deletes: 0,
                    bytes: 0,
                    backup_bytes: du(&self.gen_dir(id).join("backup"))
                        + du(&self.gen_dir(id).join("whole")),
                    backup: false,
                    versions: Vec::new(),
                    provenance: None,
                    machine: None,
                    durability: None,
                    status: Status::Damaged,
                    damaged: Some(format!(
                        "{}{}",
                        e.message,
                        e.hint.map(|h| format!(" ({h})")).unwrap_or_default()
                    )),
                },
            })
            .collect())
    }

    /// Keep the newest `keep` generations (of those not unfinished; a
    /// damaged one counts as finished when its journal says so).
    pub fn prune(&self, keep: usize) -> Result<Vec<String>> {
        let ids: Vec<String> = self
            .generation_ids()
            .into_iter()
            .filter(|id| {
                let status = match self.load(id) {
                    Ok(g) => Some(g.status()),
                    Err(_) => self.journal_status(id),
                };
                matches!(status, Some(Status::Complete | Status::RolledBack))
            })
            .collect();
        let mut removed = Vec::new();
        if ids.len() > keep {
            for id in &ids[..ids.len() - keep] {
                let dir = format!("{GENERATIONS}/{id}");
                // The journal, then meta.json, durably, before the rest: a
                // crash then leaves a generation that is whole, one that
                // recovery drops (no journal: nothing was switched), or a
                // leftover it removes, never one that claims a backup it
                // has lost part of (`remove_all` goes in the directory's
                // own order, which on ext4 is a hash of the names).
                for f in ["journal", "meta.json"] {
                    let _ = self.fs.remove_file(&format!("{dir}/{f}"));
                }
                if let Ok(d) = self.fs.dir(&dir) {
                    let _ = d.sync();
                }
                self.fs
                    .remove_all(&dir)
                    .map_err(|e| fs_err("remove", &self.gen_dir(id), &e))?;
                removed.push(id.clone());
            }
        }
        Ok(removed)
    }

    /// Remove the generation folders that hold neither `meta.json` nor a
    /// journal: what a discard leaves when an `apply --direct` receiver
    /// still wrote into the staging it was removing (the receiver works
    /// from the folder's fd), or a prepare cut off before its meta was
    /// written. Nothing of such a folder was ever switched, and the lock
    /// this state holds keeps a prepare from being halfway through one.
    pub fn remove_leftovers(&self) {
        for id in self.fs.list(GENERATIONS).unwrap_or_default() {
            let dir = format!("{GENERATIONS}/{id}");
            if made_id(&id)
                && !self.fs.exists(&format!("{dir}/meta.json"))
                && !self.fs.exists(&format!("{dir}/journal"))
            {
                let _ = self.fs.remove_all(&dir);
            }
        }
    }

    /// Discard a prepared generation (nothing switched).
    pub fn discard(&self, g: Generation) -> Result<()> {
        self.fs
            .remove_all(&format!("{GENERATIONS}/{}", g.meta.id))
            .map_err(|e| fs_err("remove", &g.dir, &e))
    }
}

/// Is `id` one that `prepare` makes (`20261206T084224Z-28ea`: a UTC time,
/// `-`, hex)? Only such folders are ever removed as leftovers.
fn made_id(id: &str) -> bool {
    let b = id.as_bytes();
    b.len() > 17
        && b[..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'T'
        && b[9..15].iter().all(u8::is_ascii_digit)
        && b[15] == b'Z'
        && b[16] == b'-'
        && b[17..].iter().all(u8::is_ascii_hexdigit)
}
