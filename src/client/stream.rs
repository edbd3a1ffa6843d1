//! The requests of a generation's stream: have a source send (to this
//! controller, or directly to the target), relay its events, have a target
//! stage what arrives or copy it on the local route, and end or abort the
//! stage.

use super::{Client, on_host};
use crate::error::Result;
use crate::model::{
    Compression, Progress, SendFile, Sent, ShebangRewrite, SourceHash, StageWaits, Written,
};
use crate::protocol::{RawFrame, Request, Response, read_raw};

/// What the target staged ([`Client::end_stage`], [`Client::staged_direct`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Staged {
    pub files: u64,
    pub bytes: u64,
    /// Where the target spent a relayed stream (zero after a direct
    /// stream's check: the source reports the receiving agent's).
    pub waits: crate::model::StageWaits,
}

/// What the target copied on the local route ([`Client::stage_local`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedLocal {
    pub files: u64,
    pub bytes: u64,
    pub copies: crate::model::CopyCounts,
}

/// What a source streams ([`Client::start_send`]).
#[derive(Debug, Clone)]
pub struct SendRequest {
    pub venv: String,
    pub files: Vec<SendFile>,
    /// Where the stream's segments start (positions in `files`, see
    /// [`crate::stream::send`]); empty for one stream. The relayed route
    /// only.
    pub cuts: Vec<usize>,
    pub shebang: Option<ShebangRewrite>,
    pub compression: Compression,
}

/// Where a direct stream goes ([`Client::start_send_direct`]).
#[derive(Debug, Clone)]
pub struct DirectTo {
    /// The target's ssh destination, as the source host knows it.
    pub ssh: String,
    /// Jump hosts for the source's `ssh -J`, if any.
    pub proxy_jump: Option<String>,
    /// The agent executable on the target (its [`Client::agent_exe`]).
    pub agent: String,
    pub target_venv: String,
    pub generation: String,
    pub connect_timeout_secs: u64,
    /// One of several connections into the generation (see
    /// [`Client::open_lanes`]).
    pub lane: Option<u32>,
}

/// One event of a source's stream ([`Client::stream_event`]).
#[derive(Debug)]
pub enum StreamEvent {
    /// A data frame of the stream, to relay to the target: the first this
    /// many bytes of the buffer given to [`Client::stream_event`], length
    /// field and all, as the source sent them (pass them on with
    /// [`Client::write_frame_bytes`]).
    Data(usize),
    Progress(Progress),
    /// The data frames that follow are this segment of a stream with cuts.
    Segment(usize),
    /// The stream is complete: what the source sent, and on the direct
    /// route what the target wrote.
    Sent {
        sent: Sent,
        written: Vec<Written>,
    },
}

impl Client {
    /// Have the source stream `files` to this controller as data frames
    /// (read them with [`Client::stream_event`]).
    pub fn start_send(&mut self, send: SendRequest) -> Result<()> {
        self.send(&Request::Send {
            venv: send.venv,
            files: send.files,
            cuts: send.cuts,
            shebang: send.shebang,
            compression: send.compression,
        })
    }

    /// Have the source stream `files` straight to the target over its own
    /// `ssh` (`apply --direct`); follow it with [`Client::stream_event`].
    pub fn start_send_direct(&mut self, send: SendRequest, to: DirectTo) -> Result<()> {
        self.send(&Request::SendDirect {
            venv: send.venv,
            files: send.files,
            shebang: send.shebang,
            compression: send.compression,
            ssh: to.ssh,
            proxy_jump: to.proxy_jump,
            agent: to.agent,
            target_venv: to.target_venv,
            generation: to.generation,
            connect_timeout_secs: to.connect_timeout_secs,
            lane: to.lane,
        })
    }

    /// The next event of a stream a source was asked for: stream data (read
    /// into `buf`, reused from frame to frame, see [`StreamEvent::Data`]),
    /// progress, or the end.
    pub fn stream_event(&mut self, buf: &mut Vec<u8>) -> Result<StreamEvent> {
        let host = self.host.clone();
        let frame = match read_raw::<Response>(&mut self.pipe()?.reader, buf) {
            Ok(Some(RawFrame::Msg(Response::Error(e)))) => return Err(on_host(e, &host)),
            Ok(Some(f)) => f,
            Ok(None) => return Err(self.died("it stopped in the middle of a stream")),
            Err(e) if self.gone().is_some() => return Err(self.died(&e.message)),
            Err(e) => return Err(on_host(e, &host)),
        };
        match frame {
            RawFrame::Data(n) => Ok(StreamEvent::Data(n)),
            RawFrame::Msg(Response::Progress(p)) => Ok(StreamEvent::Progress(p)),
            RawFrame::Msg(Response::Segment { index }) => Ok(StreamEvent::Segment(index)),
            RawFrame::Msg(Response::Sent {
                raw_bytes,
                compressed_bytes,
                hashes,
                windows,
                written,
                waits,
                target_waits,
                ..
            }) => Ok(StreamEvent::Sent {
                sent: Sent {
                    raw_bytes,
                    packed_bytes: compressed_bytes,
                    hashes,
                    windows,
                    waits,
                    target_waits,
                },
                written,
            }),
            RawFrame::Msg(other) => Err(self.unexpected("a stream", &other)),
        }
    }

