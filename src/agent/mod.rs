//! The agent: `overlay agent`, the same binary, started on each host over an
//! SSH exec channel (or as a local child process). It answers framed
//! requests on stdin/stdout, doing all file-system work on its own host.
//! [`client::Client`] is the controller's end of the conversation.

pub mod direct;
pub mod selfcheck;

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::err;
use crate::error::{Error, Result};
use crate::inventory::{self, Counters};
use crate::journal::{Generation, Record, State};
use crate::model::{
    HashMode, Progress, ScanReport, ShebangRewrite, SourceHash, StageCount, StatEntry, Unpacked,
};
use crate::protocol::{
    Frame, PROTOCOL_VERSION, Request, Response, read_any, read_frame, write_frame,
};
use crate::stream::{self, ChannelReader};
use direct::FrameSink;

/// What the agent asks for its stdin and stdout pipes
/// (`/proc/sys/fs/pipe-max-size`, 1 MiB by default, is the unprivileged limit).
pub const PIPE_SIZE: usize = 1 << 20;

/// Serve requests until `Bye` or end of input.
pub fn serve(input: &mut dyn Read, output: &mut dyn Write) -> Result<()> {
    let mut session = Session::default();
    loop {
        let Some(req) = read_frame::<Request>(input)? else {
            return Ok(());
        };
        let response = match req {
            Request::Hello { protocol } => {
                send(
                    output,
                    &Response::Hello {
                        protocol: PROTOCOL_VERSION,
                        version: env!("CARGO_PKG_VERSION").to_string(),
                        exe: std::env::current_exe()
                            .map(|p| p.to_string_lossy().into_owned())
                            .unwrap_or_default(),
                    },
                )?;
                if protocol != PROTOCOL_VERSION {
                    return Err(err!(
                        "agent speaks protocol {PROTOCOL_VERSION}, the controller {protocol}"
                    ));
                }
                continue;
            }
            Request::Bye => {
                send(output, &Response::Bye)?;
                return Ok(());
            }
            Request::Receive { venv, generation } => {
                match crate::journal::open_for_receive(&venv, &generation) {
                    Ok((host_dir, g)) => {
                        let s = stream_in(input, &g, &host_dir);
                        if s.ended {
                            // A frame that broke the stream is answered before the agent goes.
                            if let Some(e) = s.broken {
                                send(output, &Response::Error(e))?;
                            }
                            return Ok(());
                        }
                        match s.result {
                            _ if s.aborted => Response::Aborted,
                            Ok(Unpacked { count, written }) => Response::Received {
                                files: count.files,
                                bytes: count.bytes,
                                written,
                            },
                            Err(e) => Response::Error(e),
                        }
                    }
                    Err(e) => {
                        drain(input)?;
                        Response::Error(e)
                    }
                }
            }
            Request::Stage => match session.stage(input, output) {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(()), // the controller went away mid-stream
                Err(Broken(e)) => {
                    // The input cannot be read past this frame: answer, and go.
                    send(output, &Response::Error(e))?;
                    return Ok(());
                }
            },
            other => session.handle(other, output)?,
        };
        send(output, &response)?;
        if let Response::Scan(report) = response {
            session.scan = Some(report);
        }
    }
}

/// How a stat request wants its paths described.
struct StatHow<'a> {
    hash: HashMode,
    shebang: Option<&'a ShebangRewrite>,
    pycache: bool,
}

/// Stat `paths` (with progress frames) into a `Stat` answer.
fn stat_answer(
    output: &mut dyn Write,
    counters: &Counters,
    venv: &str,
    paths: &[String],
    how: &StatHow<'_>,
) -> Result<Response> {
    with_progress(output, counters, || {
        inventory::stat(venv, paths, how.hash, how.shebang, how.pycache, counters)
    })?
    .map(|entries| Response::Stat {
        entries: entries.into_iter().map(StatEntry::from_entry).collect(),
    })
}

fn send(out: &mut dyn Write, r: &Response) -> Result<()> {
    write_frame(out, r).map_err(|e| err!("agent: cannot write to the controller: {e}"))
}

