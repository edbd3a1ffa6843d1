//! Prepare: check a change list against itself and the venv as it is now,
//! then open a new generation. The shape comes first: every change path is
//! a plain venv-relative path outside `.overlay`, named once; nothing is
//! written below a path the same list turns into a file or symlink (or
//! deletes as a directory), nor through a symlink in the tree; a file
//! standing where the list needs a directory becomes an *aside* change.
//! Then the preconditions: what the plan saw is still there (no drift) and
//! the new files fit on the file system. Only then is the generation
//! folder made, with before.json, meta.json and the `Prepared` record.

use std::collections::{BTreeSet, HashMap};

use super::format::{DIGEST, Generation, Meta, Record, validate, write_before, write_meta};
use super::space::free_bytes_at;
use super::{GENERATIONS, State, ancestors, fs_err, is_state, now, stat_mixed};
use crate::beneath::normalize;
use crate::err;
use crate::error::{Error, Result};
use crate::inventory::Counters;
use crate::model::{Action, Entry, GenChange, Kind, PrepareRequest};
use crate::text::format_time;

/// What the shape check adds to a change list it accepts.
struct Shapes {
    /// Aside changes to add: files standing where the list needs a directory.
    extra: Vec<GenChange>,
    /// Changes of the list itself that are asides: files it deletes where
    /// a directory comes.
    marked: BTreeSet<usize>,
}

/// A change list with the agent's asides in it.
struct ChangeList {
    changes: Vec<GenChange>,
    /// The indices of the aside changes.
    asides: Vec<usize>,
}

/// Each change's venv-relative path, and the change each path belongs to.
struct ChangePaths {
    rels: Vec<String>,
    index: HashMap<String, usize>,
}

/// The walk up each change's ancestors: what the tree holds at each (looked
/// up once), and what the walk found.
struct AncestorWalk<'a> {
    state: &'a State,
    seen: HashMap<String, Option<rustix::fs::FileType>>,
    /// See [`Shapes::marked`].
    marked: BTreeSet<usize>,
    /// Files standing where a directory is needed, in the order found.
    asides: Vec<String>,
}

/// How a kind reads in a refusal.
fn kind_name(k: &Option<Kind>) -> &'static str {
    match k {
        Some(Kind::Symlink { .. }) => "a symlink",
        Some(Kind::Dir { .. }) => "a directory",
        _ => "a file",
    }
}

