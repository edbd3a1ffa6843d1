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
use crate::model::{
    BLOCK, Compression, CopyCounts, ElfInfo, GenerationInfo, HashMode, LevelWindow,
    PreflightReport, PreflightRequest, PrepareRequest, Progress, RollbackReport, Running,
    ScanReport, SendFile, SendWaits, Set, ShebangRewrite, SourceHash, StageWaits, StatEntry,
    StreamEntry, VenvProcess, VerifyReport, VerifyRequest, Written,
};

/// Bumped whenever a frame changes shape. 18: `shared` in `Receive` (a
/// lane of a stream several targets share). 17: `OpenLanes`; `lane` in
/// `Receive` and in the direct route's request; `cores` in `Hello`. 16: `Running` (the processes
/// that run from the venv); `allow_running` in `Prepare` and `Rollback`;
/// `running` in `Prepared`, `Committed` and the rollback report. 15: `cuts` in `Send`, and the
/// `Segment` marks of a stream cut into segments. 14: `shared` in `Stage` (a
/// stream several targets take, [`StreamEntry`]). 13: `blocked` and `ratio` in a
/// measured window ([`LevelWindow`]); `StageLocal` and `CopiedLocal` (the
/// local route); `unreached` in an error. 12: `force` in `Rollback`; the
/// rollback report's `later`, `refused`, `displaced`, `inconsistent`;
/// `sudo` in a plan's hosts; `backup_bytes` in `Committed`; `versions` in
/// `PrepareRequest`. 11: `Abort` may be sent while a
/// `Switch` runs (it undoes the switch), which then sends `Progress`; the
/// error kind `interrupted`. 10: `ElfInfo.defined` is a
/// base64 string of symbol hashes; `PrefetchElf`. 9: a source's hash and a
/// measured window are named structs ([`SourceHash`], [`LevelWindow`]), not
/// arrays. 8: a written file is a named
/// struct (`index`, `blake3`, `stamp`), not an array. 7: a symlink's tar entry carries
/// its target as data (no GNU long-link records); `same_owner` in `Prepare`;
/// `Kind::ThroughSymlink` in stat answers.
pub const PROTOCOL_VERSION: u32 = 18;

