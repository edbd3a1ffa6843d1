//! The agent: `overlay agent`, the same binary, started on each host over an
//! SSH exec channel (or as a local child process). It answers framed
//! requests on stdin/stdout, doing all file-system work on its own host.
//! [`crate::client::Client`] is the controller's end of the conversation.
//!
//! [`main`] starts it: it refuses to serve from a file or folder another
//! user could replace ([`selfcheck`]), asks for bigger pipes, and hands
//! stdin and stdout to [`serve`].
//!
//! The serve loop's rules:
//! - Requests are answered one at a time, in order. While a long one runs,
//!   `Progress` frames go out every 200 ms before its answer (`Send`'s
//!   after every block of the stream).
//! - A request that fails is answered with `Response::Error` and the session
//!   goes on. It ends at `Bye`, at the end of input, when the controller's
//!   pipe fails, and in the two cases below.
//! - `Hello` is answered first; a protocol other than this build's then ends
//!   the session with an error.
//! - While `Switch` runs, the agent looks (without reading) whether more
//!   input came: an `Abort` (Ctrl-C on the controller) or the end of input
//!   stops the switch, which is then undone, so the venv is fully old.
//! - `Stage` and `Receive` are followed by data frames up to `EndData` (or
//!   `Abort`). A frame that cannot be read is answered with an error and
//!   ends the session, since nothing after it can be read; a stream cut off
//!   (the sender went away) ends it without an answer.
//! - What requests share (the venv's lock, the open generation, the last
//!   scan, a prefetched walk) lives in one `Session` (serve.rs).
//!
//! Layout: `serve.rs` is the loop and the dispatch, `handlers/` has one file
//! per request, `stream_in.rs` reads a data stream into staging (for
//! `Stage` and `Receive`), `selfcheck.rs` is the start-up check.

pub mod direct;
mod handlers;
pub mod selfcheck;
mod serve;
mod session;
mod stream_in;
#[cfg(test)]
mod testing;

use std::os::fd::AsFd;

use crate::error::Result;

pub use serve::{serve, serve_with};

/// What the agent asks for its stdin and stdout pipes
/// (`/proc/sys/fs/pipe-max-size`, 1 MiB by default, is the unprivileged limit).
pub const PIPE_SIZE: usize = 1 << 20;

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
    serve_with(&mut input, &mut output, Some(stdin_pending))
}

/// Whether the controller wrote more to stdin, or closed it, without
/// reading anything (a `Switch` looks between its steps: an `Abort` or the
/// end of input stops it). The controller sends nothing else while a switch
/// runs, so nothing can be waiting in the `BufReader` instead.
fn stdin_pending() -> bool {
    let mut fd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll(2) on one pollfd that lives across the call, no waiting.
    unsafe { libc::poll(&mut fd, 1, 0) > 0 }
}
