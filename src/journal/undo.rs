//! Undo of one generation, whatever state it is in: bytecode compiled from
//! its new files since the switch is removed, the entries it placed are
//! removed (on several threads: each step only takes out its own path),
//! then the rest of its journal is walked backwards; each step is undone
//! only if the file system shows it took effect (so an undo can itself be
//! interrupted and run again). A placed file is removed without being read
//! when its inode and mtime are still the ones staged. A file
//! edited since the apply is kept in `<generation>/undone/`, never lost;
//! so is, when forced, an entry made since where an old one goes back.
//! The result is then checked against before.json before the backup goes.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::format::{DIGEST, Generation, Record, read_before};
use super::{State, parent_of, stat_mixed};
use crate::beneath::is_refused;
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::Counters;
use crate::model::{Kind, Status};

/// One undo step's failure, in words: the path and why.
fn step_failure(what: &str, e: &std::io::Error) -> String {
    let cause = if is_refused(e) {
        "a symlink in its path was refused".to_string()
    } else {
        io_cause(e)
    };
    format!("{what} ({cause})")
}

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
        force: bool,
        out: &mut Undone,
    ) -> std::io::Result<()> {
        match r {
            // Done before every other record's undo (`undo_places`).
            Record::Place { .. } => Ok(()),
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

    /// Undo `Place` of change `i`: remove the placed entry from the venv,
    /// or, when it is not what the apply placed, take it out into
    /// `undone/`, noting a file edited since the apply.
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
        let staged = format!("staging/{i}");
        if g.fs.exists(&staged) {
            // Placed by the no-replace fallback's link(2), cut before its
            // unlink of the staged name: the same inode under both names.
            // The venv's name goes; the staged one stays.
            let (a, b) = (g.fs.lstat(&staged), self.fs.lstat(rel));
            if let (Ok(Some(a)), Ok(Some(b))) = (a, b)
                && (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
            {
                self.fs.remove_file(rel)?;
                out.removed += 1;
            }
            return Ok(());
        }
        if !self.fs.exists(rel) || restored_already {
            return Ok(());
        }
        let unchanged = match &c.source {
            Some(Kind::File {
                blake3: Some(want), ..
            }) => match self.fs.lstat(rel)? {
                Some(st) if rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() => {
                    // The inode the switch put in place, not modified since
                    // (its stamp as staged), holds the staged bytes: it is
                    // not read again, as the guard before the rollback
                    // trusts the same stamp. Any other file there is hashed.
                    let stamp = crate::inventory::stamp_of(&st);
                    if c.staged.is_some_and(|s| s.same_inode_unchanged(&stamp)) {
                        true
                    } else {
                        let shown = self.shown(rel);
                        match crate::inventory::hash_file(&shown, None, &Counters::default()) {
                            Ok(h) if &h.blake3 == want => true,
                            Ok(_) => {
                                // Edited since the apply: kept, never lost.
                                out.edited.push(c.path.clone());
                                false
                            }
                            Err(_) => false,
                        }
                    }
                }
                _ => false,
            },
            Some(Kind::Symlink { target }) => self.fs.read_link(rel).is_ok_and(|t| &t == target),
            _ => false,
        };
        if unchanged {
            self.fs.remove_file(rel)?;
        } else {
            self.take_out(g, rel, &i.to_string())?;
        }
        out.removed += 1;
        Ok(())
    }

    /// Undo every `Place` of the generation, `places` newest first, on
    /// several threads: each only takes out an entry of its own path, so
    /// they need no order among themselves, and every other record's undo
    /// (restoring a backup, removing a directory the apply made) comes
    /// after them in [`State::undo_with`], as it would have walking the
    /// journal backwards. A step that fails is noted in `failed` (with
    /// its place in `places`); the test hook's stop ends the undo.
    fn undo_places(
        &self,
        g: &Generation,
        places: &[usize],
        moved: &HashSet<usize>,
        out: &mut Undone,
        failed: &mut Vec<(usize, String)>,
    ) -> Result<()> {
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let lanes = super::fs_lanes(places.len());
        let lane = || -> Result<(Undone, Vec<(usize, String)>)> {
            let mut mine = Undone::default();
            let mut bad = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(&i) = places.get(k) else { break };
                if let Err(e) = self.step_hook() {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                if let Err(e) = self.undo_place(g, i, moved, &mut mine) {
                    bad.push((k, step_failure(&g.meta.changes[i].path, &e)));
                }
            }
            Ok((mine, bad))
        };
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..lanes).map(|_| scope.spawn(lane)).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(err!(kind = Internal, "a rollback thread panicked"))
                    })
                })
                .collect()
        });
        for r in results {
            let (mine, bad) = r?;
            out.removed += mine.removed;
            out.restored += mine.restored;
            out.edited.extend(mine.edited);
            failed.extend(bad);
        }
        out.edited.sort();
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
        // Each place once: a switch cut inside a batch it had journalled
        // ahead, then resumed, journals a place again, and two threads
        // undoing the same place race (one finds it gone: ENOENT).
        let mut seen = HashSet::new();
        let places: Vec<usize> = records
            .iter()
            .rev()
            .filter_map(|r| match r {
                Record::Place { i } => Some(*i),
                _ => None,
            })
            .filter(|i| seen.insert(*i))
            .collect();
        let mut failed = Vec::new();
        self.undo_places(g, &places, &moved, &mut out, &mut failed)?;
        failed.sort();
        let mut failed: Vec<String> = failed.into_iter().map(|(_, m)| m).collect();
        for r in records.iter().rev() {
            if matches!(r, Record::Place { .. }) {
                continue;
            }
            self.step_hook()?;
            if let Err(e) = self.undo_step(g, r, force, &mut out) {
                let what = match r {
                    Record::Place { i } | Record::Move { i } => g.meta.changes[*i].path.clone(),
                    Record::Mkdir { dir } | Record::Rmdir { dir, .. } => dir.clone(),
                    _ => String::new(),
                };
                failed.push(step_failure(&what, &e));
            }
        }
        // Every rename back durable before `RolledBack`: one syncfs, or an
        // fsync of each directory it touched (`journal::durable`).
        self.sync_changed_dirs(g, true);
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