/// Largest data frame: the packing tag and one block of the tar stream
/// (a zstd block is sent only when smaller than the block it packs).
pub const MAX_DATA: usize = 1 + BLOCK;

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
        /// Answer without this host's machine facts (`nvidia-smi` takes a
        /// moment): they are read meanwhile, for a `Machine` that follows.
        #[serde(default)]
        machine_later: bool,
    },
    /// This host's machine facts, read since a `Scan` with
    /// `machine_later` (a default `Machine` without one). Answered with
    /// `Machine`.
    Machine,
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
        sets: Vec<Set>,
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
    /// `cuts`: where the stream's segments start (positions in `files`;
    /// empty for none), each announced by a `Segment` before its first
    /// data frame (see [`crate::stream::send`]).
    Send {
        venv: String,
        files: Vec<SendFile>,
        cuts: Vec<usize>,
        shebang: Option<ShebangRewrite>,
        compression: Compression,
    },
    /// Target side: take the lock, recover an unfinished generation, check
    /// the plan's preconditions and free space, and open a new generation.
    Prepare(Box<PrepareRequest>),
    /// Target side: data frames with the packed tar stream follow, then
    /// `EndData`. `shared`: the stream is one several targets take (one
    /// read of the source); its entry `i` is `shared[i]` for this target.
    /// `None`: entry `i` is change `i`.
    Stage {
        shared: Option<Vec<StreamEntry>>,
    },
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
        /// Jump hosts for the source's `ssh -J` (the target's `proxy_jump`).
        #[serde(default)]
        proxy_jump: Option<String>,
        /// The agent executable on the target (from its `Hello`).
        agent: String,
        target_venv: String,
        generation: String,
        connect_timeout_secs: u64,
        /// One of several connections into the generation (see `Receive`).
        #[serde(default)]
        lane: Option<u32>,
    },
    /// Target side, from a source on the direct route or from the
    /// controller's relay on a connection of its own: unpack the stream
    /// that follows (data frames, then `EndData`) into the staging folder
    /// of `generation`, which the controller's own agent on this host has
    /// prepared and holds the lock for. Answered with `Received`. Without
    /// `lane` the staging folder must be empty (one stream fills it);
    /// with it, the generation must have been opened to that many lanes
    /// (`OpenLanes`), and the lanes' streams fill it side by side, each
    /// with its own files. With `shared` (a lane of a stream several
    /// targets share), the stream's entries map onto the generation's
    /// changes through the list, as in `Stage`'s.
    Receive {
        venv: String,
        generation: String,
        #[serde(default)]
        lane: Option<u32>,
        #[serde(default)]
        shared: Option<Vec<StreamEntry>>,
    },
    /// Target side: let `count` streams on other connections fill the
    /// staging folder of the generation `Prepare` opened (`Receive` with a
    /// lane below `count`), to be checked together by `StagedDirect`.
    /// Answered with `LanesOpen`.
    OpenLanes {
        count: u32,
    },
    /// Target side, after a direct stream: the staging folder was filled by
    /// another agent; check it against what both ends reported and mark the
    /// generation staged.
    StagedDirect {
        /// What the source read (as in `EndData`).
        hashes: Vec<SourceHash>,
        /// What the receiving agent wrote.
        written: Vec<Written>,
    },
    /// Target side, the local route (the source venv is on this machine):
    /// stage the files of the generation `Prepare` opened by copying them
    /// from the source venv at `source_venv` with the kernel's copy,
    /// checked against the plan as the stream is. `Progress` frames come
    /// while it runs; an `Abort` sent meanwhile stops it (answered with an
    /// error of kind `interrupted`, then `Aborted`). Answered with
    /// `CopiedLocal`.
    StageLocal {
        source_venv: String,
        shebang: Option<ShebangRewrite>,
    },
    /// The end of the stream, with the blake3 the source computed while
    /// reading each file the plan had not hashed (by change index).
    EndData {
        hashes: Vec<SourceHash>,
    },
    /// Target side: switch the staged files into place through the journal,
    /// then re-hash what changed. `Progress` frames come while it runs; an
    /// `Abort` sent meanwhile stops it and undoes it (answered with an error
    /// of kind `interrupted`, then `Aborted` for the `Abort`).
    Switch,
    /// Target side: mark the generation complete; drop its backup unless kept.
    Commit {
        keep_backup: bool,
        keep: Option<usize>,
    },
    /// Target side: give up the open generation; one that was switched, in
    /// part or whole, is undone first (Ctrl-C on the controller).
    Abort,
    /// Roll back generations down to and including `to` (default: the newest).
    Rollback {
        venv: String,
        to: Option<String>,
        /// Roll back over changes made since the apply (`rollback --force`).
        #[serde(default)]
        force: bool,
        /// Go on while processes run from the venv (`--allow-running`).
        #[serde(default)]
        allow_running: bool,
    },
    /// Target side: the processes that run from the venv (`crate::running`).
    Running {
        venv: String,
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
        /// With `resume`: go on while processes run from the venv
        /// (`apply --resume --allow-running`).
        #[serde(default)]
        allow_running: bool,
    },
    /// Run the `[verify]` check in the venv.
    Verify(Box<VerifyRequest>),
    /// Source side: ELF facts of these files (site-packages relative).
    ElfInfo {
        venv: String,
        paths: Vec<String>,
        /// The compute capabilities of the target's GPUs: GPU code is read
        /// until it runs on them (`None`: all of it; see
        /// `preflight::elf::fatbin`).
        #[serde(default)]
        gpus: Option<Vec<(u32, u32)>>,
    },
    /// Source side: start reading the ELF facts of these files (site-packages
    /// relative) in the background, for the `ElfInfo` that follows
    /// (answered at once with `Prefetching`).
    PrefetchElf {
        venv: String,
        paths: Vec<String>,
        /// As in `ElfInfo`.
        #[serde(default)]
        gpus: Option<Vec<(u32, u32)>>,
    },
    /// Target side: start listing site-packages' shared objects (and reading
    /// their ELF facts) in the background, for the `Preflight` that follows (answered at once with
    /// `Prefetching`). The walk reads every directory of the venv, and the
    /// agent is otherwise idle while the controller decides the plan.
    PrefetchPreflight {
        venv: String,
        /// As in `ElfInfo`: this host's GPUs.
        #[serde(default)]
        gpus: Option<Vec<(u32, u32)>>,
        /// Read GPU code only of these shared objects (site-packages
        /// relative: those of the sets, which the overlay may replace), for
        /// this and the `Preflight` that follows; `None`: of all.
        #[serde(default)]
        gpu_paths: Option<Vec<String>>,
    },
    /// Target side: predict what fails to load after the overlay.
    Preflight(Box<PreflightRequest>),
    /// Check the venv as it stands (`overlay doctor`).
    Doctor(Box<crate::model::DoctorRequest>),
    /// Check some distributions' files against their own RECORD (the
    /// source's carried dists, for `plan`'s note).
    RecordCheck(Box<crate::model::RecordCheckRequest>),
    Bye,
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
        /// The CPUs this agent may run on (how many connections a stream
        /// may take, see `docs/apply.md`); 0 if unknown.
        #[serde(default)]
        cores: u32,
    },
    Scan(ScanReport),
    Machine(crate::model::Machine),
    Progress(Progress),
    /// The data frames that follow are segment `index` of a `Send` with
    /// cuts.
    Segment {
        index: usize,
    },
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
        hashes: Vec<SourceHash>,
        /// With `Compression::Auto`: each measured window's level and the
        /// bytes of files per second that got through at it.
        #[serde(default)]
        windows: Vec<LevelWindow>,
        /// On the direct route: what the target wrote.
        #[serde(default)]
        written: Vec<Written>,
        /// Where the source's writer spent the stream.
        #[serde(default)]
        waits: SendWaits,
        /// On the direct route: where the target spent it.
        #[serde(default)]
        target_waits: StageWaits,
    },
    /// The receiving end of a direct stream: files and bytes staged.
    Received {
        files: u64,
        bytes: u64,
        written: Vec<Written>,
        #[serde(default)]
        waits: StageWaits,
    },
    Prepared {
        generation: String,
        recovered: Option<String>,
        /// What prepare could not check (free space a file system does
        /// not report): the controller warns.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        warnings: Vec<String>,
        /// The venv's file system and the durability barrier chosen for it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        durability: Option<crate::model::Durability>,
        /// The processes that run from the venv, allowed to
        /// (`allow_running`).
        #[serde(default)]
        running: Vec<VenvProcess>,
    },
    Staged {
        files: u64,
        bytes: u64,
        /// Where the target spent the stream (a relayed stage; none after
        /// a direct stream's check).
        #[serde(default)]
        waits: StageWaits,
    },
    /// The local route's copy is staged: files, bytes, and how the kernel
    /// copied them.
    CopiedLocal {
        files: u64,
        bytes: u64,
        copies: CopyCounts,
    },
    Switched {
        changed: u64,
    },
    Committed {
        generation: String,
        /// Bytes the generation's backup holds on the target (0 without one).
        #[serde(default)]
        backup_bytes: u64,
        /// Those of the processes `Prepared` named that still run: they
        /// run the old files.
        #[serde(default)]
        running: Vec<VenvProcess>,
    },
    Aborted,
    LanesOpen {
        count: u32,
    },
    RolledBack(RollbackReport),
    Running(Running),
    History {
        generations: Vec<GenerationInfo>,
        recovered: Option<String>,
    },
    Pruned {
        removed: Vec<String>,
        recovered: Option<String>,
    },
    Recovered {
        outcome: Option<String>,
    },
    Verified(VerifyReport),
    ElfInfo {
        infos: Vec<Option<ElfInfo>>,
    },
    Prefetching,
    Preflight(PreflightReport),
    Doctor(crate::model::DoctorReport),
    RecordChecked {
        findings: Vec<crate::model::Finding>,
    },
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

