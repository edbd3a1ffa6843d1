//! What a stat or scan says of one path: [`Entry`], its [`Kind`], the
//! [`FileStamp`] that identifies a file's inode and last change, the compact
//! [`StatEntry`] a stat answer carries, and how much content a stat hashes
//! ([`HashMode`]).

use serde::{Deserialize, Serialize};

/// How much of a file's content a stat reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HashMode {
    /// Only metadata.
    None,
    /// Metadata, plus the blake3 where the host's hash cache still vouches
    /// for it (no content is read).
    Cached,
    /// Metadata and blake3 of every regular file (from the cache or read).
    All,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub path: String,
    pub kind: Kind,
    /// Compiled bytecode of a `.py` file (`__pycache__/<stem>.*.pyc`), relative to site-packages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pyc: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", try_from = "KindRepr")]
pub enum Kind {
    Missing,
    File {
        size: u64,
        mode: u32,
        /// Taken only where a hash decides something (see `plan`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        blake3: Option<String>,
        /// Where no hash was taken, this tells whether the file changed since.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stamp: Option<FileStamp>,
    },
    Symlink {
        target: String,
    },
    Dir {
        mode: u32,
    },
    /// A device, socket or fifo: never touched.
    Other,
    /// Reachable only through a symlinked parent directory, `link`
    /// (relative to site-packages, as RECORD spells it): never read, written
    /// or deleted through it.
    ThroughSymlink {
        link: String,
    },
}

/// The flat shape `Kind` is read through. serde reads an internally tagged
/// enum by first buffering every field of it; tens of thousands of entries
/// per stat made that the controller's main cost, so `Kind` is read as this
/// plain struct (same JSON) and checked after.
#[derive(Deserialize)]
struct KindRepr {
    kind: KindTag,
    size: Option<u64>,
    mode: Option<u32>,
    blake3: Option<String>,
    stamp: Option<FileStamp>,
    target: Option<String>,
    link: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum KindTag {
    Missing,
    File,
    Symlink,
    Dir,
    Other,
    ThroughSymlink,
}

impl TryFrom<KindRepr> for Kind {
    type Error = String;
    fn try_from(r: KindRepr) -> std::result::Result<Kind, String> {
        let need = |what: &str| format!("a {what} entry lacks a field");
        Ok(match r.kind {
            KindTag::Missing => Kind::Missing,
            KindTag::Other => Kind::Other,
            KindTag::File => Kind::File {
                size: r.size.ok_or_else(|| need("file"))?,
                mode: r.mode.ok_or_else(|| need("file"))?,
                blake3: r.blake3,
                stamp: r.stamp,
            },
            KindTag::Symlink => Kind::Symlink {
                target: r.target.ok_or_else(|| need("symlink"))?,
            },
            KindTag::Dir => Kind::Dir {
                mode: r.mode.ok_or_else(|| need("dir"))?,
            },
            KindTag::ThroughSymlink => Kind::ThroughSymlink {
                link: r.link.ok_or_else(|| need("through_symlink"))?,
            },
        })
    }
}

/// An [`Entry`] as a stat answer carries it: without the path (the answer
/// follows the request's order), as a JSON array rather than an object, and
/// without the stamp of a file whose hash came along (the hash decides
/// everything the stamp would). A warm plan moves one of these per file of
/// both venvs, so its size is most of that plan's cost: about 90 bytes
/// against 250 for the tagged object with its path.
///
/// `[tag, size, mode, hash, stamp, link, pyc]`: tag 0 missing, 1 file,
/// 2 symlink (target in `link`), 3 directory (`mode`), 4 other, 5 behind a
/// symlinked parent (that parent in `link`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatEntry(
    u8,
    u64,
    u32,
    Option<String>,
    Option<(u64, u64, i64, i64)>,
    Option<String>,
    Vec<String>,
);

impl StatEntry {
    pub fn from_entry(e: Entry) -> StatEntry {
        let Entry { kind, pyc, .. } = e;
        match kind {
            Kind::Missing => StatEntry(0, 0, 0, None, None, None, pyc),
            Kind::File {
                size,
                mode,
                blake3,
                stamp,
            } => {
                let stamp = match (&blake3, stamp) {
                    (None, Some(t)) => Some((t.dev, t.ino, t.mtime_ns, t.ctime_ns)),
                    _ => None,
                };
                StatEntry(1, size, mode, blake3, stamp, None, pyc)
            }
            Kind::Symlink { target } => StatEntry(2, 0, 0, None, None, Some(target), pyc),
            Kind::Dir { mode } => StatEntry(3, 0, mode, None, None, None, pyc),
            Kind::Other => StatEntry(4, 0, 0, None, None, None, pyc),
            Kind::ThroughSymlink { link } => StatEntry(5, 0, 0, None, None, Some(link), pyc),
        }
    }

    /// The entry for `path`; `None` for a tag this version does not know.
    pub fn into_entry(self, path: String) -> Option<Entry> {
        let StatEntry(tag, size, mode, blake3, stamp, link, pyc) = self;
        let kind = match tag {
            0 => Kind::Missing,
            1 => Kind::File {
                size,
                mode,
                blake3,
                stamp: stamp.map(|(dev, ino, mtime_ns, ctime_ns)| FileStamp {
                    dev,
                    ino,
                    mtime_ns,
                    ctime_ns,
                }),
            },
            2 => Kind::Symlink { target: link? },
            3 => Kind::Dir { mode },
            4 => Kind::Other,
            5 => Kind::ThroughSymlink { link: link? },
            _ => return None,
        };
        Some(Entry { path, kind, pyc })
    }
}

