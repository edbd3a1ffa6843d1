//! The file stream of an apply: which files the source sends, how the
//! blocks are packed, the progress both ends report, the shebang rewrite,
//! what the target wrote ([`Written`]), and what each end reports of a
//! stream ([`Sent`] with its [`SourceHash`]es and [`LevelWindow`]s,
//! [`Unpacked`], [`StageCount`]).

use serde::{Deserialize, Serialize};

use super::Kind;

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

/// How many SSH connections a stream takes (`apply --connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Connections {
    /// As many as the cores at both ends (and this machine, on the relay)
    /// and the bytes to send allow, once a first part showed the link is
    /// fast; one on a slow link (docs/apply.md, "Connections").
    #[default]
    Auto,
    /// This many, from the start.
    Fixed(u32),
}

/// The most connections `--connections` takes.
pub const MAX_CONNECTIONS: u32 = 32;

impl std::str::FromStr for Connections {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Connections, String> {
        match s {
            "auto" => Ok(Connections::Auto),
            n => match n.parse::<u32>() {
                Ok(c) if (1..=MAX_CONNECTIONS).contains(&c) => Ok(Connections::Fixed(c)),
                _ => Err(format!(
                    "{n:?} is not a number of connections: use auto or 1 to {MAX_CONNECTIONS}"
                )),
            },
        }
    }
}

/// One file for the source to send: its path and what the plan saw. A
/// regular file's `blake3`: the plan's hash (the receiver checks it, the
/// source does not hash); `None`: unhashed in the plan (the source checks
/// its stamp before and after reading it, hashes it, and sends the hash at
/// the end); `Some("")`: the receiver hashes it itself (`pack`'s bundle
/// writer), and the source only checks its stamp.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SendFile {
    /// Its index in the generation's change list: the tar entry's name.
    pub index: usize,
    pub path: String,
    pub kind: Kind,
}

impl SendFile {
    /// The files a generation's changes stage, in its order: every change
    /// that is not a delete, by its index in the list.
    pub fn of_changes(changes: &[super::GenChange]) -> Vec<SendFile> {
        changes
            .iter()
            .enumerate()
            .filter(|(_, c)| c.action != super::Action::Delete)
            .filter_map(|(index, c)| {
                Some(SendFile {
                    index,
                    path: c.path.clone(),
                    kind: c.source.clone()?,
                })
            })
            .collect()
    }
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

/// The stream is cut into blocks of this many bytes; each is packed (zstd
/// or stored) and sent as one data frame.
pub const BLOCK: usize = 1 << 20;

/// One entry of a stream that several targets share (one read of the
/// source fanned out to them, `fleet::fanout`), as one target takes it: the
/// stream's entry `i` is the `i`th of the list the target was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StreamEntry {
    /// This target's change with this index (in its generation's list).
    Take(usize),
    /// Another target's file: its `size` bytes of data are read and
    /// dropped; nothing is written.
    Skip { size: u64 },
}

/// A staged file as the target wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Written {
    /// Its index in the generation's change list.
    pub index: usize,
    /// The blake3 of what was written.
    pub blake3: String,
    /// The staged file's identity, so the switch can prove it unchanged.
    pub stamp: super::FileStamp,
}

/// The blake3 the source computed of a file while sending it (a file the
/// plan did not hash, or a rewritten script).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceHash {
    /// The file's index in the generation's change list.
    pub index: usize,
    pub blake3: String,
}

/// One window `--compress auto` measured: the level it packed at, the
/// bytes of files per second that got through at it, the fraction of the
/// window the source's writer was blocked handing blocks to the link, and
/// the bytes of files per byte on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LevelWindow {
    /// The zstd level (0: stored).
    pub level: i32,
    pub bytes_per_sec: f64,
    #[serde(default)]
    pub blocked: f64,
    #[serde(default)]
    pub ratio: f64,
}

/// What the source sent: the bytes of files read, the bytes put on the
/// connection (packed, with each block's tag), the hash of every regular
/// file read, and with `--compress auto` the windows the tuner measured.
#[derive(Debug, Clone, Default)]
pub struct Sent {
    pub raw_bytes: u64,
    pub packed_bytes: u64,
    pub hashes: Vec<SourceHash>,
    pub windows: Vec<LevelWindow>,
    pub waits: SendWaits,
    /// On the direct route: where the target spent the stream.
    pub target_waits: StageWaits,
}

