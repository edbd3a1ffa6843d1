//! The controller–agent protocol: versioned, length-prefixed frames on the
//! agent's stdin/stdout.
//!
//! Each frame is a little-endian `u32` byte length followed by one
//! MessagePack value (JSON up to protocol 5), or, with the length's high bit
//! ([`DATA_BIT`]) set, by raw bytes of a data stream.
//!
//! Intake is bounded before a byte of a frame's body is read: a data frame
//! holds a tag byte and at most one block of the stream ([`MAX_DATA`]), a
//! message at most [`Message::MAX`] bytes (a request to an agent less than
//! an answer to the controller), and a message's body is read as it
//! arrives, never into capacity the length field merely claims. A peer that
//! claims more is refused with an error that names the frame's size.
//! The controller speaks first with [`Request::Hello`]; the agent answers with
//! its own protocol number, and either side refuses a mismatch. Requests are
//! answered in order; long requests send [`Response::Progress`] frames before
//! their result. Paths in requests are data, never parts of a command line.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::err;
use crate::error::{Error, Result};

/// Bumped whenever a frame changes shape. 7: a symlink's tar entry carries
/// its target as data (no GNU long-link records); `same_owner` in `Prepare`;
/// `Kind::ThroughSymlink` in stat answers.
pub const PROTOCOL_VERSION: u32 = 7;

/// Largest data frame: the packing tag and one block of the tar stream
/// (a zstd block is sent only when smaller than the block it packs).
pub const MAX_DATA: usize = 1 + crate::apply::BLOCK;

/// A message type and the largest frame of it accepted.
pub trait Message: DeserializeOwned {
    const MAX: usize;
}

/// Requests, which agents read: a `Prepare` of 100,000 changes is under
/// 50 MB of MessagePack (473 bytes for a change with a 100-byte path and
/// both sides hashed and stamped), so 256 MiB leaves room for a very large
/// venv and still bounds what a hostile sender can make an agent hold.
impl Message for Request {
    const MAX: usize = 256 << 20;
}

/// Answers, which the controller reads (a listing of a very large venv fits).
impl Message for Response {
    const MAX: usize = (1 << 30) - 1;
}

/// How the source packs the stream's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Pick the zstd level (or none) for the link as the stream goes.
    Auto,
    /// Store every block as is.
    None,
    /// zstd at this level.
    Zstd(i32),
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Compression, String> {
        match s {
            "auto" => Ok(Compression::Auto),
            "none" | "0" => Ok(Compression::None),
            n => match n.parse::<i32>() {
                Ok(l) if (-7..=19).contains(&l) => Ok(Compression::Zstd(l)),
                _ => Err(format!(
                    "{n:?} is not a compression: use auto, none, or a zstd level from -7 to 19"
                )),
            },
        }
    }
}

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