/// A file's identity and last change: device, inode, mtime and ctime (ns).
///
/// The device number is recorded but never compared ([`FileStamp::same`]):
/// it names a mount, not a file system, and changes when a FUSE or NFS
/// file system is mounted again or a reboot numbers the disks differently,
/// while every file on it is what it was. What it would guard against, an
/// inode number of another file system, needs another file system mounted
/// inside the venv meanwhile (overlay reaches every path beneath the venv's
/// root, never through a symlink) and a file there with the same inode
/// number, size, mode and mtime to the nanosecond: the inode number with
/// those stands for the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl FileStamp {
    /// The same inode, not modified since (a rename changes only the
    /// ctime); the device number is not compared (see [`FileStamp`]).
    pub fn same_inode_unchanged(&self, now: &FileStamp) -> bool {
        self.ino == now.ino && self.mtime_ns == now.mtime_ns
    }

    /// The same inode, not changed in any way since (mtime and ctime); the
    /// device number is not compared (see [`FileStamp`]).
    pub fn same(&self, now: &FileStamp) -> bool {
        (self.ino, self.mtime_ns, self.ctime_ns) == (now.ino, now.mtime_ns, now.ctime_ns)
    }

    pub fn of(m: &std::fs::Metadata) -> FileStamp {
        use std::os::unix::fs::MetadataExt;
        FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            mtime_ns: m
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.mtime_nsec()),
            ctime_ns: m
                .ctime()
                .saturating_mul(1_000_000_000)
                .saturating_add(m.ctime_nsec()),
        }
    }
}

impl Kind {
    /// Is `now` still what `self` (an earlier observation) saw? With a hash,
    /// the content decides; without one, the size, mode and stamp must all
    /// be unchanged.
    pub fn unchanged_in(&self, now: &Kind) -> bool {
        self.matches_by(now, FileStamp::same)
    }

    /// After a rollback: is `now` the file that `self` was before the apply?
    /// With a hash, the content decides. Without one, the same inode with the
    /// same size and mtime: rollback renames the old inode back, and overlay
    /// never writes into an existing inode (a rename changes only its ctime).
    /// Not the device number: a remount in between changes it ([`FileStamp`]).
    pub fn restored_in(&self, now: &Kind) -> bool {
        self.matches_by(now, FileStamp::same_inode_unchanged)
    }

    /// Content decides where `self` has a hash; otherwise size, mode and
    /// `same_stamp`. Non-files compare with [`Kind::same_as`].
    fn matches_by(&self, now: &Kind, same_stamp: impl Fn(&FileStamp, &FileStamp) -> bool) -> bool {
        match (self, now) {
            (
                Kind::File {
                    blake3: Some(_), ..
                },
                _,
            ) => self.same_as(now),
            (
                Kind::File {
                    size: s1,
                    mode: m1,
                    stamp: Some(t1),
                    ..
                },
                Kind::File {
                    size: s2,
                    mode: m2,
                    stamp: Some(t2),
                    ..
                },
            ) => s1 == s2 && m1 == m2 && same_stamp(t1, t2),
            (Kind::File { .. }, _) => false,
            _ => self.same_as(now),
        }
    }

    pub fn digest(&self) -> Option<&str> {
        match self {
            Kind::File { blake3, .. } => blake3.as_deref(),
            _ => None,
        }
    }

    pub fn size(&self) -> u64 {
        match self {
            Kind::File { size, .. } => *size,
            _ => 0,
        }
    }
    pub fn exists(&self) -> bool {
        !matches!(self, Kind::Missing)
    }

    /// Same content, type, mode and link target: what a mirror compares.
    /// Files compare equal only when both were hashed.
    pub fn same_as(&self, other: &Kind) -> bool {
        match (self, other) {
            (Kind::Missing, Kind::Missing) | (Kind::Dir { .. }, Kind::Dir { .. }) => true,
            (
                Kind::File {
                    size: s1,
                    mode: m1,
                    blake3: h1,
                    ..
                },
                Kind::File {
                    size: s2,
                    mode: m2,
                    blake3: h2,
                    ..
                },
            ) => s1 == s2 && m1 == m2 && h1.is_some() && h1 == h2,
            (Kind::Symlink { target: t1 }, Kind::Symlink { target: t2 }) => t1 == t2,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dev: u64, ino: u64, mtime_ns: i64, ctime_ns: i64) -> Kind {
        Kind::File {
            size: 3,
            mode: 0o644,
            blake3: None,
            stamp: Some(FileStamp {
                dev,
                ino,
                mtime_ns,
                ctime_ns,
            }),
        }
    }

    /// A remount that gives the file system a new device number changes
    /// nothing of its files: rollback's check and the drift check agree.
    #[test]
    fn a_new_device_number_alone_is_the_same_file() {
        let before = file(40, 7, 100, 200);
        assert!(before.restored_in(&file(41, 7, 100, 200)));
        assert!(before.unchanged_in(&file(41, 7, 100, 200)));
        // A rename back changes only the ctime: still the file rollback restored.
        assert!(before.restored_in(&file(41, 7, 100, 300)));
        assert!(!before.unchanged_in(&file(41, 7, 100, 300)));
        // Another inode, or a write since, is not.
        assert!(!before.restored_in(&file(40, 8, 100, 200)));
        assert!(!before.restored_in(&file(40, 7, 101, 200)));
        assert!(!before.unchanged_in(&file(40, 8, 100, 200)));
    }
}
