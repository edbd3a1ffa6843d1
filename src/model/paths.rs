//! Paths as a plan names them (relative to site-packages) and as the venv
//! holds them (relative to its root).

use std::path::{Component, Path};

/// Lexically join `site_rel` and `path` and normalize; `None` if the result
/// is absolute, empty, or leaves the venv root.
pub fn venv_relative(site_rel: &str, path: &str) -> Option<String> {
    if path.is_empty() || path.starts_with('/') || path.contains('\0') {
        return None;
    }
    // The common case, a plain relative path (every RECORD line of a file
    // inside site-packages), needs no normalizing.
    if path
        .split('/')
        .all(|c| !c.is_empty() && c != "." && c != "..")
        && site_rel
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
    {
        return Some(format!("{site_rel}/{path}"));
    }
    let mut parts: Vec<&str> = Vec::new();
    let joined = Path::new(site_rel).join(path);
    for c in joined.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_str()?),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(parts.join("/"))
}

/// The prefix of a "venv" that is a folder laid out like site-packages
/// (a set's `from`, docs/manifest.md): `site-packages:/abs/folder` names
/// the folder itself as site-packages, with no interpreter. Only the
/// source side's readers (scan, stat, send, ELF facts, RECORD check)
/// accept it ([`crate::inventory::Venv::open_source`]).
pub const FOLDER_VENV: &str = "site-packages:";

/// The "venv" a source agent reads the folder `abs` through.
pub fn folder_venv(abs: &str) -> String {
    format!("{FOLDER_VENV}{abs}")
}

/// The folder of a [`folder_venv`], if `venv` is one.
pub fn folder_of(venv: &str) -> Option<&str> {
    venv.strip_prefix(FOLDER_VENV)
}

/// The prefix of a "venv" that is a bundle read in place
/// (`bundle:/abs/file.ovl`, docs/design.md "Sources"): a source with no
/// directory, its entries answered from the bundle's index and its files
/// read from its tar. Only the source side's readers accept it
/// (`crate::bundle::source`); everything else refuses it as no venv.
pub const BUNDLE_VENV: &str = "bundle:";

/// The "venv" a source agent reads the bundle file `abs` through.
pub fn bundle_venv(abs: &str) -> String {
    format!("{BUNDLE_VENV}{abs}")
}

/// The "venv" of the bundle file `abs` pinned to the bundle whose trailer
/// hash is `blake3` (`bundle:BLAKE3:/abs/file.ovl`): the agent that reads
/// it refuses the file if it holds another bundle by then, so a file
/// swapped after its signature was checked serves nothing.
pub fn bundle_venv_pinned(abs: &str, blake3: &str) -> String {
    format!("{BUNDLE_VENV}{blake3}:{abs}")
}

/// Split a bundle "venv" after its prefix into its pin and its file.
fn bundle_parts(venv: &str) -> Option<(Option<&str>, &str)> {
    let rest = venv.strip_prefix(BUNDLE_VENV)?;
    Some(match rest.split_at_checked(64) {
        Some((hash, file))
            if file.starts_with(":/") && hash.bytes().all(|c| c.is_ascii_hexdigit()) =>
        {
            (Some(hash), &file[1..])
        }
        _ => (None, rest),
    })
}

/// The bundle file of a [`bundle_venv`] (or [`bundle_venv_pinned`]), if
/// `venv` is one.
pub fn bundle_of(venv: &str) -> Option<&str> {
    bundle_parts(venv).map(|(_, file)| file)
}

/// The BLAKE3 a [`bundle_venv_pinned`] pins, if it pins one.
pub fn bundle_pin(venv: &str) -> Option<&str> {
    bundle_parts(venv).and_then(|(pin, _)| pin)
}

/// Is this path (relative to anything) inside a `__pycache__` directory?
pub fn in_pycache(path: &str) -> bool {
    path.split('/').any(|c| c == "__pycache__")
}
