//! `Hello`: the agent's protocol number, version and executable. A
//! controller of another protocol still gets the answer (so it can say
//! which builds disagree), then the session ends.

use crate::agent::session::Next;
use crate::err;
use crate::protocol::{PROTOCOL_VERSION, Response};

pub fn hello(protocol: u32) -> Next {
    let answer = Response::Hello {
        protocol: PROTOCOL_VERSION,
        version: env!("CARGO_PKG_VERSION").to_string(),
        exe: std::env::current_exe()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get() as u32),
    };
    if protocol != PROTOCOL_VERSION {
        let why = err!(
            kind = Protocol,
            "agent speaks protocol {PROTOCOL_VERSION}, the controller {protocol}"
        );
        return Next::Refuse(answer, why);
    }
    Next::Answer(answer)
}
