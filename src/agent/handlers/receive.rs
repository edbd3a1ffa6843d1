//! `Receive`: target side of `apply --direct`, and of each lane of a
//! stream over several connections. A source agent (or the controller's
//! relay) streams into the staging folder of a generation that the
//! controller's own agent on this host prepared and holds the lock for
//! ([`open_for_receive`](crate::journal::open_for_receive) finds it).

use std::io::Read;

use crate::agent::session::Next;
use crate::agent::stream_in::{drain, stream_in};
use crate::error::Result;
use crate::model::{StreamEntry, Unpacked};
use crate::protocol::Response;
use crate::stream::Holds;

/// Unpack the stream that follows into `generation`'s staging folder.
/// `Err`: the input could not be skipped after a refusal.
pub fn receive(
    input: &mut dyn Read,
    venv: &str,
    generation: &str,
    lane: Option<u32>,
    shared: Option<&[StreamEntry]>,
) -> Result<Next> {
    match crate::journal::open_for_receive(venv, generation, lane) {
        Ok(g) => {
            let holds = match (lane, shared) {
                (Some(_), Some(list)) => Holds::SharedPart(list),
                (Some(_), None) => Holds::Part,
                (None, Some(list)) => Holds::Shared(list),
                (None, None) => Holds::All,
            };
            let s = stream_in(input, &g, &g.root, holds);
            if s.ended {
                // A frame that broke the stream is answered before the agent goes.
                return Ok(Next::Last(s.broken.map(Response::Error)));
            }
            Ok(Next::Answer(match s.result {
                _ if s.aborted => Response::Aborted,
                Ok(Unpacked {
                    count,
                    written,
                    waits,
                }) => Response::Received {
                    files: count.files,
                    bytes: count.bytes,
                    written,
                    waits,
                },
                Err(e) => Response::Error(e),
            }))
        }
        Err(e) => {
            drain(input)?;
            Ok(Next::Answer(Response::Error(e)))
        }
    }
}