impl AncestorWalk<'_> {
    /// Check change `i` against every proper ancestor of its path: in the
    /// change list, then in the tree.
    fn change(&mut self, changes: &[GenChange], paths: &ChangePaths, i: usize) -> Result<()> {
        let c = &changes[i];
        let writes = c.action != Action::Delete;
        // Once an ancestor is missing, so are those below it; the change
        // list is still checked against itself all the way down.
        let mut missing = false;
        for a in ancestors(&paths.rels[i]) {
            if let Some(&j) = paths.index.get(a) {
                // Deleted below a path that changes: moved to the backup
                // before it (see `switch_order`).
                if writes {
                    self.below_listed(c, j, &changes[j])?;
                }
                continue;
            }
            if missing {
                continue;
            }
            let kind = self.tree_kind(a)?;
            missing = self.below_existing(c, a, kind, writes)?;
        }
        Ok(())
    }

    /// `c` writes below `d` (change `j`), which the same list changes: only
    /// a file deleted where a directory comes allows it (an aside).
    fn below_listed(&mut self, c: &GenChange, j: usize, d: &GenChange) -> Result<()> {
        let how = match d.action {
            Action::Delete if !matches!(d.target, Some(Kind::Dir { .. })) => {
                // A file deleted where a directory comes.
                self.marked.insert(j);
                return Ok(());
            }
            Action::Delete => "deletes as a directory".to_string(),
            _ => format!("turns into {}", kind_name(&d.source)),
        };
        Err(err!(
            kind = Protocol,
            hint = "the source lists files below a path it has as a file or symlink (a RECORD naming paths through a symlink?); fix the source venv or leave these paths out of the manifest, then run `overlay plan` again",
            "Refusing the change list: {} would be written below {}, which the same change list {how}",
            c.path,
            d.path
        ))
    }

    /// What the tree holds at the venv-relative `a`, looked up once.
    fn tree_kind(&mut self, a: &str) -> Result<Option<rustix::fs::FileType>> {
        if let Some(k) = self.seen.get(a) {
            return Ok(*k);
        }
        let k = self.state.fs.kind(a).map_err(|e| {
            fs_err("look at", &self.state.shown(a), &e).hint(
                "overlay never writes through a symlink; replace the link with a directory or leave the path out",
            )
        })?;
        self.seen.insert(a.to_string(), k);
        Ok(k)
    }

    /// Check `c` against its ancestor `a`, which the tree holds as `kind`:
    /// a directory is fine, a file goes aside when `c` writes, anything
    /// else is refused. Returns whether `a` is missing from here down.
    fn below_existing(
        &mut self,
        c: &GenChange,
        a: &str,
        kind: Option<rustix::fs::FileType>,
        writes: bool,
    ) -> Result<bool> {
        match kind {
            None => Ok(true),
            Some(k) if k.is_dir() => Ok(false),
            Some(k) if k.is_symlink() => Err(err!(
                kind = Drift,
                hint = "overlay never writes through a symlink; replace the link with a directory or leave the path out",
                "Refusing to write {}: {} is a symlink",
                c.path,
                self.state.shown(a).display()
            )),
            Some(k) if writes && k.is_file() => {
                if !self.asides.iter().any(|x| x == a) {
                    self.asides.push(a.to_string());
                }
                Ok(true)
            }
            Some(_) => Err(err!(
                kind = Drift,
                hint = "move that file aside on the target, then run `overlay plan` again",
                "Refusing to write {}: {} is not a directory",
                c.path,
                self.state.shown(a).display()
            )),
        }
    }
}

/// The change list with the shape check's asides: the list's own marked
/// changes, then the new aside changes appended.
fn with_asides(changes: &[GenChange], shapes: Shapes) -> ChangeList {
    let mut changes = changes.to_vec();
    let mut asides: Vec<usize> = shapes.marked.into_iter().collect();
    asides.extend(changes.len()..changes.len() + shapes.extra.len());
    changes.extend(shapes.extra);
    ChangeList { changes, asides }
}

/// A new generation id: the time it was made, and 16 bits of the clock's
/// nanoseconds and the process id; always after `newest` (the newest id
/// there is), so that ids sort in the order generations were made even
/// when two come in one second (or the clock stepped back).
fn new_id(created: u64, newest: Option<&str>) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let id = format!(
        "{}-{:04x}",
        format_time(created),
        (nanos ^ std::process::id()) & 0xffff
    );
    let Some(newest) = newest.filter(|n| id.as_str() <= *n) else {
        return id;
    };
    match newest.rsplit_once('-') {
        Some((time, suffix)) => match u32::from_str_radix(suffix, 16) {
            Ok(n) if n < 0xffff && suffix.len() == 4 => format!("{time}-{:04x}", n + 1),
            _ => format!("{newest}-1"),
        },
        None => format!("{newest}-1"),
    }
}

/// Whether `need` bytes fit in `free` (plus a 16 MiB margin) on the file
/// system of `root`: a refusal if not; a warning (returned) where the
/// file system reports no size (`free` unknown, `f_blocks` 0), since "0
/// free" there means "not known", and a stage that fills the disk fails
/// before the venv is touched anyway.
fn space_verdict(root: &std::path::Path, need: u64, free: Option<u64>) -> Result<Option<String>> {
    let margin = 16 << 20;
    let Some(free) = free else {
        return Ok(Some(format!(
            "the file system of {} reports no size, so its free space is unknown: the apply needs {need} bytes; if it fills up while staging, nothing in the venv is changed",
            root.display()
        )));
    };
    if need + margin > free {
        return Err(err!(
            kind = Refused,
            hint = "free space on that file system, then run `overlay apply` again",
            "Not enough space for the apply in {}: {} bytes needed (plus {} margin), {} free",
            root.display(),
            need,
            margin,
            free
        ));
    }
    Ok(None)
}

