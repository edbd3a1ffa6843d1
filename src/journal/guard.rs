//! Changes made after an apply, as rollback sees them. At commit, each
//! generation writes `after.json` ([`After`]): every `*.dist-info`
//! directory in site-packages right after the switch and the distributions
//! the generation touched (PEP 503 names: those with a dist-info among its
//! changes, or whose RECORD lists one of its paths). The files it placed are
//! already recorded in meta.json (type, size, mode, blake3 and the staged
//! inode's stamp).
//!
//! Before undoing, [`State::later_changes`] compares the venv with that:
//! files the generations placed that were modified or removed since, paths
//! they deleted that exist again, and dist-info directories of the touched
//! distributions added or removed since (pip ran). Bytecode is left out
//! (Python writes it). Distributions the generations did not touch are not
//! looked at. A generation from before after.json existed is not checked.
//!
//! With `--force`, after the undo, [`State::reconcile`] keeps one installed
//! version per distribution, as pip or uv would: a dist-info directory that
//! was not there before the apply (pip installed another version since) is
//! moved out of site-packages into `<generation>/displaced/`, together with
//! the files only its RECORD lists; then it names what is still not
//! consistent: a distribution with two dist-infos, files a restored
//! distribution's RECORD lists that are missing (pip removed them and the
//! apply had not changed them, so its backup does not hold them).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

use super::format::{Generation, Record};
use super::{State, fs_err, is_state, parent_of, stat_mixed};
use crate::beneath::normalize;
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::Counters;
use crate::model::{
    Action, ChangedFile, FileChange, Kind, LaterChanges, dist_of, in_pycache, venv_relative,
};

/// The listing taken right after an apply (`after.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct After {
    /// Every `*.dist-info` directory in site-packages (names).
    pub dist_infos: BTreeSet<String>,
    /// The distributions the generation touched (PEP 503 names).
    pub touched: BTreeSet<String>,
}

const AFTER: &str = "after.json";
/// The largest RECORD or after.json read.
const LIMIT: u64 = 64 << 20;