#[cfg(test)]
mod tests {
    use super::super::State;
    use super::super::tests_support::{Fx, New, apply, change, request, stage, staged_a_and};
    use crate::inventory::Counters;
    use crate::model::Action;

    /// A switch interrupted after any step, resumed (`apply --resume`),
    /// then rolled back: the venv is as before, exactly.
    /// (It failed in about 6 runs of 10 while a place the resumed switch
    /// journalled twice was undone on two threads at once.)
    #[test]
    fn a_resumed_switch_rolls_back_exactly() {
        for k in 0..10 {
            let fx = Fx::new();
            std::fs::create_dir_all(fx.site().join("pkg/sub")).unwrap();
            std::fs::write(fx.site().join("pkg/a.py"), b"old a").unwrap();
            std::fs::write(fx.site().join("pkg/gone.py"), b"gone").unwrap();
            std::fs::write(fx.site().join("pkg/sub/s.py"), b"old s").unwrap();
            let before = fx.tree();
            let news = [
                Some(New::File(b"new a".to_vec())),
                None,
                Some(New::File(b"b".to_vec())),
                Some(New::File(b"new s".to_vec())),
            ];
            let changes = vec![
                change(&fx, "pkg/a.py", Action::Replace, news[0].as_ref()),
                change(&fx, "pkg/gone.py", Action::Delete, None),
                change(&fx, "pkg/new/b.py", Action::Add, news[2].as_ref()),
                change(&fx, "pkg/sub/s.py", Action::Replace, news[3].as_ref()),
            ];
            let state = State::open(&fx.v()).unwrap();
            let counters = Counters::default();
            let mut g = state.prepare(&request(&fx, changes), &counters).unwrap();
            stage(&mut g, &news);
            let asked = std::sync::atomic::AtomicUsize::new(0);
            let stop = || asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= k;
            let stopped = state.switch_unless(&mut g, &stop).unwrap().is_none();
            drop(g);
            if stopped {
                state.recover(true, &counters).unwrap();
            }
            let r = state.rollback(None, false, &counters);
            assert!(r.is_ok(), "stopped after {k} steps: {:?}", r.err());
            assert_eq!(fx.tree(), before, "stopped after {k} steps");
        }
    }

