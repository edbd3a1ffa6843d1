//! The switch and what follows it: the staged entries are switched into
//! place in the journalled order (asides first, directories replaced or
//! deleted whole last), the journal written ahead of each batch of steps;
//! then every changed path is checked against the plan, and the generation
//! is committed (its backup dropped unless kept, old generations pruned).
//! A switch can be told to stop between two steps ([`State::switch_unless`]);
//! its caller then undoes it, so a Ctrl-C leaves the venv fully old.

use std::collections::{BTreeSet, HashSet};

use super::durable;
use super::format::{Generation, Record};
use super::{State, ancestors, crash_hook, fs_err, parent_of, stat_mixed};
use crate::beneath::DirCache;
use crate::err;
use crate::error::Result;
use crate::inventory::Counters;
use crate::model::{Action, Kind};

/// Whether `rel` and its backup are one inode: a link-then-unlink move
/// (`beneath::noreplace_fallback`, where the file system refuses
/// `RENAME_NOREPLACE`) that a crash cut short; moving it again finishes it.
fn half_moved(fs: &Dirs<'_>, rel: &str, backup: &str) -> bool {
    match (fs.venv.lstat(rel), fs.generation.lstat(backup)) {
        (Ok(Some(a)), Ok(Some(b))) => {
            (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
                && !rustix::fs::FileType::from_raw_mode(a.st_mode).is_dir()
        }
        _ => false,
    }
}

/// Switch steps whose journal records share one fsync, at first; each
/// batch after is twice the one before, up to [`SWITCH_BATCH_MAX`] (an
/// interrupted small switch has little to undo; a big one takes few fsyncs:
/// 17,857 steps in 8 instead of 70).
pub const SWITCH_BATCH: usize = 256;
/// The largest batch of switch steps.
pub const SWITCH_BATCH_MAX: usize = 4096;

/// `order` in batches of [`SWITCH_BATCH`], then twice as many, and so on up
/// to [`SWITCH_BATCH_MAX`].
fn batches(order: &[usize]) -> Vec<&[usize]> {
    let (mut out, mut rest, mut size) = (Vec::new(), order, SWITCH_BATCH);
    while !rest.is_empty() {
        let (batch, after) = rest.split_at(size.min(rest.len()));
        out.push(batch);
        rest = after;
        size = (size * 2).min(SWITCH_BATCH_MAX);
    }
    out
}

/// The directories a switch works in, each with its fds kept across steps.
struct Dirs<'a> {
    venv: DirCache<'a>,
    generation: DirCache<'a>,
}

/// One step of the switch, journalled before it is taken.
enum Step {
    /// Change `i`'s old entry to the backup.
    Move(usize),
    /// A missing parent directory.
    Mkdir(String),
    /// Change `i`'s staged entry into place.
    Place(usize),
}

/// A batch of the switch, planned: its journal records, made durable
/// together, then the steps they name.
struct Batch {
    records: Vec<Record>,
    steps: Vec<Step>,
}

impl State {
    /// The order of the switch: asides (files where a directory comes)
    /// first, then the ordinary changes in list order, then directories
    /// replaced or deleted whole, deepest first — after every planned
    /// change below them.
    fn switch_order(g: &Generation) -> Vec<usize> {
        let group = |i: usize| {
            let c = &g.meta.changes[i];
            if g.meta.asides.contains(&i) {
                0
            } else if c.action != Action::Add && matches!(c.target, Some(Kind::Dir { .. })) {
                2
            } else {
                1
            }
        };
        let mut order: Vec<usize> = (0..g.meta.changes.len()).collect();
        order.sort_by_key(|&i| {
            let depth = if group(i) == 2 {
                usize::MAX - g.rels[i].matches('/').count()
            } else {
                0
            };
            (group(i), depth, i)
        });
        order
    }

