//! Ctrl-C (SIGINT) and SIGTERM on the controller.
//!
//! [`install`] (called by `main` for every command but `agent`) starts one
//! thread that waits for the signals (signal-hook's iterator: the signal
//! handler itself only wakes that thread). What a signal does depends on
//! whether an operation that can stop cleanly is running, which it says by
//! holding a [`Cleanly`] (only `apply` does):
//!
//! - none: the process ends at once, killed by the signal as the default
//!   action would (the shell reports 130), after an `interrupted` line
//!   (nothing on a host is half done then: read-only commands, or a
//!   rollback whose journal finishes it later);
//! - the first signal sets a flag that the operation reads with
//!   [`requested`] between the blocks of its stream and the steps of its
//!   switch; it then stops, has the target put back what it started, and
//!   returns an error of kind `Interrupted` that names the target's state;
//! - a second one says the cleanup is still going on and what stopping now
//!   would leave ([`Note`]); a third ends the process with that message.
//!
//! The agent installs nothing: it is stopped by its controller, never by a
//! terminal (a local agent runs in its own process group).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::text::escape;

/// The exit code of an interrupted command (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Signals received.
static SIGNALS: AtomicUsize = AtomicUsize::new(0);
/// Operations running that stop cleanly.
static CLEANLY: AtomicUsize = AtomicUsize::new(0);
/// What the running operation says about a forced stop.
static NOTE: Mutex<Option<Note>> = Mutex::new(None);

/// What an operation that stops cleanly tells the user on the second and
/// third signal.
#[derive(Debug, Clone, Default)]
pub struct Note {
    /// What the cleanup does ("dst discards the staged files or undoes its switch").
    pub cleaning: String,
    /// What a forced stop leaves ("dst in an unknown state").
    pub forced: String,
    /// The commands that show or finish it.
    pub hint: String,
}

/// Held while an operation that stops cleanly runs: signals then only set
/// the flag (see the module doc). Dropped, the default comes back.
pub struct Cleanly(());

impl Cleanly {
    pub fn new(note: Note) -> Cleanly {
        *NOTE.lock().unwrap_or_else(|p| p.into_inner()) = Some(note);
        CLEANLY.fetch_add(1, Ordering::SeqCst);
        Cleanly(())
    }
}

impl Drop for Cleanly {
    fn drop(&mut self) {
        CLEANLY.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether Ctrl-C or SIGTERM was received.
pub fn requested() -> bool {
    SIGNALS.load(Ordering::SeqCst) > 0
}

/// Start the thread that receives SIGINT and SIGTERM. A failure to
/// register leaves the default actions in place.
pub fn install() {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                received(signal);
            }
        });
    drop(spawned);
}

/// One signal, on the signal thread.
fn received(signal: std::ffi::c_int) {
    let n = SIGNALS.fetch_add(1, Ordering::SeqCst) + 1;
    if CLEANLY.load(Ordering::SeqCst) == 0 {
        eprintln!("interrupted");
        // End by the signal itself, as without a handler, so that a shell
        // running overlay in a script stops too (exit 130 when it cannot).
        let _ = signal_hook::low_level::emulate_default_handler(signal);
        std::process::exit(EXIT_INTERRUPTED.into());
    }
    let note = NOTE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default();
    // Host names and paths come from the manifest: one line each.
    let (cleaning, forced) = (escape(&note.cleaning), escape(&note.forced));
    match n {
        1 => eprintln!("interrupted: stopping cleanly ({cleaning})"),
        2 => eprintln!(
            "interrupted: still cleaning up ({cleaning}); Ctrl-C again stops now and leaves {forced}"
        ),
        _ => {
            eprintln!("interrupted: stopped before the cleanup finished, leaving {forced}");
            eprintln!("hint: {}", escape(&note.hint));
            std::process::exit(EXIT_INTERRUPTED.into());
        }
    }
}