/// A frame's length field, checked against its cap: `Ok(None)` at a clean
/// end of stream, else the body's length and whether it is data.
fn read_head<T: Message>(r: &mut dyn Read) -> Result<Option<(usize, bool)>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(err!(kind = Connection, "connection failed: {e}")),
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
    Ok(Some((len, data)))
}

/// What [`read_raw`] read: a data frame, whole and as it came, or a message.
#[derive(Debug)]
pub enum RawFrame<T> {
    /// A data frame: its length field and body are the first this many
    /// bytes of the caller's buffer, ready to be written on unchanged.
    Data(usize),
    Msg(T),
}

/// Read a message, or a data frame into `buf` as it came (length field and
/// body, see [`RawFrame::Data`]) for a relay to pass on without decoding
/// it. The frame's size is checked before a byte of its body is read, as
/// in [`read_any`]. `buf` is grown once to the largest data frame and then
/// reused: nothing is allocated or zeroed per frame. `Ok(None)` at a clean
/// end of stream.
pub fn read_raw<T: Message>(r: &mut dyn Read, buf: &mut Vec<u8>) -> Result<Option<RawFrame<T>>> {
    let Some((len, data)) = read_head::<T>(r)? else {
        return Ok(None);
    };
    if !data {
        return read_message(r, len).map(|m| Some(RawFrame::Msg(m)));
    }
    if buf.len() < 4 + MAX_DATA {
        buf.resize(4 + MAX_DATA, 0);
    }
    buf[..4].copy_from_slice(&(len as u32 | DATA_BIT).to_le_bytes());
    let body = &mut buf[4..4 + len];
    let mut n = 0;
    while n < len {
        match r.read(&mut body[n..]) {
            Ok(0) => {
                return Err(err!(
                    kind = Connection,
                    "connection closed in the middle of a frame ({n} of {len} bytes)"
                ));
            }
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(err!(
                    kind = Connection,
                    "connection closed in the middle of a frame: {e}"
                ));
            }
        }
    }
    Ok(Some(RawFrame::Data(4 + len)))
}