// Externally tagged (`{"stat": {...}}`), not `tag = "type"`: serde reads an
// internally tagged enum by buffering the whole message first, which for a
// stat of tens of thousands of paths cost more than the stat itself.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Request {
    Hello {
        protocol: u32,
    },
    /// List the venv's interpreter, site-packages, distributions and the
    /// files matching `file_globs` (relative to site-packages).
    Scan {
        venv: String,
        file_globs: Vec<String>,
    },
    /// Describe `paths` (relative to site-packages): type, size, mode, and
    /// their blake3 as `hash` asks. `shebang` rewrites script interpreters
    /// before hashing; `pycache` lists each `.py` file's compiled bytecode.
    Stat {
        venv: String,
        paths: Vec<String>,
        hash: HashMode,
        shebang: Option<ShebangRewrite>,
        pycache: bool,
    },
    /// [`Stat`](Request::Stat) of the sets' members on this host, as
    /// [`crate::plan::members`] finds them in the scan this agent answered
    /// last, plus `extra` paths: the paths themselves need not travel (a
    /// torch stack has 35,000). They are stated in [`crate::plan::stat_order`];
    /// `count` and `check` ([`crate::plan::order_check`]) are the
    /// controller's for that order, so a disagreement is an error, not a
    /// misread answer.
    StatMembers {
        venv: String,
        sets: Vec<crate::manifest::Set>,
        globs: Vec<String>,
        extra: Vec<String>,
        count: u64,
        check: u64,
        hash: HashMode,
        shebang: Option<ShebangRewrite>,
        pycache: bool,
    },
    /// Source side: stream these files as a tar stream in packed data frames,
    /// checking each against the hash the plan saw while it is read.
    Send {
        venv: String,
        files: Vec<SendFile>,
        shebang: Option<ShebangRewrite>,
        compression: Compression,
    },
    /// Target side: take the lock, recover an unfinished generation, check
    /// the plan's preconditions and free space, and open a new generation.
    Prepare(Box<crate::journal::PrepareRequest>),
    /// Target side: data frames with the packed tar stream follow, then `EndData`.
    Stage,
    /// Source side, `apply --direct`: like `Send`, but the stream goes
    /// straight to the target: the source starts `agent` there with its own
    /// `ssh` client (see `transport::openssh`) and sends it `Receive`.
    SendDirect {
        venv: String,
        files: Vec<SendFile>,
        shebang: Option<ShebangRewrite>,
        compression: Compression,
        /// The ssh destination of the target, as the source host knows it.
        ssh: String,
        /// The agent executable on the target (from its `Hello`).
        agent: String,
        target_venv: String,
        generation: String,
        connect_timeout_secs: u64,
    },
    /// Target side, from a source on the direct route: unpack the stream
    /// that follows (data frames, then `EndData`) into the staging folder
    /// of `generation`, which the controller's own agent on this host has
    /// prepared and holds the lock for. Answered with `Received`.
    Receive {
        venv: String,
        generation: String,
    },
    /// Target side, after a direct stream: the staging folder was filled by
    /// another agent; check it against what both ends reported and mark the
    /// generation staged.
    StagedDirect {
        /// What the source read (as in `EndData`).
        hashes: Vec<(usize, String)>,
        /// What the receiving agent wrote.
        written: Vec<crate::apply::Written>,
    },
    /// The end of the stream, with the blake3 the source computed while
    /// reading each file the plan had not hashed (by change index).
    EndData {
        hashes: Vec<(usize, String)>,
    },
    /// Target side: switch the staged files into place through the journal,
    /// then re-hash what changed.
    Switch,
    /// Target side: mark the generation complete; drop its backup unless kept.
    Commit {
        keep_backup: bool,
        keep: Option<usize>,
    },
    /// Target side: give up the prepared generation (nothing was switched).
    Abort,
    /// Roll back generations down to and including `to` (default: the newest).
    Rollback {
        venv: String,
        to: Option<String>,
    },
    History {
        venv: String,
    },
    Prune {
        venv: String,
        keep: usize,
    },
    /// Finish (roll back, or with `resume` complete) an interrupted generation.
    Recover {
        venv: String,
        resume: bool,
    },
    /// Run the `[verify]` check in the venv.
    Verify(Box<crate::verify::VerifyRequest>),
    /// Source side: ELF facts of these files (site-packages relative).
    ElfInfo {
        venv: String,
        paths: Vec<String>,
    },
    /// Target side: start listing site-packages' shared objects in the
    /// background, for the `Preflight` that follows (answered at once with
    /// `Prefetching`). The walk reads every directory of the venv, and the
    /// agent is otherwise idle while the controller decides the plan.
    PrefetchPreflight {
        venv: String,
    },
    /// Target side: predict what fails to load after the overlay.
    Preflight(Box<crate::preflight::PreflightRequest>),
    Bye,
}

/// One file for the source to send: its path and what the plan saw.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendFile {
    /// Its index in the generation's change list: the tar entry's name.
    pub index: usize,
    pub path: String,
    pub kind: Kind,
}

