//! What the load model holds of one shared object of the venv
//! ([`Object`]), what it reports of a root ([`Found`]), and how it compares
//! paths ([`lexical`]). Shared by the load model (`super::load_model`) and
//! the preloads of imported-first packages (`super::preloads`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::elf;
use crate::model::ElfInfo;

/// `p` with `.` and `..` resolved lexically: how the load model compares
/// the paths of placed objects with those a closure found.
pub(super) fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// One problem of a root, worded for the report.
#[derive(PartialEq, Eq, Hash)]
pub(super) struct Found {
    pub(super) reason: String,
    /// The grouping key ([`elf::cause_of`]).
    pub(super) cause: String,
    pub(super) unmet: elf::Unmet,
}

/// One shared object of the venv as the load model sees it.
pub(super) struct Object {
    /// Relative to site-packages.
    pub(super) rel: String,
    pub(super) path: PathBuf,
    pub(super) info: Arc<ElfInfo>,
    /// A Python extension module (imports load it).
    pub(super) extension: bool,
    /// Placed by the overlay.
    pub(super) placed: bool,
}

impl Object {
    pub(super) fn new(rel: &str, path: &Path, info: Arc<ElfInfo>, placed: bool) -> Self {
        let name = rel.rsplit('/').next().unwrap_or(rel);
        Object {
            extension: info.is_extension(name),
            rel: rel.to_owned(),
            path: path.to_path_buf(),
            info,
            placed,
        }
    }
}
