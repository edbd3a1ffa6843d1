//! Fixtures shared by the journal's tests: a fake venv beside an
//! `outside` directory ([`Fx`]), tree snapshots, change lists, staging as
//! the stream would, and whole applies and rollbacks through [`State`].

use std::collections::BTreeMap;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use super::{Generation, Record, State};
use crate::error::Result;
use crate::inventory::Counters;
use crate::model::{
    Action, GenChange, GenerationInfo, HashMode, Kind, PrepareRequest, RollbackReport, STATE_DIR,
};

pub(super) const SITE: &str = "lib/python3.11/site-packages";

/// A fake venv (`pyvenv.cfg`, `lib/python3.11/site-packages`) next to an
/// `outside` directory holding a file, a directory and a payload.
pub(super) struct Fx {
    pub t: tempfile::TempDir,
}

impl Fx {
    pub fn new() -> Fx {
        let t = tempfile::tempdir().unwrap();
        let fx = Fx { t };
        std::fs::create_dir_all(fx.site()).unwrap();
        std::fs::write(fx.venv().join("pyvenv.cfg"), "version = 3.11.4\n").unwrap();
        std::fs::create_dir_all(fx.outside().join("dir")).unwrap();
        std::fs::write(fx.outside().join("secret"), b"keep me").unwrap();
        std::fs::write(fx.outside().join("dir/mod.py"), b"outside").unwrap();
        std::fs::create_dir_all(fx.t.path().join("payload")).unwrap();
        std::fs::write(fx.t.path().join("payload/mod.py"), b"payload").unwrap();
        fx
    }
    pub fn venv(&self) -> PathBuf {
        self.t.path().join("venv")
    }
    pub fn v(&self) -> String {
        self.venv().to_string_lossy().into_owned()
    }
    pub fn site(&self) -> PathBuf {
        self.venv().join(SITE)
    }
    pub fn outside(&self) -> PathBuf {
        self.t.path().join("outside")
    }
    /// Everything beside the venv (the outside and the payload).
    pub fn beside(&self) -> BTreeMap<String, String> {
        let mut all = snap(self.t.path());
        all.retain(|k, _| !(k == "venv" || k.starts_with("venv/")));
        all
    }
    /// The venv without overlay's own state.
    pub fn tree(&self) -> BTreeMap<String, String> {
        let mut all = snap(&self.venv());
        all.retain(|k, _| !(k == STATE_DIR || k.starts_with(".overlay/")));
        all
    }
    pub fn kind(&self, path: &str) -> Kind {
        crate::inventory::stat(
            &self.v(),
            &[path.to_string()],
            HashMode::All,
            None,
            false,
            &Counters::default(),
        )
        .unwrap()
        .remove(0)
        .kind
    }
}

/// Path -> type, mode and content (or link target), without following links.
pub(super) fn snap(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in walkdir::WalkDir::new(root).min_depth(1) {
        let e = e.unwrap();
        let m = e.path().symlink_metadata().unwrap();
        let rel = e
            .path()
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let mode = m.permissions().mode() & 0o7777;
        let v = if m.file_type().is_symlink() {
            format!("l {}", std::fs::read_link(e.path()).unwrap().display())
        } else if m.is_dir() {
            format!("d {mode:o}")
        } else {
            format!(
                "f {mode:o} {}",
                String::from_utf8_lossy(&std::fs::read(e.path()).unwrap())
            )
        };
        out.insert(rel, v);
    }
    out
}

/// What a change brings: file content or a link target.
#[derive(Debug, Clone)]
pub(super) enum New {
    File(Vec<u8>),
    Link(String),
}

pub(super) fn source_kind(n: &New) -> Kind {
    match n {
        New::File(data) => Kind::File {
            size: data.len() as u64,
            mode: 0o644,
            blake3: Some(blake3::hash(data).to_hex().to_string()),
            stamp: None,
        },
        New::Link(t) => Kind::Symlink { target: t.clone() },
    }
}

pub(super) fn change(fx: &Fx, path: &str, action: Action, new: Option<&New>) -> GenChange {
    GenChange {
        path: path.into(),
        action,
        source: new.map(source_kind),
        target: (action != Action::Add).then(|| fx.kind(path)),
        bytecode: false,
        staged: None,
    }
}

pub(super) fn request(fx: &Fx, changes: Vec<GenChange>) -> PrepareRequest {
    PrepareRequest {
        venv: fx.v(),
        source: "src".into(),
        target: "dst".into(),
        plan_created: 0,
        changes,
        backup: true,
        resume: false,
        same_owner: false,
        versions: Vec::new(),
        shebang: None,
        provenance: None,
        machine: None,
        allow_running: false,
    }
}

/// Write what each change brings into staging, as the stream would.
pub(super) fn stage(g: &mut Generation, news: &[Option<New>]) {
    let staging = g.dir.join("staging");
    for (i, n) in news.iter().enumerate() {
        let p = staging.join(i.to_string());
        match n {
            Some(New::File(d)) => {
                std::fs::write(&p, d).unwrap();
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
            }
            Some(New::Link(t)) => symlink(t, &p).unwrap(),
            None => {}
        }
    }
    g.append(Record::Staged).unwrap();
}

/// A generation that replaces `pkg/a.py` ("old a" to "new a") and adds
/// `added` ("b"), prepared and staged but not switched: the state, the
/// generation, and the venv's tree before it.
pub(super) fn staged_a_and(fx: &Fx, added: &str) -> (State, Generation, BTreeMap<String, String>) {
    std::fs::create_dir_all(fx.site().join("pkg")).unwrap();
    std::fs::write(fx.site().join("pkg/a.py"), b"old a").unwrap();
    let before = fx.tree();
    let news = [
        Some(New::File(b"new a".to_vec())),
        Some(New::File(b"b".to_vec())),
    ];
    let changes = vec![
        change(fx, "pkg/a.py", Action::Replace, news[0].as_ref()),
        change(fx, added, Action::Add, news[1].as_ref()),
    ];
    let state = State::open(&fx.v()).unwrap();
    let mut g = state
        .prepare(&request(fx, changes), &Counters::default())
        .unwrap();
    stage(&mut g, &news);
    (state, g, before)
}

/// Prepare, stage, switch, check and commit `changes` (each with what it brings).
pub(super) fn apply(fx: &Fx, list: &[(&str, Action, Option<New>)]) -> Result<String> {
    let state = State::open(&fx.v())?;
    let changes = list
        .iter()
        .map(|(p, a, n)| change(fx, p, *a, n.as_ref()))
        .collect();
    let counters = Counters::default();
    let mut g = state.prepare(&request(fx, changes), &counters)?;
    let news: Vec<Option<New>> = list.iter().map(|(_, _, n)| n.clone()).collect();
    stage(&mut g, &news);
    state.switch(&mut g)?;
    state.check(&mut g, &counters)?;
    state.commit(&mut g, None)?;
    Ok(g.meta.id.clone())
}

pub(super) fn rollback(fx: &Fx) -> Result<RollbackReport> {
    State::open(&fx.v())?.rollback(None, false, &Counters::default())
}

pub(super) fn history(fx: &Fx) -> Result<Vec<GenerationInfo>> {
    State::open(&fx.v())?.history()
}
