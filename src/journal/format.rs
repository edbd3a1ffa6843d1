//! The on-disk format of one generation, `.overlay/generations/<id>/`:
//! the journal of [`Record`]s (JSON lines, appended and fsynced before the
//! step each names), meta.json ([`Meta`]: the change list, written whole at
//! prepare and again once the staged files' hashes are known) and
//! before.json (the listing of every changed path from before the apply).
//! [`Generation`] is one generation opened beneath the venv root: opening
//! it reads meta.json and the journal and validates both before anything
//! acts on them (a torn last journal line is a step that never started);
//! a damaged or planted file is an error naming the generation and the
//! file. The status of a generation is what its journal says.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::space::du;
use super::{GENERATIONS, crash_hook, fs_err, io, is_state};
use crate::beneath::{Beneath, normalize};
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::Venv;
use crate::model::{
    Action, Entry, GenChange, GenerationInfo, Kind, STATE_DIR, SourceHash, Status, Written,
    venv_relative,
};

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
    /// See [`crate::model::PrepareRequest::same_owner`].
    #[serde(default)]
    pub same_owner: bool,
    /// See [`crate::model::PrepareRequest::versions`]; none in older generations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<crate::model::Transition>,
    /// The content hash of every digest in this generation. Generations
    /// from before BLAKE3 have none recorded and used sha256.
    #[serde(default = "sha256_name")]
    pub digest: String,
    pub changes: Vec<GenChange>,
    /// Changes (indices) that are *asides*, set by the agent only: a file
    /// deleted so that a directory can take its place (the change list
    /// writes below it). After the switch each is a directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asides: Vec<usize>,
    /// See [`crate::model::PrepareRequest::shebang`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shebang: Option<crate::model::ShebangRewrite>,
    /// See [`crate::model::PrepareRequest::provenance`]; none in older generations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<crate::model::Provenance>,
    /// See [`crate::model::PrepareRequest::machine`]; none in older generations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<crate::model::Machine>,
    /// The file system and the barrier chosen at prepare
    /// (`journal::durable`); none in older generations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durability: Option<crate::model::Durability>,
}

/// The content hash this version writes and checks.
pub const DIGEST: &str = "blake3";

fn sha256_name() -> String {
    "sha256".into()
}

/// The largest meta.json or before.json read back.
const STATE_FILE_LIMIT: u64 = 1 << 30;

/// An opened generation with its journal.
pub struct Generation {
    /// The canonical venv root, for messages (and the stream's unpacker).
    pub root: PathBuf,
    /// Its directory's path, for messages (and the stream's unpacker).
    pub dir: PathBuf,
    /// Its directory, opened beneath the venv root: every state file,
    /// `staging/`, `backup/`, `whole/` and `undone/` go through it.
    pub fs: Beneath,
    pub meta: Meta,
    pub records: Vec<Record>,
    /// The journal's length up to the end of its last whole record, as
    /// read or appended: anything past it is a torn tail ([`read_journal`]),
    /// cut before the next append.
    pub(super) journal_len: u64,
    /// Each change's path relative to the venv root (validated).
    pub(super) rels: Vec<String>,
    /// What prepare could not check and the operator should hear (free
    /// space a file system does not report).
    pub warnings: Vec<String>,
}

