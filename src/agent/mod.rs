//! The agent: `overlay agent`, the same binary, started on each host over an
//! SSH exec channel (or as a local child process). It answers framed
//! requests on stdin/stdout, doing all file-system work on its own host.
//! [`client::Client`] is the controller's end of the conversation.

pub mod client;
pub mod protocol;

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::err;
use crate::error::{Error, Result};
use crate::inventory::{self, Counters};
use protocol::{PROTOCOL_VERSION, Progress, Request, Response, read_frame, write_frame};

/// Serve requests until `Bye` or end of input.
pub fn serve(input: &mut dyn Read, output: &mut dyn Write) -> Result<()> {
    let send = |out: &mut dyn Write, r: &Response| -> Result<()> {
        write_frame(out, r).map_err(|e| err!("agent: cannot write to the controller: {e}"))
    };
    loop {
        let Some(req) = read_frame::<Request>(input)? else {
            return Ok(());
        };
        match req {
            Request::Hello { protocol } => {
                send(
                    output,
                    &Response::Hello {
                        protocol: PROTOCOL_VERSION,
                        version: env!("CARGO_PKG_VERSION").to_string(),
                    },
                )?;
                if protocol != PROTOCOL_VERSION {
                    return Err(err!(
                        "agent speaks protocol {PROTOCOL_VERSION}, the controller {protocol}"
                    ));
                }
            }
            Request::Scan { venv, file_globs } => {
                let r = inventory::scan(&venv, &file_globs);
                send(output, &r.map(Response::Scan).unwrap_or_else(Response::Error))?;
            }
            Request::Stat {
                venv,
                paths,
                hash,
                shebang,
                pycache,
            } => {
                let counters = Arc::new(Counters::default());
                let result = with_progress(output, &counters, {
                    let counters = counters.clone();
                    move || inventory::stat(&venv, &paths, hash, shebang.as_ref(), pycache, &counters)
                })?;
                send(
                    output,
                    &result
                        .map(|entries| Response::Stat { entries })
                        .unwrap_or_else(Response::Error),
                )?;
            }
            Request::Bye => {
                send(output, &Response::Bye)?;
                return Ok(());
            }
        }
    }
}

/// Run `work` on a worker thread while sending progress frames every 200 ms.
fn with_progress<T: Send + 'static>(
    output: &mut dyn Write,
    counters: &Counters,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    let handle = std::thread::spawn(work);
    while !handle.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
        if handle.is_finished() {
            break;
        }
        let p = Progress {
            files: counters.files.load(Ordering::Relaxed),
            bytes: counters.bytes.load(Ordering::Relaxed),
            total_files: counters.total_files.load(Ordering::Relaxed),
            total_bytes: counters.total_bytes.load(Ordering::Relaxed),
        };
        write_frame(output, &Response::Progress(p))
            .map_err(|e| err!("agent: cannot write to the controller: {e}"))?;
        std::thread::sleep(Duration::from_millis(150));
    }
    handle
        .join()
        .map_err(|_| Error::new("agent: a worker thread panicked"))
}

/// Entry point of `overlay agent`.
pub fn main() -> Result<()> {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let mut input = std::io::BufReader::new(stdin.lock());
    let mut output = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    serve(&mut input, &mut output)
}
