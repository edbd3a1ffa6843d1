//! The controller's relay: the source agent's stream passed on to the
//! target agent, frame by frame, on two threads.
//!
//! [`follow`] reads the source's events on the calling thread: progress
//! goes to the caller, `Sent` ends the stream, and each data frame is read
//! whole (length field and body) into one of a few reused buffers and
//! handed to a writer thread, which writes it to the target as it came, in
//! one write, and gives the buffer back. The payload is never decoded or
//! re-encoded, nothing is allocated per frame, and reading from one host
//! overlaps writing to the other. At most [`BUFFERS`] frames (about 8 MiB)
//! are in flight: when the target is slower, the reader waits for a buffer.
//!
//! A frame the source sends that is larger than the protocol allows, or cut
//! short, is refused before anything of it is forwarded, with the source
//! named (see [`crate::protocol::read_raw`]); the target checks the
//! payload itself, as from any sender. A failed write (the target gone) is
//! the error reported, whatever the source's side saw meanwhile; else the
//! reader's. After any failure or Ctrl-C the writer stops at a frame
//! boundary, so the target's input never ends inside a frame.
//!
//! On the direct route there is no writer: a data frame from the source is
//! an error.
//!
//! [`fan_out`] passes one source's frames on to several targets (one read
//! of the source for all, see `crate::fleet::fanout`): a writer thread per
//! target, each frame shared between those that take it; a target whose
//! write fails is dropped and the others go on; the slowest target sets the
//! pace. A stream cut into segments (the source announces each with a
//! `Segment` mark) goes segment by segment only to the targets whose files
//! it holds ([`Routes`]); the marks themselves are not passed on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};

use crate::client::{Client, StreamEvent};
use crate::err;
use crate::error::{Error, Result};
use crate::interrupt;
use crate::model::{Progress, Sent, Written};

/// Data frames in flight between the two threads at most (each up to
/// 1 MiB, see [`crate::protocol::MAX_DATA`]).
pub const BUFFERS: usize = 8;

/// The end of a stream: what the source sent, and on the direct route what
/// the target wrote.
pub struct Ended {
    pub sent: Sent,
    pub written: Vec<Written>,
}

/// What the caller hears of the stream while it runs.
pub struct Listener<'a> {
    /// Called once, after the first event (the tests' pause point).
    pub first: &'a mut dyn FnMut(),
    pub progress: &'a mut dyn FnMut(&Progress),
}

/// Follow the source's stream to its end, passing its data frames on to
/// `dst` (relayed) or refusing any (`None`: the direct route). Checks for
/// Ctrl-C before each event.
pub fn follow(src: &mut Client, dst: Option<&mut Client>, listen: Listener<'_>) -> Result<Ended> {
    match dst {
        Some(dst) => relay(src, dst, listen),
        None => events(
            src,
            listen,
            &mut |_, _, host| {
                Err(err!(
                    kind = Protocol,
                    "unexpected stream data from {host} on the direct route"
                ))
            },
            &mut no_segments,
        ),
    }
}

/// A `Segment` mark in a stream that was not cut: refused.
fn no_segments(index: usize, host: &str) -> Result<()> {
    Err(err!(
        kind = Protocol,
        "unexpected segment mark {index} from {host} in a stream that was not cut"
    ))
}

/// What is done with a data frame: the buffer holding it, the frame's
/// length in it, and the source's name; the buffer left in its place is
/// the one the next frame is read into.
type OnData<'a> = dyn FnMut(&mut Vec<u8>, usize, &str) -> Result<()> + 'a;

/// What is done with a `Segment` mark: its index and the source's name.
type OnSegment<'a> = dyn FnMut(usize, &str) -> Result<()> + 'a;

/// The source's events until `Sent`, data frames to `data`, segment marks
/// to `segment`.
fn events(
    src: &mut Client,
    listen: Listener<'_>,
    data: &mut OnData<'_>,
    segment: &mut OnSegment<'_>,
) -> Result<Ended> {
    let Listener { first, progress } = listen;
    let mut buf = Vec::new();
    let mut started = false;
    loop {
        if interrupt::requested() {
            return Err(err!(kind = Interrupted, "interrupted"));
        }
        let event = src.stream_event(&mut buf)?;
        if !std::mem::replace(&mut started, true) {
            first();
        }
        match event {
            StreamEvent::Data(n) => data(&mut buf, n, &src.host)?,
            StreamEvent::Progress(p) => progress(&p),
            StreamEvent::Segment(i) => segment(i, &src.host)?,
            StreamEvent::Sent { sent, written } => return Ok(Ended { sent, written }),
        }
    }
}