/// Read a message's body of `len` bytes (already checked against its cap)
/// and decode it.
fn read_message<T: Message>(r: &mut dyn Read, len: usize) -> Result<T> {
    decode(&read_body(r, len)?)
}

/// Read a message or a data frame. `Ok(None)` at a clean end of stream.
pub fn read_any<T: Message>(r: &mut dyn Read) -> Result<Option<Frame<T>>> {
    let Some((len, data)) = read_head::<T>(r)? else {
        return Ok(None);
    };
    let body = read_body(r, len)?;
    if data {
        return Ok(Some(Frame::Data(body)));
    }
    decode(&body).map(|m| Some(Frame::Msg(m)))
}

/// A frame's body of `len` bytes (checked against its cap), as it arrives.
fn read_body(r: &mut dyn Read, len: usize) -> Result<Vec<u8>> {
    // Read into fresh capacity: a data frame is up to 1 MiB, and zeroing it
    // first would cost as much as a copy. A message grows as its bytes
    // arrive: its length alone reserves no more than a data frame's.
    let mut body = Vec::with_capacity(len.min(MAX_DATA));
    match r.take(len as u64).read_to_end(&mut body) {
        Ok(n) if n == len => {}
        Ok(n) => {
            return Err(err!(
                kind = Connection,
                "connection closed in the middle of a frame ({n} of {len} bytes)"
            ));
        }
        Err(e) => {
            return Err(err!(
                kind = Connection,
                "connection closed in the middle of a frame: {e}"
            ));
        }
    }
    Ok(body)
}

/// Decode a message's body.
fn decode<T: Message>(body: &[u8]) -> Result<T> {
    rmp_serde::from_slice(body).map_err(|e| {
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
mod tests;
