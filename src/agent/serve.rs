//! The serve loop: read a request, dispatch it to its handler, write the
//! answer; and the [`Session`] the requests of one connection share. The
//! loop's rules are in the [module doc of the agent](super).

use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::handlers::{self, Members, Peer, Sending, StatHow};
use crate::err;
use crate::error::{Error, Result};
use crate::inventory::Counters;
use crate::journal::{Generation, State};
use crate::model::{Progress, ScanReport};
use crate::protocol::{Request, Response, read_frame, write_frame};

/// Serve requests until `Bye` or end of input.
pub fn serve(input: &mut dyn Read, output: &mut dyn Write) -> Result<()> {
    serve_with(input, output, None)
}

/// [`serve`], with `pending` saying (without reading it) whether the
/// controller sent something more or closed the input: a `Switch` stops
/// and undoes itself then (an `Abort` on Ctrl-C, or a dead controller).
pub fn serve_with(
    input: &mut dyn Read,
    output: &mut dyn Write,
    pending: Option<fn() -> bool>,
) -> Result<()> {
    let mut session = Session {
        pending,
        ..Session::default()
    };
    loop {
        let Some(req) = read_frame::<Request>(input)? else {
            return Ok(());
        };
        match session.dispatch(req, input, output)? {
            Next::Answer(response) => {
                send(output, &response)?;
                if let Response::Scan(report) = response {
                    session.scan = Some(report);
                }
            }
            Next::Last(response) => {
                if let Some(r) = response {
                    send(output, &r)?;
                }
                return Ok(());
            }
            Next::Refuse(response, why) => {
                send(output, &response)?;
                return Err(why);
            }
        }
    }
}

/// What the loop does after a request.
pub(super) enum Next {
    /// Send this answer and read the next request.
    Answer(Response),
    /// Send this answer, if any, and stop serving: the input ended, or
    /// cannot be read past a broken frame.
    Last(Option<Response>),
    /// Send this answer, then stop serving with this error.
    Refuse(Response, Error),
}

/// What the agent holds between requests: the venv's lock and the open generation.
#[derive(Default)]
pub(super) struct Session {
    pub(super) state: Option<State>,
    pub(super) generation: Option<Generation>,
    /// The scan this agent answered last (for `StatMembers`).
    pub(super) scan: Option<ScanReport>,
    /// A `PrefetchPreflight` walk: its venv and the thread listing the
    /// shared objects of site-packages and reading their facts.
    pub(super) prefetch: Option<(
        String,
        std::thread::JoinHandle<Option<crate::preflight::facts::Prefetched>>,
    )>,
    /// A `PrefetchElf` read (source side).
    pub(super) elf_prefetch: Option<ElfPrefetch>,
    /// Whether input waits to be read, or has ended (see [`serve_with`]).
    pub(super) pending: Option<fn() -> bool>,
}

/// The ELF facts a `PrefetchElf` is reading: of these `paths` of `venv`.
pub(super) struct ElfPrefetch {
    pub(super) venv: String,
    pub(super) paths: Vec<String>,
    /// `None` once taken.
    pub(super) read: Option<std::thread::JoinHandle<Option<crate::preflight::facts::Read>>>,
}

impl ElfPrefetch {
    /// What the read gave (`None` if it failed).
    pub(super) fn join(&mut self) -> Option<crate::preflight::facts::Read> {
        self.read.take()?.join().ok().flatten()
    }
}

impl Drop for ElfPrefetch {
    /// A read nobody asked for is waited for, not cut off while it saves
    /// the facts cache.
    fn drop(&mut self) {
        let _ = self.join();
    }
}