/// The relay proper: this thread reads the source, a second one writes the
/// target; full buffers go one way, empty ones come back.
fn relay(src: &mut Client, dst: &mut Client, listen: Listener<'_>) -> Result<Ended> {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (full_tx, full_rx) = mpsc::channel::<(Vec<u8>, usize)>();
        let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
        let stop = &stop;
        let writer = scope.spawn(move || -> Result<()> {
            for (frame, n) in full_rx {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                dst.write_frame_bytes(&frame[..n])?;
                // The reader may be done already: then the buffer just goes.
                let _ = free_tx.send(frame);
            }
            Ok(())
        });
        let mut made = 0;
        let mut on_data = |buf: &mut Vec<u8>, n: usize, _: &str| {
            let next = match free_rx.try_recv() {
                Ok(b) => Some(b),
                Err(_) if made < BUFFERS => {
                    made += 1;
                    Some(Vec::new())
                }
                Err(_) => free_rx.recv().ok(),
            };
            let sent = next.and_then(|next| {
                let frame = std::mem::replace(buf, next);
                full_tx.send((frame, n)).ok()
            });
            if sent.is_none() {
                // The writer failed; its error, which says why, is returned.
                return Err(err!(
                    kind = Connection,
                    "the target stopped taking the stream"
                ));
            }
            Ok(())
        };
        let read = events(src, listen, &mut on_data, &mut no_segments);
        if read.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        drop(full_tx);
        let wrote = writer
            .join()
            .unwrap_or_else(|_| Err(err!("the relay's writer thread failed")));
        match (read, wrote) {
            (Ok(ended), Ok(())) => Ok(ended),
            // The writer fails only when the target is gone: that is the
            // cause, whatever the source's side saw meanwhile (the watch
            // cuts the source when the target dies).
            (_, Err(w)) => Err(w),
            (Err(e), _) => Err(e),
        }
    })
}

/// The end of a stream fanned out to several targets: how the source's
/// side ended, and for each target in the order given its write error and
/// the bytes of data frames written to it.
pub struct FannedOut {
    pub ended: Result<Ended>,
    pub failed: Vec<Option<Error>>,
    pub received: Vec<u64>,
}

/// Which targets take which segment of a stream cut into segments:
/// `takes[s][k]` for segment `s` and target `k`. Empty: the stream is not
/// cut, and every target takes every frame.
pub struct Routes {
    pub takes: Vec<Vec<bool>>,
}