/// What the agent holds between requests: the venv's lock and the open generation.
#[derive(Default)]
struct Session {
    state: Option<State>,
    generation: Option<Generation>,
    /// The scan this agent answered last (for `StatMembers`).
    scan: Option<ScanReport>,
    /// A `PrefetchPreflight` walk: its venv and the thread listing the
    /// shared objects of site-packages.
    prefetch: Option<(
        String,
        std::thread::JoinHandle<Option<crate::preflight::SharedObjects>>,
    )>,
}

impl Session {
    fn state(&mut self, venv: &str) -> Result<&State> {
        if self
            .state
            .as_ref()
            .is_none_or(|s| s.venv.root != std::path::Path::new(venv))
        {
            self.state = Some(State::open(venv)?);
        }
        Ok(self.state.as_ref().expect("just set"))
    }

    fn opened(&mut self) -> Result<(&State, &mut Generation)> {
        match (&self.state, &mut self.generation) {
            (Some(s), Some(g)) => Ok((s, g)),
            _ => Err(err!("no generation is open: send Prepare first")),
        }
    }

    /// Answer one request; errors become error responses, I/O to the controller fails the loop.
    fn handle(&mut self, req: Request, output: &mut dyn Write) -> Result<Response> {
        let counters = Counters::default();
        let r: Result<Response> = (|| match req {
            Request::Scan { venv, file_globs } => {
                inventory::scan(&venv, &file_globs).map(Response::Scan)
            }
            Request::Stat {
                venv,
                paths,
                hash,
                shebang,
                pycache,
            } => {
                let how = StatHow {
                    hash,
                    shebang: shebang.as_ref(),
                    pycache,
                };
                stat_answer(output, &counters, &venv, &paths, &how)
            }
            Request::StatMembers {
                venv,
                sets,
                globs,
                extra,
                count,
                check,
                hash,
                shebang,
                pycache,
            } => {
                let scan = self
                    .scan
                    .as_ref()
                    .filter(|s| s.venv == venv)
                    .ok_or_else(|| err!("StatMembers of {venv} without a Scan of it first"))?;
                let members = crate::plan::members_of(&sets, scan, &globs);
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                let order = crate::plan::stat_order(&members, &extra);
                if order.len() as u64 != count || crate::plan::order_check(&order) != check {
                    return Err(err!(
                        hint = "use one overlay build on both ends",
                        "the agent found {} member paths in {venv}, the controller {count} (or in another order)",
                        order.len()
                    ));
                }
                let paths: Vec<String> = order.iter().map(|p| p.to_string()).collect();
                let how = StatHow {
                    hash,
                    shebang: shebang.as_ref(),
                    pycache,
                };
                stat_answer(output, &counters, &venv, &paths, &how)
            }
            Request::Send {
                venv,
                files,
                shebang,
                compression,
            } => {
                // Data frames go straight to the output; progress is implied by them.
                let mut sink = FrameSink {
                    out: output,
                    progress: true,
                };
                stream::send(
                    &venv,
                    &files,
                    shebang.as_ref(),
                    compression,
                    &mut sink,
                    &counters,
                )
                .map(|sent| Response::Sent {
                    files: files.len() as u64,
                    raw_bytes: sent.raw_bytes,
                    compressed_bytes: sent.packed_bytes,
                    hashes: sent.hashes,
                    windows: sent.windows,
                    written: Vec::new(),
                })
            }
            Request::SendDirect {
                venv,
                files,
                shebang,
                compression,
                ssh,
                agent,
                target_venv,
                generation,
                connect_timeout_secs,
            } => {
                let req = direct::Direct {
                    ssh: &ssh,
                    agent: &agent,
                    target_venv: &target_venv,
                    generation: &generation,
                    timeout: Duration::from_secs(connect_timeout_secs),
                };
                with_progress(output, &counters, || {
                    direct::send_direct(
                        &venv,
                        &files,
                        shebang.as_ref(),
                        compression,
                        &req,
                        &counters,
                    )
                })?
                .map(|d| Response::Sent {
                    files: files.len() as u64,
                    raw_bytes: d.sent.raw_bytes,
                    compressed_bytes: d.sent.packed_bytes,
                    hashes: d.sent.hashes,
                    windows: d.sent.windows,
                    written: d.written,
                })
            }
            Request::StagedDirect { hashes, written } => {
                let (_, g) = self.opened()?;
                let r = stream::check_staged(g, &written).and_then(|count| {
                    g.record_hashes(&written, &hashes)?;
                    g.append(Record::Staged)?;
                    Ok(count)
                });
                match r {
                    Ok(StageCount { files, bytes }) => Ok(Response::Staged { files, bytes }),
                    Err(e) => {
                        self.discard_open();
                        Err(e)
                    }
                }
            }
            Request::Prepare(req) => {
                // The plan is checked before anything is recovered, locked or written.
                let venv = inventory::Venv::open(&req.venv)?;
                crate::validate::check_prepare(&req, &venv.site_rel)?;
                let state = self.state(&req.venv)?;
                let recovered = state.recover(req.resume, &counters)?.map(|(_, msg)| msg);
                let g = with_progress(output, &counters, || state.prepare(&req, &counters))??;
                let generation = g.meta.id.clone();
                self.generation = Some(g);
                Ok(Response::Prepared {
                    generation,
                    recovered,
                })
            }
            Request::Switch => {
                let (state, g) = self.opened()?;
                let changed = state.switch(g)?;
                if let Err(e) = with_progress(output, &counters, || state.check(g, &counters))? {
                    let undone = state.undo(g)?;
                    let n = state.finish_undo(g, &undone, &counters)?;
                    return Err(err!(
                        hint = "the generation was rolled back; run `overlay plan` and `overlay apply` again",
                        "{}; rolled back ({n} paths match the listing from before the apply)",
                        e.message
                    ));
                }
                Ok(Response::Switched { changed })
            }
            Request::Commit { keep_backup, keep } => {
                let (state, g) = self.opened()?;
                g.meta.backup = keep_backup;
                let _ = state.commit(g, keep)?;
                let generation = g.meta.id.clone();
                self.generation = None;
                Ok(Response::Committed { generation })
            }
            Request::Abort => {
                if let (Some(state), Some(g)) = (&self.state, self.generation.take()) {
                    state.discard(g)?;
                }
                Ok(Response::Aborted)
            }
            Request::Rollback { venv, to } => {
                let state = self.state(&venv)?;
                with_progress(output, &counters, || {
                    state.rollback(to.as_deref(), &counters)
                })?
                .map(Response::RolledBack)
            }
            Request::History { venv } => {
                let state = self.state(&venv)?;
                // A generation recovery cannot finish (damaged mid-switch)
                // is listed as such; history never fails for it.
                let recovered = match state.recover(false, &counters) {
                    Ok(r) => r.map(|(_, msg)| msg),
                    Err(e) => Some(format!(
                        "could not finish an interrupted generation: {}{}",
                        e.message,
                        e.hint.map(|h| format!(" ({h})")).unwrap_or_default()
                    )),
                };
                state.history().map(|generations| Response::History {
                    generations,
                    recovered,
                })
            }
            Request::Prune { venv, keep } => {
                let state = self.state(&venv)?;
                let recovered = state.recover(false, &counters)?.map(|(_, msg)| msg);
                state
                    .prune(keep)
                    .map(|removed| Response::Pruned { removed, recovered })
            }
            Request::Recover { venv, resume } => {
                let state = self.state(&venv)?;
                with_progress(output, &counters, || state.recover(resume, &counters))?.map(
                    |outcome| Response::Recovered {
                        outcome: outcome.map(|(_, msg)| msg),
                    },
                )
            }
            Request::Verify(req) => crate::verify::run(&req).map(Response::Verified),
            Request::ElfInfo { venv, paths } => with_progress(output, &counters, || {
                crate::preflight::elf_infos(&venv, &paths)
            })?
            .map(|infos| Response::ElfInfo { infos }),
            Request::PrefetchPreflight { venv } => {
                let walk = venv.clone();
                self.prefetch = Some((
                    venv,
                    std::thread::spawn(move || crate::preflight::shared_objects(&walk).ok()),
                ));
                Ok(Response::Prefetching)
            }
            Request::Preflight(req) => {
                let listed = match self.prefetch.take() {
                    Some((venv, walk)) if venv == req.venv => walk.join().ok().flatten(),
                    _ => None,
                };
                with_progress(output, &counters, || {
                    crate::preflight::run_on_target(&req, listed)
                })?
                .map(Response::Preflight)
            }
            Request::EndData { .. } => Err(err!("EndData without Stage")),
            Request::Receive { .. } => Err(err!("Receive is handled by serve")),
            Request::Hello { .. } | Request::Bye | Request::Stage => {
                unreachable!("handled by serve")
            }
        })();
        Ok(r.unwrap_or_else(Response::Error))
    }

