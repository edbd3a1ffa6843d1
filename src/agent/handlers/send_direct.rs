//! `SendDirect`: source side of `apply --direct`. Like `Send`, but the
//! stream goes straight to the target's agent, which this agent starts with
//! its own `ssh` client and sends `Receive`; progress frames go to the
//! controller meanwhile.

use std::io::Write;
use std::time::Duration;

use super::send::Sending;
use crate::agent::direct;
use crate::agent::session::with_progress;
use crate::error::Result;
use crate::inventory::Counters;
use crate::protocol::Response;

/// The target of a direct stream, as the source host reaches it.
pub struct Peer {
    pub ssh: String,
    /// Jump hosts for `ssh -J`.
    pub proxy_jump: Option<String>,
    pub agent: String,
    pub target_venv: String,
    pub generation: String,
    pub connect_timeout_secs: u64,
    /// One of several connections into the generation.
    pub lane: Option<u32>,
}

pub fn send_direct(output: &mut dyn Write, s: &Sending, to: &Peer) -> Result<Response> {
    let counters = Counters::default();
    let req = direct::Direct {
        ssh: &to.ssh,
        proxy_jump: to.proxy_jump.as_deref(),
        agent: &to.agent,
        target_venv: &to.target_venv,
        generation: &to.generation,
        timeout: Duration::from_secs(to.connect_timeout_secs),
        lane: to.lane,
    };
    with_progress(output, &counters, || {
        direct::send_direct(
            &s.venv,
            &s.files,
            s.shebang.as_ref(),
            s.compression,
            &req,
            &counters,
        )
    })?
    .map(|d| Response::Sent {
        files: s.files.len() as u64,
        raw_bytes: d.sent.raw_bytes,
        compressed_bytes: d.sent.packed_bytes,
        hashes: d.sent.hashes,
        windows: d.sent.windows,
        written: d.written,
        waits: d.sent.waits,
        target_waits: d.sent.target_waits,
    })
}
