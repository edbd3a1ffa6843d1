//! The agent seen from its pipe, for the handlers' tests: requests in,
//! answers out, through the real serve loop.

use crate::agent::serve;
use crate::protocol::{Request, Response, read_frame, write_frame};

/// Serve `requests` in one session; the answers, without progress frames.
pub fn exchange(requests: &[Request]) -> Vec<Response> {
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
