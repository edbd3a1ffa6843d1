//! Bundles (`overlay pack`, docs/pack.md): one file that carries package
//! sets to hosts the controller cannot reach live.
//!
//! A bundle is a standard zstd-compressed tar followed by a zstd skippable
//! frame, so `zstd -dc stack.ovl | tar -tv` lists it:
//!
//! - the tar's first member is `overlay-bundle.json`, the index
//!   ([`BundleIndex`]): Python minor, site-packages layout, the packed
//!   sets, `[verify]` and `[preflight]` (as TOML), the distributions, and
//!   every entry (path relative to the venv, kind, mode, size, BLAKE3, the
//!   distribution whose RECORD lists it), sorted by path;
//! - then one member per entry, in the index's order, named `venv/PATH`:
//!   each file's bytes once;
//! - the trailer is a skippable frame (magic `0x184D2A5E`, 48 bytes of
//!   payload): `OVLBNDL1`, the BLAKE3 of every byte before it, and their
//!   count (u64 little-endian).
//!
//! Deterministic: sorted order, uid and gid 0, no user or group names,
//! zstd level 3 (the entries by one thread per core, in zstd's
//! multi-threaded mode, whose bytes do not depend on the thread count; the
//! index by one, as its own frame, before a skippable frame that fills its
//! room), no timestamp of the run anywhere; a file's
//! header carries the source file's mtime (whole seconds: a `.py` must keep
//! the mtime its packed bytecode records), every other header mtime 0. The
//! same source files and index give the same bytes.
//!
//! Reading trusts nothing: [`Bundle::open`] checks the trailer's length and
//! hash over the whole file before it parses anything (a truncated or
//! altered bundle is refused before anything is written); with a trust
//! file ([`Bundle::open_trusted`], `sign`) the signature beside the bundle
//! is checked against the trailer first, before the whole-file hash. Every
//! later read is from the file opened then (not its path again), the index is read
//! with a size limit, the tar is read raw (GNU long names bounded by
//! [`PATH_LIMIT`], no PAX), and [`Bundle::extract`] accepts only the members
//! the index names, in its order, with its sizes, modes and hashes, writing
//! beneath a fresh directory without following symlinks.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::beneath::normalize;
use crate::err;
use crate::error::{Error, Result, io_cause};
use crate::model::{BUNDLE_FORMAT, BundleEntry, BundleIndex, BundleKind};

/// The index's member name.
pub const INDEX_NAME: &str = "overlay-bundle.json";
/// The largest index read (bytes).
pub const INDEX_LIMIT: u64 = 256 << 20;
/// The longest member name or symlink target read (bytes).
pub const PATH_LIMIT: u64 = 4096;
/// zstd's largest window a reader accepts (2^27 = 128 MiB).
const WINDOW_LOG_MAX: u32 = 27;
/// The zstd level a bundle is written with.
pub(crate) const LEVEL: i32 = 3;
/// The trailer: skippable-frame magic, its payload size, tag, hash, length.
const SKIPPABLE_MAGIC: u32 = 0x184D_2A5E;
const TAG: &[u8; 8] = b"OVLBNDL1";
pub(crate) const TRAILER: u64 = 4 + 4 + 8 + 32 + 8;

mod agent;
pub mod allowed;
mod at;
pub mod sign;
mod source;
mod write;

pub use source::BundleSource;
pub use write::{Contents, Folder, Packed, write};
#[cfg(test)]
use write::{header, trailer};

/// A bundle whose whole-file hash was checked, with its index read.
#[derive(Debug)]
pub struct Bundle {
    pub path: PathBuf,
    pub index: BundleIndex,
    /// The trailer's BLAKE3 (of every byte before it).
    pub blake3: String,
    /// Bytes before the trailer.
    body: u64,
    /// The file as opened and checked: every later read is from it.
    file: std::sync::Arc<File>,
    /// What the check of its signature found ([`Bundle::open_trusted`];
    /// [`sign::Checked::Unsigned`] from [`Bundle::open`], which checks none).
    pub signature: sign::Checked,
}