    /// Switch the staged files into place (or continue an interrupted switch).
    ///
    /// The journal is written ahead in batches: the records of a batch of
    /// steps ([`SWITCH_BATCH`] at first, growing to [`SWITCH_BATCH_MAX`])
    /// are made durable with one fsync, then the steps are taken. Undo and redo look at the file system to tell a recorded
    /// step that was taken from one that was not, so a crash anywhere in a
    /// batch is recovered like a crash between two single steps. Every step
    /// is made relative to a directory fd opened beneath the venv (or the
    /// generation) without following a symlink, kept across steps in a
    /// [`DirCache`] and dropped when a step moves it: a symlink in a parent
    /// chain fails the step, it is never followed.
    pub fn switch(&self, g: &mut Generation) -> Result<u64> {
        Ok(self.switch_unless(g, &|| false)?.unwrap_or_default())
    }

    /// [`State::switch`], looking at `stop` before every step (the agent's:
    /// the controller sent `Abort`, or went away): `Ok(None)` when it said
    /// stop, with the switch journalled up to the last step taken, for
    /// [`State::undo`] to undo.
    pub fn switch_unless(
        &self,
        g: &mut Generation,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<Option<u64>> {
        let order = Self::switch_order(g);
        let pause = PauseHook::from_env();
        let mut taken = 0;
        // Consecutive changes share their parents: each directory is opened
        // once for the whole switch, not once per step (a fifth of the
        // syscalls for a big switch).
        let gfs = g.fs.dir("").map_err(|e| fs_err("open", g.fs.path(), &e))?;
        let fs = Dirs {
            venv: DirCache::new(&self.fs),
            generation: DirCache::new(&gfs),
        };
        for batch in batches(&order) {
            if stop() {
                return Ok(None);
            }
            let Batch { records, steps } = self.plan_batch(g, &fs, batch);
            g.append_all(records)?;
            for step in steps {
                self.take_step(g, &fs, step)?;
                crash_hook();
                self.step_hook()?;
                taken += 1;
                pause.at(taken, stop);
                if stop() {
                    return Ok(None);
                }
            }
        }
        self.remove_emptied_dirs(g, &fs.venv)?;
        self.sync_changed_dirs(g, false);
        g.append(Record::Switched)?;
        Ok(Some(order.len() as u64))
    }

    /// The steps a batch of changes still needs, judged from the file
    /// system and what the batch's earlier steps will have done: move the
    /// old entry to the backup (unless it is there, or the new one was
    /// already placed), create missing parents (journalled, so that
    /// rollback removes them), place the staged entry.
    fn plan_batch(&self, g: &Generation, fs: &Dirs<'_>, batch: &[usize]) -> Batch {
        // What this batch's steps will have done, before they run.
        let mut made: HashSet<String> = HashSet::new();
        let mut gone: HashSet<String> = HashSet::new();
        let mut records = Vec::new();
        let mut steps = Vec::new();
        for &i in batch {
            let c = &g.meta.changes[i];
            let rel = g.rels[i].clone();
            let staged = format!("staging/{i}");
            let present = |r: &str, made: &HashSet<String>, gone: &HashSet<String>| {
                made.contains(r) || (!gone.contains(r) && fs.venv.exists(r))
            };
            if c.action != Action::Add
                && present(&rel, &made, &gone)
                && (!fs.generation.exists(&g.backup_rel(i))
                    || half_moved(fs, &rel, &g.backup_rel(i)))
                && !(c.action == Action::Replace && !fs.generation.exists(&staged) && g.placed(i))
            {
                records.push(Record::Move { i });
                steps.push(Step::Move(i));
                made.remove(&rel);
                gone.insert(rel.clone());
            }
            if c.action != Action::Delete && fs.generation.exists(&staged) {
                // Create missing parents, journalled so that rollback removes them.
                // Upward from the parent, to the first that is there.
                let up: Vec<&str> = ancestors(&rel).collect();
                let mut missing: Vec<&str> = up
                    .into_iter()
                    .rev()
                    .take_while(|a| !present(a, &made, &gone))
                    .collect();
                missing.reverse();
                for dir in missing {
                    records.push(Record::Mkdir {
                        dir: dir.to_string(),
                    });
                    gone.remove(dir);
                    made.insert(dir.to_string());
                    steps.push(Step::Mkdir(dir.to_string()));
                }
                records.push(Record::Place { i });
                steps.push(Step::Place(i));
                gone.remove(&rel);
                made.insert(rel);
            }
        }
        Batch { records, steps }
    }

    /// Take one journalled step, relative to the venv's and the
    /// generation's directory fds.
    fn take_step(&self, g: &Generation, fs: &Dirs<'_>, step: Step) -> Result<()> {
        match step {
            Step::Move(i) => {
                let rel = &g.rels[i];
                let backup = g.backup_rel(i);
                let parent = parent_of(&backup);
                fs.generation
                    .create_dir_all(parent, 0o700)
                    .map_err(|e| fs_err("create", &g.fs.shown(parent), &e))?;
                fs.venv
                    .rename_noreplace(rel, &fs.generation, &backup)
                    .map_err(|e| fs_err("move to the backup", &self.shown(rel), &e))?;
            }
            Step::Mkdir(dir) => {
                fs.venv
                    .create_dir(&dir, 0o755)
                    .map_err(|e| fs_err("create", &self.shown(&dir), &e))?;
            }
            Step::Place(i) => {
                let rel = &g.rels[i];
                fs.generation
                    .rename_noreplace(&format!("staging/{i}"), &fs.venv, rel)
                    .map_err(|e| fs_err("put in place", &self.shown(rel), &e))?;
            }
        }
        Ok(())
    }

    /// Remove directories the deletes left empty, deepest first, each
    /// journalled (`Rmdir`, with its mode) before it goes, through the
    /// switch's directory fds (`venv`), which drop each one removed.
    fn remove_emptied_dirs(&self, g: &mut Generation, venv: &DirCache<'_>) -> Result<()> {
        let site = &self.venv.site_rel;
        let mut dirs: BTreeSet<String> = BTreeSet::new();
        for (i, (c, rel)) in g.meta.changes.iter().zip(&g.rels).enumerate() {
            if c.action == Action::Delete && !g.meta.asides.contains(&i) {
                for a in ancestors(rel) {
                    if a.len() > site.len() && a.starts_with(&format!("{site}/")) {
                        dirs.insert(a.to_string());
                    } else if !site.starts_with(&format!("{a}/")) && a != site {
                        // A `bin/`-side path outside site-packages.
                        dirs.insert(a.to_string());
                    }
                }
            }
        }
        let mut dirs: Vec<String> = dirs.into_iter().collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.matches('/').count()));
        for dir in dirs {
            let Ok(Some(st)) = venv.lstat(&dir) else {
                continue;
            };
            if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir()
                || !self.fs.is_empty_dir(&dir).unwrap_or(false)
            {
                continue;
            }
            g.append(Record::Rmdir {
                dir: dir.clone(),
                mode: st.st_mode & 0o7777,
            })?;
            venv.remove_dir(&dir)
                .map_err(|e| fs_err("remove the empty directory", &self.shown(&dir), &e))?;
            self.step_hook()?;
        }
        Ok(())
    }

    /// Make the renames durable: every directory that gained or lost an
    /// entry. Where one `syncfs` vouches for them ([`durable::barrier`]:
    /// both file systems write back through it): one of the venv's file
    /// system and one of the generation's (when it is another), instead of
    /// an fsync per directory, each its own journal commit. Elsewhere
    /// (FUSE, NFS, unknown) an fsync of each directory. Either way this
    /// comes before the `Switched` record, and a crash before it is undone
    /// from the journal as before. An undo makes its renames durable the
    /// same way before its `RolledBack` record.
    pub(super) fn sync_changed_dirs(&self, g: &Generation, undo: bool) {
        use std::os::fd::AsFd;
        if durable::barrier(&[self.fs.as_fd(), g.fs.as_fd()]) == durable::Barrier::Syncfs {
            let venv = durable::sync_fs(&self.fs);
            let generation = if durable::device(&self.fs) == durable::device(&g.fs) {
                Ok(())
            } else {
                durable::sync_fs(&g.fs)
            };
            if venv.is_ok() && generation.is_ok() {
                return;
            }
        }
        // Every directory above a changed path: a parent the switch made
        // gained its entry in its own parent.
        let mut parents: BTreeSet<&str> = g.rels.iter().flat_map(|r| ancestors(r)).collect();
        parents.insert(&self.venv.site_rel);
        parents.insert("");
        let venv = || {
            for p in &parents {
                if let Ok(d) = self.fs.dir(p) {
                    let _ = d.sync();
                }
            }
        };
        // The generation's side: `staging/` lost entries, the backup's
        // folders gained them (and an undo's `undone/`).
        let backups: Vec<String> = (0..g.rels.len()).map(|i| g.backup_rel(i)).collect();
        let mut gen_dirs: BTreeSet<&str> = backups.iter().flat_map(|b| ancestors(b)).collect();
        gen_dirs.extend(["staging", "undone"]);
        let generation = || {
            for p in &gen_dirs {
                if let Ok(d) = g.fs.dir(p) {
                    let _ = d.sync();
                }
            }
            let _ = g.fs.sync();
        };
        // The side a file moved to first, then the side it left: where a
        // move is a link(2) then an unlink(2) (the no-replace fallback),
        // the name it lost must never be durable before the name it
        // gained, or a power cut between the two fsyncs loses the old file
        // (tests/crash_states.rs on bindfs found it). The switch moves old
        // files into the backup; an undo moves them back.
        if undo {
            venv();
            generation();
        } else {
            generation();
            venv();
        }
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
            .enumerate()
            .filter(
                |(i, (c, e))| match (c.action, &c.staged, &c.source, &e.kind) {
                    // A file moved aside for a directory: the directory is there.
                    (Action::Delete, ..) if g.meta.asides.contains(i) => {
                        !matches!(e.kind, Kind::Dir { .. })
                    }
                    // Gone, or beyond a symlink the list placed (no longer in the venv).
                    (Action::Delete, ..) => e.kind.exists() && self.fs.exists(&g.rels[*i]),
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
                },
            )
            .map(|(_, (c, _))| c.path.as_str())
            .collect();
        if !bad.is_empty() {
            return Err(err!(
                kind = Drift,
                "After the switch, {} path{} not match the plan: {}",
                bad.len(),
                if bad.len() == 1 { " does" } else { "s do" },
                bad.iter().take(5).copied().collect::<Vec<_>>().join(", ")
            ));
        }
        g.append(Record::Checked)
    }

    /// Write the listing after the apply (after.json), mark complete; drop
    /// the backup unless asked to keep it; prune.
    pub fn commit(&self, g: &mut Generation, keep: Option<usize>) -> Result<Vec<String>> {
        self.write_after(g)?;
        g.append(Record::Complete)?;
        let _ = g.fs.remove_all("staging");
        if !g.meta.backup {
            let _ = g.fs.remove_all("backup");
            let _ = g.fs.remove_all("whole");
        }
        match keep {
            // Never prune the generation just made.
            Some(n) => self.prune(n.max(1)),
            None => Ok(Vec::new()),
        }
    }
}

