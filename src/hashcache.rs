//! Caches on each host of what was learned from a file's content, keyed by
//! its path and its stamp (device, inode, size, mtime and ctime in
//! nanoseconds): sha256 hashes ([`HashCache`]) and ELF facts (the preflight's
//! [`StampCache<ElfInfo>`](crate::preflight::elf::ElfInfo)). An entry is
//! used only while every part of the stamp is unchanged, so an unchanged venv
//! re-plans at the speed of `stat`. Files modified in the last few seconds
//! are not cached (the "racy" case: a write in the same clock tick as the
//! hash would leave the stamp unchanged).
//!
//! The caches live outside the venv, in `~/.cache/overlay/{hashes,elf}/` of
//! the user the agent runs as, one file per venv; `OVERLAY_NO_HASH_CACHE=1`
//! turns them off.

use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

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
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(bound = "V: Serialize + DeserializeOwned")]
struct Store<V> {
    version: u32,
    entries: HashMap<String, (Stamp, V)>,
}

impl<V> Default for Store<V> {
    fn default() -> Self {
        Store {
            version: VERSION,
            entries: HashMap::new(),
        }
    }
}

const VERSION: u32 = 1;
/// Files changed this recently are never cached.
const RACY_NS: i128 = 3_000_000_000;

/// The sha256 cache.
pub type HashCache = StampCache<String>;

/// Values learned from files, valid while the file's stamp is unchanged.
#[derive(Debug)]
pub struct StampCache<V> {
    file: Option<PathBuf>,
    racy_ns: i128,
    store: Mutex<Store<V>>,
    dirty: Mutex<bool>,
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
        let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
        let file = match (disabled, home) {
            (false, Some(h)) => {
                let key = crate::inventory::hex(&Sha256::digest(root.to_string_lossy().as_bytes()));
                Some(
                    PathBuf::from(h)
                        .join(".cache/overlay")
                        .join(kind)
                        .join(format!("{}.json", &key[..16])),
                )
            }
            _ => None,
        };
        let store = file
            .as_ref()
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|b| serde_json::from_slice::<Store<V>>(&b).ok())
            .filter(|s| s.version == VERSION)
            .unwrap_or_default();
        StampCache::with_file(file, RACY_NS, store)
    }

    /// A cache that remembers nothing (and reads no file).
    pub fn disabled() -> StampCache<V> {
        StampCache::with_file(None, RACY_NS, Store::default())
    }

    fn with_file(file: Option<PathBuf>, racy_ns: i128, store: Store<V>) -> StampCache<V> {
        StampCache {
            file,
            racy_ns,
            store: Mutex::new(store),
            dirty: Mutex::new(false),
        }
    }

    /// The cached value for `path`, if its stamp is unchanged.
    pub fn get(&self, path: &Path, m: &Metadata) -> Option<V> {
        self.file.as_ref()?;
        let store = self.store.lock().ok()?;
        let (stamp, sha) = store.entries.get(path.to_str()?)?;
        (*stamp == Stamp::of(m)).then(|| sha.clone())
    }

    /// Remember a value learned from content read with metadata `m`.
    pub fn put(&self, path: &Path, m: &Metadata, value: &V) {
        if self.file.is_none() {
            return;
        }
        let stamp = Stamp::of(m);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        if now - stamp.mtime_ns.max(stamp.ctime_ns) < self.racy_ns {
            return;
        }
        let Some(key) = path.to_str() else { return };
        if let Ok(mut s) = self.store.lock() {
            s.entries.insert(key.to_string(), (stamp, value.clone()));
            if let Ok(mut d) = self.dirty.lock() {
                *d = true;
            }
        }
    }

    /// Write the cache back (atomically), if anything was added.
    pub fn save(&self) {
        let Some(file) = &self.file else { return };
        if !self.dirty.lock().is_ok_and(|d| *d) {
            return;
        }
        let Ok(mut store) = self.store.lock() else {
            return;
        };
        store.version = VERSION;
        // Forget files that are gone, so the cache does not grow forever.
        store.entries.retain(|p, _| Path::new(p).exists());
        let Some(dir) = file.parent() else { return };
        if std::fs::create_dir_all(dir).is_err() {
            return;
        }
        let Ok(bytes) = serde_json::to_vec(&*store) else {
            return;
        };
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
        // A new process reads it back.
        let store: Store<String> =
            serde_json::from_slice(&std::fs::read(&store_file).unwrap()).unwrap();
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