impl Bundle {
    /// Open `path`: check its trailer and whole-file hash, then read and
    /// check its index. Nothing is written. Its signature is not looked at
    /// ([`Bundle::open_trusted`] does).
    pub fn open(path: &Path) -> Result<Bundle> {
        Self::open_checked(path, None)
    }

    /// [`Bundle::open`], with the signature beside the bundle checked
    /// against `trust` ([`sign::check`]) once the trailer is read: before
    /// the whole-file hash and before any byte is parsed.
    pub fn open_trusted(path: &Path, trust: &sign::Trust) -> Result<Bundle> {
        Self::open_checked(path, Some(trust))
    }

    fn open_checked(path: &Path, trust: Option<&sign::Trust>) -> Result<Bundle> {
        let shown = path.display().to_string();
        let damaged = |why: &str| {
            err!(
                kind = Protocol,
                hint = "copy the bundle again (compare `b3sum` or `overlay pack`'s printed hash), or pack it again",
                "Bundle {shown} is truncated or damaged: {why}"
            )
        };
        let mut f = File::open(path).map_err(|e| {
            err!(
                kind = Usage,
                hint = "give the path of a file written by `overlay pack`",
                "Cannot open the bundle {shown}: {}",
                io_cause(&e)
            )
        })?;
        let len = f.metadata().map_err(|e| damaged(&io_cause(&e)))?.len();
        if len < TRAILER {
            return Err(damaged(&format!("{len} bytes, shorter than its trailer")));
        }
        let mut t = [0u8; TRAILER as usize];
        f.seek(SeekFrom::Start(len - TRAILER))
            .and_then(|_| f.read_exact(&mut t))
            .map_err(|e| damaged(&io_cause(&e)))?;
        if t[0..4] != SKIPPABLE_MAGIC.to_le_bytes() || &t[8..16] != TAG {
            return Err(damaged(
                "it does not end with overlay's trailer (not a bundle, or cut short)",
            ));
        }
        let body = u64::from_le_bytes(t[48..56].try_into().expect("8 bytes"));
        if body != len - TRAILER {
            return Err(damaged(&format!(
                "the trailer counts {body} bytes before it, the file has {}",
                len - TRAILER
            )));
        }
        let claimed = crate::text::hex(&t[16..48]);
        let signature = match trust {
            Some(trust) => sign::check(path, &claimed, body, trust)?,
            None => sign::Checked::Unsigned,
        };
        f.seek(SeekFrom::Start(0))
            .map_err(|e| damaged(&io_cause(&e)))?;
        let mut hasher = blake3::Hasher::new();
        let copied =
            io::copy(&mut (&mut f).take(body), &mut hasher).map_err(|e| damaged(&io_cause(&e)))?;
        let digest = hasher.finalize();
        if copied != body || digest.as_bytes()[..] != t[16..48] {
            return Err(damaged("its BLAKE3 does not match the one in its trailer"));
        }
        let mut b = Bundle {
            path: path.to_path_buf(),
            index: BundleIndex {
                format: 0,
                python: String::new(),
                site_packages: String::new(),
                source_host: String::new(),
                source_venv: String::new(),
                manifest: String::new(),
                sets: Vec::new(),
                dists: Vec::new(),
                entries: Vec::new(),
                facts: Default::default(),
            },
            blake3: digest.to_hex().to_string(),
            body,
            file: std::sync::Arc::new(f),
            signature,
        };
        let mut members = b.reader()?;
        let shown = members.shown.clone();
        let mut entries = members.archive.entries().map_err(|e| b.bad(&e))?.raw(true);
        b.index = read_index(&mut entries, &shown)?;
        Ok(b)
    }

    /// Bytes before the trailer (what its BLAKE3 covers).
    pub fn body_len(&self) -> u64 {
        self.body
    }