impl State {
    /// The `*.dist-info` directories in site-packages, by name.
    fn dist_infos(&self) -> BTreeSet<String> {
        let site = &self.venv.site_rel;
        self.fs
            .list(site)
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.ends_with(".dist-info"))
            .filter(|n| {
                self.fs
                    .kind(&format!("{site}/{n}"))
                    .ok()
                    .flatten()
                    .is_some_and(|k| k.is_dir())
            })
            .collect()
    }

    /// The paths (site-packages relative, bytecode left out) a dist-info's
    /// RECORD lists; empty when it cannot be read.
    fn record_of(&self, dist_info: &str) -> Vec<String> {
        let site = &self.venv.site_rel;
        let Ok(text) = self.fs.read(&format!("{site}/{dist_info}/RECORD"), LIMIT) else {
            return Vec::new();
        };
        crate::inventory::parse_record(&String::from_utf8_lossy(&text), site).unwrap_or_default()
    }

    /// Write after.json for a generation that is about to be committed.
    pub(super) fn write_after(&self, g: &Generation) -> Result<()> {
        let dist_infos = self.dist_infos();
        let changed: HashSet<&str> = g.meta.changes.iter().map(|c| c.path.as_str()).collect();
        let mut touched: BTreeSet<String> = g
            .meta
            .changes
            .iter()
            .filter_map(|c| c.path.split('/').next().and_then(dist_of))
            .collect();
        for d in &dist_infos {
            let Some(name) = dist_of(d) else { continue };
            if !touched.contains(&name)
                && self
                    .record_of(d)
                    .iter()
                    .any(|p| changed.contains(p.as_str()))
            {
                touched.insert(name);
            }
        }
        let after = After {
            dist_infos,
            touched,
        };
        g.fs.write_atomic(
            AFTER,
            &serde_json::to_vec(&after).expect("serializes"),
            0o600,
        )
        .map_err(|e| fs_err("write", &g.dir.join(AFTER), &e))
    }

    /// after.json of a generation; `None` for one from before it existed.
    pub(super) fn read_after(&self, g: &Generation) -> Result<Option<After>> {
        let text = match g.fs.read(AFTER, LIMIT) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(fs_err("read", &g.dir.join(AFTER), &e)),
        };
        serde_json::from_slice(&text).map(Some).map_err(|e| {
            err!(
                kind = Conflict,
                "{} of generation {} is damaged: {e}",
                g.dir.join(AFTER).display(),
                g.meta.id
            )
            .hint("`overlay rollback HOST --force` rolls back without comparing with it")
        })
    }

    /// What changed since the apply in `gens` (newest first): their files
    /// and the dist-infos of their distributions, against the listing after
    /// the newest. `None` when the newest has no after.json (made by an
    /// older overlay): such generations roll back unchecked, as before.
    pub(super) fn later_changes(
        &self,
        gens: &[Generation],
        counters: &Counters,
    ) -> Result<Option<(LaterChanges, After)>> {
        let Some(newest) = gens.first() else {
            return Ok(None);
        };
        let Some(after) = self.read_after(newest)? else {
            return Ok(None);
        };
        let mut touched = after.touched.clone();
        for g in &gens[1..] {
            if let Some(a) = self.read_after(g)? {
                touched.extend(a.touched);
            }
        }
        let mut later = LaterChanges {
            changed_files: self.changed_files(gens, counters)?,
            ..LaterChanges::default()
        };
        let now = self.dist_infos();
        let ours = |d: &&String| dist_of(d).is_some_and(|n| touched.contains(&n));
        later.dist_infos_added = now
            .difference(&after.dist_infos)
            .filter(ours)
            .cloned()
            .collect();
        later.dist_infos_removed = after
            .dist_infos
            .difference(&now)
            .filter(ours)
            .cloned()
            .collect();
        // A file inside a dist-info added or removed whole is told by that.
        let whole: HashSet<&str> = later
            .dist_infos_added
            .iter()
            .chain(&later.dist_infos_removed)
            .map(String::as_str)
            .collect();
        later
            .changed_files
            .retain(|f| !f.path.split('/').next().is_some_and(|d| whole.contains(d)));
        Ok(Some((later, After { touched, ..after })))
    }

    /// The generations' paths that differ from what they left: a file or
    /// symlink they placed, modified or gone; a path they deleted, there
    /// again. A path a newer generation changed counts for that one only.
    fn changed_files(&self, gens: &[Generation], counters: &Counters) -> Result<Vec<ChangedFile>> {
        let mut seen: HashSet<&str> = HashSet::new();
        // (path, what the apply left: Some(kind) placed, None deleted, staged stamp)
        let mut look: Vec<(&str, Option<&Kind>, Option<crate::model::FileStamp>)> = Vec::new();
        for g in gens {
            for (i, c) in g.meta.changes.iter().enumerate() {
                if !seen.insert(g.rels[i].as_str())
                    || c.bytecode
                    || in_pycache(&c.path)
                    || g.meta.asides.contains(&i)
                {
                    continue;
                }
                match &c.source {
                    Some(k @ (Kind::File { .. } | Kind::Symlink { .. })) if g.placed(i) => {
                        look.push((&c.path, Some(k), c.staged))
                    }
                    _ if c.action == Action::Delete => look.push((&c.path, None, None)),
                    _ => {}
                }
            }
        }
        let root = self.venv.root.to_string_lossy();
        let paths: Vec<String> = look.iter().map(|(p, ..)| p.to_string()).collect();
        let now = stat_mixed(&root, &paths, &vec![false; paths.len()], counters)?;
        let mut out = Vec::new();
        let mut rehash = Vec::new();
        for ((path, left, staged), e) in look.iter().zip(&now) {
            let change = match (left, &e.kind) {
                (None, Kind::Missing | Kind::Dir { .. } | Kind::ThroughSymlink { .. }) => None,
                (None, _) => Some(FileChange::Recreated),
                (Some(_), Kind::Missing) => Some(FileChange::Removed),
                (
                    Some(Kind::File { size, mode, .. }),
                    Kind::File {
                        size: s2,
                        mode: m2,
                        stamp: Some(t),
                        ..
                    },
                ) if size == s2 && mode == m2 => {
                    if !staged.is_some_and(|st| st.same_inode_unchanged(t)) {
                        rehash.push((path.to_string(), left.expect("placed")));
                    }
                    None
                }
                (Some(k), now) if k.same_as(now) => None,
                (Some(_), _) => Some(FileChange::Modified),
            };
            if let Some(change) = change {
                out.push(ChangedFile {
                    path: path.to_string(),
                    change,
                });
            }
        }
        if !rehash.is_empty() {
            let paths: Vec<String> = rehash.iter().map(|(p, _)| p.clone()).collect();
            let now = stat_mixed(&root, &paths, &vec![true; paths.len()], counters)?;
            for ((path, left), e) in rehash.into_iter().zip(now) {
                if !left.same_as(&e.kind) {
                    out.push(ChangedFile {
                        path,
                        change: FileChange::Modified,
                    });
                }
            }
        }
        out.sort_by(|a, b| (a.change, &a.path).cmp(&(b.change, &b.path)));
        Ok(out)
    }

    /// After a forced rollback of `gens` (newest first; `to` is the last):
    /// one dist-info per distribution the generations touched. A dist-info
    /// that was not there before the applies is moved, with the files only
    /// its RECORD lists, to `<to>/displaced/`. Returns what was moved, where,
    /// and what is still not consistent, in words.
    pub(super) fn reconcile(&self, gens: &[Generation], after: &After) -> Reconciled {
        let site = &self.venv.site_rel;
        let top = |dir: &str| -> Option<String> {
            dir.strip_prefix(&format!("{site}/"))
                .filter(|d| !d.contains('/') && d.ends_with(".dist-info"))
                .map(str::to_string)
        };
        // Before the applies: after the newest, less what they made, plus what they removed.
        let mut before = after.dist_infos.clone();
        for g in gens {
            for r in &g.records {
                match r {
                    Record::Mkdir { dir } => {
                        if let Some(d) = top(dir) {
                            before.remove(&d);
                        }
                    }
                    Record::Rmdir { dir, .. } => {
                        if let Some(d) = top(dir) {
                            before.insert(d);
                        }
                    }
                    _ => {}
                }
            }
        }
        let ours = |d: &String| dist_of(d).filter(|n| after.touched.contains(n));
        let mut by_dist: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for d in self.dist_infos() {
            if let Some(n) = ours(&d) {
                by_dist.entry(n).or_default().push(d);
            }
        }
        let generation_paths: HashSet<&str> = gens
            .iter()
            .flat_map(|g| g.meta.changes.iter().map(|c| c.path.as_str()))
            .collect();
        let mut out = Reconciled::default();
        let to = gens.last().expect("a generation");
        for (name, dirs) in by_dist {
            let (keep, extra): (Vec<String>, Vec<String>) =
                dirs.into_iter().partition(|d| before.contains(d));
            let kept_rows: HashSet<String> = keep.iter().flat_map(|d| self.record_of(d)).collect();
            let mut dirs = Vec::new();
            for d in extra {
                match self.displace(to, &d, &kept_rows, &generation_paths) {
                    Ok(()) => out.displaced.push(d),
                    Err(e) => {
                        out.problems
                            .push(format!("{d} ({name}) could not be moved out: {e}"));
                        dirs.push(d);
                    }
                }
            }
            dirs.extend(keep);
            dirs.sort();
            if dirs.len() > 1 {
                out.problems.push(format!(
                    "{name} has {} dist-info directories: {}",
                    dirs.len(),
                    dirs.join(", ")
                ));
            }
            for d in &dirs {
                let missing: Vec<String> = self
                    .record_of(d)
                    .into_iter()
                    .filter(|p| {
                        venv_relative(site, p)
                            .is_some_and(|r| !self.fs.lstat(&r).is_ok_and(|s| s.is_some()))
                    })
                    .collect();
                if !missing.is_empty() {
                    out.problems.push(format!(
                        "{d}: {} file{} its RECORD lists {} missing (pip removed {}; the apply had not changed {}, so no backup holds {}): {}{}",
                        missing.len(),
                        if missing.len() == 1 { "" } else { "s" },
                        if missing.len() == 1 { "is" } else { "are" },
                        if missing.len() == 1 { "it" } else { "them" },
                        if missing.len() == 1 { "it" } else { "them" },
                        if missing.len() == 1 { "it" } else { "them" },
                        missing.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
                        if missing.len() > 5 { ", ..." } else { "" }
                    ));
                }
            }
        }
        if !out.displaced.is_empty() {
            out.to = Some(to.dir.join("displaced").display().to_string());
        }
        out
    }

    /// Move dist-info `d` and the files only its RECORD lists (not `kept`,
    /// not a generation's path, not inside the state folder) to
    /// `<g>/displaced/<venv-relative path>`.
    fn displace(
        &self,
        g: &Generation,
        d: &str,
        kept: &HashSet<String>,
        generation_paths: &HashSet<&str>,
    ) -> std::result::Result<(), String> {
        let site = &self.venv.site_rel;
        let prefix = format!("{d}/");
        for p in self.record_of(d) {
            if p.starts_with(&prefix) || kept.contains(&p) || generation_paths.contains(p.as_str())
            {
                continue;
            }
            let Some(rel) =
                venv_relative(site, &p).filter(|r| normalize(r).is_some() && !is_state(r))
            else {
                continue;
            };
            // Files and symlinks only: a directory may hold others' files.
            if self.fs.kind(&rel).ok().flatten().is_none_or(|k| k.is_dir()) {
                continue;
            }
            self.move_out(g, &rel).map_err(|e| format!("{p}: {e}"))?;
            // Directories this left empty (pip made them) go too.
            let mut dir = parent_of(&rel);
            while dir.starts_with(&format!("{site}/")) && self.fs.remove_dir(dir).is_ok() {
                dir = parent_of(dir);
            }
        }
        self.move_out(g, &format!("{site}/{d}"))
    }

    /// Move the venv entry `rel` to `<g>/displaced/<rel>`.
    fn move_out(&self, g: &Generation, rel: &str) -> std::result::Result<(), String> {
        let to = format!("displaced/{rel}");
        g.fs.create_dir_all(parent_of(&to), 0o700)
            .and_then(|()| self.fs.rename_noreplace(rel, &g.fs, &to))
            .map_err(|e| io_cause(&e))
    }
}