    /// Delete the open generation after a failed or abandoned stage (best
    /// effort: the next run recovers whatever is left).
    fn discard_open(&mut self) {
        if let (Some(g), Some(s)) = (self.generation.take(), &self.state) {
            let _ = s.discard(g);
        }
    }

    /// Receive the data frames of a stage. `Ok(None)`: the input ended;
    /// `Err`: a frame could not be read, and nothing after it can be.
    fn stage(
        &mut self,
        input: &mut dyn Read,
        _output: &mut dyn Write,
    ) -> std::result::Result<Option<Response>, Broken> {
        let opened = self.opened();
        let (state, g) = match opened {
            Ok(x) => x,
            Err(e) => {
                drain(input).map_err(Broken)?;
                return Ok(Some(Response::Error(e)));
            }
        };
        let host_dir = state.venv.root.clone();
        let StreamIn {
            result,
            source_hashes,
            ended,
            aborted,
            broken,
        } = stream_in(input, g, &host_dir);
        if ended || aborted {
            self.discard_open();
            if let Some(e) = broken {
                return Err(Broken(e));
            }
            return Ok(if ended { None } else { Some(Response::Aborted) });
        }
        // Files the plan had not hashed: what the target wrote must be what the source read.
        let result = result.and_then(|Unpacked { count, written }| {
            let (_, g) = self.opened()?;
            g.record_hashes(&written, &source_hashes)?;
            g.append(Record::Staged)?;
            Ok(count)
        });
        match result {
            Ok(StageCount { files, bytes }) => Ok(Some(Response::Staged { files, bytes })),
            Err(e) => {
                self.discard_open();
                Ok(Some(Response::Error(e)))
            }
        }
    }
}

