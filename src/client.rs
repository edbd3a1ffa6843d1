//! The controller's end of an agent connection: one method per request
//! over a [`crate::transport::AgentPipe`], each returning its
//! answer as a named result (progress callbacks where the request streams
//! [`Progress`]).
//!
//! This is the only code outside the agent that reads a [`Response`]: an
//! answer that does not fit its question is one error, of kind
//! [`Protocol`](crate::error::ErrorKind::Protocol), made in one place. The
//! untyped [`Client::request`], [`Client::response`] and [`Client::writer`]
//! remain for the source agent's direct sender (`crate::apply`).

use crate::err;
use crate::error::{Error, Result};
use crate::transport::{self, AgentPipe, ConnectOptions, Watch};

use super::protocol::{
    PROTOCOL_VERSION, RawFrame, Request, Response, read_frame, read_raw, write_frame,
};
use crate::model::{
    Compression, ElfInfo, Endpoint, Entry, GenerationInfo, HashMode, PreflightReport,
    PreflightRequest, PrepareRequest, Progress, RollbackReport, ScanReport, SendFile, Sent, Set,
    ShebangRewrite, SourceHash, VerifyReport, VerifyRequest, Written,
};

/// A generation opened on the target ([`Client::prepare`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The new generation's id.
    pub generation: String,
    /// What was done first to an interrupted generation, if there was one.
    pub recovered: Option<String>,
}

/// A generation committed on the target ([`Client::commit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The generation's id.
    pub generation: String,
    /// Bytes its backup holds on the target (0 without one).
    pub backup_bytes: u64,
}

/// What the target staged ([`Client::end_stage`], [`Client::staged_direct`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Staged {
    pub files: u64,
    pub bytes: u64,
}

/// What the target copied on the local route ([`Client::stage_local`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedLocal {
    pub files: u64,
    pub bytes: u64,
    pub copies: crate::model::CopyCounts,
}

/// A venv's generations ([`Client::history`]).
#[derive(Debug, Clone)]
pub struct History {
    pub generations: Vec<GenerationInfo>,
    /// What was done first to an interrupted generation, if there was one.
    pub recovered: Option<String>,
}

/// The generations [`Client::prune`] removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pruned {
    pub removed: Vec<String>,
    /// What was done first to an interrupted generation, if there was one.
    pub recovered: Option<String>,
}

/// What a source streams ([`Client::start_send`]).
#[derive(Debug, Clone)]
pub struct SendRequest {
    pub venv: String,
    pub files: Vec<SendFile>,
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
    /// The stream is complete: what the source sent, and on the direct
    /// route what the target wrote.
    Sent {
        sent: Sent,
        written: Vec<Written>,
    },
}

/// Ask `$req` of the agent and take the answer that matches `$pat` as
/// `$out`; any other answer is the one "unexpected answer" error.
macro_rules! answer {
    ($client:ident, $req:expr, $what:expr, $pat:pat => $out:expr) => {
        match $client.call($req, &mut |_| {})? {
            $pat => Ok($out),
            other => Err($client.unexpected($what, &other)),
        }
    };
}

/// A connected agent on one host.
pub struct Client {
    /// The manifest's host name, used in every message.
    pub host: String,
    pipe: Option<AgentPipe>,
    /// The agent's executable, from its greeting.
    exe: String,
    /// Set once the agent or its connection died (the pipe is gone then).
    lost: bool,
}

impl Client {
    /// Start the agent on `host` and shake hands; `sudo`: run it as that
    /// user through `sudo -n` (the manifest's `sudo`).
    pub fn connect(
        host: &str,
        endpoint: &Endpoint,
        sudo: Option<&str>,
        opts: &ConnectOptions,
    ) -> Result<Client> {
        if let Endpoint::Ssh(target) = endpoint {
            // Most runs find this build on the host already: start it
            // straight away. Only if it does not answer (first run of a new
            // build, a damaged copy) check over SFTP and upload.
            let pipe = transport::ssh::start_cached_agent(host, target, sudo, opts)?;
            if let Ok(c) = Client::over(host, pipe) {
                return Ok(c);
            }
        }
        let pipe = transport::start_agent(host, endpoint, sudo, opts)?;
        Client::over(host, pipe)
    }

