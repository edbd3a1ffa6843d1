//! A small prepared generation to throw crafted streams at ([`Intake`]):
//! shared by the stream's unit and property tests and the fuzz target
//! (`fuzz/`), with helpers to craft headers. Not part of the API.
#![doc(hidden)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::mpsc;

use super::{ChannelReader, unpack};
use crate::error::Result;
use crate::inventory::Counters;
use crate::journal::{Generation, State};
use crate::model::{Action, GenChange, HashMode, Kind, PrepareRequest, StageCount};

/// A venv with a generation of three adds — a 10-byte file (mode 4755
/// in the plan), a symlink, and a symlink with a 300-byte target — and
/// the replacement of `a.py` (7 bytes).
pub struct Intake {
    pub dir: tempfile::TempDir,
    _state: State,
    pub g: Generation,
    before: Vec<(String, u32, u64)>,
}

/// Every path below `root`, its mode and size, without following
/// symlinks; staged entries are left out.
fn tree(root: &Path, staging: &Path) -> Vec<(String, u32, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for e in walkdir::WalkDir::new(root).sort_by_file_name() {
        let Ok(e) = e else { continue };
        if e.path().parent() == Some(staging) {
            continue;
        }
        if let Ok(m) = e.path().symlink_metadata() {
            let size = if m.is_dir() { 0 } else { m.len() };
            out.push((e.path().display().to_string(), m.mode(), size));
        }
    }
    out
}

pub const LONG_TARGET_LEN: usize = 300;

impl Intake {
    pub fn new(base: &Path, same_owner: bool) -> Intake {
        Self::planned(base, same_owner, None)
    }

    /// As [`Intake::new`], with `new.py` (change 0, 10 bytes) hashed in
    /// the plan as `blake3`.
    pub fn with_hash(base: &Path, blake3: &str) -> Intake {
        Self::planned(base, false, Some(blake3.to_string()))
    }

    fn planned(base: &Path, same_owner: bool, new_py: Option<String>) -> Intake {
        let dir = tempfile::tempdir_in(base).expect("tempdir");
        let site = dir.path().join("lib/python3.11/site-packages");
        fs::create_dir_all(site.join("pkg")).expect("venv");
        fs::write(dir.path().join("pyvenv.cfg"), "version = 3.11.2\n").expect("venv");
        fs::write(site.join("a.py"), "a = 1\n").expect("venv");
        let v = dir.path().to_str().expect("utf-8").to_string();
        let change = GenChange::add;
        let state = State::open(&v).expect("state");
        let now = crate::inventory::stat(
            &v,
            &["a.py".to_string()],
            HashMode::All,
            None,
            false,
            &Counters::default(),
        )
        .expect("stat")
        .remove(0);
        let req = PrepareRequest {
            venv: v,
            source: "s".into(),
            target: "t".into(),
            plan_created: 0,
            changes: vec![
                change(
                    "new.py",
                    Kind::File {
                        size: 10,
                        mode: 0o4755,
                        blake3: new_py,
                        stamp: None,
                    },
                ),
                change(
                    "link",
                    Kind::Symlink {
                        target: "a.py".into(),
                    },
                ),
                change(
                    "pkg/long",
                    Kind::Symlink {
                        target: "x".repeat(LONG_TARGET_LEN),
                    },
                ),
                GenChange {
                    action: Action::Replace,
                    target: Some(now.kind),
                    ..change(
                        "a.py",
                        Kind::File {
                            size: 7,
                            mode: 0o644,
                            blake3: None,
                            stamp: None,
                        },
                    )
                },
            ],
            backup: false,
            resume: false,
            same_owner,
            versions: Vec::new(),
            shebang: None,
            provenance: None,
            machine: None,
            allow_running: false,
        };
        let g = state.prepare(&req, &Counters::default()).expect("prepare");
        let before = tree(dir.path(), &g.dir.join("staging"));
        Intake {
            dir,
            _state: state,
            g,
            before,
        }
    }

