//! The per-path rules of a plan: which paths are never carried, never
//! written over and never deleted, each with the words of the warning that
//! says why (docs/plan.md, "What is left out"), and the mode bits that never
//! travel. Each rule looks at one path; [`compute`](fn@super::compute) applies
//! them in order.

use crate::model::Kind;
use crate::plan::Warning;
use crate::plan::side::Side;
use crate::validate::{MODE_MASK, canonical, state_path};

/// Why the site-relative `path` is never carried, if it is not: it points
/// into overlay's state folder, or it is not spelled the one plain way
/// (`validate::canonical`), which the target would refuse.
pub(super) fn left_out(site_rel: &str, path: &str) -> Option<&'static str> {
    if state_path(site_rel, path) {
        Some("points into overlay's state folder")
    } else if crate::beneath::normalize(path).is_none() && canonical(site_rel, path).is_none() {
        Some("is not spelled as a plain path (empty, `.` or needless `..` parts)")
    } else {
        None
    }
}

/// Why the source's `path` (of kind `kind` there) is not carried, if it is
/// not: it points into the state folder on either side, it is not a file or
/// a symlink on the source, or it is not spelled plainly.
pub(super) fn not_carried(src: &Side, dst: &Side, path: &str, kind: &Kind) -> Option<String> {
    if state_path(&src.scan.site_packages, path) || state_path(&dst.scan.site_packages, path) {
        return Some(format!(
            "{path} points into overlay's state folder; it is left out"
        ));
    }
    let host = src.host;
    let refused = match kind {
        Kind::Missing => Some(format!(
            "{path} is listed in a RECORD on {host} but missing there; it is left out"
        )),
        Kind::Dir { .. } => Some(format!(
            "{path} is a directory on {host}; overlay carries files and symlinks, never a directory named by a RECORD row or glob; it is left out"
        )),
        Kind::ThroughSymlink { link } => Some(format!(
            "{path}: its parent {link} is a symlink on {host}; overlay never reads through one; it is left out"
        )),
        Kind::Other => Some(format!(
            "{path} on {host} is not a regular file or symlink; it is left out"
        )),
        Kind::File { .. } | Kind::Symlink { .. } => None,
    };
    refused.or_else(|| {
        left_out(&src.scan.site_packages, path)
            .or(left_out(&dst.scan.site_packages, path))
            .map(|why| format!("{path} {why}; it is left out"))
    })
}

/// Why the target's `path` (of kind `target` there, if it exists) is not
/// written over, if it is not: a directory, a path behind a symlinked
/// parent, or something other than a file or a symlink.
pub(super) fn not_written(dst: &Side, path: &str, target: Option<&Kind>) -> Option<String> {
    let host = dst.host;
    match target {
        Some(Kind::Dir { .. }) => Some(format!(
            "{path} is a directory on {host}; overlay never replaces a directory; it is left out"
        )),
        Some(Kind::ThroughSymlink { link }) => Some(format!(
            "{path}: its parent {link} is a symlink on {host}; overlay never writes through one; it is left out"
        )),
        Some(Kind::Other) => Some(format!(
            "{path} on {host} is not a regular file or symlink; it is left out"
        )),
        _ => None,
    }
}

/// Why the target's `path` (of kind `target`), which no set carries from
/// the source, is not deleted, if it is not: it points into the state
/// folder, it is a directory (those go only when the deletes leave them
/// empty), it lies behind a symlinked parent, it is not a file or a symlink,
/// or it is not spelled plainly.
pub(super) fn not_deleted(dst: &Side, path: &str, target: &Kind) -> Option<String> {
    let host = dst.host;
    match target {
        _ if state_path(&dst.scan.site_packages, path) => Some(format!(
            "{path} points into overlay's state folder; it is kept"
        )),
        Kind::Dir { .. } => Some(format!(
            "{path} is a directory on {host}; a RECORD row never deletes a directory (it goes when the deletes leave it empty); it is kept"
        )),
        Kind::ThroughSymlink { link } => Some(format!(
            "{path}: its parent {link} is a symlink on {host}; overlay never deletes through one; it is kept"
        )),
        Kind::File { .. } | Kind::Symlink { .. } => {
            left_out(&dst.scan.site_packages, path).map(|why| format!("{path} {why}; it is kept"))
        }
        _ => Some(format!(
            "{path} on {host} is not a regular file or symlink; it is kept"
        )),
    }
}

/// `kind` without its setuid, setgid and sticky bits, if it has any: those
/// never travel.
pub(super) fn without_special_bits(kind: &Kind) -> Option<Kind> {
    match kind {
        Kind::File {
            size,
            mode,
            blake3,
            stamp,
        } if mode & !MODE_MASK != 0 => Some(Kind::File {
            size: *size,
            mode: mode & MODE_MASK,
            blake3: blake3.clone(),
            stamp: *stamp,
        }),
        _ => None,
    }
}

/// The one warning for a set's files on `host` whose setuid, setgid or
/// sticky bits are dropped, if there are any.
pub(super) fn special_bits_warning(set: &str, host: &str, special: &[&str]) -> Option<Warning> {
    if special.is_empty() {
        return None;
    }
    Some(Warning {
        set: Some(set.to_string()),
        path: (special.len() == 1).then(|| special[0].to_string()),
        message: format!(
            "setuid, setgid or sticky bits of {} file{} on {host} are dropped (overlay carries modes up to 0o777): {}",
            special.len(),
            if special.len() == 1 { "" } else { "s" },
            some_of(special)
        ),
    })
}

/// The names of `paths` for a message: all of them when few, else the first few and a count.
fn some_of(paths: &[&str]) -> String {
    const SHOWN: usize = 5;
    let mut s = paths
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > SHOWN {
        s.push_str(&format!(" and {} more", paths.len() - SHOWN));
    }
    s
}