/// A test hook: `OVERLAY_TEST_PAUSE_AT=switch:N` makes the switch wait
/// after its N-th step until it is told to stop (at most two minutes),
/// having created the file `OVERLAY_TEST_PAUSE_MARK` to say it waits
/// (tests/interrupt.rs: a Ctrl-C in the middle of a switch).
struct PauseHook {
    at: Option<(u64, std::path::PathBuf)>,
}

impl PauseHook {
    fn from_env() -> PauseHook {
        let n = std::env::var("OVERLAY_TEST_PAUSE_AT")
            .ok()
            .and_then(|v| v.strip_prefix("switch:")?.parse::<u64>().ok());
        let mark = std::env::var_os("OVERLAY_TEST_PAUSE_MARK").map(std::path::PathBuf::from);
        PauseHook { at: n.zip(mark) }
    }

    fn at(&self, step: u64, stop: &(dyn Fn() -> bool + Sync)) {
        let Some((n, mark)) = &self.at else { return };
        if step != *n {
            return;
        }
        let _ = std::fs::write(mark, b"paused\n");
        let t = std::time::Instant::now();
        while !stop() && t.elapsed() < std::time::Duration::from_secs(120) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::State;
    use super::super::tests_support::{Fx, New, apply, change, history, request, rollback, stage};
    use super::{Record, SWITCH_BATCH, SWITCH_BATCH_MAX, batches};
    use crate::inventory::Counters;
    use crate::model::{Action, Status};

    /// A switch told to stop (Ctrl-C) after any number of steps stops there,
    /// and undo brings the venv back exactly.
    #[test]
    fn a_switch_told_to_stop_after_any_step_is_undone_exactly() {
        let mut stopped = 0;
        for k in 0..8 {
            let fx = Fx::new();
            std::fs::create_dir_all(fx.site().join("pkg")).unwrap();
            std::fs::write(fx.site().join("pkg/a.py"), b"old a").unwrap();
            std::fs::write(fx.site().join("pkg/gone.py"), b"gone").unwrap();
            let (before, beside) = (fx.tree(), fx.beside());
            let list = [
                (
                    "pkg/a.py",
                    Action::Replace,
                    Some(New::File(b"new a".to_vec())),
                ),
                ("pkg/gone.py", Action::Delete, None),
                ("pkg/new/b.py", Action::Add, Some(New::File(b"b".to_vec()))),
            ];
            let state = State::open(&fx.v()).unwrap();
            let changes = list
                .iter()
                .map(|(p, a, n)| change(&fx, p, *a, n.as_ref()))
                .collect();
            let counters = Counters::default();
            let mut g = state.prepare(&request(&fx, changes), &counters).unwrap();
            let news: Vec<Option<New>> = list.iter().map(|(_, _, n)| n.clone()).collect();
            stage(&mut g, &news);
            let asked = std::sync::atomic::AtomicUsize::new(0);
            let stop = || asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= k;
            match state.switch_unless(&mut g, &stop).unwrap() {
                None => {
                    let undone = state.undo(&mut g).unwrap();
                    state.finish_undo(&g, &undone, &counters).unwrap();
                    assert_eq!(fx.tree(), before, "stopped after {k} steps");
                    stopped += 1;
                }
                // More asks than steps: it finished.
                Some(n) => assert!(n >= 3 && k >= 5, "{k}: {n}"),
            }
            assert_eq!(fx.beside(), beside);
        }
        assert!(stopped >= 5, "stopped {stopped} times");
    }

    /// A crash between the `link` and the `unlink` of a move to the backup
    /// (the fallback where the file system refuses `RENAME_NOREPLACE`)
    /// leaves the old file under both names: resuming the switch finishes
    /// that move and the rest, and rollback restores the venv exactly.
    #[test]
    fn a_move_to_the_backup_cut_short_between_link_and_unlink_is_finished() {
        let fx = Fx::new();
        std::fs::create_dir_all(fx.site().join("pkg")).unwrap();
        std::fs::write(fx.site().join("pkg/a.py"), b"old a").unwrap();
        let (before, beside) = (fx.tree(), fx.beside());
        let list = [(
            "pkg/a.py",
            Action::Replace,
            Some(New::File(b"new a".to_vec())),
        )];
        let state = State::open(&fx.v()).unwrap();
        let changes = list
            .iter()
            .map(|(p, a, n)| change(&fx, p, *a, n.as_ref()))
            .collect();
        let counters = Counters::default();
        let mut g = state.prepare(&request(&fx, changes), &counters).unwrap();
        stage(&mut g, &[list[0].2.clone()]);
        // The journalled move, taken as far as its link.
        g.append(Record::Move { i: 0 }).unwrap();
        let backup = g.backup_rel(0);
        g.fs.create_dir_all(super::parent_of(&backup), 0o700)
            .unwrap();
        std::fs::hard_link(fx.site().join("pkg/a.py"), g.dir.join(&backup)).unwrap();
        state.switch_unless(&mut g, &|| false).unwrap().unwrap();
        assert_eq!(std::fs::read(fx.site().join("pkg/a.py")).unwrap(), b"new a");
        assert_eq!(std::fs::read(g.dir.join(&backup)).unwrap(), b"old a");
        let undone = state.undo(&mut g).unwrap();
        state.finish_undo(&g, &undone, &counters).unwrap();
        assert_eq!(fx.tree(), before);
        assert_eq!(fx.beside(), beside);
    }

    /// A directory replaced by a symlink: its planned children go to the
    /// backup first, then the directory whole (with unplanned `__pycache__`),
    /// then the link is placed; rollback puts the directory back whole.
    #[test]
    fn a_directory_replaced_by_a_symlink_moves_whole_and_comes_back_whole() {
        let fx = Fx::new();
        let sub = fx.site().join("pkg/sub");
        std::fs::create_dir_all(sub.join("__pycache__")).unwrap();
        std::fs::write(sub.join("mod.py"), b"old").unwrap();
        std::fs::write(sub.join("__pycache__/mod.cpython-311.pyc"), b"pyc").unwrap();
        let (before, beside) = (fx.tree(), fx.beside());
        apply(
            &fx,
            &[
                ("pkg/sub/mod.py", Action::Delete, None),
                (
                    "pkg/sub",
                    Action::Replace,
                    Some(New::Link("../../../../../payload".into())),
                ),
            ],
        )
        .unwrap();
        assert!(sub.symlink_metadata().unwrap().file_type().is_symlink());
        assert_eq!(fx.beside(), beside);
        let h = history(&fx).unwrap();
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].status, Status::Complete);
        rollback(&fx).unwrap();
        assert_eq!(fx.tree(), before);
        assert_eq!(fx.beside(), beside);
        assert_eq!(history(&fx).unwrap()[0].status, Status::RolledBack);
    }

    /// A file where the source has a directory (it lists files below it):
    /// the file goes to the backup, the directory is made; rollback undoes both.
    #[test]
    fn a_file_where_the_source_has_a_directory_goes_to_the_backup() {
        let fx = Fx::new();
        std::fs::create_dir_all(fx.site().join("pkg")).unwrap();
        std::fs::write(fx.site().join("pkg/data"), b"a file").unwrap();
        let (before, beside) = (fx.tree(), fx.beside());
        apply(
            &fx,
            &[
                (
                    "pkg/data/x.py",
                    Action::Add,
                    Some(New::File(b"new x".to_vec())),
                ),
                (
                    "pkg/data/y/z.py",
                    Action::Add,
                    Some(New::File(b"new z".to_vec())),
                ),
            ],
        )
        .unwrap();
        assert_eq!(
            std::fs::read(fx.site().join("pkg/data/y/z.py")).unwrap(),
            b"new z"
        );
        // Python ran meanwhile.
        std::fs::create_dir_all(fx.site().join("pkg/data/__pycache__")).unwrap();
        std::fs::write(
            fx.site().join("pkg/data/__pycache__/x.cpython-311.pyc"),
            b"c",
        )
        .unwrap();
        rollback(&fx).unwrap();
        assert_eq!(fx.tree(), before);
        assert_eq!(fx.beside(), beside);
        let h = history(&fx).unwrap();
        assert_eq!((h[0].adds, h[0].deletes), (2, 0), "{h:?}");
    }

    /// The switch's batches cover the order exactly, in order: 256 steps,
    /// then twice as many each time, never more than the largest batch.
    #[test]
    fn switch_batches_grow_and_cover_the_order_exactly() {
        for n in [0, 1, 255, 256, 257, 17_857, 40_000] {
            let order: Vec<usize> = (0..n).rev().collect();
            let b = batches(&order);
            assert_eq!(b.concat(), order, "{n} steps");
            let sizes: Vec<usize> = b.iter().map(|b| b.len()).collect();
            for (k, s) in sizes.iter().enumerate() {
                let full = (SWITCH_BATCH << k.min(4)).min(SWITCH_BATCH_MAX);
                assert!(
                    *s == full || k == sizes.len() - 1 && *s <= full,
                    "{sizes:?}"
                );
            }
        }
        assert_eq!(batches(&(0..17_857).collect::<Vec<_>>()).len(), 8);
    }
}
