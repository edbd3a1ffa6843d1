//! The agent's end of the stream's connection: [`FrameSink`] puts the
//! source's packed blocks on a connection as data frames (for `Send`, to
//! the controller, and for the direct route, to the target), and
//! [`send_direct`] is the source's side of `apply --direct`: it starts the
//! agent on the target with this host's own `ssh` client, asks it to
//! `Receive`, and streams into the generation's staging folder there. The
//! target's `ssh` value goes to `ssh` as its own arguments (`-l USER -p
//! PORT HOST`, never a shell string), and its jump hosts as `-J`
//! ([`crate::transport::openssh`]).

use std::io::Write;

use crate::client::Client;
use crate::err;
use crate::error::Result;
use crate::inventory::Counters;
use crate::model::{Compression, Progress, SendFile, SentDirect, ShebangRewrite};
use crate::protocol::{Request, Response, write_data_parts, write_frame};
use crate::stream::{self, BlockSink};

/// A [`BlockSink`] that writes each block as one data frame (its packing
/// tag, then its payload) and, when asked to, progress frames between them.
pub struct FrameSink<'a> {
    pub out: &'a mut dyn Write,
    /// Send `Progress` frames (the controller wants them; a target does not).
    pub progress: bool,
}

impl BlockSink for FrameSink<'_> {
    fn block(&mut self, tag: u8, payload: &[u8]) -> std::io::Result<()> {
        write_data_parts(self.out, &[tag], payload)
    }

    fn segment(&mut self, index: usize) -> std::io::Result<()> {
        write_frame(self.out, &Response::Segment { index })
    }

    fn progress(&mut self, p: &Progress) -> std::io::Result<()> {
        if self.progress {
            write_frame(self.out, &Response::Progress(*p))?;
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Where the direct route goes (`Request::SendDirect`).
pub struct Direct<'a> {
    /// `[user@]host[:port]` or an alias of the source's ~/.ssh/config.
    pub ssh: &'a str,
    /// Jump hosts, passed as `ssh -J`.
    pub proxy_jump: Option<&'a str>,
    pub agent: &'a str,
    pub target_venv: &'a str,
    pub generation: &'a str,
    pub timeout: std::time::Duration,
    /// One of several connections into the generation (`Request::Receive`).
    pub lane: Option<u32>,
}

/// Source side of `apply --direct`: start the agent on the target with this
/// host's `ssh` client and send the stream straight into the generation's
/// staging folder there. Returns what [`stream::send`] does, plus what the
/// target wrote.
pub fn send_direct(
    venv_root: &str,
    files: &[SendFile],
    shebang: Option<&ShebangRewrite>,
    compression: Compression,
    to: &Direct<'_>,
    counters: &Counters,
) -> Result<SentDirect> {
    let here = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    // Until the target's agent has answered, nothing was sent: the error
    // says so (`unreached`), and `apply` may take the relay instead.
    let unreachable = |why: String| {
        let mut e = err!(
            kind = Connection,
            hint = "the direct route uses the source host's own ssh (its ~/.ssh/config, keys and known_hosts) without prompting: check `ssh -o BatchMode=yes DEST true` on the source, set `direct_ssh` for the target in the manifest, or apply without --direct",
            "The source ({here}) could not reach the target as {:?} over SSH: {}",
            to.ssh,
            why.trim()
        );
        e.unreached = Some(why.trim().to_string());
        e
    };
    let pipe = crate::transport::openssh::start_agent(
        to.ssh,
        &crate::transport::openssh::Dest {
            ssh: to.ssh,
            proxy_jump: to.proxy_jump,
        },
        to.agent,
        to.timeout,
    );
    let pipe = match pipe {
        Ok(p) => p,
        Err(mut e) => {
            e.unreached = Some(e.to_string());
            return Err(e);
        }
    };
    let mut target = match Client::over(to.ssh, pipe) {
        Ok(c) => c,
        Err(e) => return Err(unreachable(e.message)),
    };
    target.request(&Request::Receive {
        venv: to.target_venv.to_string(),
        generation: to.generation.to_string(),
        lane: to.lane,
        shared: None,
    })?;
    let mut sink = FrameSink {
        out: target.writer()?,
        progress: false,
    };
    let sent = stream::send(
        venv_root,
        files,
        &[],
        shebang,
        compression,
        &mut sink,
        counters,
    );
    let sent = match sent {
        Ok(s) => s,
        Err(e) => {
            // The target may have said why it stopped reading.
            let _ = target.request(&Request::Abort);
            return match target.response(&mut |_| {}) {
                Ok(_) | Err(_) => Err(e),
            };
        }
    };
    target.request(&Request::EndData {
        hashes: sent.hashes.clone(),
    })?;
    let mut sent = sent;
    let written = match target.response(&mut |_| {})? {
        Response::Received { written, waits, .. } => {
            sent.target_waits = waits;
            written
        }
        other => {
            return Err(err!(
                kind = Protocol,
                "unexpected answer from {}: {other:?}",
                to.ssh
            ));
        }
    };
    target.close()?;
    Ok(SentDirect { sent, written })
}