/// Follow the source's stream to its end, passing each data frame on to
/// every target of `dsts` still taking it that `routes` sends the frame's
/// segment to (see the module doc). The source is read on to the end
/// while one target takes frames; when none does, its side ends with an
/// error (each target's own is in `failed`). Segment marks must come in
/// order, one per segment of `routes`, before the frames they route.
pub fn fan_out(
    src: &mut Client,
    dsts: Vec<&mut Client>,
    routes: &Routes,
    listen: Listener<'_>,
) -> FannedOut {
    std::thread::scope(|scope| {
        let mut txs = Vec::new();
        let mut writers = Vec::new();
        for dst in dsts {
            let (tx, rx) = mpsc::sync_channel::<Arc<Vec<u8>>>(BUFFERS);
            txs.push(Some(tx));
            writers.push(scope.spawn(move || -> (u64, Result<()>) {
                let mut wrote = 0u64;
                for frame in rx {
                    if let Err(e) = dst.write_frame_bytes(&frame) {
                        return (wrote, Err(e));
                    }
                    wrote += frame.len() as u64;
                }
                (wrote, Ok(()))
            }));
        }
        // The segment the frames are in: `None` before the first mark.
        let segment = std::cell::Cell::new(None::<usize>);
        let mut on_segment = |index: usize, host: &str| {
            let next = segment.get().map_or(0, |s| s + 1);
            if index != next || index >= routes.takes.len() {
                return Err(err!(
                    kind = Protocol,
                    "{host} marked segment {index} where segment {next} of {} was due; nothing more of its stream was passed on",
                    routes.takes.len()
                ));
            }
            segment.set(Some(index));
            Ok(())
        };
        let mut on_data = |buf: &mut Vec<u8>, n: usize, host: &str| {
            let takes = match segment.get() {
                Some(s) => Some(&routes.takes[s]),
                None if routes.takes.is_empty() => None,
                None => {
                    return Err(err!(
                        kind = Protocol,
                        "{host} sent stream data before its first segment mark"
                    ));
                }
            };
            let mut frame = std::mem::take(buf);
            frame.truncate(n);
            let frame = Arc::new(frame);
            for (k, tx) in txs.iter_mut().enumerate() {
                if takes.is_some_and(|t| !t[k]) {
                    continue;
                }
                if let Some(t) = tx
                    && t.send(Arc::clone(&frame)).is_err()
                {
                    *tx = None; // its writer failed: it says why
                }
            }
            if txs.iter().all(Option::is_none) {
                return Err(err!(
                    kind = Connection,
                    "no target is taking the stream any more"
                ));
            }
            Ok(())
        };
        let ended = events(src, listen, &mut on_data, &mut on_segment);
        // Dropping the senders ends the writers once they have written
        // what is queued (whole frames).
        drop(txs);
        let (received, failed) = writers
            .into_iter()
            .map(|w| {
                let (wrote, r) = w
                    .join()
                    .unwrap_or_else(|_| (0, Err(err!("a relay writer thread failed"))));
                (wrote, r.err())
            })
            .unzip();
        FannedOut {
            ended,
            failed,
            received,
        }
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::protocol::{
        DATA_BIT, MAX_DATA, PROTOCOL_VERSION, Response, write_data, write_frame,
    };
    use crate::transport::{AgentPipe, Watch};

    /// What a client wrote to its (in-memory) agent.
    #[derive(Clone, Default)]
    struct Taken(Arc<Mutex<Vec<u8>>>);

    impl Write for Taken {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Taken {
        /// What was written after the greeting (the `Hello` request).
        fn after_hello(&self) -> Vec<u8> {
            let all = self.0.lock().unwrap();
            let len = u32::from_le_bytes(all[..4].try_into().unwrap()) as usize;
            all[4 + len..].to_vec()
        }
    }

    /// A client whose agent "says" `said` after its greeting.
    fn client(host: &str, said: &[u8]) -> (Client, Taken) {
        let mut bytes = Vec::new();
        write_frame(
            &mut bytes,
            &Response::Hello {
                protocol: PROTOCOL_VERSION,
                version: "test".into(),
                exe: "/x".into(),
                cores: 0,
            },
        )
        .unwrap();
        bytes.extend_from_slice(said);
        let taken = Taken::default();
        let pipe = AgentPipe {
            reader: Box::new(std::io::Cursor::new(bytes)),
            writer: Box::new(taken.clone()),
            finish: Box::new(|| Ok(String::new())),
            watch: Watch::new(|| None, || {}),
        };
        (Client::over(host, pipe).unwrap(), taken)
    }

    fn data(payload: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        write_data(&mut f, payload).unwrap();
        f
    }

    fn msg(r: &Response) -> Vec<u8> {
        let mut f = Vec::new();
        write_frame(&mut f, r).unwrap();
        f
    }

    fn sent() -> Vec<u8> {
        msg(&Response::Sent {
            files: 1,
            raw_bytes: 7,
            compressed_bytes: 5,
            hashes: vec![],
            windows: vec![],
            written: vec![],
            waits: Default::default(),
            target_waits: Default::default(),
        })
    }

    fn run(src: &mut Client, dst: Option<&mut Client>) -> (Result<Ended>, Vec<Progress>) {
        let mut seen = Vec::new();
        let r = follow(
            src,
            dst,
            Listener {
                first: &mut || {},
                progress: &mut |p| seen.push(*p),
            },
        );
        (r, seen)
    }

    #[test]
    fn data_frames_pass_through_unchanged_and_in_order() {
        let small = data(&[0, b'a', b'b', b'c']);
        let full: Vec<u8> = data(&(0..MAX_DATA).map(|i| (i * 7) as u8).collect::<Vec<_>>());
        let progress = Progress {
            files: 1,
            bytes: 3,
            total_files: 2,
            total_bytes: 9,
        };
        // More frames than buffers, so buffers are reused.
        let mut said = small.clone();
        said.extend(msg(&Response::Progress(progress)));
        let mut expected = small.clone();
        for i in 0..2 * BUFFERS {
            let f = if i % 2 == 0 { &full } else { &small };
            said.extend(f);
            expected.extend(f);
        }
        said.extend(sent());
        let (mut src, _) = client("src", &said);
        let (mut dst, taken) = client("dst", &[]);
        let (r, seen) = run(&mut src, Some(&mut dst));
        let ended = r.unwrap();
        assert_eq!(ended.sent.raw_bytes, 7);
        assert_eq!(ended.sent.packed_bytes, 5);
        assert_eq!(seen.len(), 1);
        assert_eq!((seen[0].bytes, seen[0].total_bytes), (3, 9));
        assert!(
            taken.after_hello() == expected,
            "the frames changed on the way"
        );
    }

    #[test]
    fn a_bad_frame_from_the_source_is_refused_and_nothing_after_it_is_forwarded() {
        let first = data(&[0, 1, 2, 3]);
        let after = data(&[0, 9, 9]);
        let oversized = ((MAX_DATA as u32 + 1) | DATA_BIT).to_le_bytes().to_vec();
        // Longer than all that follows it, so the input ends inside it.
        let mut cut_short = (10_000u32 | DATA_BIT).to_le_bytes().to_vec();
        cut_short.extend([0u8; 10]);
        for (bad, says) in [
            (oversized, "larger than"),
            (cut_short, "in the middle of a frame"),
        ] {
            let mut said = first.clone();
            said.extend(&bad);
            said.extend(&after);
            said.extend(sent());
            let (mut src, _) = client("src", &said);
            let (mut dst, taken) = client("dst", &[]);
            let e = run(&mut src, Some(&mut dst)).0.err().unwrap();
            assert!(e.message.contains("on src:"), "{}", e.message);
            assert!(e.message.contains(says), "{}", e.message);
            // The frame before the bad one may or may not have gone out
            // (the writer stops at a frame boundary once the reader
            // failed); nothing after it ever does.
            let got = taken.after_hello();
            assert!(got.is_empty() || got == first, "{got:?}");
            assert!(!dst.lost());
        }
    }

    /// An agent input that takes the greeting (two writes) and is then closed.
    struct ClosedAfterHello(usize);
    impl Write for ClosedAfterHello {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += 1;
            if self.0 > 2 {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_target_that_stops_taking_frames_is_the_error() {
        let mut hello = Vec::new();
        write_frame(
            &mut hello,
            &Response::Hello {
                protocol: PROTOCOL_VERSION,
                version: "test".into(),
                exe: "/x".into(),
                cores: 0,
            },
        )
        .unwrap();
        let pipe = AgentPipe {
            reader: Box::new(std::io::Cursor::new(hello)),
            writer: Box::new(ClosedAfterHello(0)),
            finish: Box::new(|| Ok(String::new())),
            watch: Watch::new(|| None, || {}),
        };
        let mut dst = Client::over("dst", pipe).unwrap();
        let mut said = Vec::new();
        for _ in 0..3 * BUFFERS {
            said.extend(data(&[0, 1, 2]));
        }
        said.extend(sent());
        let (mut src, _) = client("src", &said);
        let e = run(&mut src, Some(&mut dst)).0.err().unwrap();
        assert!(e.message.contains("dst"), "{}", e.message);
        assert!(dst.lost());
    }

    #[test]
    fn data_on_the_direct_route_is_an_error_naming_the_source() {
        let mut said = data(&[0, 1]);
        said.extend(sent());
        let (mut src, _) = client("src", &said);
        let e = run(&mut src, None).0.err().unwrap();
        assert!(
            e.message
                .contains("unexpected stream data from src on the direct route"),
            "{}",
            e.message
        );
    }
}