/// The status a list of records gives.
pub(super) fn status_of(records: &[Record]) -> Status {
    let mut s = Status::Prepared;
    for r in records {
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

/// Check what was read back from a generation before anything acts on it:
/// each change path is a plain path inside the venv and outside `.overlay`,
/// each journalled index exists, each journalled directory is a plain
/// venv-relative path outside `.overlay`. Returns the changes' venv-relative
/// paths, or the first problem found (naming its file).
pub(super) fn validate(
    venv: &Venv,
    id: &str,
    meta: &Meta,
    records: &[Record],
) -> std::result::Result<Vec<String>, String> {
    let mut rels = Vec::with_capacity(meta.changes.len());
    let mut problem = None;
    if meta.id != id {
        problem = Some(format!("meta.json names generation {:?}", meta.id));
    }
    for (i, c) in meta.changes.iter().enumerate() {
        match venv_relative(&venv.site_rel, &c.path)
            .filter(|r| normalize(r).is_some() && !is_state(r))
        {
            Some(r) => rels.push(r),
            None => {
                problem.get_or_insert(format!(
                    "meta.json change {i} ({:?}) is not a path inside the venv outside .overlay",
                    c.path
                ));
                rels.push(String::new());
            }
        }
    }
    let n = meta.changes.len();
    if let Some(i) = meta.asides.iter().find(|&&i| i >= n) {
        problem.get_or_insert(format!("meta.json names aside {i}; it has {n} changes"));
    }
    for r in records {
        match r {
            Record::Move { i } | Record::Place { i } if *i >= n => {
                problem.get_or_insert(format!("the journal names change {i}; meta.json has {n}"));
            }
            Record::Mkdir { dir } | Record::Rmdir { dir, .. }
                if normalize(dir).is_none() || is_state(dir) =>
            {
                problem.get_or_insert(format!(
                    "the journal names the directory {dir:?}, not a path inside the venv outside .overlay"
                ));
            }
            _ => {}
        }
    }
    match problem {
        Some(p) => Err(p),
        None => Ok(rels),
    }
}

impl Generation {
    /// Open generation `id` of the venv whose root is `fs`, and validate it.
    pub(super) fn open(venv: &Venv, fs: &Beneath, root: &Path, id: &str) -> Result<Generation> {
        let rel = format!("{GENERATIONS}/{id}");
        let dir = root.join(&rel);
        let damaged = |why: String| {
            err!(kind = Conflict, "Generation {id} in {} is damaged: {why}", root.display()).hint(format!(
                "if its journal shows it never switched, any overlay command drops it; otherwise move {} out of {} (the old files of a switch are in its backup/ and whole/ folders), then run again",
                dir.display(),
                root.join(GENERATIONS).display()
            ))
        };
        let gfs = fs.dir(&rel).map_err(|e| {
            err!(
                kind = Conflict,
                hint = "run `overlay history HOST` to list generations",
                "No generation {id} in {}: {}",
                root.join(STATE_DIR).display(),
                io_cause(&e)
            )
        })?;
        let text = gfs
            .read("meta.json", STATE_FILE_LIMIT)
            .map_err(|e| damaged(format!("{}/meta.json: {}", dir.display(), io_cause(&e))))?;
        let meta: Meta = serde_json::from_slice(&text)
            .map_err(|e| damaged(format!("{}/meta.json: {e}", dir.display())))?;
        let (records, journal_len) = read_journal_len(&gfs)
            .map_err(|e| damaged(format!("{}/journal: {}", dir.display(), io_cause(&e))))?;
        let rels = validate(venv, id, &meta, &records)
            .map_err(|p| damaged(format!("{p} (in {})", dir.display())))?;
        Ok(Generation {
            root: root.to_path_buf(),
            dir,
            fs: gfs,
            meta,
            records,
            journal_len,
            rels,
            warnings: Vec::new(),
        })
    }

    /// Where change `i`'s old entry goes: a directory whole to
    /// `whole/<i>`, anything else to `backup/<venv-relative path>`.
    pub(super) fn backup_rel(&self, i: usize) -> String {
        if matches!(self.meta.changes[i].target, Some(Kind::Dir { .. })) {
            format!("whole/{i}")
        } else {
            format!("backup/{}", self.rels[i])
        }
    }

    /// Where change `i`'s old entry is now, if in the backup. (No fallback
    /// to `backup/<path>` for a directory: that folder may be the one
    /// holding its children's backups, never the directory itself.)
    pub(super) fn backup_of(&self, i: usize) -> Option<String> {
        let b = self.backup_rel(i);
        self.fs.exists(&b).then_some(b)
    }

    /// Append records with one fsync, before the steps they name are taken.
    ///
    /// A torn tail (the part of a record that a power cut, a kill or a full
    /// disk left without its end, or a hole where a lost page reads as
    /// zeros) is cut off first: [`read_journal`] stops at the first line
    /// that is not a whole record, so a record appended after it would
    /// never be read again (an undo's `RolledBack` lost that way left the
    /// generation `switching` for good; tests/crash_states.rs found it).
    /// Nothing past the last whole record was ever durable, so no step it
    /// names was taken.
    pub fn append_all(&mut self, rs: Vec<Record>) -> Result<()> {
        if rs.is_empty() {
            return Ok(());
        }
        let path = self.dir.join("journal");
        let mut f = self
            .fs
            .open_append("journal", 0o600)
            .map_err(|e| fs_err("open", &path, &e))?;
        let len = f
            .metadata()
            .map_err(io(format_args!("stat {}", path.display())))?
            .len();
        if len != self.journal_len {
            // Read again: another handle of this generation may have
            // appended whole records since this one read it.
            let (_, whole) =
                read_journal_len(&self.fs).map_err(io(format_args!("read {}", path.display())))?;
            if len > whole {
                f.set_len(whole)
                    .map_err(io(format_args!("cut the torn tail of {}", path.display())))?;
            }
            self.journal_len = whole;
        }
        let mut lines = Vec::new();
        for r in &rs {
            serde_json::to_writer(&mut lines, r).expect("serializes");
            lines.push(b'\n');
        }
        f.write_all(&lines)
            .map_err(io(format_args!("write {}", path.display())))?;
        f.sync_data()
            .map_err(io(format_args!("sync {}", path.display())))?;
        self.journal_len += lines.len() as u64;
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
    /// (meta.json replaced whole, durably) for the checks after the switch.
    pub fn record_hashes(&mut self, written: &[Written], source: &[SourceHash]) -> Result<()> {
        let source: HashMap<usize, &str> = source
            .iter()
            .map(|h| (h.index, h.blake3.as_str()))
            .collect();
        let mut changed = false;
        for Written {
            index: i,
            blake3: digest,
            stamp,
        } in written
        {
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
                        kind = Protocol,
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
            write_meta(&self.fs, &self.dir, &self.meta)?;
        }
        Ok(())
    }

    pub(super) fn placed(&self, i: usize) -> bool {
        self.records.contains(&Record::Place { i })
    }

    pub fn status(&self) -> Status {
        status_of(&self.records)
    }

    pub fn info(&self) -> GenerationInfo {
        let count = |a: Action| {
            self.meta
                .changes
                .iter()
                .enumerate()
                .filter(|(i, c)| c.action == a && !c.bytecode && !self.meta.asides.contains(i))
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
            backup_bytes: du(&self.dir.join("backup")) + du(&self.dir.join("whole")),
            backup: self.meta.backup,
            versions: self.meta.versions.clone(),
            provenance: self.meta.provenance.clone(),
            machine: self.meta.machine.clone(),
            durability: self.meta.durability.clone(),
            status: self.status(),
            damaged: None,
        }
    }
}

/// Write meta.json whole (temp, fsync, rename; mode 0600) in the
/// generation folder `fs`, shown as `dir`.
pub(super) fn write_meta(fs: &Beneath, dir: &Path, meta: &Meta) -> Result<()> {
    fs.write_atomic(
        "meta.json",
        &serde_json::to_vec_pretty(meta).expect("serializes"),
        0o600,
    )
    .map_err(|e| fs_err("write", &dir.join("meta.json"), &e))
}

/// Write before.json, the listing from before the apply, whole (mode 0600).
pub(super) fn write_before(fs: &Beneath, dir: &Path, before: &[Entry]) -> Result<()> {
    fs.write_atomic(
        "before.json",
        &serde_json::to_vec(before).expect("serializes"),
        0o600,
    )
    .map_err(|e| fs_err("write", &dir.join("before.json"), &e))
}

/// Read before.json back; the error says why it cannot be used.
pub(super) fn read_before(fs: &Beneath) -> std::result::Result<Vec<Entry>, String> {
    let text = fs
        .read("before.json", STATE_FILE_LIMIT)
        .map_err(|e| io_cause(&e))?;
    serde_json::from_slice(&text).map_err(|e| e.to_string())
}

/// The journal's records; a torn last line (a crash mid-write) is ignored:
/// its step never started. Absent: no records.
pub(super) fn read_journal(fs: &Beneath) -> std::io::Result<Vec<Record>> {
    read_journal_len(fs).map(|(records, _)| records)
}

/// The journal's records up to the first line that is not a whole record,
/// and the length of the journal up to there. A whole record ends with its
/// newline: a line without one was cut short (it and its fsync never
/// finished, so its step never started), even where what is there parses.
fn read_journal_len(fs: &Beneath) -> std::io::Result<(Vec<Record>, u64)> {
    let f = match fs.open_read("journal") {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let (mut out, mut len) = (Vec::new(), 0u64);
    let mut r = std::io::BufReader::new(f);
    let mut line = Vec::new();
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line)? == 0 || line.last() != Some(&b'\n') {
            break;
        }
        match serde_json::from_slice(&line) {
            Ok(rec) => out.push(rec),
            Err(_) => break,
        }
        len += line.len() as u64;
    }
    Ok((out, len))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::super::State;
    use super::super::tests_support::{
        Fx, New, apply, change, history, request, rollback, stage, staged_a_and,
    };
    use crate::inventory::Counters;
    use crate::model::{Action, Status};

    /// A planted (or damaged) journal whose directories point outside the
    /// venv is an error with a hint, never an action outside the venv; and
    /// `history` lists it as damaged.
    #[test]
    fn a_planted_journal_never_acts_outside_the_venv() {
        let fx = Fx::new();
        std::fs::write(fx.site().join("a.py"), b"a").unwrap();
        apply(
            &fx,
            &[("a.py", Action::Replace, Some(New::File(b"b".to_vec())))],
        )
        .unwrap();
        let id = "20000101T000000Z-0000";
        let g = fx.venv().join(".overlay/generations").join(id);
        std::fs::create_dir_all(&g).unwrap();
        let mut meta: serde_json::Value = serde_json::from_slice(
            &std::fs::read(
                fx.venv()
                    .join(".overlay/generations")
                    .join(&history(&fx).unwrap()[0].id)
                    .join("meta.json"),
            )
            .unwrap(),
        )
        .unwrap();
        meta["id"] = id.into();
        std::fs::write(g.join("meta.json"), meta.to_string()).unwrap();
        std::fs::write(
            g.join("journal"),
            concat!(
                "{\"op\":\"prepared\"}\n{\"op\":\"staged\"}\n",
                "{\"op\":\"mkdir\",\"dir\":\"../outside/dir\"}\n",
                "{\"op\":\"rmdir\",\"dir\":\"../outside/made\",\"mode\":511}\n",
            ),
        )
        .unwrap();
        let beside = fx.beside();
        let state = State::open(&fx.v()).unwrap();
        let e = state.recover(false, &Counters::default()).unwrap_err();
        assert!(
            e.message.contains(id) && e.message.contains("journal"),
            "{}",
            e.message
        );
        assert!(e.hint.is_some());
        drop(state);
        assert!(rollback(&fx).is_err());
        assert_eq!(fx.beside(), beside);
        let h = history(&fx).unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].status, Status::Damaged, "{h:?}");
        assert!(h[0].damaged.as_deref().unwrap().contains("../outside"));
        // The same through a meta.json change path.
        meta["changes"][0]["path"] = "../../../../outside/secret".into();
        std::fs::write(g.join("meta.json"), meta.to_string()).unwrap();
        std::fs::write(
            g.join("journal"),
            "{\"op\":\"prepared\"}\n{\"op\":\"staged\"}\n{\"op\":\"move\",\"i\":0}\n",
        )
        .unwrap();
        assert!(rollback(&fx).is_err());
        assert_eq!(fx.beside(), beside);
        assert_eq!(history(&fx).unwrap()[0].status, Status::Damaged);
    }

    /// Issue 12, case 3: state files are replaced whole (mode 0600); a
    /// damaged meta.json never wedges the venv: a generation that never
    /// switched is dropped, one that did is listed as damaged, and the
    /// error names the file and says what to do.
    #[test]
    fn a_damaged_meta_json_names_itself_and_never_wedges_the_venv() {
        let fx = Fx::new();
        std::fs::write(fx.site().join("a.py"), b"a").unwrap();
        let state = State::open(&fx.v()).unwrap();
        let counters = Counters::default();
        let news = [Some(New::File(b"b".to_vec()))];
        let changes = vec![change(&fx, "a.py", Action::Replace, news[0].as_ref())];
        let g = state
            .prepare(&request(&fx, changes.clone()), &counters)
            .unwrap();
        let meta = g.dir.join("meta.json");
        let mode = |p: &Path| p.metadata().unwrap().permissions().mode() & 0o777;
        assert_eq!(
            (mode(&meta), mode(&g.dir.join("before.json"))),
            (0o600, 0o600)
        );
        assert_eq!(mode(&g.dir), 0o700);
        // A crash mid-write of meta.json while staging (as the in-place rewrite could leave it).
        std::fs::write(&meta, b"{\"id\": \"trunc").unwrap();
        drop(g);
        let (id, msg) = state.recover(false, &counters).unwrap().unwrap();
        assert!(
            msg.contains("discarded") && msg.contains("meta.json"),
            "{msg}"
        );
        assert!(!fx.venv().join(".overlay/generations").join(&id).exists());
        // Mid-switch: listed as damaged, rollback names the file and the way out.
        let mut g = state.prepare(&request(&fx, changes), &counters).unwrap();
        stage(&mut g, &news);
        state.switch(&mut g).unwrap();
        std::fs::write(g.dir.join("meta.json"), b"").unwrap();
        drop(state);
        let h = history(&fx).unwrap();
        assert_eq!(h[0].status, Status::Damaged);
        let e = rollback(&fx).unwrap_err();
        assert!(
            e.message.contains("meta.json") && e.message.contains(&h[0].id),
            "{}",
            e.message
        );
        assert!(e.hint.unwrap().contains("move"));
    }

    /// A record cut short at the journal's end (a power cut before its
    /// fsync returned, a full disk, a kill inside a write) is a step that
    /// never started, and the next record appended goes after the last
    /// whole one: a rollback's `RolledBack` written after a torn tail was
    /// never read back, and the generation stayed `switching` with its
    /// undo run again each time (tests/crash_states.rs found it, resuming
    /// a switch cut in its removal of emptied folders). Each tail: part of
    /// a record; a page lost to zeros, then a record's end; a whole record
    /// without its newline.
    #[test]
    fn records_appended_after_a_torn_tail_are_read_back() {
        let tails: [&[u8]; 3] = [
            b"{\"op\":\"rmdir\",\"dir\":\"lib/pyth",
            b"\0\0\0\0\0\0\0\0ib/python3.11\",\"mode\":493}\n",
            b"{\"op\":\"mkdir\",\"dir\":\"lib/python3.11/site-packages/pkg/new\"}",
        ];
        for (t, tail) in tails.iter().enumerate() {
            for resume in [false, true] {
                let fx = Fx::new();
                let (state, mut g, before) = staged_a_and(&fx, "pkg/new/b.py");
                let counters = Counters::default();
                // Cut after its first step (the move of the old a.py).
                let asked = std::sync::atomic::AtomicUsize::new(0);
                let stop = || asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= 1;
                assert!(state.switch_unless(&mut g, &stop).unwrap().is_none());
                let journal = g.dir.join("journal");
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&journal)
                    .unwrap();
                std::io::Write::write_all(&mut f, tail).unwrap();
                drop((f, g));
                let case = format!("tail {t}, resume {resume}");
                let done = state.recover(resume, &counters).unwrap();
                assert!(done.is_some(), "{case}");
                let h = state.history().unwrap();
                let want = if resume {
                    Status::Complete
                } else {
                    Status::RolledBack
                };
                assert_eq!(h[0].status, want, "{case}: {h:?}");
                if resume {
                    assert_eq!(std::fs::read(fx.site().join("pkg/new/b.py")).unwrap(), b"b");
                    state.rollback(None, false, &counters).unwrap();
                    assert_eq!(
                        state.history().unwrap()[0].status,
                        Status::RolledBack,
                        "{case}"
                    );
                }
                assert_eq!(fx.tree(), before, "{case}");
                // Nothing torn is left in the journal: every line is whole.
                let text = std::fs::read(&journal).unwrap();
                assert!(text.ends_with(b"\n"), "{case}");
                for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                    let r: std::result::Result<super::Record, _> = serde_json::from_slice(line);
                    assert!(r.is_ok(), "{case}: {}", String::from_utf8_lossy(line));
                }
            }
        }
    }
}
