//! Undo of one generation, whatever state it is in: bytecode compiled from
//! its new files since the switch is removed, then its journal is walked
//! backwards, each step undone only if the file system shows it took
//! effect (so an undo can itself be interrupted and run again). A file
//! edited since the apply is kept in `<generation>/undone/`, never lost;
//! so is, when forced, an entry made since where an old one goes back.
//! The result is then checked against before.json before the backup goes.

use std::collections::{BTreeSet, HashSet};

use super::format::{DIGEST, Generation, Record, read_before};
use super::{State, parent_of, stat_mixed};
use crate::beneath::is_refused;
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::Counters;
use crate::model::{Kind, Status};

/// What an undo did.
#[derive(Debug, Default)]
pub struct Undone {
    pub restored: u64,
    pub removed: u64,
    /// Files the apply placed that were edited since; kept in `<generation>/undone/`.
    pub edited: Vec<String>,
}

impl State {
    /// Remove bytecode compiled from the generation's new `.py` files since
    /// the switch: it would be stale once the old ones are back (same size
    /// and mtime is possible); the backup brings back the old bytecode.
    /// Bytecode the generation itself placed, replaced or deleted (carried
    /// with its `.py`, or stale) is the journal's to undo, not removed here.
    fn remove_new_bytecode(&self, g: &Generation) {
        let journalled: BTreeSet<&str> = g.rels.iter().map(|r| r.as_str()).collect();
        for (c, rel) in g.meta.changes.iter().zip(&g.rels) {
            if c.bytecode || !rel.ends_with(".py") {
                continue;
            }
            let (dir, file) = match rel.rsplit_once('/') {
                Some((d, f)) => (d, f),
                None => ("", rel.as_str()),
            };
            let Some(stem) = file.strip_suffix(".py") else {
                continue;
            };
            let cache = if dir.is_empty() {
                "__pycache__".to_string()
            } else {
                format!("{dir}/__pycache__")
            };
            let want = format!("{stem}.");
            for name in self.fs.list(&cache).unwrap_or_default() {
                let p = format!("{cache}/{name}");
                if name.starts_with(&want)
                    && name.ends_with(".pyc")
                    && !journalled.contains(p.as_str())
                {
                    let _ = self.fs.remove_file(&p);
                }
            }
        }
    }