/// The meta.json of a new generation. No setuid, setgid or sticky bit
/// comes in, whatever the plan says: the stage writes modes masked to
/// 0o777, and the check after the switch compares with these.
fn new_meta(req: &PrepareRequest, id: &str, created: u64, list: ChangeList) -> Meta {
    Meta {
        id: id.to_string(),
        created,
        source: req.source.clone(),
        target: req.target.clone(),
        plan_created: req.plan_created,
        backup: req.backup,
        same_owner: req.same_owner,
        versions: req.versions.clone(),
        provenance: req.provenance.clone(),
        machine: req.machine.clone(),
        durability: None,
        digest: DIGEST.into(),
        changes: list
            .changes
            .into_iter()
            .map(|mut c| {
                if let Some(Kind::File { mode, .. }) = &mut c.source {
                    *mode &= 0o777;
                }
                c
            })
            .collect(),
        asides: list.asides,
        shebang: req.shebang.clone(),
    }
}

/// The refusal for paths that changed since the plan.
fn drift_error(venv: &str, drift: &[String]) -> Error {
    let shown: Vec<&str> = drift.iter().take(5).map(String::as_str).collect();
    err!(
        kind = Drift,
        hint = "the target changed since the plan was made; run `overlay plan` again, then apply the new plan",
        "The target venv {} has drifted since the plan: {} path{} ({}{})",
        venv,
        drift.len(),
        if drift.len() == 1 {
            " differs"
        } else {
            "s differ"
        },
        shown.join(", "),
        if drift.len() > 5 { ", ..." } else { "" }
    )
}

impl State {
    /// A change's path relative to the venv root, or why it is refused.
    pub(super) fn change_rel(&self, path: &str) -> Result<String> {
        let (_, rel) = self.venv.resolve(path)?;
        if normalize(&rel).is_none() {
            return Err(err!(
                kind = Protocol,
                hint = "a RECORD or glob may only name files inside the venv",
                "path {path:?} is not a plain path inside the venv {}",
                self.root.display()
            ));
        }
        if is_state(&rel) {
            return Err(err!(
                kind = Protocol,
                hint = "a RECORD or glob must not name overlay's own state; leave the path out of the manifest (or fix the RECORD on the source)",
                "Refusing the change list: {path:?} is {}, overlay's own state",
                self.shown(&rel).display()
            ));
        }
        Ok(rel)
    }

    /// `rel` relative to site-packages, as change paths are written.
    fn site_relative(&self, rel: &str) -> String {
        match rel.strip_prefix(&format!("{}/", self.venv.site_rel)) {
            Some(r) => r.to_string(),
            None => {
                let up = self.venv.site_rel.split('/').count();
                format!("{}{rel}", "../".repeat(up))
            }
        }
    }

    /// Each change's venv-relative path; refuses a path outside the venv or
    /// inside `.overlay`, a write that brings no file or symlink, and two
    /// changes naming one path.
    fn change_paths(&self, changes: &[GenChange]) -> Result<ChangePaths> {
        let mut rels = Vec::with_capacity(changes.len());
        let mut index: HashMap<String, usize> = HashMap::new();
        for (i, c) in changes.iter().enumerate() {
            let rel = self.change_rel(&c.path)?;
            if c.action != Action::Delete
                && !matches!(c.source, Some(Kind::File { .. } | Kind::Symlink { .. }))
            {
                return Err(err!(
                    kind = Protocol,
                    hint = "run `overlay plan` again with this overlay build",
                    "Refusing the change list: {} brings no file or symlink",
                    c.path
                ));
            }
            if let Some(first) = index.insert(rel.clone(), i) {
                return Err(err!(
                    kind = Protocol,
                    hint = "two RECORD rows name one file; leave one of them out of the manifest",
                    "Refusing the change list: {} and {} are the same path {}",
                    changes[first].path,
                    c.path,
                    self.shown(&rel).display()
                ));
            }
            rels.push(rel);
        }
        Ok(ChangePaths { rels, index })
    }