/// What [`State::reconcile`] did.
#[derive(Debug, Default)]
pub struct Reconciled {
    /// dist-info directories moved out.
    pub displaced: Vec<String>,
    /// Where they went.
    pub to: Option<String>,
    /// What is still not consistent, in words.
    pub problems: Vec<String>,
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::State;
    use super::super::tests_support::{Fx, New, apply};
    use crate::inventory::Counters;
    use crate::model::{Action, FileChange};

    fn write(p: &Path, data: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }

    fn record(fx: &Fx, dist_info: &str, paths: &[&str]) {
        let rows: String = paths.iter().map(|p| format!("{p},,\n")).collect();
        write(&fx.site().join(dist_info).join("RECORD"), &rows);
    }

    /// The case, in small: an apply replaced foo 1.0 by 2.0, then
    /// "pip" installed foo 3.0. Rollback refuses and changes nothing; forced,
    /// it restores 1.0, keeps what pip wrote over the generation's files in
    /// undone/, and moves 3.0's dist-info and its own files to displaced/:
    /// one dist-info per distribution. An untouched distribution changed by
    /// pip is not looked at.
    #[test]
    fn rollback_over_a_later_pip_install_is_refused_then_forced_to_one_version() {
        let fx = Fx::new();
        let site = fx.site();
        write(&site.join("foo.py"), "v1");
        write(
            &site.join("foo-1.0.dist-info/METADATA"),
            "Name: foo\nVersion: 1.0\n",
        );
        record(
            &fx,
            "foo-1.0.dist-info",
            &[
                "foo.py",
                "foo-1.0.dist-info/METADATA",
                "foo-1.0.dist-info/RECORD",
            ],
        );
        write(&site.join("bar.py"), "bar");
        record(
            &fx,
            "bar-1.0.dist-info",
            &["bar.py", "bar-1.0.dist-info/RECORD"],
        );
        let before = fx.tree();
        let rec2 = "foo.py,,\nfoo-2.0.dist-info/METADATA,,\nfoo-2.0.dist-info/RECORD,,\n";
        apply(
            &fx,
            &[
                ("foo.py", Action::Replace, Some(New::File(b"v2".to_vec()))),
                ("foo-1.0.dist-info/METADATA", Action::Delete, None),
                ("foo-1.0.dist-info/RECORD", Action::Delete, None),
                (
                    "foo-2.0.dist-info/METADATA",
                    Action::Add,
                    Some(New::File(b"Name: foo\nVersion: 2.0\n".to_vec())),
                ),
                (
                    "foo-2.0.dist-info/RECORD",
                    Action::Add,
                    Some(New::File(rec2.as_bytes().to_vec())),
                ),
            ],
        )
        .unwrap();
        // An untouched distribution changed since: no reason to refuse.
        std::fs::remove_dir_all(site.join("bar-1.0.dist-info")).unwrap();
        write(&site.join("bar.py"), "bar 2");
        record(
            &fx,
            "bar-2.0.dist-info",
            &["bar.py", "bar-2.0.dist-info/RECORD"],
        );
        let state = State::open(&fx.v()).unwrap();
        let gens = vec![state.load(&state.generation_ids()[0]).unwrap()];
        let (later, _) = state
            .later_changes(&gens, &Counters::default())
            .unwrap()
            .unwrap();
        assert!(later.is_empty(), "{later:?}");
        // "pip install foo==3.0": uninstalls 2.0, installs 3.0 (foo.py and foo/extra.py).
        std::fs::remove_dir_all(site.join("foo-2.0.dist-info")).unwrap();
        write(&site.join("foo.py"), "v3");
        write(&site.join("foo/extra.py"), "extra");
        write(
            &site.join("foo-3.0.dist-info/METADATA"),
            "Name: foo\nVersion: 3.0\n",
        );
        record(
            &fx,
            "foo-3.0.dist-info",
            &[
                "foo.py",
                "foo/extra.py",
                "foo-3.0.dist-info/METADATA",
                "foo-3.0.dist-info/RECORD",
            ],
        );
        let after_pip = fx.tree();
        let r = state.rollback(None, false, &Counters::default()).unwrap();
        assert!(r.refused);
        let later = r.later.unwrap();
        let files: Vec<(&str, FileChange)> = later
            .changed_files
            .iter()
            .map(|f| (f.path.as_str(), f.change))
            .collect();
        assert_eq!(files, [("foo.py", FileChange::Modified)]);
        assert_eq!(later.dist_infos_added, ["foo-3.0.dist-info"]);
        assert_eq!(later.dist_infos_removed, ["foo-2.0.dist-info"]);
        assert_eq!(fx.tree(), after_pip, "a refused rollback changes nothing");
        // Forced.
        let r = state.rollback(None, true, &Counters::default()).unwrap();
        assert!(!r.refused && r.inconsistent.is_empty(), "{r:?}");
        assert_eq!(r.displaced, ["foo-3.0.dist-info"]);
        let g = fx
            .venv()
            .join(".overlay/generations")
            .join(&r.generations[0]);
        assert_eq!(
            std::fs::read_to_string(
                g.join("displaced")
                    .join(super::super::tests_support::SITE)
                    .join("foo/extra.py")
            )
            .unwrap(),
            "extra"
        );
        assert_eq!(
            std::fs::read_to_string(g.join("undone/0")).unwrap(),
            "v3",
            "pip's foo.py is kept"
        );
        let mut want = before;
        want.retain(|k, _| !k.contains("bar"));
        let mut now = fx.tree();
        now.retain(|k, _| !k.contains("bar"));
        assert_eq!(now, want);
    }

