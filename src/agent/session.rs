//! What the requests of one connection share ([`Session`]: the venv's
//! lock, the open generation, the last scan, reads started ahead), what the
//! serve loop does after each ([`Next`]), and what handlers share: progress
//! frames while a long request works ([`with_progress`]), and telling a
//! permission error apart ([`permission_denied`]). The loop itself is
//! `super::serve`; the handlers are `super::handlers`.

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::err;
use crate::error::{Error, Result};
use crate::inventory::Counters;
use crate::journal::{Generation, State};
use crate::model::{Progress, ScanReport};
use crate::protocol::{Response, write_frame};

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
    /// Whether input waits to be read, or has ended (see `super::session::serve_with`).
    pub(super) pending: Option<fn() -> bool>,
    /// The bundle read in place that source requests named last
    /// (`bundle:/abs/file.ovl`), opened (and checked whole) once.
    pub(super) bundle: Option<std::sync::Arc<crate::bundle::BundleSource>>,
    /// The processes that ran from the venv when `Prepare` opened the
    /// generation (with `allow_running`), for `Commit` to name those that
    /// still run.
    pub(super) running: Vec<crate::model::VenvProcess>,
    /// A look for the processes that run from a venv, started with
    /// `PrefetchPreflight`: its venv and the thread.
    pub(super) running_prefetch: Option<(
        String,
        std::thread::JoinHandle<Result<crate::model::Running>>,
    )>,
    /// This host's machine facts, read since a `Scan` with `machine_later`.
    pub(super) machine: Option<std::thread::JoinHandle<crate::model::Machine>>,
}

impl Session {
    /// The bundle source `venv` names, if it names one: opened on first use.
    pub(super) fn bundle_source(
        &mut self,
        venv: &str,
    ) -> Result<Option<std::sync::Arc<crate::bundle::BundleSource>>> {
        if crate::model::bundle_of(venv).is_none() {
            return Ok(None);
        }
        if let Some(b) = self.bundle.as_ref().filter(|b| b.venv() == venv) {
            return Ok(Some(b.clone()));
        }
        let b = std::sync::Arc::new(crate::bundle::BundleSource::open(venv)?);
        self.bundle = Some(b.clone());
        Ok(Some(b))
    }
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

/// Whether `e` is a file operation this user was not allowed (the
/// message ends in `io_cause`'s "permission denied").
pub(crate) fn permission_denied(e: &Error) -> bool {
    e.message.ends_with(": permission denied")
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