    /// Check the shape of a change list against itself and the venv as it is
    /// now. Returns the aside changes to add (files standing where the list
    /// needs a directory) and the changes of the list to mark aside (deleted
    /// files where a directory comes).
    fn check_shapes(&self, changes: &[GenChange]) -> Result<Shapes> {
        let paths = self.change_paths(changes)?;
        let mut walk = AncestorWalk {
            state: self,
            seen: HashMap::new(),
            marked: BTreeSet::new(),
            asides: Vec::new(),
        };
        for i in 0..changes.len() {
            walk.change(changes, &paths, i)?;
        }
        let extra = walk
            .asides
            .iter()
            .map(|a| GenChange {
                path: self.site_relative(a),
                action: Action::Delete,
                source: None,
                target: None,
                bytecode: false,
                staged: None,
            })
            .collect();
        Ok(Shapes {
            extra,
            marked: walk.marked,
        })
    }

    /// Preconditions: what we replace or delete is as the plan saw it; what
    /// we add is absent. Hash only where the plan did (and the small
    /// bytecode files); elsewhere the stamp tells whether the file changed
    /// since the plan. An aside the agent added takes what is there as its
    /// target. Returns the listing from before the apply (before.json).
    fn check_drift(
        &self,
        venv: &str,
        list: &mut ChangeList,
        counters: &Counters,
    ) -> Result<Vec<Entry>> {
        let hashed: Vec<bool> = list
            .changes
            .iter()
            .map(|c| c.bytecode || c.target.as_ref().is_some_and(|t| t.digest().is_some()))
            .collect();
        let paths: Vec<String> = list.changes.iter().map(|c| c.path.clone()).collect();
        let now_entries = stat_mixed(venv, &paths, &hashed, counters)?;
        let mut drift = Vec::new();
        for (i, (c, e)) in list.changes.iter_mut().zip(&now_entries).enumerate() {
            if list.asides.contains(&i) && c.target.is_none() {
                // Added by the agent just now: what is there is what goes aside.
                c.target = Some(e.kind.clone());
                continue;
            }
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
            return Err(drift_error(venv, &drift));
        }
        Ok(now_entries)
    }

    /// Free space: new files are staged in full before anything is
    /// switched ([`space_verdict`]).
    fn check_space(&self, changes: &[GenChange]) -> Result<Option<String>> {
        let need: u64 = changes
            .iter()
            .filter(|c| c.action != Action::Delete)
            .map(|c| c.source.as_ref().map_or(0, Kind::size))
            .sum();
        let free = free_bytes_at(&self.fs, &self.root)?;
        // Test hook: OVERLAY_TEST_SKIP_SPACE_CHECK lets the disk fill up while staging.
        if std::env::var_os("OVERLAY_TEST_SKIP_SPACE_CHECK").is_some() {
            return Ok(None);
        }
        space_verdict(&self.root, need, free)
    }

