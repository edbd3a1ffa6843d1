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
//!
//! This file holds the connection (greeting, frames, how an agent died);
//! the requests are grouped by what they do to a host: `inspect` (read
//! only), `stream` (a generation's files on their way), `generation`
//! (prepare, switch, commit, roll back, history, prune).

use crate::err;
use crate::error::{Error, Result};
use crate::transport::{self, AgentPipe, ConnectOptions, Watch};

use super::protocol::{PROTOCOL_VERSION, Request, Response, read_frame, write_frame};
use crate::model::{Endpoint, Progress};

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

mod generation;
mod inspect;
mod stream;

pub use generation::{Committed, History, Prepared, Pruned};
pub use stream::{DirectTo, SendRequest, Staged, StagedLocal, StreamEvent};

/// A connected agent on one host.
pub struct Client {
    /// The manifest's host name, used in every message.
    pub host: String,
    pipe: Option<AgentPipe>,
    /// The agent's executable, from its greeting.
    exe: String,
    /// The CPUs the agent may run on, from its greeting (0: unknown).
    cores: u32,
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
            cores: 0,
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
            Response::Hello {
                protocol,
                exe,
                cores,
                ..
            } if protocol == PROTOCOL_VERSION => {
                c.exe = exe;
                c.cores = cores;
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

    /// Send a request without waiting (its answer comes later).
    pub fn request(&mut self, req: &Request) -> Result<()> {
        self.send(req)
    }

    /// The CPUs the agent may run on (0: unknown).
    pub fn cores(&self) -> u32 {
        self.cores
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