    /// Have the target stage the relayed stream (data frames follow, sent
    /// with [`Client::write_frame_bytes`], then [`Client::end_stage`]).
    /// `shared`: the stream is one several targets take, and this is how
    /// its entries map onto this target's changes.
    pub fn start_stage(&mut self, shared: Option<Vec<crate::model::StreamEntry>>) -> Result<()> {
        self.send(&Request::Stage { shared })
    }

    /// End a relayed stream: the hashes the source computed while reading.
    pub fn end_stage(&mut self, hashes: Vec<SourceHash>) -> Result<Staged> {
        let req = Request::EndData { hashes };
        answer!(self, &req, "the end of a stream", Response::Staged { files, bytes, waits } => Staged { files, bytes, waits })
    }

    /// After a direct stream: have the target check what another agent
    /// staged against what both ends reported.
    pub fn staged_direct(
        &mut self,
        hashes: Vec<SourceHash>,
        written: Vec<Written>,
    ) -> Result<Staged> {
        let req = Request::StagedDirect { hashes, written };
        answer!(self, &req, "a direct stream's report", Response::Staged { files, bytes, waits } => Staged { files, bytes, waits })
    }

    /// The local route: have the target copy the generation's files from
    /// the source venv on its own machine, passing progress frames to
    /// `on_progress` and looking at `stop` at each: once it says stop
    /// (Ctrl-C), `Abort` is sent, and the target stops and discards the
    /// generation. Returns `None` then.
    pub fn stage_local(
        &mut self,
        source_venv: &str,
        shebang: Option<ShebangRewrite>,
        on_progress: &mut dyn FnMut(Progress),
        stop: &dyn Fn() -> bool,
    ) -> Result<Option<StagedLocal>> {
        self.send(&Request::StageLocal {
            source_venv: source_venv.to_string(),
            shebang,
        })?;
        let mut aborted = false;
        let answer = loop {
            match self.recv() {
                Ok(Response::Progress(p)) => {
                    on_progress(p);
                    if !aborted && stop() {
                        self.send(&Request::Abort)?;
                        aborted = true;
                    }
                }
                Ok(Response::CopiedLocal {
                    files,
                    bytes,
                    copies,
                }) if !aborted => {
                    return Ok(Some(StagedLocal {
                        files,
                        bytes,
                        copies,
                    }));
                }
                // Copied before the `Abort` came: it discards the generation.
                Ok(Response::CopiedLocal { .. }) => break Ok(()),
                Err(e) if aborted && !self.lost => break Err(e),
                Err(e) => return Err(e),
                Ok(other) => return Err(self.unexpected("a local copy", &other)),
            }
        };
        // The answer to the `Abort`: the target discarded the generation.
        match self.recv() {
            Ok(Response::Aborted) => Ok(None),
            Ok(other) => Err(self.unexpected("an abort", &other)),
            Err(e) => Err(answer.err().unwrap_or(e)),
        }
    }

    /// On the direct route, the source's side: have the target's agent
    /// unpack the stream that follows (data frames written with
    /// [`Client::writer`], then [`Client::end_receive`]) into the staging
    /// folder of `generation`, as one of its lanes if `lane` is given.
    pub fn start_receive(
        &mut self,
        venv: &str,
        generation: &str,
        lane: Option<u32>,
        shared: Option<Vec<crate::model::StreamEntry>>,
    ) -> Result<()> {
        self.send(&Request::Receive {
            venv: venv.to_string(),
            generation: generation.to_string(),
            lane,
            shared,
        })
    }

    /// End a received stream: the hashes the source computed while
    /// reading. Returns what the receiving agent wrote, and its waits.
    pub fn end_receive(&mut self, hashes: Vec<SourceHash>) -> Result<(Vec<Written>, StageWaits)> {
        let req = Request::EndData { hashes };
        answer!(self, &req, "the end of a received stream", Response::Received { written, waits, .. } => (written, waits))
    }

    /// Let `count` streams on other connections fill the staging folder of
    /// the generation `Prepare` opened ([`Client::start_receive`] with a lane).
    pub fn open_lanes(&mut self, count: u32) -> Result<()> {
        let req = Request::OpenLanes { count };
        answer!(self, &req, "opening the stream's lanes", Response::LanesOpen { .. } => ())
    }

    /// Give up the prepared generation (nothing was switched).
    pub fn abort(&mut self) -> Result<()> {
        answer!(self, &Request::Abort, "an abort", Response::Aborted => ())
    }
}
