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
//! altered bundle is refused before anything is written), the index is read
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
const TRAILER: u64 = 4 + 4 + 8 + 32 + 8;

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
}

impl Bundle {
    /// Open `path`: check its trailer and whole-file hash, then read and
    /// check its index. Nothing is written.
    pub fn open(path: &Path) -> Result<Bundle> {
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
        };
        let mut members = b.reader()?;
        let shown = members.shown.clone();
        let mut entries = members.archive.entries().map_err(|e| b.bad(&e))?.raw(true);
        b.index = read_index(&mut entries, &shown)?;
        Ok(b)
    }

    fn reader(&self) -> Result<Members> {
        let f = File::open(&self.path).map_err(|e| self.bad(&io_cause(&e)))?;
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
mod tests {
    use super::*;
    use crate::model::ShebangRewrite;

    const SITE: &str = "lib/python3.11/site-packages";

    fn file(path: &str, bytes: &[u8], mode: u32) -> BundleEntry {
        BundleEntry {
            path: path.into(),
            kind: BundleKind::File {
                size: bytes.len() as u64,
                mode,
                blake3: blake3::hash(bytes).to_hex().to_string(),
            },
            owner: Some("pkg".into()),
        }
    }

    fn dir(path: &str) -> BundleEntry {
        BundleEntry {
            path: path.into(),
            kind: BundleKind::Dir { mode: 0o755 },
            owner: None,
        }
    }

    /// A staged folder and its index: a module, a script, a symlink.
    fn staged(root: &Path) -> BundleIndex {
        let script = b"#!/src/venv/bin/python\nprint(1)\n";
        std::fs::create_dir_all(root.join(SITE).join("pkg")).unwrap();
        std::fs::create_dir_all(root.join("bin")).unwrap();
        std::fs::write(root.join(SITE).join("pkg/__init__.py"), b"x = 1\n").unwrap();
        std::fs::write(root.join("bin/tool"), script).unwrap();
        std::os::unix::fs::symlink("tool", root.join("bin/tool2")).unwrap();
        let mut entries = vec![
            dir("bin"),
            file("bin/tool", script, 0o755),
            BundleEntry {
                path: "bin/tool2".into(),
                kind: BundleKind::Symlink {
                    target: "tool".into(),
                },
                owner: None,
            },
            dir("lib"),
            dir("lib/python3.11"),
            dir(SITE),
            dir(&format!("{SITE}/pkg")),
            file(&format!("{SITE}/pkg/__init__.py"), b"x = 1\n", 0o644),
        ];
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        BundleIndex {
            format: BUNDLE_FORMAT,
            python: "3.11".into(),
            site_packages: SITE.into(),
            source_host: "src".into(),
            source_venv: "/src/venv".into(),
            manifest: "[sets.pkg]\ndists = [\"pkg\"]\n".into(),
            sets: vec!["pkg".into()],
            dists: Vec::new(),
            entries,
            facts: Default::default(),
        }
    }

    /// A body (zstd tar) sealed with a correct trailer: valid to
    /// [`Bundle::open`]'s whole-file check, whatever it holds.
    fn sealed(t: &Path, name: &str, build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> PathBuf {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        let tar = b.into_inner().unwrap();
        let mut body = zstd::encode_all(tar.as_slice(), 3).unwrap();
        let t_bytes = trailer(&blake3::hash(&body), body.len() as u64);
        body.extend_from_slice(&t_bytes);
        let p = t.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    fn add_index(b: &mut tar::Builder<Vec<u8>>, index: &BundleIndex) {
        let json = serde_json::to_vec(index).unwrap();
        let mut h = header(tar::EntryType::Regular, 0o644, json.len() as u64);
        b.append_data(&mut h, INDEX_NAME, json.as_slice()).unwrap();
    }

    #[test]
    fn the_same_files_give_the_same_bytes_and_unpack_exactly() {
        let t = tempfile::tempdir().unwrap();
        let index = staged(&t.path().join("stage"));
        let a = write(
            &mut index.clone(),
            &mut Folder(t.path().join("stage")),
            &t.path().join("a.ovl"),
        )
        .unwrap();
        let b = write(
            &mut index.clone(),
            &mut Folder(t.path().join("stage")),
            &t.path().join("b.ovl"),
        )
        .unwrap();
        assert_eq!(a.blake3, b.blake3);
        assert_eq!(
            std::fs::read(t.path().join("a.ovl")).unwrap(),
            std::fs::read(t.path().join("b.ovl")).unwrap()
        );
        // Files whose hashes the index leaves empty are hashed as they are
        // written (one read): the index records them, and the bundle is
        // the same file.
        let mut blank = index.clone();
        for e in &mut blank.entries {
            if let BundleKind::File { blake3, .. } = &mut e.kind {
                blake3.clear();
            }
        }
        let c = write(
            &mut blank,
            &mut Folder(t.path().join("stage")),
            &t.path().join("c.ovl"),
        )
        .unwrap();
        assert_eq!(blank, index, "the writer filled in the hashes");
        assert_eq!(c.blake3, a.blake3);
        // zstd reads it as one stream of one tar (the index's frame, its
        // room's skippable frame, the entries' frame, the trailer).
        let listed = std::process::Command::new("sh")
            .arg("-c")
            .arg("zstd -dcq a.ovl | tar -t")
            .current_dir(t.path())
            .output()
            .unwrap();
        let listed = String::from_utf8_lossy(&listed.stdout);
        assert_eq!(listed.lines().next(), Some(INDEX_NAME), "{listed}");
        for e in index
            .entries
            .iter()
            .filter(|e| !matches!(e.kind, BundleKind::Dir { .. }))
        {
            let name = format!("venv/{}", e.path);
            assert!(listed.lines().any(|l| l == name), "{name} in {listed}");
        }
        let opened = Bundle::open(&t.path().join("a.ovl")).unwrap();
        assert_eq!(opened.index, index);
        // Read in place: the script as packed, rewritten for a target.
        let venv = crate::model::bundle_venv(t.path().join("a.ovl").to_str().unwrap());
        let src = BundleSource::open(&venv).unwrap();
        let rw = ShebangRewrite {
            from: venv.clone(),
            to: "/here".into(),
        };
        let got = src
            .stat(&["../../../bin/tool".into()], Some(&rw), false)
            .unwrap();
        let placed = b"#!/here/bin/python\nprint(1)\n";
        assert_eq!(
            got[0].kind,
            crate::model::Kind::File {
                size: placed.len() as u64,
                mode: 0o755,
                blake3: Some(blake3::hash(placed).to_hex().to_string()),
                stamp: None,
            }
        );
    }

    #[test]
    fn a_cut_or_altered_bundle_is_refused_before_it_is_read() {
        let t = tempfile::tempdir().unwrap();
        let index = staged(&t.path().join("stage"));
        let p = t.path().join("a.ovl");
        write(&mut index.clone(), &mut Folder(t.path().join("stage")), &p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
            std::fs::write(&p, &bytes[..cut]).unwrap();
            let e = Bundle::open(&p).unwrap_err();
            assert!(e.message.contains("truncated or damaged"), "{cut}: {e:?}");
        }
        for at in [0, bytes.len() / 3, bytes.len() - 30, bytes.len() - 3] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            std::fs::write(&p, &bad).unwrap();
            let e = Bundle::open(&p).unwrap_err();
            assert!(e.message.contains("truncated or damaged"), "{at}: {e:?}");
        }
    }

    /// Every file and symlink of the bundle at `p`, sent from it read in
    /// place (as a plan from its own index would ask): the error.
    fn send_all(p: &Path) -> Result<crate::model::Sent> {
        let venv = crate::model::bundle_venv(p.to_str().unwrap());
        let src = BundleSource::open(&venv)?;
        let files: Vec<crate::model::SendFile> = src
            .bundle
            .index
            .entries
            .iter()
            .filter_map(|e| {
                let kind = match &e.kind {
                    BundleKind::File { size, mode, blake3 } => crate::model::Kind::File {
                        size: *size,
                        mode: *mode,
                        blake3: Some(blake3.clone()),
                        stamp: None,
                    },
                    BundleKind::Symlink { target } => crate::model::Kind::Symlink {
                        target: target.clone(),
                    },
                    BundleKind::Dir { .. } => return None,
                };
                Some((e.path.clone(), kind))
            })
            .enumerate()
            .map(|(index, (path, kind))| crate::model::SendFile {
                index,
                path: format!("../../../{path}"),
                kind,
            })
            .collect();
        struct Null;
        impl crate::stream::BlockSink for Null {
            fn block(&mut self, _: u8, _: &[u8]) -> io::Result<()> {
                Ok(())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let counters = crate::inventory::Counters::default();
        src.send(
            &files,
            &[],
            None,
            crate::model::Compression::None,
            &mut Null,
            &counters,
        )
    }

    #[test]
    fn a_sealed_but_hostile_bundle_is_refused_when_it_is_read() {
        let t = tempfile::tempdir().unwrap();
        let mut index = staged(&t.path().join("stage"));
        let unpack = |p: &Path| send_all(p).unwrap_err();
        // A member the index does not name, where it names another.
        let script = b"#!/src/venv/bin/python\nprint(1)\n";
        index.entries = vec![dir("bin"), file("bin/tool", script, 0o755)];
        let p = sealed(t.path(), "extra.ovl", |b| {
            add_index(b, &index);
            let mut h = header(tar::EntryType::Directory, 0o755, 0);
            b.append_data(&mut h, "venv/bin/", io::empty()).unwrap();
            let mut h = header(tar::EntryType::Regular, 0o644, 3);
            b.append_data(&mut h, "venv/etc/x", &b"bad"[..]).unwrap();
        });
        assert!(
            unpack(&p).message.contains("where the index has"),
            "{:?}",
            unpack(&p)
        );
        // A file longer than the index says.
        let p = sealed(t.path(), "size.ovl", |b| {
            add_index(b, &index);
            let mut h = header(tar::EntryType::Directory, 0o755, 0);
            b.append_data(&mut h, "venv/bin/", io::empty()).unwrap();
            let mut h = header(tar::EntryType::Regular, 0o755, 4096);
            b.append_data(&mut h, "venv/bin/tool", &[0u8; 4096][..])
                .unwrap();
        });
        assert!(
            unpack(&p).message.contains("is not the index's entry"),
            "{:?}",
            unpack(&p)
        );
        // The right size, other bytes.
        let p = sealed(t.path(), "bytes.ovl", |b| {
            add_index(b, &index);
            let mut h = header(tar::EntryType::Directory, 0o755, 0);
            b.append_data(&mut h, "venv/bin/", io::empty()).unwrap();
            let mut h = header(tar::EntryType::Regular, 0o755, script.len() as u64);
            b.append_data(&mut h, "venv/bin/tool", &[b'#'; 32][..])
                .unwrap();
        });
        // Sent as the index has it: the target hashes what it writes and
        // refuses bytes that are not the plan's (the index's) hash.
        assert!(send_all(&p).is_ok());
        // A long name past the limit is refused, not read into memory.
        let p = sealed(t.path(), "long.ovl", |b| {
            add_index(b, &index);
            let mut h = header(tar::EntryType::Regular, 0o644, 0);
            b.append_data(
                &mut h,
                "venv/".to_string() + &"a/".repeat(3000),
                io::empty(),
            )
            .unwrap();
        });
        assert!(unpack(&p).message.contains("a name of"));
        // An index path that leaves the venv, or names overlay's state.
        for bad in ["../etc/passwd", "/etc/passwd", ".overlay/journal", "a//b"] {
            index.entries = vec![file(bad, b"x", 0o644)];
            let p = sealed(t.path(), "path.ovl", |b| add_index(b, &index));
            assert!(unpack(&p).message.contains("its index: path"), "{bad}");
        }
        // Not the first member.
        let p = sealed(t.path(), "noindex.ovl", |b| {
            let mut h = header(tar::EntryType::Regular, 0o644, 1);
            b.append_data(&mut h, "venv/x", &b"x"[..]).unwrap();
        });
        assert!(unpack(&p).message.contains("first member"));
    }
}