// Externally tagged, like `Request`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Hello {
        protocol: u32,
        version: String,
        /// The agent's own executable (for the direct route).
        #[serde(default)]
        exe: String,
    },
    Scan(ScanReport),
    Progress(Progress),
    /// One [`StatEntry`] per requested path, in the request's order.
    Stat {
        entries: Vec<StatEntry>,
    },
    /// Source: the stream is complete (data frames came before).
    Sent {
        files: u64,
        raw_bytes: u64,
        compressed_bytes: u64,
        /// blake3 of every file sent, computed while reading (by change index).
        hashes: Vec<(usize, String)>,
        /// With `Compression::Auto`: each measured window's level and the
        /// bytes of files per second that got through at it.
        #[serde(default)]
        windows: Vec<(i32, f64)>,
        /// On the direct route: what the target wrote.
        #[serde(default)]
        written: Vec<crate::apply::Written>,
    },
    /// The receiving end of a direct stream: files and bytes staged.
    Received {
        files: u64,
        bytes: u64,
        written: Vec<crate::apply::Written>,
    },
    Prepared {
        generation: String,
        recovered: Option<String>,
    },
    Staged {
        files: u64,
        bytes: u64,
    },
    Switched {
        changed: u64,
    },
    Committed {
        generation: String,
    },
    Aborted,
    RolledBack(crate::journal::RollbackReport),
    History {
        generations: Vec<crate::journal::GenerationInfo>,
        recovered: Option<String>,
    },
    Pruned {
        removed: Vec<String>,
        recovered: Option<String>,
    },
    Recovered {
        outcome: Option<String>,
    },
    Verified(crate::verify::VerifyReport),
    ElfInfo {
        infos: Vec<Option<crate::preflight::elf::ElfInfo>>,
    },
    Prefetching,
    Preflight(crate::preflight::PreflightReport),
    Error(Error),
    Bye,
}

/// A frame on the wire: a message, or raw bytes of a data stream.
#[derive(Debug)]
pub enum Frame<T> {
    Msg(T),
    Data(Vec<u8>),
}

/// The high bit of a frame's length marks raw data.
pub const DATA_BIT: u32 = 1 << 31;

/// Write raw stream bytes as one data frame (not flushed).
pub fn write_data(w: &mut dyn Write, bytes: &[u8]) -> std::io::Result<()> {
    write_data_parts(w, &[], bytes)
}

/// Write one data frame whose payload is `head` followed by `body`.
pub fn write_data_parts(w: &mut dyn Write, head: &[u8], body: &[u8]) -> std::io::Result<()> {
    w.write_all(&((head.len() + body.len()) as u32 | DATA_BIT).to_le_bytes())?;
    w.write_all(head)?;
    w.write_all(body)
}

/// Read a message or a data frame. `Ok(None)` at a clean end of stream.
pub fn read_any<T: Message>(r: &mut dyn Read) -> Result<Option<Frame<T>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(err!("connection failed: {e}")),
    }
    let raw = u32::from_le_bytes(len);
    let len = (raw & !DATA_BIT) as usize;
    let data = raw & DATA_BIT != 0;
    let max = if data { MAX_DATA } else { T::MAX };
    if len > max {
        return Err(err!(
            hint = "the other side is not a compatible overlay agent (or is hostile); nothing more was read from it",
            "{} frame of {len} bytes is larger than the {max} bytes allowed",
            if data { "data" } else { "message" }
        ));
    }
    // Read into fresh capacity: a data frame is up to 1 MiB, and zeroing it
    // first would cost as much as a copy. A message grows as its bytes
    // arrive: its length alone reserves no more than a data frame's.
    let mut body = Vec::with_capacity(len.min(MAX_DATA));
    match r.take(len as u64).read_to_end(&mut body) {
        Ok(n) if n == len => {}
        Ok(n) => {
            return Err(err!(
                "connection closed in the middle of a frame ({n} of {len} bytes)"
            ));
        }
        Err(e) => return Err(err!("connection closed in the middle of a frame: {e}")),
    }
    if data {
        return Ok(Some(Frame::Data(body)));
    }
    rmp_serde::from_slice(&body)
        .map(|m| Some(Frame::Msg(m)))
        .map_err(|e| {
            // Protocols 1-5 framed JSON. Our MessagePack messages start with
            // a map or a string, never with `{` (0x7b, the integer 123).
            if body.starts_with(b"{\"") {
                let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
                err!(
                    hint = "the other side is an older overlay (protocol 5 or before, JSON frames): use one overlay build on both ends (is OVERLAY_AGENT_BINARY another build?)",
                    "the other side speaks an older protocol; it said: {text}"
                )
            } else {
                err!(
                    hint = "controller and agent disagree on the protocol; use one overlay build on both ends",
                    "malformed frame: {e}"
                )
            }
        })
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Progress {
    pub files: u64,
    pub bytes: u64,
    pub total_files: u64,
    pub total_bytes: u64,
}