impl Session {
    /// Pass one request to its handler. A handler's error becomes an error
    /// answer; only reading or writing the controller's pipe fails here.
    fn dispatch(
        &mut self,
        req: Request,
        input: &mut dyn Read,
        output: &mut dyn Write,
    ) -> Result<Next> {
        use handlers as h;
        // One arm per request (unformatted: rustfmt would spread each
        // request's fields over a line apiece).
        #[rustfmt::skip]
        let answer = match req {
            Request::Hello { protocol } => return Ok(h::hello(protocol)),
            Request::Bye => return Ok(Next::Last(Some(Response::Bye))),
            Request::Receive { venv, generation } => return h::receive(input, &venv, &generation),
            Request::Stage { shared } => return Ok(h::stage(self, input, shared.as_deref())),
            Request::EndData { .. } => Err(err!(kind = Protocol, "EndData without Stage")),
            Request::Scan { venv, file_globs } => h::scan(&venv, &file_globs),
            Request::Stat { venv, paths, hash, shebang, pycache } =>
                h::stat(output, &venv, &paths, &StatHow { hash, shebang, pycache }),
            Request::StatMembers {
                venv, sets, globs, extra, count, check, hash, shebang, pycache,
            } =>
                h::stat_members(self, output, &Members { venv, sets, globs, extra, count, check },
                    &StatHow { hash, shebang, pycache }),
            Request::Send { venv, files, shebang, compression } =>
                h::send(output, &Sending { venv, files, shebang, compression }),
            Request::SendDirect {
                venv, files, shebang, compression,
                ssh, proxy_jump, agent, target_venv, generation, connect_timeout_secs,
            } =>
                h::send_direct(output, &Sending { venv, files, shebang, compression },
                    &Peer { ssh, proxy_jump, agent, target_venv, generation, connect_timeout_secs }),
            Request::StagedDirect { hashes, written } => h::staged_direct(self, &hashes, &written),
            Request::StageLocal { source_venv, shebang } =>
                h::stage_local(self, output, &source_venv, shebang.as_ref()),
            Request::Prepare(req) => h::prepare(self, output, &req),
            Request::Switch => h::switch(self, output),
            Request::Commit { keep_backup, keep } => h::commit(self, keep_backup, keep),
            Request::Abort => h::abort(self),
            Request::Rollback { venv, to, force } => {
                h::rollback(self, output, &venv, to.as_deref(), force)
            }
            Request::History { venv } => h::history(self, &venv),
            Request::Prune { venv, keep } => h::prune(self, &venv, keep),
            Request::Recover { venv, resume } => h::recover(self, output, &venv, resume),
            Request::Verify(req) => h::verify(&req),
            Request::ElfInfo { venv, paths } => h::elf_info(self, output, &venv, &paths),
            Request::PrefetchElf { venv, paths } => h::prefetch_elf(self, venv, paths),
            Request::PrefetchPreflight { venv } => h::prefetch_preflight(self, venv),
            Request::Preflight(req) => h::preflight(self, output, &req),
            Request::Doctor(req) => h::doctor(output, &req),
            Request::RecordCheck(req) => h::record_check(output, &req),
        };
        Ok(Next::Answer(
            answer.unwrap_or_else(|e| Response::Error(explain_denied(e))),
        ))
    }

    /// The venv's journal state, opened (and locked) on first use.
    pub(super) fn state(&mut self, venv: &str) -> Result<&State> {
        if self
            .state
            .as_ref()
            .is_none_or(|s| s.venv.root != std::path::Path::new(venv))
        {
            self.state = Some(State::open(venv)?);
        }
        Ok(self.state.as_ref().expect("just set"))
    }

    /// The state and the generation `Prepare` opened.
    pub(super) fn opened(&mut self) -> Result<(&State, &mut Generation)> {
        match (&self.state, &mut self.generation) {
            (Some(s), Some(g)) => Ok((s, g)),
            _ => Err(err!(
                kind = Protocol,
                "no generation is open: send Prepare first"
            )),
        }
    }

    /// Delete the open generation after a failed or abandoned stage (best
    /// effort: the next run recovers whatever is left).
    pub(super) fn discard_open(&mut self) {
        if let (Some(g), Some(s)) = (self.generation.take(), &self.state) {
            let _ = s.discard(g);
        }
    }
}

/// Whether `e` is a file operation this user was not allowed (the
/// message ends in `io_cause`'s "permission denied").
pub(crate) fn permission_denied(e: &Error) -> bool {
    e.message.ends_with(": permission denied")
}

/// A file operation refused to an agent that does not run as root gets
/// the hint that says who it runs as and how to run it as root: the
/// manifest's `sudo` (docs/sudo.md). The controller adds the host's name.
fn explain_denied(e: Error) -> Error {
    let uid = rustix::process::geteuid().as_raw();
    if uid == 0 || !permission_denied(&e) {
        return e;
    }
    let who = match std::env::var("USER") {
        Ok(u) if !u.is_empty() && crate::model::valid_user_name(&u) => format!("{u} (uid {uid})"),
        _ => format!("uid {uid}"),
    };
    e.hint(format!(
        "the agent runs as {who} there, which may not do this: add `sudo = true` to this host's [hosts] table in the manifest to run it as root through sudo (docs/sudo.md), or log in as the venv's owner"
    ))
}

fn send(out: &mut dyn Write, r: &Response) -> Result<()> {
    write_frame(out, r).map_err(|e| {
        err!(
            kind = Connection,
            "agent: cannot write to the controller: {e}"
        )
    })
}

/// Run `work` on a worker thread while sending progress frames every 200 ms.
pub(super) fn with_progress<T: Send>(
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
                return Err(err!(
                    kind = Connection,
                    "agent: cannot write to the controller: {e}"
                ));
            }
        }
        handle
            .join()
            .map_err(|_| Error::new("agent: a worker thread panicked"))
    })
}