    /// Take the entry `rel` out of the venv into the generation's `undone/`
    /// (never overwriting what is there). Returns where it went.
    fn take_out(&self, g: &Generation, rel: &str, name: &str) -> std::io::Result<String> {
        g.fs.create_dir_all("undone", 0o700)?;
        let mut n = 0;
        loop {
            let to = if n == 0 {
                format!("undone/{name}")
            } else {
                format!("undone/{name}.{n}")
            };
            match self.fs.rename_noreplace(rel, &g.fs, &to) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                r => return r.map(|()| to),
            }
        }
    }

    /// Undo one journal record. `moved`: the changes with a `Move` record.
    fn undo_step(
        &self,
        g: &Generation,
        r: &Record,
        moved: &HashSet<usize>,
        force: bool,
        out: &mut Undone,
    ) -> std::io::Result<()> {
        match r {
            Record::Place { i } => self.undo_place(g, *i, moved, out),
            Record::Move { i } => self.undo_move(g, *i, force, out),
            Record::Mkdir { dir } => self.undo_mkdir(g, dir, out),
            Record::Rmdir { dir, mode } if !self.fs.exists(dir) => {
                let mode = mode & 0o7777;
                self.fs.create_dir(dir, mode)?;
                self.fs.set_dir_mode(dir, mode)
            }
            _ => Ok(()),
        }
    }

    /// Undo `Place` of change `i`: take the placed entry out of the venv
    /// (into `undone/`), noting a file edited since the apply.
    fn undo_place(
        &self,
        g: &Generation,
        i: usize,
        moved: &HashSet<usize>,
        out: &mut Undone,
    ) -> std::io::Result<()> {
        let c = &g.meta.changes[i];
        let rel = &g.rels[i];
        // Not placed yet; or placed, taken out and the old entry
        // put back by an earlier, interrupted undo.
        let restored_already = moved.contains(&i) && g.backup_of(i).is_none();
        if g.fs.exists(&format!("staging/{i}")) || !self.fs.exists(rel) || restored_already {
            return Ok(());
        }
        // A file edited since the apply is kept (in undone/), never lost.
        if let Some(Kind::File {
            blake3: Some(want), ..
        }) = &c.source
            && self.fs.kind(rel)?.is_some_and(|k| k.is_file())
        {
            let now =
                crate::inventory::hash_file(&self.shown(rel), None, &Counters::default()).ok();
            if now.is_some_and(|h| &h.blake3 != want) {
                out.edited.push(c.path.clone());
            }
        }
        self.take_out(g, rel, &i.to_string())?;
        out.removed += 1;
        Ok(())
    }

    /// Undo `Move` of change `i`: put its old entry back from the backup
    /// where nothing stands (bytecode written since the switch gives way).
    fn undo_move(
        &self,
        g: &Generation,
        i: usize,
        force: bool,
        out: &mut Undone,
    ) -> std::io::Result<()> {
        let c = &g.meta.changes[i];
        let rel = &g.rels[i];
        let Some(backup) = g.backup_of(i) else {
            return Ok(());
        };
        if force && !c.bytecode && self.fs.exists(rel) {
            // Made since the apply (pip re-created it): kept, out of the way.
            self.take_out(g, rel, &i.to_string())?;
            out.edited.push(c.path.clone());
        }
        if c.bytecode
            && self
                .fs
                .kind(rel)
                .ok()
                .flatten()
                .is_some_and(|k| k.is_file())
        {
            // Bytecode written since the switch, where the old one goes back.
            let _ = self.fs.remove_file(rel);
        }
        if !self.fs.exists(rel) {
            let parent = parent_of(rel);
            if !parent.is_empty() {
                self.fs.create_dir_all(parent, 0o755)?;
            }
            g.fs.rename_noreplace(&backup, &self.fs, rel)?;
            out.restored += 1;
        }
        Ok(())
    }

    /// Undo `Mkdir`: remove the directory the apply made (and bytecode
    /// compiled into it); one that holds anything else is taken out whole.
    /// Gone already when a parent is no longer a directory: an undo run
    /// again after an interrupted one has put back the file the apply had
    /// moved aside for this directory's parent.
    fn undo_mkdir(&self, g: &Generation, dir: &str, out: &mut Undone) -> std::io::Result<()> {
        match self.fs.kind(dir) {
            Ok(Some(k)) if k.is_dir() => {}
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Ok(()),
            Err(e) => return Err(e),
        }
        // Bytecode compiled into a directory the apply made goes with it.
        let cache = format!("{dir}/__pycache__");
        if self
            .fs
            .list(&cache)
            .is_ok_and(|names| names.iter().all(|n| n.ends_with(".pyc")))
        {
            let _ = self.fs.remove_all(&cache);
        }
        match self.fs.remove_dir(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                // Something was made in it since: kept, out of the way.
                let to = self.take_out(g, dir, "dir")?;
                out.edited.push(format!("{dir}/ (now {to})"));
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Undo a generation, whatever state it is in. The backup folder is
    /// kept until [`State::finish_undo`] has verified the result. A step
    /// that fails does not stop the others; the undo then fails naming
    /// them, and can be run again.
    pub fn undo(&self, g: &mut Generation) -> Result<Undone> {
        self.undo_with(g, false)
    }

    /// [`State::undo`]; with `force`, an entry standing where an old one
    /// goes back (made since the apply) is first taken out into `undone/`.
    pub fn undo_with(&self, g: &mut Generation, force: bool) -> Result<Undone> {
        let mut out = Undone::default();
        if g.status() == Status::RolledBack {
            return Ok(out);
        }
        if g.meta.digest != DIGEST {
            return Err(err!(
                kind = Conflict,
                hint = "roll it back with the overlay version that applied it (its agent stays in ~/.cache/overlay on the host)",
                "Generation {} in {} records {} digests; this overlay checks {DIGEST} and cannot verify it",
                g.meta.id,
                self.root.display(),
                g.meta.digest
            ));
        }
        if g.status() == Status::Complete && !g.meta.backup {
            return Err(err!(
                kind = Conflict,
                hint = "a generation applied with --no-backup (or by an older overlay without --backup) kept no old files and cannot be rolled back; to restore its files, plan from a host that has the old versions",
                "Generation {} was applied with --no-backup; its old files were not kept",
                g.meta.id
            ));
        }
        g.append(Record::RollbackBegin)?;
        self.remove_new_bytecode(g);
        let records = g.records.clone();
        let moved: HashSet<usize> = records
            .iter()
            .filter_map(|r| match r {
                Record::Move { i } => Some(*i),
                _ => None,
            })
            .collect();
        let mut failed = Vec::new();
        for r in records.iter().rev() {
            self.step_hook()?;
            if let Err(e) = self.undo_step(g, r, &moved, force, &mut out) {
                let what = match r {
                    Record::Place { i } | Record::Move { i } => g.meta.changes[*i].path.clone(),
                    Record::Mkdir { dir } | Record::Rmdir { dir, .. } => dir.clone(),
                    _ => String::new(),
                };
                let cause = if is_refused(&e) {
                    "a symlink in its path was refused".to_string()
                } else {
                    io_cause(&e)
                };
                failed.push(format!("{what} ({cause})"));
            }
        }
        if let Ok(d) = self.fs.dir(&self.venv.site_rel) {
            let _ = d.sync();
        }
        if !failed.is_empty() {
            return Err(err!(
                "Rollback of generation {} in {} could not restore {} path{}: {}",
                g.meta.id,
                self.root.display(),
                failed.len(),
                if failed.len() == 1 { "" } else { "s" },
                failed.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
            )
            .hint(format!(
                "fix what blocks these paths (a symlink or file where a directory was?), then run `overlay rollback` again; the old files are kept in {}",
                g.dir.display()
            )));
        }
        g.append(Record::RolledBack)?;
        let _ = g.fs.remove_all("staging");
        Ok(out)
    }

    /// Check an undone generation against the listing from before it; only
    /// then drop its backup (and the files taken out, unless edited since).
    pub fn finish_undo(&self, g: &Generation, undone: &Undone, counters: &Counters) -> Result<u64> {
        let n = self.verify_before(g, counters)?;
        let _ = g.fs.remove_all("backup");
        let _ = g.fs.remove_all("whole");
        if undone.edited.is_empty() {
            let _ = g.fs.remove_all("undone");
        }
        Ok(n)
    }

    /// Compare the touched paths with the listing from before the apply.
    pub fn verify_before(&self, g: &Generation, counters: &Counters) -> Result<u64> {
        let file = g.dir.join("before.json");
        let damaged = |why: String| {
            err!(
kind = Conflict,
                "{} of generation {} is damaged: {why}",
                file.display(),
                g.meta.id
            )
            .hint(format!(
                "the rollback itself finished; compare the venv with {}/meta.json by hand, then move {} out of {}",
                g.dir.display(),
                g.dir.display(),
                self.dir.display()
            ))
        };
        let before = read_before(&g.fs).map_err(damaged)?;
        if before.iter().any(|e| self.change_rel(&e.path).is_err()) {
            return Err(damaged("it names a path outside the venv".into()));
        }
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
}