/// Replace `#!{from}/bin/` with `#!{to}/bin/` on the first line of scripts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShebangRewrite {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanReport {
    pub venv: String,
    /// site-packages relative to the venv, e.g. `lib/python3.11/site-packages`.
    pub site_packages: String,
    /// Interpreter `major.minor`, e.g. `3.11`.
    pub python: String,
    pub dists: Vec<Dist>,
    /// For each requested file glob, in request order, the matching paths.
    pub globs: Vec<Vec<String>>,
    #[serde(default)]
    pub facts: Facts,
}

/// One installed distribution (a `*.dist-info` directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dist {
    pub name: String,
    /// PEP 503-normalized name.
    pub normalized: String,
    pub version: String,
    /// The true build, e.g. `2.11.0+cu130` from `torch/version.py`, when it
    /// says more than the dist-info's version.
    pub build: Option<String>,
    /// The dist-info directory, relative to site-packages.
    pub dist_info: String,
    /// Paths relative to site-packages: RECORD's entries (without
    /// `__pycache__`) plus every file inside the dist-info directory.
    pub files: Vec<String>,
    /// Why RECORD or METADATA could not be read, if so.
    pub problem: Option<String>,
    /// METADATA `Requires-Dist` lines, verbatim.
    #[serde(default)]
    pub requires_dist: Vec<String>,
    /// METADATA `Provides-Extra`.
    #[serde(default)]
    pub provides_extra: Vec<String>,
    /// The CUDA version a `<pkg>/version.py` declares (`cuda = '13.0'`).
    #[serde(default)]
    pub cuda: Option<String>,
}

#[cfg(test)]
impl Dist {
    /// A distribution for unit tests: `name` `version` and nothing else.
    pub(crate) fn for_test(name: &str, version: &str) -> Dist {
        Dist {
            name: name.into(),
            normalized: crate::manifest::normalize_name(name),
            version: version.into(),
            build: None,
            dist_info: format!("{name}-{version}.dist-info"),
            files: vec![],
            problem: None,
            requires_dist: vec![],
            provides_extra: vec![],
            cuda: None,
        }
    }
}