/// Where the source's writer spent a stream, in seconds (`apply -vv`'s
/// "stream waits" line, `--json`'s `waits`): blocked handing packed blocks
/// to the connection (what is downstream, the link or the target, is the
/// limit) against waiting for the next packed block (reading or packing
/// the files is).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SendWaits {
    /// From the first block packed to the last handed over.
    pub secs: f64,
    /// Blocked handing blocks to the connection.
    pub sink_secs: f64,
    /// Waiting for the next packed block.
    pub starved_secs: f64,
}

/// Where the target's side of a stream spent its time, in seconds: the
/// reader of the connection (waiting for input, decompressing, waiting for
/// the unpacker to take a block) and the unpacker (waiting for the writer,
/// that is the disk), then the fsyncs after the last byte. Input waits
/// mean the link or the source is the limit; the others, the target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StageWaits {
    /// From the first frame read to the stage durable.
    pub secs: f64,
    /// The reader waited for the next frame.
    pub input_secs: f64,
    /// The reader decompressed frames.
    pub decode_secs: f64,
    /// The reader waited for the unpacker to take a decoded block
    /// (hashing, creating files, or the disk behind them).
    pub behind_secs: f64,
    /// The unpacker waited for the writer to take a chunk (the disk).
    pub disk_secs: f64,
    /// After the last byte: the staged files' fsyncs finishing.
    pub durable_secs: f64,
}

/// Where both ends spent a stream (`apply --json`'s `waits`); the
/// streams of several sources (sets with `from`) add up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamWaits {
    pub source: SendWaits,
    pub target: StageWaits,
}

impl SendWaits {
    /// Another stream's figures added to these (a stream in parts).
    pub fn add(&mut self, o: &SendWaits) {
        self.secs += o.secs;
        self.sink_secs += o.sink_secs;
        self.starved_secs += o.starved_secs;
    }
}

impl StageWaits {
    /// Another stream's figures added to these (a stream in parts).
    pub fn add(&mut self, o: &StageWaits) {
        self.secs += o.secs;
        self.input_secs += o.input_secs;
        self.decode_secs += o.decode_secs;
        self.behind_secs += o.behind_secs;
        self.disk_secs += o.disk_secs;
        self.durable_secs += o.durable_secs;
    }
}

impl StreamWaits {
    /// This stream's figures added to those of the streams before it.
    pub fn add(&mut self, o: &StreamWaits) {
        self.source.add(&o.source);
        self.target.add(&o.target);
    }
}

/// What the source sent on the direct route, and what the target wrote
/// (`sent.target_waits`: where the target spent the stream).
#[derive(Debug, Clone, Default)]
pub struct SentDirect {
    pub sent: Sent,
    pub written: Vec<Written>,
}

/// Files and bytes in a generation's staging folder.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageCount {
    pub files: u64,
    /// Bytes of regular files (symlinks count none).
    pub bytes: u64,
}

/// What the target unpacked into staging, and each regular file it wrote.
#[derive(Debug, Clone, Default)]
pub struct Unpacked {
    pub count: StageCount,
    pub written: Vec<Written>,
    pub waits: StageWaits,
}

/// How the kernel copied the files of a local copy (`apply` with both
/// hosts on this machine): whole-file clones, big files read and written
/// past the page cache (`O_DIRECT`), `copy_file_range`, plain reads and
/// writes (where the kernel refused the others), and scripts whose shebang
/// was rewritten (read, rewritten, written); and in how many lanes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyCounts {
    pub reflink: u64,
    #[serde(default)]
    pub direct: u64,
    pub copy_range: u64,
    pub read_write: u64,
    pub rewritten: u64,
    /// How many lanes copied at once.
    #[serde(default)]
    pub lanes: u64,
}

/// What a local copy staged: the count, each regular file as written (and
/// the blake3 read back from it, which is also the source's), and how the
/// kernel copied them.
#[derive(Debug, Clone, Default)]
pub struct Copied {
    pub count: StageCount,
    pub written: Vec<Written>,
    pub hashes: Vec<SourceHash>,
    pub copies: CopyCounts,
}
