//! `Send`: source side. Stream the files to the controller as data frames,
//! checking each against the hash the plan saw while it is read.

use std::io::Write;

use crate::apply;
use crate::error::Result;
use crate::inventory::Counters;
use crate::model::{Compression, SendFile, ShebangRewrite};
use crate::protocol::Response;

/// What to send, from `Send` or `SendDirect`.
pub struct Sending {
    pub venv: String,
    pub files: Vec<SendFile>,
    pub shebang: Option<ShebangRewrite>,
    pub compression: Compression,
}

pub fn send(output: &mut dyn Write, s: &Sending) -> Result<Response> {
    let counters = Counters::default();
    // Data frames go straight to the output; progress is implied by them.
    apply::send(
        &s.venv,
        &s.files,
        s.shebang.as_ref(),
        s.compression,
        output,
        true,
        &counters,
    )
    .map(|(raw, compressed, hashes, windows)| Response::Sent {
        files: s.files.len() as u64,
        raw_bytes: raw,
        compressed_bytes: compressed,
        hashes,
        windows,
        written: Vec::new(),
    })
}