/// What the agent knows of its host, for evaluating markers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    /// `version` from pyvenv.cfg, e.g. `3.11.2`.
    pub python_full: String,
    /// `uname -m`, `-r`, `-v`.
    pub machine: String,
    pub release: String,
    pub kernel_version: String,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl FileStamp {
    /// The same inode, not modified since (a rename changes only the ctime).
    pub fn same_inode_unchanged(&self, now: &FileStamp) -> bool {
        self.dev == now.dev && self.ino == now.ino && self.mtime_ns == now.mtime_ns
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
        self.matches_by(now, |a, b| a == b)
    }

    /// After a rollback: is `now` the file that `self` was before the apply?
    /// With a hash, the content decides. Without one, the same inode with the
    /// same size and mtime: rollback renames the old inode back, and overlay
    /// never writes into an existing inode (a rename changes only its ctime).
    pub fn restored_in(&self, now: &Kind) -> bool {
        self.matches_by(now, |a, b| {
            (a.dev, a.ino, a.mtime_ns) == (b.dev, b.ino, b.mtime_ns)
        })
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

/// Write one frame and flush.
pub fn write_frame<T: Serialize>(w: &mut dyn Write, value: &T) -> std::io::Result<()> {
    let body = rmp_serde::to_vec_named(value).map_err(std::io::Error::other)?;
    w.write_all(&(body.len() as u32).to_le_bytes())?;
    w.write_all(&body)?;
    w.flush()
}

/// Read one message frame. `Ok(None)` at a clean end of stream.
pub fn read_frame<T: Message>(r: &mut dyn Read) -> Result<Option<T>> {
    match read_any(r)? {
        None => Ok(None),
        Some(Frame::Msg(m)) => Ok(Some(m)),
        Some(Frame::Data(_)) => Err(err!("unexpected data frame where a message was due")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that counts what was taken from it.
    struct Counting<'a>(&'a [u8], usize);
    impl Read for Counting<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1 += n;
            Ok(n)
        }
    }

    #[test]
    fn oversize_frames_are_refused_before_their_body_is_read() {
        // A data frame claiming 512 MiB, a request claiming 300 MiB.
        for (raw, what) in [
            ((512u32 << 20) | DATA_BIT, "data frame of 536870912 bytes"),
            (
                (MAX_DATA as u32 + 1) | DATA_BIT,
                "data frame of 1048578 bytes",
            ),
            (300 << 20, "message frame of 314572800 bytes"),
        ] {
            let mut bytes = raw.to_le_bytes().to_vec();
            bytes.extend([0u8; 4096]);
            let mut r = Counting(&bytes, 0);
            let e = read_any::<Request>(&mut r).unwrap_err();
            assert!(e.message.contains(what), "{}", e.message);
            assert!(e.message.contains("larger than"), "{}", e.message);
            assert_eq!(r.1, 4, "only the length was read");
        }
        // An answer may be bigger than a request (a listing of a big venv):
        // 300 MiB is not refused for its size, only for being cut short.
        let mut bytes = (300u32 << 20).to_le_bytes().to_vec();
        bytes.extend([0u8; 16]);
        let e = read_any::<Response>(&mut bytes.as_slice()).unwrap_err();
        assert!(
            e.message.contains("in the middle of a frame"),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_full_data_frame_is_accepted() {
        let mut buf = Vec::new();
        write_data(&mut buf, &vec![1u8; MAX_DATA]).unwrap();
        let Some(Frame::Data(d)) = read_any::<Request>(&mut buf.as_slice()).unwrap() else {
            panic!()
        };
        assert_eq!(d.len(), MAX_DATA);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

            /// Whatever the bytes: no panic, and no frame holds more than
            /// its cap (nor the capacity for more).
            #[test]
            fn the_frame_reader_is_bounded_on_any_input(
                data in proptest::collection::vec(any::<u8>(), 0..2048),
            ) {
                let mut r = data.as_slice();
                while let Ok(Some(f)) = read_any::<Request>(&mut r) {
                    if let Frame::Data(d) = f {
                        prop_assert!(d.capacity() <= MAX_DATA);
                    }
                }
            }

            /// A frame's length field alone: over the cap is refused after
            /// reading 4 bytes; under it, the capacity reserved is no more
            /// than the bytes that actually arrived or a data frame's cap.
            #[test]
            fn a_claimed_length_reserves_nothing_beyond_the_cap(
                len in any::<u32>(),
                body in proptest::collection::vec(any::<u8>(), 0..512),
            ) {
                let mut bytes = len.to_le_bytes().to_vec();
                bytes.extend(&body);
                let mut r = Counting(&bytes, 0);
                let claimed = (len & !DATA_BIT) as usize;
                let cap = if len & DATA_BIT != 0 { MAX_DATA } else { <Request as Message>::MAX };
                match read_any::<Request>(&mut r) {
                    Ok(Some(Frame::Data(d))) => prop_assert!(d.len() == claimed && d.capacity() <= MAX_DATA),
                    _ if claimed > cap => prop_assert_eq!(r.1, 4),
                    _ => prop_assert!(r.1 <= 4 + claimed),
                }
            }

            /// The MessagePack request decoder on arbitrary bytes, and on a
            /// real `Prepare` with bytes changed: no panic.
            #[test]
            fn the_request_decoder_never_panics(
                data in proptest::collection::vec(any::<u8>(), 0..1024),
                flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
            ) {
                let _ = rmp_serde::from_slice::<Request>(&data);
                let req = Request::Prepare(Box::new(crate::journal::PrepareRequest {
                    venv: "/v".into(),
                    source: "s".into(),
                    target: "t".into(),
                    plan_created: 1,
                    changes: vec![crate::journal::GenChange {
                        path: "a/b.py".into(),
                        action: crate::plan::Action::Replace,
                        source: Some(Kind::File { size: 5, mode: 0o644, blake3: Some("ab".into()), stamp: None }),
                        target: Some(Kind::Symlink { target: "x".into() }),
                        bytecode: false,
                        staged: None,
                    }],
                    backup: false,
                    resume: false,
                    same_owner: false,
                }));
                let mut m = rmp_serde::to_vec_named(&req).unwrap();
                for (at, b) in flips {
                    let n = m.len();
                    m[at % n] = b;
                }
                let _ = rmp_serde::from_slice::<Request>(&m);
            }
        }
    }

    /// One change of a `Prepare` as MessagePack: what bounds a request.
    #[test]
    fn a_prepare_of_100k_changes_fits_a_request_frame() {
        let change = crate::journal::GenChange {
            path: "nvidia/cublas/lib/python3.11/site-packages/some/long/module_name.cpython-311-x86_64-linux-gnu.so".into(),
            action: crate::plan::Action::Replace,
            source: Some(Kind::File { size: 123_456_789, mode: 0o755, blake3: Some("a".repeat(64)), stamp: Some(FileStamp { dev: 2049, ino: 1 << 40, mtime_ns: 1 << 60, ctime_ns: 1 << 60 }) }),
            target: Some(Kind::File { size: 123_456_789, mode: 0o755, blake3: Some("b".repeat(64)), stamp: Some(FileStamp { dev: 2049, ino: 1 << 40, mtime_ns: 1 << 60, ctime_ns: 1 << 60 }) }),
            bytecode: false,
            staged: None,
        };
        let one = rmp_serde::to_vec_named(&change).unwrap().len();
        eprintln!("one change of a Prepare: {one} bytes");
        assert!(
            one * 100_000 < <Request as Message>::MAX / 4,
            "{one} bytes a change"
        );
    }

    #[test]
    fn a_json_frame_from_an_older_agent_is_named_as_such() {
        let body = br#"{"error":{"message":"malformed request"}}"#;
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(body);
        let e = read_frame::<Response>(&mut frame.as_slice()).unwrap_err();
        assert!(e.message.contains("older protocol"), "{}", e.message);
        assert!(e.message.contains("malformed request"), "{}", e.message);
        assert!(e.hint.unwrap().contains("one overlay build"));
    }

    #[test]
    fn stat_entries_round_trip_without_path_and_drop_a_hashed_files_stamp() {
        let stamp = FileStamp {
            dev: 2049,
            ino: 7,
            mtime_ns: -1,
            ctime_ns: 1_732_999_999_123_456_789,
        };
        let kinds = [
            Kind::Missing,
            Kind::File {
                size: 5,
                mode: 0o644,
                blake3: None,
                stamp: Some(stamp),
            },
            Kind::Symlink {
                target: "../x".into(),
            },
            Kind::Dir { mode: 0o755 },
            Kind::Other,
            Kind::ThroughSymlink {
                link: "evil_data".into(),
            },
        ];
        for kind in kinds {
            let e = Entry {
                path: "a/b.py".into(),
                kind,
                pyc: vec!["a/__pycache__/b.cpython-311.pyc".into()],
            };
            let wire = serde_json::to_string(&StatEntry::from_entry(e.clone())).unwrap();
            assert!(!wire.contains("a/b.py\""), "{wire}");
            let back: StatEntry = serde_json::from_str(&wire).unwrap();
            assert_eq!(back.into_entry("a/b.py".into()), Some(e));
        }
        let hashed = Entry {
            path: "t.so".into(),
            kind: Kind::File {
                size: 5,
                mode: 0o755,
                blake3: Some("ab".into()),
                stamp: Some(stamp),
            },
            pyc: vec![],
        };
        let wire = serde_json::to_string(&StatEntry::from_entry(hashed)).unwrap();
        assert_eq!(wire, r#"[1,5,493,"ab",null,null,[]]"#);
        let bad: StatEntry = serde_json::from_str("[9,0,0,null,null,null,[]]").unwrap();
        assert_eq!(bad.into_entry("x".into()), None);
    }

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Request::Hello { protocol: 7 }).unwrap();
        write_frame(&mut buf, &Request::Bye).unwrap();
        let mut r = &buf[..];
        let a: Request = read_frame(&mut r).unwrap().unwrap();
        assert!(matches!(a, Request::Hello { protocol: 7 }));
        let b: Request = read_frame(&mut r).unwrap().unwrap();
        assert!(matches!(b, Request::Bye));
        assert!(read_frame::<Request>(&mut r).unwrap().is_none());
    }

    #[test]
    fn truncated_and_garbage_frames_are_errors() {
        let mut r: &[u8] = &[5, 0, 0, 0, b'{'];
        assert!(read_frame::<Request>(&mut r).is_err());
        let mut r: &[u8] = &[255, 255, 255, 255];
        assert!(read_frame::<Request>(&mut r).is_err());
        let mut r: &[u8] = &[2, 0, 0, 0, b'4', b'2'];
        assert!(read_frame::<Request>(&mut r).is_err());
    }
}