    /// Make the folder of generation `meta.id` with an empty `staging/`,
    /// write before.json and meta.json, and journal `Prepared`.
    fn create_generation(&self, mut meta: Meta, before: &[Entry]) -> Result<Generation> {
        let id = meta.id.clone();
        let rel = format!("{GENERATIONS}/{id}");
        let dir = self.gen_dir(&id);
        // Not recursive: an existing directory of that name is an error, never reused.
        self.fs
            .create_dir(&rel, 0o700)
            .map_err(|e| fs_err("create", &dir, &e))?;
        let fs = self.fs.dir(&rel).map_err(|e| fs_err("open", &dir, &e))?;
        fs.create_dir("staging", 0o700)
            .map_err(|e| fs_err("create", &dir.join("staging"), &e))?;
        // What the stage and the switch will make durable, and how.
        meta.durability = Some(super::durable::durability(&self.fs, &fs));
        write_before(&fs, &dir, before)?;
        write_meta(&fs, &dir, &meta)?;
        // The generation's own entry, and those of the folders above it
        // (made by `State::open` the first time): durable before anything
        // in the venv changes. On ext4 the stage's `syncfs` covers them
        // too; where the barrier is an fsync per directory (FUSE, NFS)
        // nothing else does, and a power cut after the switch's renames
        // could lose the whole generation, its journal and its backup
        // (found by tests/crash_states.rs on bindfs).
        for parent in [GENERATIONS, super::STATE_DIR, ""] {
            self.fs
                .dir(parent)
                .and_then(|d| d.sync())
                .map_err(|e| fs_err("make durable", &self.root.join(parent), &e))?;
        }
        let rels = validate(&self.venv, &id, &meta, &[]).map_err(|p| err!("{p}"))?;
        let mut g = Generation {
            root: self.root.clone(),
            dir,
            fs,
            meta,
            records: Vec::new(),
            journal_len: 0,
            rels,
            warnings: Vec::new(),
        };
        g.append(Record::Prepared)?;
        Ok(g)
    }

    /// Open a new generation after checking the plan's preconditions.
    pub fn prepare(&self, req: &PrepareRequest, counters: &Counters) -> Result<Generation> {
        let shapes = self.check_shapes(&req.changes)?;
        let mut list = with_asides(&req.changes, shapes);
        let before = self.check_drift(&req.venv, &mut list, counters)?;
        let space = self.check_space(&list.changes)?;
        let created = now();
        let id = new_id(created, self.generation_ids().last().map(String::as_str));
        let mut g = self.create_generation(new_meta(req, &id, created, list), &before)?;
        g.warnings.extend(space);
        Ok(g)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests_support::{Fx, New, apply, history};
    use crate::model::Action;

    /// Too little space refuses; a file system that reports no size only
    /// warns.
    #[test]
    fn unknown_free_space_is_a_warning_not_a_refusal() {
        let root = std::path::Path::new("/v");
        let e = super::space_verdict(root, 100 << 20, Some(50 << 20)).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::Refused, "{e:?}");
        assert_eq!(
            super::space_verdict(root, 1 << 20, Some(1 << 30)).unwrap(),
            None
        );
        let w = super::space_verdict(root, 100 << 20, None)
            .unwrap()
            .unwrap();
        assert!(w.contains("reports no size") && w.contains("/v"), "{w}");
    }