/// A frame of the input that could not be read: the stream cannot go on.
struct Broken(Error);

/// A stream read into staging.
struct StreamIn {
    result: Result<Unpacked>,
    /// The source's hashes from `EndData`.
    source_hashes: Vec<SourceHash>,
    /// The input ended (the sender went away) before `EndData`.
    ended: bool,
    aborted: bool,
    /// Why the input ended, when a frame was refused (too large, cut short).
    broken: Option<Error>,
}

/// Decoded blocks queued for the unpacker. A data frame is at most
/// [`protocol::MAX_DATA`] bytes and decodes to at most one block
/// ([`BLOCK`](crate::model::BLOCK)), so the queue holds at most this many MiB (plus the
/// frame being read and the block being unpacked), whatever the sender does.
const DECODED_BLOCKS: usize = 8;

/// Read data frames until `EndData` (or `Abort`), decoding them on this
/// thread while another unpacks them into `g`'s staging folder.
fn stream_in(input: &mut dyn Read, g: &Generation, host_dir: &std::path::Path) -> StreamIn {
    let counters = Counters::default();
    let (tx, rx) = std::sync::mpsc::sync_channel::<(Vec<u8>, usize)>(DECODED_BLOCKS);
    let mut unz = match zstd::bulk::Decompressor::new() {
        Ok(z) => z,
        Err(e) => {
            let _ = drain(input);
            return StreamIn {
                result: Err(err!("zstd: {e}")),
                source_hashes: Vec::new(),
                ended: false,
                aborted: false,
                broken: None,
            };
        }
    };
    let mut ended = false;
    let mut aborted = false;
    let mut source_hashes: Vec<SourceHash> = Vec::new();
    let mut bad_block = None;
    let mut broken = None;
    let result = std::thread::scope(|scope| {
        let worker = scope.spawn(|| stream::unpack(g, host_dir, ChannelReader::new(rx), &counters));
        let mut tx = Some(tx);
        loop {
            match read_any::<Request>(input) {
                Ok(Some(Frame::Data(d))) => {
                    // Decoded here, so that decoding runs beside the writing.
                    if let Some(t) = &tx {
                        match stream::unpack_block(d, &mut unz) {
                            Ok(b) => {
                                if t.send(b).is_err() {
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
            .unwrap_or_else(|_| Err(err!("the unpacking thread panicked")));
        match bad_block.take() {
            Some(e) => Err(e),
            None => r,
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

/// Skip data frames until the end of a stream.
fn drain(input: &mut dyn Read) -> Result<()> {
    while let Some(f) = read_any::<Request>(input)? {
        if matches!(f, Frame::Msg(Request::EndData { .. } | Request::Abort)) {
            break;
        }
    }
    Ok(())
}

/// Run `work` on a worker thread while sending progress frames every 200 ms.
fn with_progress<T: Send>(
    output: &mut dyn Write,
    counters: &Counters,
    work: impl FnOnce() -> T + Send,
) -> Result<T> {
    std::thread::scope(|scope| {
        // The worker says when it is done, so the answer goes out at once
        // (not at the next poll); until then, progress every 200 ms.
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let handle = scope.spawn(move || {
            let out = work();
            let _ = done_tx.send(());
            out
        });
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            done_rx.recv_timeout(Duration::from_millis(200))
        {
            let p = Progress {
                files: counters.files.load(Ordering::Relaxed),
                bytes: counters.bytes.load(Ordering::Relaxed),
                total_files: counters.total_files.load(Ordering::Relaxed),
                total_bytes: counters.total_bytes.load(Ordering::Relaxed),
            };
            if let Err(e) = write_frame(output, &Response::Progress(p)) {
                // The controller is gone: a stream it asked for stops (the
                // scope still waits for the worker to return).
                counters.cancel.store(true, Ordering::Relaxed);
                return Err(err!("agent: cannot write to the controller: {e}"));
            }
        }
        handle
            .join()
            .map_err(|_| Error::new("agent: a worker thread panicked"))
    })
}

/// Entry point of `overlay agent`.
pub fn main() -> Result<()> {
    // Started from ~/.cache/overlay/ (over SSH): refuse to serve when that
    // file or its folders could be replaced by another user.
    if let Err(u) = selfcheck::check() {
        eprintln!(
            "overlay agent: not serving: {}\nhint: {}",
            u.message, u.hint
        );
        std::process::exit(selfcheck::EXIT_UNSAFE);
    }
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    // sshd connects the agent through pipes of 64 KiB; a stream moves in
    // 1 MiB frames, and bigger pipes let each side write a frame with one
    // call and fewer wakeups of the other. Not a pipe, or over the user's
    // limit: left as it is.
    for fd in [stdin.as_fd(), stdout.as_fd()] {
        let _ = rustix::pipe::fcntl_setpipe_size(fd, PIPE_SIZE);
    }
    let mut input = std::io::BufReader::new(stdin.lock());
    let mut output = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    serve(&mut input, &mut output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::HashMode;
    use crate::model::Set;

    /// A venv with one distribution `a` of three files plus its dist-info.
    fn venv() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let site = t.path().join("lib/python3.11/site-packages");
        std::fs::create_dir_all(site.join("a/sub")).unwrap();
        std::fs::create_dir_all(site.join("a-1.0.dist-info")).unwrap();
        for (p, text) in [
            ("a/__init__.py", "x = 1\n"),
            ("a/sub/b.py", "y = 2\n"),
            ("a/c.so", "not really\n"),
            (
                "a-1.0.dist-info/METADATA",
                "Metadata-Version: 2.1\nName: a\nVersion: 1.0\n",
            ),
            (
                "a-1.0.dist-info/RECORD",
                "a/__init__.py,,\na/sub/b.py,,\na/c.so,,\na-1.0.dist-info/METADATA,,\na-1.0.dist-info/RECORD,,\n",
            ),
        ] {
            std::fs::write(site.join(p), text).unwrap();
        }
        t
    }

    /// Serve `requests` in one session; the answers, without progress frames.
    fn exchange(requests: &[Request]) -> Vec<Response> {
        let mut input = Vec::new();
        for r in requests {
            write_frame(&mut input, r).unwrap();
        }
        let mut output = Vec::new();
        serve(&mut input.as_slice(), &mut output).unwrap();
        let mut answers = Vec::new();
        let mut r = output.as_slice();
        while let Some(m) = read_frame::<Response>(&mut r).unwrap() {
            if !matches!(m, Response::Progress(_)) {
                answers.push(m);
            }
        }
        answers
    }

    #[test]
    fn stat_members_answers_in_the_controllers_order_and_refuses_another() {
        let t = venv();
        let v = t.path().to_str().unwrap().to_string();
        let set = Set {
            name: "a".into(),
            dists: vec!["a".into()],
            files: vec![],
        };
        // The controller's side of it, from the same scan.
        let scan = inventory::scan(&v, &[]).unwrap();
        let members = vec![crate::plan::members(&set, &scan, &[])];
        let order = crate::plan::stat_order(&members, &["a/extra.py"]);
        assert_eq!(order.len(), 6);
        let stat = |count: usize, check: u64| Request::StatMembers {
            venv: v.clone(),
            sets: vec![set.clone()],
            globs: vec![],
            extra: vec!["a/extra.py".into()],
            count: count as u64,
            check,
            hash: HashMode::None,
            shebang: None,
            pycache: false,
        };
        let right = || stat(order.len(), crate::plan::order_check(&order));
        let answers = exchange(&[
            right(),
            Request::Scan {
                venv: v.clone(),
                file_globs: vec![],
            },
            right(),
            stat(order.len(), crate::plan::order_check(&order[1..])),
            stat(order.len() - 1, crate::plan::order_check(&order)),
            Request::Bye,
        ]);
        // Before a scan of that venv: refused.
        assert!(
            matches!(&answers[0], Response::Error(e) if e.message.contains("without a Scan")),
            "{:?}",
            answers[0]
        );
        assert!(matches!(answers[1], Response::Scan(_)));
        // In order: one entry per path, the extra one missing.
        let Response::Stat { entries } = &answers[2] else {
            panic!("{:?}", answers[2]);
        };
        let kinds: Vec<Option<crate::model::Kind>> = order
            .iter()
            .zip(entries.clone())
            .map(|(p, e)| e.into_entry(p.to_string()).map(|e| e.kind))
            .collect();
        assert_eq!(kinds.len(), order.len());
        let extra = order.iter().position(|p| *p == "a/extra.py").unwrap();
        assert_eq!(kinds[extra], Some(crate::model::Kind::Missing));
        let b = order.iter().position(|p| *p == "a/sub/b.py").unwrap();
        assert!(
            matches!(kinds[b], Some(crate::model::Kind::File { size: 6, .. })),
            "{:?}",
            kinds[b]
        );
        // Another order (checksum) or another count: refused, with a hint.
        for a in &answers[3..5] {
            assert!(
                matches!(a, Response::Error(e) if e.message.contains("member paths") && e.hint.is_some()),
                "{a:?}"
            );
        }
        assert!(matches!(answers[5], Response::Bye));
    }
}