    /// Greet the agent at the other end of `pipe`.
    pub fn over(host: &str, pipe: AgentPipe) -> Result<Client> {
        let mut c = Client {
            host: host.to_string(),
            pipe: Some(pipe),
            exe: String::new(),
            lost: false,
        };
        let greeting = c
            .send(&Request::Hello {
                protocol: PROTOCOL_VERSION,
            })
            .and_then(|()| c.recv());
        let greeting = match greeting {
            Ok(g) => g,
            Err(e) => {
                // What the agent, or the program that should have run it, said.
                let said = c.abandon();
                let said = said.trim();
                return Err(Error {
                    message: if said.is_empty() {
                        e.message
                    } else {
                        format!("{} ({said})", e.message)
                    },
                    ..e
                });
            }
        };
        match greeting {
            Response::Hello { protocol, exe, .. } if protocol == PROTOCOL_VERSION => {
                c.exe = exe;
                Ok(c)
            }
            Response::Hello {
                protocol, version, ..
            } => Err(err!(
                hint = "the agent binary differs from this controller (is OVERLAY_AGENT_BINARY another build?); use one overlay build on both ends",
                "The agent on {host} (overlay {version}) speaks protocol {protocol}, this controller {PROTOCOL_VERSION}"
            )),
            other => Err(c.unexpected("the greeting", &other)),
        }
    }

    fn pipe(&mut self) -> Result<&mut AgentPipe> {
        let host = &self.host;
        self.pipe
            .as_mut()
            .ok_or_else(|| err!("The agent on {host} is gone"))
    }

    fn send(&mut self, req: &Request) -> Result<()> {
        let r = write_frame(&mut self.pipe()?.writer, req);
        r.map_err(|e| self.died(&e.to_string()))
    }

    fn recv(&mut self) -> Result<Response> {
        let host = self.host.clone();
        match read_frame::<Response>(&mut self.pipe()?.reader) {
            Ok(Some(Response::Error(e))) => Err(on_host(e, &host)),
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(self.died("it closed the connection")),
            Err(e) if self.gone().is_some() => Err(self.died(&e.message)),
            Err(e) => Err(on_host(e, &host)),
        }
    }

    /// The agent or its connection died (`cause`: what the pipe said):
    /// collect how it ended (its exit status or signal, what it wrote on
    /// stderr) and say so. Returns at once for a dead agent or a cut
    /// connection, which is all this is called for.
    fn died(&mut self, cause: &str) -> Error {
        let host = &self.host;
        self.lost = true;
        let how = self.pipe.take().map(|p| {
            drop(p.writer);
            drop(p.reader);
            (p.finish)()
        });
        let message = match how {
            // The agent never ran, and the transport knows why and what to
            // do (sudo wanted a password, or is missing): that error.
            Some(Err(e))
                if e.message
                    .starts_with(&format!("Failed to start the agent on {host}")) =>
            {
                return e;
            }
            // "The agent on HOST was killed by signal 9 (KILL)", "... exited with status 2: ..."
            Some(Err(e)) if e.message.starts_with(&format!("The agent on {host} ")) => e.message,
            // Over SSH: the session (sshd) or the network died before the agent.
            Some(Err(e)) => {
                let prefix = format!("Failed to wait for the agent on {host}: ");
                format!(
                    "Lost the connection to the agent on {host} (its SSH session or the network went away): {}",
                    e.message.strip_prefix(&prefix).unwrap_or(&e.message)
                )
            }
            Some(Ok(text)) if !text.trim().is_empty() => {
                format!("The agent on {host} stopped: {}", text.trim())
            }
            _ => format!("The agent on {host} stopped: {cause}"),
        };
        err!(
            kind = Connection,
            hint = "run again; if it repeats, check the host's logs, or run `overlay agent` on that host by hand to see why",
            "{message}"
        )
    }