    /// A generation folder with neither meta.json nor a journal (what a
    /// discard leaves while a `--direct` receiver still writes into its
    /// staging) goes with the next recovery; a real one stays.
    #[test]
    fn leftover_generation_folders_go_with_the_next_recovery() {
        let fx = Fx::new();
        let state = crate::journal::State::open(&fx.v()).unwrap();
        let gens = fx.venv().join(".overlay/generations");
        let ghost = gens.join(super::new_id(1_800_000_000, None));
        std::fs::create_dir_all(ghost.join("staging/pkg")).unwrap();
        std::fs::write(ghost.join("staging/pkg/x.py"), "x").unwrap();
        let real = gens.join(super::new_id(1_800_000_001, None));
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("meta.json"), "{}").unwrap();
        let odd = gens.join("not-an-id");
        std::fs::create_dir_all(&odd).unwrap();
        state.remove_leftovers();
        assert!(!ghost.exists());
        assert!(real.exists(), "the real one went");
        assert!(odd.exists(), "not an id");
    }

    /// A receiver without a lane takes only an empty staging folder; with
    /// one, only a generation its holder opened to more lanes than that.
    #[test]
    fn lanes_are_received_only_where_the_holder_opened_them() {
        use super::super::tests_support::{change, request};
        let fx = Fx::new();
        let state = crate::journal::State::open(&fx.v()).unwrap();
        let new = New::File(b"x = 1\n".to_vec());
        let changes = vec![
            change(
                &fx,
                "lib/python3.11/site-packages/a.py",
                Action::Add,
                Some(&new),
            ),
            change(
                &fx,
                "lib/python3.11/site-packages/b.py",
                Action::Add,
                Some(&new),
            ),
        ];
        let counters = crate::inventory::Counters::default();
        let g = state.prepare(&request(&fx, changes), &counters).unwrap();
        let id = g.meta.id.clone();
        let receive = |lane| crate::journal::open_for_receive(&fx.v(), &id, lane);
        assert!(receive(None).is_ok(), "an empty staging folder, no lane");
        assert!(receive(Some(0)).is_err(), "lanes not opened");
        g.open_lanes(2).unwrap();
        assert!(receive(Some(0)).is_ok() && receive(Some(1)).is_ok());
        assert!(receive(Some(2)).is_err(), "past the lanes opened");
        // One lane staged a file: the others go on, a receiver without a
        // lane is refused.
        std::fs::write(g.dir.join("staging/0"), "x = 1\n").unwrap();
        assert!(receive(Some(1)).is_ok());
        assert!(receive(None).is_err());
    }

    /// Two generations in one second (or after the clock stepped back)
    /// still sort in the order they were made.
    #[test]
    fn ids_sort_in_the_order_they_were_made() {
        let t = 1_800_000_000;
        let first = super::new_id(t, None);
        let second = super::new_id(t, Some(&first));
        assert!(second > first, "{second} after {first}");
        let third = super::new_id(t - 5, Some(&second));
        assert!(third > second, "{third} after {second}");
        assert!(crate::journal::valid_id(&third));
        let full = format!("{}-ffff", &first[..first.len() - 5]);
        let next = super::new_id(t, Some(&full));
        assert!(next > full && crate::journal::valid_id(&next), "{next}");
    }

    /// Issue 12, case 1: the source has `pkg/sub` as a symlink out of the
    /// venv and lists `pkg/sub/x` below it. Refused at prepare, naming both
    /// paths; nothing is written, inside or outside.
    #[test]
    fn writing_below_a_directory_that_becomes_a_symlink_is_refused_at_prepare() {
        let fx = Fx::new();
        std::fs::create_dir_all(fx.site().join("pkg/sub")).unwrap();
        std::fs::write(fx.site().join("pkg/sub/mod.py"), b"old").unwrap();
        std::fs::write(fx.outside().join("x"), b"outside x").unwrap();
        let (before, beside) = (fx.tree(), fx.beside());
        let link = New::Link("../../../../../outside".into());
        let e = apply(
            &fx,
            &[
                ("pkg/sub/mod.py", Action::Delete, None),
                ("pkg/sub", Action::Replace, Some(link)),
                (
                    "pkg/sub/x",
                    Action::Replace,
                    Some(New::File(b"evil".to_vec())),
                ),
            ],
        )
        .err()
        .map(|e| e.message);
        let e = e.expect("refused");
        assert!(e.contains("pkg/sub/x") && e.contains("pkg/sub,"), "{e}");
        assert_eq!(fx.tree(), before);
        assert_eq!(fx.beside(), beside);
        assert!(history(&fx).unwrap().is_empty());
    }

    /// Issue 12, case 2: a change path inside `.overlay` is refused at
    /// prepare, and nothing is written there.
    #[test]
    fn change_paths_into_overlays_own_state_are_refused() {
        let fx = Fx::new();
        for path in [
            "../../../.overlay/generations/20000101T000000Z-0000/journal",
            "../../../.overlay/lock",
            "../../../.overlay",
        ] {
            let e = apply(&fx, &[(path, Action::Add, Some(New::File(b"{}".to_vec())))])
                .err()
                .map(|e| e.message)
                .expect("refused");
            assert!(e.contains(".overlay"), "{e}");
            assert!(
                !fx.venv()
                    .join(".overlay/generations/20000101T000000Z-0000")
                    .exists()
            );
            assert!(history(&fx).unwrap().is_empty());
        }
    }
}
