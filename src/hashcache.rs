//! Caches on each host of what was learned from a file's content, keyed by
//! its path and its stamp (device, inode, size, mtime and ctime in
//! nanoseconds): BLAKE3 content hashes ([`HashCache`]) and ELF facts (the preflight's
//! [`StampCache<ElfInfo>`](crate::model::ElfInfo)). An entry is
//! used only while every part of the stamp is unchanged, so an unchanged venv
//! re-plans at the speed of `stat`. Files modified in the last few seconds
//! are not cached (the "racy" case: a write in the same clock tick as the
//! hash would leave the stamp unchanged).
//!
//! The caches live outside the venv, in `~/.cache/overlay/{hashes,elf4}/` of
//! the user the agent runs as ([`home_dir`]: under sudo that user's own
//! home, not the login user's), one file per venv;
//! `OVERLAY_NO_HASH_CACHE=1` turns them off.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::model::FileStamp;
use rustc_hash::FxHashMap;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The home directory of the user this process runs as: `$HOME`, except
/// when sudo started it as another user than the one who ran sudo
/// (`SUDO_UID`, which sudo sets, differs from the effective uid): then
/// the password database's home of the effective uid, as a login of that
/// user would have, whatever HOME sudo kept (docs/sudo.md).
pub fn home_dir() -> Option<PathBuf> {
    let euid = rustix::process::geteuid().as_raw();
    if sudo_login_uid().is_some_and(|u| u != euid)
        && let Some(home) = user_home(euid)
    {
        return Some(home);
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// The uid of the user who ran sudo (`SUDO_UID`), when sudo started this process.
pub fn sudo_login_uid() -> Option<u32> {
    std::env::var("SUDO_UID").ok()?.trim().parse().ok()
}

/// The home directory of `uid` in the password database (`getpwuid_r`).
pub fn user_home(uid: u32) -> Option<PathBuf> {
    use std::ffi::CStr;
    use std::os::unix::ffi::OsStrExt;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: an all-zero passwd is a valid out-parameter for getpwuid_r.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buf` outlives the use
    // of the strings it holds.
    let rc =
        unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() || pw.pw_dir.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r succeeded, so pw_dir points at a C string in `buf`.
    let dir = unsafe { CStr::from_ptr(pw.pw_dir) };
    let dir = std::ffi::OsStr::from_bytes(dir.to_bytes());
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(m: &Metadata) -> Stamp {
        Stamp::at(m.size(), &FileStamp::of(m))
    }

    /// The same stamp from an lstat kept as a [`FileStamp`] and a size.
    fn at(size: u64, st: &FileStamp) -> Stamp {
        Stamp {
            dev: st.dev,
            ino: st.ino,
            size,
            mtime_ns: i128::from(st.mtime_ns),
            ctime_ns: i128::from(st.ctime_ns),
        }
    }
}

/// The entries. On disk the store is a flat binary file (see `encode`); a
/// warm plan reads the whole cache of a 35,000-file venv while it lstats
/// the same files, so the file is searched where it lies (a sorted index
/// of path hashes and offsets) instead of being decoded into 70,000 small
/// allocations first (that took ~25 ms of CPU per host). Each value is kept
/// as its JSON bytes and decoded only when it is asked for.
#[derive(Debug)]
struct Store<V> {
    /// The store file as read.
    base: Vec<u8>,
    /// (FxHash of the path, offset of its entry in `base`), sorted.
    index: Vec<(u64, u32)>,
    /// Entries learned by this process; they win over `base`.
    added: FxHashMap<String, (Stamp, Vec<u8>)>,
    _v: std::marker::PhantomData<fn() -> V>,
}

impl<V> Default for Store<V> {
    fn default() -> Self {
        Store {
            base: Vec::new(),
            index: Vec::new(),
            added: FxHashMap::default(),
            _v: std::marker::PhantomData,
        }
    }
}

/// File magic and format version.
const MAGIC: &[u8; 8] = b"OVLCACH3";

/// One entry of a store file: path, stamp, value; and where the next begins.
fn entry_at(b: &[u8], at: usize) -> Option<(&[u8], Stamp, &[u8], usize)> {
    let mut r = b.get(at..)?;
    let start = r.len();
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, rest) = r.split_at_checked(n)?;
        r = rest;
        Some(head)
    };
    let u32_ = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize;
    let u64_ = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let i128_ = |b: &[u8]| i128::from_le_bytes(b.try_into().expect("16 bytes"));
    let len = u32_(take(4)?);
    let path = take(len)?;
    let st = Stamp {
        dev: u64_(take(8)?),
        ino: u64_(take(8)?),
        size: u64_(take(8)?),
        mtime_ns: i128_(take(16)?),
        ctime_ns: i128_(take(16)?),
    };
    let vlen = u32_(take(4)?);
    let value = take(vlen)?;
    let used = start - r.len();
    Some((path, st, value, at + used))
}

fn path_hash(path: &[u8]) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(path)
}

impl<V> Store<V> {
    /// The entry for `path`: learned here, or in the file.
    fn get(&self, path: &str) -> Option<(Stamp, &[u8])> {
        if let Some((st, v)) = self.added.get(path) {
            return Some((st.clone(), v));
        }
        let h = path_hash(path.as_bytes());
        let from = self.index.partition_point(|(x, _)| *x < h);
        self.index[from..]
            .iter()
            .take_while(|(x, _)| *x == h)
            .find_map(|(_, at)| {
                let (p, st, v, _) = entry_at(&self.base, *at as usize)?;
                (p == path.as_bytes()).then_some((st, v))
            })
    }

    /// `MAGIC`, then per entry: path length (u32 LE), path, dev, ino, size
    /// (u64 LE), mtime and ctime in ns (i128 LE), value length (u32 LE),
    /// value (JSON). Only entries whose path passes `keep` are written.
    fn encode(&self, keep: impl Fn(&str) -> bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.base.len() + self.added.len() * 160);
        out.extend_from_slice(MAGIC);
        let mut put = |path: &str, st: &Stamp, value: &[u8]| {
            out.extend_from_slice(&(path.len() as u32).to_le_bytes());
            out.extend_from_slice(path.as_bytes());
            out.extend_from_slice(&st.dev.to_le_bytes());
            out.extend_from_slice(&st.ino.to_le_bytes());
            out.extend_from_slice(&st.size.to_le_bytes());
            out.extend_from_slice(&st.mtime_ns.to_le_bytes());
            out.extend_from_slice(&st.ctime_ns.to_le_bytes());
            out.extend_from_slice(&(value.len() as u32).to_le_bytes());
            out.extend_from_slice(value);
        };
        for (_, at) in &self.index {
            if let Some((p, st, v, _)) = entry_at(&self.base, *at as usize)
                && let Ok(p) = std::str::from_utf8(p)
                && !self.added.contains_key(p)
                && keep(p)
            {
                put(p, &st, v);
            }
        }
        for (p, (st, v)) in &self.added {
            if keep(p) {
                put(p, st, v);
            }
        }
        out
    }

    /// `None` for anything that is not a whole, well-formed store.
    fn decode(base: Vec<u8>) -> Option<Store<V>> {
        if !base.starts_with(MAGIC) || base.len() > u32::MAX as usize {
            return None;
        }
        let mut index = Vec::new();
        let mut at = MAGIC.len();
        while at < base.len() {
            let (path, _, _, next) = entry_at(&base, at)?;
            std::str::from_utf8(path).ok()?;
            index.push((path_hash(path), at as u32));
            at = next;
        }
        index.sort_unstable();
        Some(Store {
            base,
            index,
            added: FxHashMap::default(),
            _v: std::marker::PhantomData,
        })
    }
}
/// Files changed this recently are never cached.
const RACY_NS: i128 = 3_000_000_000;

/// The content-hash (BLAKE3) cache.
pub type HashCache = StampCache<String>;

/// Values learned from files, valid while the file's stamp is unchanged.
#[derive(Debug)]
pub struct StampCache<V> {
    file: Option<PathBuf>,
    racy_ns: i128,
    /// Read by every stat thread at once; written only for new hashes.
    store: RwLock<Store<V>>,
    dirty: AtomicBool,
}

impl StampCache<String> {
    /// The hash cache for the venv at `root` (disabled when there is no home).
    pub fn open(root: &Path) -> HashCache {
        StampCache::open_kind(root, "hashes")
    }
}

impl<V: Serialize + DeserializeOwned + Clone> StampCache<V> {
    /// The cache of `kind` for the venv at `root` (disabled when there is no home).
    pub fn open_kind(root: &Path, kind: &str) -> StampCache<V> {
        let disabled =
            std::env::var_os("OVERLAY_NO_HASH_CACHE").is_some_and(|v| !v.is_empty() && v != "0");
        let home = home_dir();
        let file = match (disabled, home) {
            (false, Some(h)) => {
                let key = crate::text::hex(&Sha256::digest(root.to_string_lossy().as_bytes()));
                Some(
                    h.join(".cache/overlay")
                        .join(kind)
                        .join(format!("{}.bin", &key[..16])),
                )
            }
            _ => None,
        };
        let store = file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(Store::decode)
            .unwrap_or_default();
        StampCache::with_file(file, RACY_NS, store)
    }

    /// A cache that remembers nothing (and reads no file).
    pub fn disabled() -> StampCache<V> {
        StampCache::with_file(None, RACY_NS, Store::default())
    }

    /// A cache kept in `file`, that trusts files however recently changed
    /// (tests write the files they cache just before).
    #[cfg(test)]
    pub(crate) fn for_test(file: &Path) -> StampCache<V> {
        let store = std::fs::read(file)
            .ok()
            .and_then(Store::decode)
            .unwrap_or_default();
        StampCache::with_file(Some(file.to_path_buf()), 0, store)
    }

    fn with_file(file: Option<PathBuf>, racy_ns: i128, store: Store<V>) -> StampCache<V> {
        StampCache {
            file,
            racy_ns,
            store: RwLock::new(store),
            dirty: AtomicBool::new(false),
        }
    }

    /// The cached value for `path`, if its stamp is unchanged.
    pub fn get(&self, path: &Path, m: &Metadata) -> Option<V> {
        self.get_stamped(path, &Stamp::of(m))
    }

    /// [`get`](Self::get) for an lstat kept as its size and [`FileStamp`].
    pub fn get_at(&self, path: &Path, size: u64, st: &FileStamp) -> Option<V> {
        self.get_stamped(path, &Stamp::at(size, st))
    }

    fn get_stamped(&self, path: &Path, now: &Stamp) -> Option<V> {
        self.file.as_ref()?;
        let store = self.store.read().ok()?;
        let (stamp, value) = store.get(path.to_str()?)?;
        if stamp != *now {
            return None;
        }
        serde_json::from_slice(value).ok()
    }

    /// Remember a value learned from content read with metadata `m`.
    pub fn put(&self, path: &Path, m: &Metadata, value: &V) {
        self.put_stamped(path, Stamp::of(m), value);
    }

    /// [`put`](Self::put) for an lstat kept as its size and [`FileStamp`].
    pub fn put_at(&self, path: &Path, size: u64, st: &FileStamp, value: &V) {
        self.put_stamped(path, Stamp::at(size, st), value);
    }

    fn put_stamped(&self, path: &Path, stamp: Stamp, value: &V) {
        if self.file.is_none() {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        if now - stamp.mtime_ns.max(stamp.ctime_ns) < self.racy_ns {
            return;
        }
        let Some(key) = path.to_str() else { return };
        let Ok(value) = serde_json::to_vec(value) else {
            return;
        };
        if let Ok(mut s) = self.store.write() {
            s.added.insert(key.to_string(), (stamp, value));
            self.dirty.store(true, Ordering::Relaxed);
        }
    }

    /// Write the cache back (atomically), if anything was added.
    pub fn save(&self) {
        let Some(file) = &self.file else { return };
        if !self.dirty.load(Ordering::Relaxed) {
            return;
        }
        let Ok(store) = self.store.read() else {
            return;
        };
        // Forget files that are gone, so the cache does not grow forever.
        let keep = |p: &str| Path::new(p).exists();
        let Some(dir) = file.parent() else { return };
        // ~/.cache/overlay/... is private to its user: folders 0700, and the
        // file 0600 (a NamedTempFile is created with that mode).
        if std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
            .is_err()
        {
            return;
        }
        let bytes = store.encode(keep);
        let Ok(mut tmp) = tempfile::NamedTempFile::new_in(dir) else {
            return;
        };
        if std::io::Write::write_all(&mut tmp, &bytes).is_ok() {
            let _ = tmp.persist(file);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_homes_come_from_the_password_database() {
        assert_eq!(user_home(0), Some(PathBuf::from("/root")));
        assert_eq!(user_home(4_000_000_000), None);
    }

    #[test]
    fn an_entry_is_used_only_while_the_stamp_is_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.so");
        std::fs::write(&f, b"one").unwrap();
        let store_file = dir.path().join("cache.json");
        let c = HashCache::with_file(Some(store_file.clone()), 0, Store::default());
        let m = std::fs::metadata(&f).unwrap();
        c.put(&f, &m, &"h1".to_string());
        assert_eq!(c.get(&f, &m).as_deref(), Some("h1"));
        c.save();
        // A new process reads it back; a cut file is not a store.
        let bytes = std::fs::read(&store_file).unwrap();
        assert!(Store::<String>::decode(bytes[..bytes.len() - 1].to_vec()).is_none());
        let store = Store::<String>::decode(bytes).unwrap();
        let c = HashCache::with_file(Some(store_file), 0, store);
        assert_eq!(
            c.get(&f, &std::fs::metadata(&f).unwrap()).as_deref(),
            Some("h1")
        );
        // Same size, mtime put back: the ctime still moves, so the entry is not trusted.
        let mtime = m.modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&f, b"two").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let m2 = std::fs::metadata(&f).unwrap();
        assert_eq!(m2.len(), m.len());
        assert_eq!(c.get(&f, &m2), None);
    }

    #[test]
    fn a_file_changed_just_now_is_not_cached() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.py");
        std::fs::write(&f, b"x").unwrap();
        let c = HashCache::with_file(Some(dir.path().join("c.json")), RACY_NS, Store::default());
        let m = std::fs::metadata(&f).unwrap();
        c.put(&f, &m, &"h".to_string());
        assert_eq!(c.get(&f, &m), None);
    }
}