    /// Whether the agent or its connection died (see [`Watch::gone`]).
    /// Takes none of its output.
    pub fn gone(&self) -> Option<String> {
        self.pipe.as_ref().and_then(|p| p.watch.gone())
    }

    /// The agent died, as [`Client::gone`] or another thread found: end the
    /// connection and say how it ended.
    pub fn dead(&mut self) -> Error {
        let cause = self.gone().unwrap_or_else(|| "it stopped".into());
        self.died(&cause)
    }

    /// A handle on this agent for another thread, while this one waits on
    /// something else.
    pub fn watch(&self) -> Option<Watch> {
        self.pipe.as_ref().map(|p| p.watch.clone())
    }

    /// Whether the agent or its connection died during this conversation.
    pub fn lost(&self) -> bool {
        self.lost
    }

    /// Scan the venv.
    pub fn scan(&mut self, venv: &str, file_globs: &[String]) -> Result<ScanReport> {
        self.send(&Request::Scan {
            venv: venv.to_string(),
            file_globs: file_globs.to_vec(),
        })?;
        match self.recv()? {
            Response::Scan(r) => Ok(r),
            other => Err(self.unexpected("a scan", &other)),
        }
    }

    /// Stat and hash paths, reporting progress.
    pub fn stat(
        &mut self,
        venv: &str,
        paths: Vec<String>,
        hash: HashMode,
        shebang: Option<ShebangRewrite>,
        pycache: bool,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<Entry>> {
        let req = Request::Stat {
            venv: venv.to_string(),
            paths,
            hash,
            shebang,
            pycache,
        };
        self.send(&req)?;
        let Request::Stat { paths, .. } = req else {
            unreachable!()
        };
        self.stat_answer(paths, on_progress)
    }

    /// Stat the members of `sets` on this host (found in the scan it
    /// answered) and `extra` paths: the answer is for `order`, which is
    /// [`crate::plan::stat_order`] of the same, as the controller computed it.
    #[allow(clippy::too_many_arguments)]
    pub fn stat_members(
        &mut self,
        venv: &str,
        sets: &[Set],
        globs: &[String],
        extra: Vec<String>,
        order: Vec<String>,
        check: u64,
        hash: HashMode,
        shebang: Option<ShebangRewrite>,
        pycache: bool,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<Entry>> {
        self.send(&Request::StatMembers {
            venv: venv.to_string(),
            sets: sets.to_vec(),
            globs: globs.to_vec(),
            extra,
            count: order.len() as u64,
            check,
            hash,
            shebang,
            pycache,
        })?;
        self.stat_answer(order, on_progress)
    }

    /// Read a stat's answer: one entry for each of `paths`, in order.
    fn stat_answer(
        &mut self,
        paths: Vec<String>,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<Entry>> {
        loop {
            match self.recv()? {
                Response::Progress(p) => on_progress(p),
                Response::Stat { entries } => {
                    if entries.len() != paths.len() {
                        return Err(err!(
                            kind = Protocol,
                            "The agent on {} answered a stat of {} paths with {} entries",
                            self.host,
                            paths.len(),
                            entries.len()
                        ));
                    }
                    return paths
                        .into_iter()
                        .zip(entries)
                        .map(|(p, e)| {
                            e.into_entry(p).ok_or_else(|| {
                                err!(
                                    kind = Protocol,
                                    "The agent on {} sent a stat entry of an unknown kind",
                                    self.host
                                )
                            })
                        })
                        .collect();
                }
                other => return Err(self.unexpected("a stat", &other)),
            }
        }
    }

    /// Send a request and wait for its answer, passing progress frames to
    /// `on_progress`.
    fn call(&mut self, req: &Request, on_progress: &mut dyn FnMut(Progress)) -> Result<Response> {
        self.send(req)?;
        self.response(on_progress)
    }

    /// The one error for an answer that does not fit the question.
    fn unexpected(&self, what: &str, other: &Response) -> Error {
        err!(
            kind = Protocol,
            hint =
                "controller and agent disagree on the protocol; use one overlay build on both ends",
            "unexpected answer from {} to {what}: {other:?}",
            self.host
        )
    }

    /// Start listing the target's shared objects in the background, for
    /// the [`Client::preflight`] that follows.
    pub fn prefetch_preflight(&mut self, venv: &str) -> Result<()> {
        let req = Request::PrefetchPreflight {
            venv: venv.to_string(),
        };
        answer!(self, &req, "a preflight prefetch", Response::Prefetching => ())
    }

    /// Start reading the ELF facts of `paths` (site-packages relative) on the
    /// source in the background, for the [`Client::elf_info`] that follows.
    pub fn prefetch_elf(&mut self, venv: &str, paths: Vec<String>) -> Result<()> {
        let req = Request::PrefetchElf {
            venv: venv.to_string(),
            paths,
        };
        answer!(self, &req, "an ELF facts prefetch", Response::Prefetching => ())
    }

    /// ELF facts of `paths` (site-packages relative), one per path.
    pub fn elf_info(&mut self, venv: &str, paths: Vec<String>) -> Result<Vec<Option<ElfInfo>>> {
        let req = Request::ElfInfo {
            venv: venv.to_string(),
            paths,
        };
        answer!(self, &req, "a request for ELF facts", Response::ElfInfo { infos } => infos)
    }

    /// Predict on the target what fails to load after the overlay.
    pub fn preflight(&mut self, req: PreflightRequest) -> Result<PreflightReport> {
        let req = Request::Preflight(Box::new(req));
        answer!(self, &req, "a preflight", Response::Preflight(r) => r)
    }

    /// Check the venv as it stands (`overlay doctor`).
    /// `on_progress` sees the hashing as it goes.
    pub fn doctor(
        &mut self,
        req: crate::model::DoctorRequest,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<crate::model::DoctorReport> {
        let req = Request::Doctor(Box::new(req));
        match self.call(&req, on_progress)? {
            Response::Doctor(r) => Ok(r),
            other => Err(self.unexpected("a doctor", &other)),
        }
    }

    /// Check some distributions' files against their own RECORD.
    pub fn record_check(
        &mut self,
        req: crate::model::RecordCheckRequest,
    ) -> Result<Vec<crate::model::Finding>> {
        let req = Request::RecordCheck(Box::new(req));
        answer!(self, &req, "a RECORD check", Response::RecordChecked { findings } => findings)
    }

    /// Finish an interrupted generation: roll it back, or with `resume`
    /// complete it. Returns what was done, if there was one.
    pub fn recover(&mut self, venv: &str, resume: bool) -> Result<Option<String>> {
        let req = Request::Recover {
            venv: venv.to_string(),
            resume,
        };
        answer!(self, &req, "a recovery", Response::Recovered { outcome } => outcome)
    }

    /// Open a new generation on the target.
    pub fn prepare(&mut self, req: PrepareRequest) -> Result<Prepared> {
        let req = Request::Prepare(Box::new(req));
        answer!(self, &req, "a prepare", Response::Prepared {
            generation,
            recovered,
        } => Prepared {
            generation,
            recovered,
        })
    }

    /// Have the source stream `files` to this controller as data frames
    /// (read them with [`Client::stream_event`]).
    pub fn start_send(&mut self, send: SendRequest) -> Result<()> {
        self.send(&Request::Send {
            venv: send.venv,
            files: send.files,
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
            RawFrame::Msg(Response::Sent {
                raw_bytes,
                compressed_bytes,
                hashes,
                windows,
                written,
                ..
            }) => Ok(StreamEvent::Sent {
                sent: Sent {
                    raw_bytes,
                    packed_bytes: compressed_bytes,
                    hashes,
                    windows,
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
        answer!(self, &req, "the end of a stream", Response::Staged { files, bytes } => Staged { files, bytes })
    }

    /// After a direct stream: have the target check what another agent
    /// staged against what both ends reported.
    pub fn staged_direct(
        &mut self,
        hashes: Vec<SourceHash>,
        written: Vec<Written>,
    ) -> Result<Staged> {
        let req = Request::StagedDirect { hashes, written };
        answer!(self, &req, "a direct stream's report", Response::Staged { files, bytes } => Staged { files, bytes })
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
    /// folder of `generation`.
    pub fn start_receive(&mut self, venv: &str, generation: &str) -> Result<()> {
        self.send(&Request::Receive {
            venv: venv.to_string(),
            generation: generation.to_string(),
        })
    }

    /// End a direct stream: the hashes the source computed while reading.
    /// Returns what the receiving agent wrote.
    pub fn end_receive(&mut self, hashes: Vec<SourceHash>) -> Result<Vec<Written>> {
        let req = Request::EndData { hashes };
        answer!(self, &req, "the end of a direct stream", Response::Received { written, .. } => written)
    }

    /// Give up the prepared generation (nothing was switched).
    pub fn abort(&mut self) -> Result<()> {
        answer!(self, &Request::Abort, "an abort", Response::Aborted => ())
    }

    /// Switch the staged generation into place; returns the paths changed.
    pub fn switch(&mut self) -> Result<u64> {
        answer!(self, &Request::Switch, "a switch", Response::Switched { changed } => changed)
    }

    /// [`Client::switch`], looking at `stop` at each progress frame: once it
    /// says stop (Ctrl-C), `Abort` is sent, and the target stops the switch
    /// and undoes it (or undoes it whole if it had finished). Returns
    /// `None` then: the generation is gone and the venv is as before.
    pub fn switch_unless(&mut self, stop: &dyn Fn() -> bool) -> Result<Option<u64>> {
        self.send(&Request::Switch)?;
        let mut aborted = false;
        let answer = loop {
            match self.recv() {
                Ok(Response::Progress(_)) if !aborted && stop() => {
                    self.send(&Request::Abort)?;
                    aborted = true;
                }
                Ok(Response::Progress(_)) => {}
                Ok(Response::Switched { changed }) if !aborted && !stop() => {
                    return Ok(Some(changed));
                }
                // Stopped and undone, or switched before the `Abort` came.
                Ok(Response::Switched { .. }) => break Ok(()),
                Err(e) if aborted && !self.lost => break Err(e),
                Err(e) => return Err(e),
                Ok(other) => return Err(self.unexpected("a switch", &other)),
            }
        };
        if !aborted {
            self.send(&Request::Abort)?;
        }
        // The answer to the `Abort`: the target undid and discarded the generation.
        match self.recv() {
            Ok(Response::Aborted) => Ok(None),
            Ok(other) => Err(self.unexpected("an abort", &other)),
            Err(e) => Err(answer.err().unwrap_or(e)),
        }
    }

    /// Mark the switched generation complete.
    pub fn commit(&mut self, keep_backup: bool, keep: Option<usize>) -> Result<Committed> {
        let req = Request::Commit { keep_backup, keep };
        answer!(self, &req, "a commit", Response::Committed {
            generation,
            backup_bytes,
        } => Committed {
            generation,
            backup_bytes,
        })
    }

    /// Roll back generations down to and including `to` (default: the newest).
    /// With `force`, also over changes made since the apply.
    pub fn rollback(
        &mut self,
        venv: &str,
        to: Option<String>,
        force: bool,
    ) -> Result<RollbackReport> {
        let req = Request::Rollback {
            venv: venv.to_string(),
            to,
            force,
        };
        answer!(self, &req, "a rollback", Response::RolledBack(r) => r)
    }

    /// The venv's generations, oldest first.
    pub fn history(&mut self, venv: &str) -> Result<History> {
        let req = Request::History {
            venv: venv.to_string(),
        };
        answer!(self, &req, "a history", Response::History {
            generations,
            recovered,
        } => History {
            generations,
            recovered,
        })
    }

    /// Remove all but the newest `keep` generations.
    pub fn prune(&mut self, venv: &str, keep: usize) -> Result<Pruned> {
        let req = Request::Prune {
            venv: venv.to_string(),
            keep,
        };
        answer!(self, &req, "a prune", Response::Pruned { removed, recovered } => Pruned { removed, recovered })
    }

    /// Run the `[verify]` check in the venv.
    pub fn verify(&mut self, req: VerifyRequest) -> Result<VerifyReport> {
        let req = Request::Verify(Box::new(req));
        answer!(self, &req, "a verify", Response::Verified(r) => r)
    }

    /// Send a request without waiting (its answer comes later).
    pub fn request(&mut self, req: &Request) -> Result<()> {
        self.send(req)
    }

    /// The agent's own executable on its host.
    pub fn agent_exe(&self) -> &str {
        &self.exe
    }

    /// The agent's input, to write data frames to directly.
    pub fn writer(&mut self) -> Result<&mut dyn std::io::Write> {
        Ok(&mut *self.pipe()?.writer)
    }

    /// End the connection without the goodbye, returning what the agent
    /// (or the program that ran it) wrote on stderr.
    pub fn abandon(mut self) -> String {
        match self.pipe.take() {
            Some(p) => {
                drop(p.writer);
                drop(p.reader);
                match (p.finish)() {
                    Ok(t) => t,
                    Err(e) => e.message,
                }
            }
            None => String::new(),
        }
    }

    /// Pass a data frame read by [`Client::stream_event`] on to this agent
    /// as it is (one write: its length field and body together).
    pub fn write_frame_bytes(&mut self, frame: &[u8]) -> Result<()> {
        let r = self.pipe()?.writer.write_all(frame);
        r.map_err(|e| self.died(&e.to_string()))
    }

    /// Wait for the answer to an earlier `request`, passing progress
    /// frames to `on_progress`.
    pub fn response(&mut self, on_progress: &mut dyn FnMut(Progress)) -> Result<Response> {
        loop {
            match self.recv()? {
                Response::Progress(p) => on_progress(p),
                r => return Ok(r),
            }
        }
    }

    /// Say goodbye and wait for the agent to exit.
    pub fn close(mut self) -> Result<()> {
        if self.pipe.is_none() {
            return Ok(());
        }
        self.send(&Request::Bye)?;
        let _ = self.recv();
        if let Some(p) = self.pipe.take() {
            drop(p.writer);
            (p.finish)()?;
        }
        Ok(())
    }
}

/// Name the host in an error from its agent, unless the message already
/// names it as a word of its own (a host `c` is not named by "conda").
fn on_host(e: Error, host: &str) -> Error {
    let message = if names_host(&e.message, host) {
        e.message
    } else {
        format!("on {host}: {}", e.message)
    };
    Error { message, ..e }
}

/// Whether `message` holds `host` with no letter, digit, `-`, `_` or `.`
/// of a longer name right before or after it.
fn names_host(message: &str, host: &str) -> bool {
    let part = |c: char| c.is_alphanumeric() || matches!(c, '-' | '_' | '.');
    !host.is_empty()
        && message.match_indices(host).any(|(i, _)| {
            let before = message[..i].chars().next_back();
            let after = message[i + host.len()..].chars().next();
            !before.is_some_and(part) && !after.is_some_and(|c| part(c) && c != '.')
        })
}

#[cfg(test)]
mod tests {
    use super::names_host;

    #[test]
    fn a_host_is_named_only_as_a_word_of_its_own() {
        assert!(names_host("Failed to open /v on dst: denied", "dst"));
        assert!(names_host("dst (ssh root@h) refused", "dst"));
        assert!(names_host("the agent on dst.", "dst"));
        assert!(!names_host("venv /v is a conda environment", "c"));
        assert!(!names_host("ct200 is busy", "ct2"));
        assert!(!names_host("in /srv/dst-old/venv", "dst"));
        assert!(!names_host("anything", ""));
    }
}
