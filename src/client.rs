//! The controller's end of an agent connection: typed requests over an
//! [`AgentPipe`](crate::transport::AgentPipe), with progress callbacks.

use crate::err;
use crate::error::{Error, Result};
use crate::transport::{self, AgentPipe, ConnectOptions, Watch};

use super::protocol::{
    Frame, PROTOCOL_VERSION, Request, Response, read_any, read_frame, write_data, write_frame,
};
use crate::model::{Endpoint, Entry, HashMode, Progress, ScanReport, Set, ShebangRewrite};

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
    /// Start the agent on `host` and shake hands.
    pub fn connect(host: &str, endpoint: &Endpoint, opts: &ConnectOptions) -> Result<Client> {
        if let Endpoint::Ssh(target) = endpoint {
            // Most runs find this build on the host already: start it
            // straight away. Only if it does not answer (first run of a new
            // build, a damaged copy) check over SFTP and upload.
            let pipe = transport::ssh::start_cached_agent(host, target, opts)?;
            if let Ok(c) = Client::over(host, pipe) {
                return Ok(c);
            }
        }
        let pipe = transport::start_agent(host, endpoint, opts)?;
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
            other => Err(err!(
                "The agent on {host} answered the greeting with {other:?}"
            )),
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
            other => Err(err!(
                "The agent on {} answered a scan with {other:?}",
                self.host
            )),
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
                                    "The agent on {} sent a stat entry of an unknown kind",
                                    self.host
                                )
                            })
                        })
                        .collect();
                }
                other => {
                    return Err(err!(
                        "The agent on {} answered a stat with {other:?}",
                        self.host
                    ));
                }
            }
        }
    }

    /// Send a request and wait for its answer, passing progress frames to `on_progress`.
    pub fn call(
        &mut self,
        req: &Request,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<Response> {
        self.send(req)?;
        loop {
            match self.recv()? {
                Response::Progress(p) => on_progress(p),
                r => return Ok(r),
            }
        }
    }

    /// Send a request without waiting (its answer comes later).
    pub fn request(&mut self, req: &Request) -> Result<()> {
        self.send(req)
    }

    /// Read the next frame: raw stream data or a message.
    pub fn next_frame(&mut self) -> Result<Frame<Response>> {
        let host = self.host.clone();
        match read_any::<Response>(&mut self.pipe()?.reader) {
            Ok(Some(Frame::Msg(Response::Error(e)))) => Err(on_host(e, &host)),
            Ok(Some(f)) => Ok(f),
            Ok(None) => Err(self.died("it stopped in the middle of a stream")),
            Err(e) if self.gone().is_some() => Err(self.died(&e.message)),
            Err(e) => Err(on_host(e, &host)),
        }
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

    /// Relay raw stream bytes to this agent.
    pub fn write_data(&mut self, bytes: &[u8]) -> Result<()> {
        let r = write_data(&mut self.pipe()?.writer, bytes);
        r.map_err(|e| self.died(&e.to_string()))
    }

    /// Wait for the answer to an earlier `request`.
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

/// Name the host in an error from its agent.
fn on_host(e: Error, host: &str) -> Error {
    let message = if e.message.contains(host) {
        e.message
    } else {
        format!("on {host}: {}", e.message)
    };
    Error { message, ..e }
}