    /// With `--to`, every generation in the range is checked: a file the
    /// older one placed and no newer one changed, edited since, blocks it.
    #[test]
    fn a_change_to_an_older_generations_file_blocks_a_rollback_to_it() {
        let fx = Fx::new();
        write(&fx.site().join("a.py"), "a");
        write(&fx.site().join("b.py"), "b");
        let before = fx.tree();
        let old = apply(
            &fx,
            &[("a.py", Action::Replace, Some(New::File(b"a2".to_vec())))],
        )
        .unwrap();
        apply(
            &fx,
            &[("b.py", Action::Replace, Some(New::File(b"b2".to_vec())))],
        )
        .unwrap();
        write(&fx.site().join("a.py"), "edited");
        let state = State::open(&fx.v()).unwrap();
        // The newest alone does not touch a.py.
        let gens = vec![state.load(&state.generation_ids()[1]).unwrap()];
        let (later, _) = state
            .later_changes(&gens, &Counters::default())
            .unwrap()
            .unwrap();
        assert!(later.is_empty(), "{later:?}");
        let r = state
            .rollback(Some(&old), false, &Counters::default())
            .unwrap();
        assert!(r.refused);
        assert_eq!(r.generations.len(), 2);
        assert_eq!(r.later.unwrap().changed_files[0].path, "a.py");
        state
            .rollback(Some(&old), true, &Counters::default())
            .unwrap();
        assert_eq!(fx.tree(), before);
    }

    /// A path the generation deleted and pip re-created blocks the rollback;
    /// forced, the re-created file is kept in undone/ and the old one restored.
    #[test]
    fn a_re_created_path_blocks_and_is_kept_when_forced() {
        let fx = Fx::new();
        write(&fx.site().join("old.py"), "old");
        let before = fx.tree();
        apply(&fx, &[("old.py", Action::Delete, None)]).unwrap();
        write(&fx.site().join("old.py"), "pip's");
        let state = State::open(&fx.v()).unwrap();
        let r = state.rollback(None, false, &Counters::default()).unwrap();
        assert!(r.refused);
        assert_eq!(
            r.later.unwrap().changed_files[0].change,
            FileChange::Recreated
        );
        let r = state.rollback(None, true, &Counters::default()).unwrap();
        assert_eq!(fx.tree(), before);
        assert!(r.kept_edited[0].contains("old.py"), "{r:?}");
    }
}