    /// The no-replace fallback places a file with link(2), then unlinks
    /// the staged name; a crash between the two leaves the staged inode
    /// under both names. Its undo must take the venv's name away (the
    /// crash states of tests/crash_states.rs on FUSE found it kept: the
    /// rollback left the new file in the venv, or the old one in backup).
    #[test]
    fn a_place_the_link_fallback_left_half_done_is_undone() {
        let fx = Fx::new();
        let (state, mut g, before) = staged_a_and(&fx, "pkg/b.py");
        let counters = Counters::default();
        state.switch(&mut g).unwrap();
        // Each place cut between its link and its unlink.
        for (i, p) in ["pkg/a.py", "pkg/b.py"].iter().enumerate() {
            let staged = g.dir.join("staging").join(i.to_string());
            std::fs::hard_link(fx.site().join(p), staged).unwrap();
        }
        drop(g);
        state.recover(false, &counters).unwrap();
        assert_eq!(fx.tree(), before);
    }

    /// Many files added in several new directories, with a symlink, are
    /// removed by the undo's threads and the directories after them; a file
    /// edited since the apply (forced past the guard) is kept in undone/
    /// and named, and one replaced since by a file of the same bytes is
    /// removed like the others.
    #[test]
    fn an_undo_removes_every_placed_file_on_its_threads_and_keeps_an_edited_one() {
        let fx = Fx::new();
        std::fs::write(fx.site().join("keep.py"), "keep").unwrap();
        let before = fx.tree();
        let mut list = Vec::new();
        for d in 0..8 {
            for f in 0..40 {
                let body = format!("{d}/{f}").into_bytes();
                list.push((format!("pkg{d}/sub/m{f}.py"), New::File(body)));
            }
        }
        list.push(("pkg0/link".to_string(), New::Link("sub/m0.py".into())));
        let changes: Vec<(&str, Action, Option<New>)> = list
            .iter()
            .map(|(p, n)| (p.as_str(), Action::Add, Some(n.clone())))
            .collect();
        apply(&fx, &changes).unwrap();
        std::fs::write(fx.site().join("pkg3/sub/m7.py"), "edited").unwrap();
        // Same bytes, another inode: hashed, found unchanged, removed.
        let p = fx.site().join("pkg5/sub/m1.py");
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, "5/1").unwrap();
        let state = State::open(&fx.v()).unwrap();
        let r = state.rollback(None, false, &Counters::default()).unwrap();
        assert!(r.refused, "{r:?}");
        let r = state.rollback(None, true, &Counters::default()).unwrap();
        assert_eq!(fx.tree(), before);
        assert_eq!(r.removed, 321, "{r:?}");
        assert_eq!(r.kept_edited.len(), 1, "{r:?}");
        assert!(
            r.kept_edited[0].starts_with("pkg3/sub/m7.py (changed since"),
            "{r:?}"
        );
        let undone = state.load(&r.generations[0]).unwrap().dir.join("undone");
        let kept: Vec<_> = std::fs::read_dir(&undone).unwrap().collect();
        assert_eq!(kept.len(), 1);
        let kept = kept[0].as_ref().unwrap().path();
        assert_eq!(std::fs::read(kept).unwrap(), b"edited");
    }
}