    fn reader(&self) -> Result<Members> {
        let f = at::At::new(self.file.clone());
        let take = BufReader::with_capacity(1 << 20, f).take(self.body);
        let mut dec = zstd::Decoder::with_buffer(take).map_err(|e| self.bad(&e))?;
        dec.window_log_max(WINDOW_LOG_MAX)
            .map_err(|e| self.bad(&e))?;
        Ok(Members {
            archive: tar::Archive::new(Box::new(dec)),
            shown: self.path.display().to_string(),
        })
    }

    fn bad(&self, why: &dyn std::fmt::Display) -> Error {
        bad(&self.path.display().to_string(), why)
    }
}

/// The BLAKE3 the trailer of the bundle at `path` records (of every byte
/// before it), read from its last bytes: which bundle the file holds, not
/// whether it is intact ([`Bundle::open`] checks that).
pub fn sealed_blake3(path: &Path) -> Result<String> {
    let shown = path.display();
    let mut f = File::open(path).map_err(|e| {
        err!(
            kind = Usage,
            "Cannot open the bundle {shown}: {}",
            io_cause(&e)
        )
    })?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut t = [0u8; TRAILER as usize];
    if len < TRAILER
        || f.seek(SeekFrom::Start(len - TRAILER))
            .and_then(|_| f.read_exact(&mut t))
            .is_err()
        || t[0..4] != SKIPPABLE_MAGIC.to_le_bytes()
        || &t[8..16] != TAG
    {
        return Err(err!(
            kind = Protocol,
            "Bundle {shown} does not end with overlay's trailer"
        ));
    }
    let hash: [u8; 32] = t[16..48].try_into().expect("32 bytes");
    Ok(blake3::Hash::from_bytes(hash).to_hex().to_string())
}

fn bad(shown: &str, why: &dyn std::fmt::Display) -> Error {
    err!(
        kind = Protocol,
        hint = "this bundle was not written by `overlay pack` as it stands: pack it again",
        "Bundle {shown} is not valid: {why}"
    )
}

/// The archive of a bundle, read raw.
struct Members {
    archive: tar::Archive<Box<dyn Read>>,
    shown: String,
}

/// Read and check the index, the archive's first member.
fn read_index(entries: &mut tar::Entries<'_, Box<dyn Read>>, shown: &str) -> Result<BundleIndex> {
    let (name, _, entry) =
        next_member(entries, shown)?.ok_or_else(|| bad(shown, &"it is empty"))?;
    if name != INDEX_NAME {
        return Err(bad(
            shown,
            &format!("its first member is {name:?}, not {INDEX_NAME}"),
        ));
    }
    let size = entry.header().size().map_err(|e| bad(shown, &e))?;
    if size > INDEX_LIMIT {
        return Err(bad(
            shown,
            &format!("its index has {size} bytes, more than {INDEX_LIMIT}"),
        ));
    }
    // Grown as it arrives: a header's size alone reserves little.
    let mut json = Vec::with_capacity(size.min(1 << 20) as usize);
    entry
        .take(size)
        .read_to_end(&mut json)
        .map_err(|e| bad(shown, &e))?;
    let index: BundleIndex = serde_json::from_slice(&json).map_err(|e| {
        if serde_json::from_slice::<serde_json::Value>(&json)
            .ok()
            .and_then(|v| v.get("format")?.as_u64())
            .is_some_and(|f| f != u64::from(BUNDLE_FORMAT))
        {
            err!(
                kind = Usage,
                hint = "pack it again with this overlay, or use the overlay that packed it",
                "Bundle {shown} has another format than this overlay reads ({BUNDLE_FORMAT})"
            )
        } else {
            bad(shown, &format!("its index: {e}"))
        }
    })?;
    check_index(&index).map_err(|why| bad(shown, &format!("its index: {why}")))?;
    Ok(index)
}

