//! Reading a data stream into staging, for `Stage` (the controller's stream)
//! and `Receive` (a source agent's, on the direct route): data frames up to
//! `EndData` or `Abort`, decoded on this thread while another unpacks them.

use std::io::Read;
use std::time::{Duration, Instant};

use crate::err;
use crate::error::{Error, Result};
use crate::inventory::Counters;
use crate::journal::Generation;
use crate::model::{SourceHash, StageWaits, Unpacked};
use crate::protocol::{Frame, Request, read_any};
use crate::stream::{self, ChannelReader};

/// A stream read into staging.
pub(super) struct StreamIn {
    pub(super) result: Result<Unpacked>,
    /// The source's hashes from `EndData`.
    pub(super) source_hashes: Vec<SourceHash>,
    /// The input ended (the sender went away) before `EndData`.
    pub(super) ended: bool,
    pub(super) aborted: bool,
    /// Why the input ended, when a frame was refused (too large, cut short).
    pub(super) broken: Option<Error>,
}

/// Decoded blocks queued for the unpacker. A data frame is at most
/// [`crate::protocol::MAX_DATA`] bytes and decodes to at most one block
/// ([`BLOCK`](crate::model::BLOCK)), so the queue holds at most this many MiB (plus the
/// frame being read and the block being unpacked), whatever the sender does.
const DECODED_BLOCKS: usize = 8;

/// Read data frames until `EndData` (or `Abort`), decoding them on this
/// thread while another unpacks them into `g`'s staging folder.
pub(super) fn stream_in(
    input: &mut dyn Read,
    g: &Generation,
    host_dir: &std::path::Path,
    holds: stream::Holds<'_>,
) -> StreamIn {
    let counters = Counters::default();
    let (tx, rx) = std::sync::mpsc::sync_channel::<(Vec<u8>, usize)>(DECODED_BLOCKS);
    let mut unz = match zstd::bulk::Decompressor::new() {
        Ok(z) => z,
        Err(e) => {
            let _ = drain(input);
            return StreamIn {
                result: Err(err!(kind = Protocol, "zstd: {e}")),
                source_hashes: Vec::new(),
                ended: false,
                aborted: false,
                broken: None,
            };
        }
    };
    let mut clock = ReaderClock::default();
    let mut started: Option<Instant> = None;
    let mut ended = false;
    let mut aborted = false;
    let mut source_hashes: Vec<SourceHash> = Vec::new();
    let mut bad_block = None;
    let mut broken = None;
    let result = std::thread::scope(|scope| {
        let worker =
            scope.spawn(|| stream::unpack(g, host_dir, ChannelReader::new(rx), &counters, holds));
        let mut tx = Some(tx);
        loop {
            let asked = Instant::now();
            let frame = read_any::<Request>(input);
            let got = Instant::now();
            // Waits before the first frame are the source starting, not the stream.
            match started {
                Some(_) => clock.input += got - asked,
                None => started = Some(got),
            }
            match frame {
                Ok(Some(Frame::Data(d))) => {
                    // Decoded here, so that decoding runs beside the writing.
                    if let Some(t) = &tx {
                        let decoded = stream::unpack_block(d, &mut unz);
                        let handed = Instant::now();
                        clock.decode += handed - got;
                        match decoded {
                            Ok(b) => {
                                let taken = t.send(b);
                                clock.behind += handed.elapsed();
                                if taken.is_err() {
                                    tx = None; // the unpacker failed; keep draining
                                }
                            }
                            Err(e) => {
                                tx = None;
                                bad_block = Some(e);
                            }
                        }
                    }
                }
                Ok(Some(Frame::Msg(Request::EndData { hashes }))) => {
                    source_hashes = hashes;
                    break;
                }
                Ok(Some(Frame::Msg(Request::Abort))) => {
                    aborted = true;
                    break;
                }
                Ok(Some(Frame::Msg(_))) | Ok(None) => {
                    ended = true;
                    break;
                }
                Err(e) => {
                    ended = true;
                    broken = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        let r = worker
            .join()
            .unwrap_or_else(|_| Err(err!(kind = Internal, "the unpacking thread panicked")));
        match bad_block.take() {
            Some(e) => Err(e),
            None => r.map(|u| clock.fill(u, started)),
        }
    });
    StreamIn {
        result,
        source_hashes,
        ended,
        aborted,
        broken,
    }
}

/// Where the reader of the connection spent the stream (see
/// [`StageWaits`]).
#[derive(Default)]
struct ReaderClock {
    input: Duration,
    decode: Duration,
    behind: Duration,
}

impl ReaderClock {
    /// The unpacker's figures with the reader's, timed from the first frame.
    fn fill(self, mut u: Unpacked, started: Option<Instant>) -> Unpacked {
        u.waits = StageWaits {
            secs: started.map_or(0.0, |t| t.elapsed().as_secs_f64()),
            input_secs: self.input.as_secs_f64(),
            decode_secs: self.decode.as_secs_f64(),
            behind_secs: self.behind.as_secs_f64(),
            ..u.waits
        };
        u
    }
}

/// Skip data frames until the end of a stream.
pub(super) fn drain(input: &mut dyn Read) -> Result<()> {
    while let Some(f) = read_any::<Request>(input)? {
        if matches!(f, Frame::Msg(Request::EndData { .. } | Request::Abort)) {
            break;
        }
    }
    Ok(())
}
