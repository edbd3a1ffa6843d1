//! `Send`: source side. Stream the files to the controller as data frames,
//! checking each against the hash the plan saw while it is read; a bundle
//! read in place streams from its tar (`crate::bundle::BundleSource::send`).

use std::io::Write;

use crate::agent::direct::FrameSink;
use crate::agent::session::Session;
use crate::error::Result;
use crate::inventory::Counters;
use crate::model::{Compression, SendFile, ShebangRewrite};
use crate::protocol::Response;
use crate::stream;

/// What to send, from `Send` or `SendDirect`.
pub struct Sending {
    pub venv: String,
    pub files: Vec<SendFile>,
    /// Where the stream's segments start (see [`stream::send`]).
    pub cuts: Vec<usize>,
    pub shebang: Option<ShebangRewrite>,
    pub compression: Compression,
}

pub fn send(session: &mut Session, output: &mut dyn Write, s: &Sending) -> Result<Response> {
    let counters = Counters::default();
    // Data frames go straight to the output; progress is implied by them.
    let mut sink = FrameSink {
        out: output,
        progress: true,
    };
    let (files, cuts, shebang) = (&s.files, &s.cuts, s.shebang.as_ref());
    match session.bundle_source(&s.venv)? {
        Some(b) => b.send(files, cuts, shebang, s.compression, &mut sink, &counters),
        None => stream::send(
            &s.venv,
            files,
            cuts,
            shebang,
            s.compression,
            &mut sink,
            &counters,
        ),
    }
    .map(|sent| Response::Sent {
        files: s.files.len() as u64,
        raw_bytes: sent.raw_bytes,
        compressed_bytes: sent.packed_bytes,
        hashes: sent.hashes,
        windows: sent.windows,
        written: Vec::new(),
        waits: sent.waits,
        target_waits: Default::default(),
    })
}