    /// A well-formed stream for this generation, as the source writes it.
    pub fn valid_stream(&self) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(10);
        h.set_mode(0o4755);
        tar.append_data(&mut h, "0", &b"0123456789"[..])
            .expect("tar");
        for (name, target) in [
            ("1", "a.py".to_string()),
            ("2", "x".repeat(LONG_TARGET_LEN)),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(target.len() as u64);
            tar.append_data(&mut h, name, target.as_bytes())
                .expect("tar");
        }
        let mut h = tar::Header::new_gnu();
        h.set_size(7);
        h.set_mode(0o644);
        tar.append_data(&mut h, "3", &b"a = 2\n\n"[..])
            .expect("tar");
        tar.into_inner().expect("tar")
    }

    /// Unpack `data` (in pieces of `piece` bytes) into staging, then
    /// check that nothing outside staging changed, and that staging
    /// holds only entries named by the generation's indexes, none with
    /// a setuid, setgid or sticky bit. Staging is emptied after.
    pub fn run_in_pieces(&self, data: &[u8], piece: usize) -> Result<StageCount> {
        self.run_with(data, piece, |_| {})
    }

    /// [`Intake::run_in_pieces`], with a look at staging before it is emptied.
    pub fn run_with(
        &self,
        data: &[u8],
        piece: usize,
        inspect: impl FnOnce(&Path),
    ) -> Result<StageCount> {
        let (tx, rx) = mpsc::sync_channel(data.len() / piece.max(1) + 2);
        for p in data.chunks(piece.max(1)) {
            tx.send((p.to_vec(), 0)).expect("queue");
        }
        drop(tx);
        let r = unpack(
            &self.g,
            self.dir.path(),
            ChannelReader::new(rx),
            &Counters::default(),
            crate::stream::Holds::All,
        );
        let staging = self.g.dir.join("staging");
        inspect(&staging);
        assert_eq!(
            tree(self.dir.path(), &staging),
            self.before,
            "something outside staging changed"
        );
        for e in fs::read_dir(&staging).expect("staging") {
            let e = e.expect("staging");
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(
                ["0", "1", "2", "3"].contains(&name.as_str()),
                "staged {name:?}"
            );
            let m = e.path().symlink_metadata().expect("staged");
            assert_eq!(
                m.permissions().mode() & 0o7000,
                0,
                "{name} has {:o}",
                m.permissions().mode()
            );
            fs::remove_file(e.path()).expect("clear staging");
        }
        r.map(|u| u.count)
    }

    pub fn run(&self, data: &[u8]) -> Result<StageCount> {
        self.run_in_pieces(data, data.len().max(1))
    }
}

/// A 512-byte header for entry `name` of type `kind` declaring `size`
/// bytes (the checksum set), as a hostile sender would craft it.
pub fn raw_header(name: &str, kind: u8, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    h.as_bytes().to_vec()
}

/// The names in a staging folder, sorted.
pub fn staged_names(staging: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(staging)
        .expect("staging")
        .map(|e| {
            e.expect("staging")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

/// A file of the plan to send: `content` at `path` (under site-packages),
/// hashed in the plan.
#[cfg(test)]
pub(crate) fn send_file(index: usize, path: &str, content: &[u8]) -> crate::model::SendFile {
    use crate::inventory::{ContentHasher, content_hex};
    crate::model::SendFile {
        index,
        path: path.to_string(),
        kind: Kind::File {
            size: content.len() as u64,
            mode: 0o644,
            blake3: Some(content_hex(ContentHasher::new().update(content))),
            stamp: None,
        },
    }
}

/// A venv with these files under site-packages; returns its folder.
#[cfg(test)]
pub(crate) fn venv_with(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("lib/python3.11/site-packages");
    fs::create_dir_all(&site).unwrap();
    fs::write(dir.path().join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
    for (path, content) in files {
        let p = site.join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }
    dir
}