/// The next member's name, long link target, and entry; GNU long names
/// and links are read here, bounded by [`PATH_LIMIT`].
#[allow(clippy::type_complexity)]
fn next_member<'a>(
    entries: &mut tar::Entries<'a, Box<dyn Read>>,
    shown: &str,
) -> Result<Option<(String, Option<String>, tar::Entry<'a, Box<dyn Read>>)>> {
    let (mut long_name, mut long_link) = (None, None);
    loop {
        let Some(entry) = entries.next() else {
            if long_name.is_some() || long_link.is_some() {
                return Err(bad(shown, &"a long name with no member after it"));
            }
            return Ok(None);
        };
        let mut entry = entry.map_err(|e| bad(shown, &e))?;
        let ty = entry.header().entry_type();
        if ty.is_gnu_longname() || ty.is_gnu_longlink() {
            let size = entry.header().size().map_err(|e| bad(shown, &e))?;
            if size > PATH_LIMIT {
                return Err(bad(shown, &format!("a name of {size} bytes")));
            }
            let mut buf = Vec::new();
            (&mut entry)
                .take(size)
                .read_to_end(&mut buf)
                .map_err(|e| bad(shown, &e))?;
            while buf.last() == Some(&0) {
                buf.pop();
            }
            let s = String::from_utf8(buf).map_err(|_| bad(shown, &"a name that is not UTF-8"))?;
            let slot = if ty.is_gnu_longname() {
                &mut long_name
            } else {
                &mut long_link
            };
            if slot.replace(s).is_some() {
                return Err(bad(shown, &"two long names for one member"));
            }
            continue;
        }
        if ty.is_pax_global_extensions() || ty.is_pax_local_extensions() {
            return Err(bad(shown, &"a PAX header (overlay writes none)"));
        }
        let name = match long_name {
            Some(n) => n,
            None => String::from_utf8(entry.path_bytes().into_owned())
                .map_err(|_| bad(shown, &"a name that is not UTF-8"))?,
        };
        let link = match long_link {
            Some(l) => Some(l),
            None => match entry.link_name_bytes() {
                Some(b) => Some(
                    String::from_utf8(b.into_owned())
                        .map_err(|_| bad(shown, &"a link that is not UTF-8"))?,
                ),
                None => None,
            },
        };
        return Ok(Some((name, link, entry)));
    }
}

/// The index's own rules: its format, sorted unique normalized paths
/// inside the venv (none in overlay's state folder), sane Python minor.
fn check_index(index: &BundleIndex) -> std::result::Result<(), String> {
    if index.format != BUNDLE_FORMAT {
        return Err(format!(
            "format {} (this overlay reads {BUNDLE_FORMAT})",
            index.format
        ));
    }
    let minor_ok = index.python.split_once('.').is_some_and(|(a, b)| {
        !a.is_empty()
            && !b.is_empty()
            && a.bytes().all(|c| c.is_ascii_digit())
            && b.bytes().all(|c| c.is_ascii_digit())
    });
    if !minor_ok || index.site_packages != format!("lib/python{}/site-packages", index.python) {
        return Err(format!(
            "python {:?} with site-packages {:?}",
            index.python, index.site_packages
        ));
    }
    let mut last: Option<&str> = None;
    for BundleEntry { path, kind, .. } in &index.entries {
        if normalize(path) != Some(path.as_str())
            || path.is_empty()
            || path.len() as u64 > PATH_LIMIT
            || path == ".overlay"
            || path.starts_with(".overlay/")
        {
            return Err(format!("path {path:?}"));
        }
        if last.is_some_and(|l| l >= path.as_str()) {
            return Err(format!("path {path:?} out of order or twice"));
        }
        if let BundleKind::Symlink { target } = kind
            && (target.is_empty() || target.len() as u64 > PATH_LIMIT || target.contains('\0'))
        {
            return Err(format!("symlink {path:?}"));
        }
        last = Some(path);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
