//! Moving the files into the target's staging by the chosen route
//! ([`transfer`]): the local copy, one stream, a stream per source, or
//! direct falling back to the relay; and the error of a stream that failed
//! ([`stream_failed`]).

use crate::client::Client;
use crate::error::{Error, ErrorKind, Result};
use crate::interrupt;
use crate::model::{SendFile, StreamWaits};
use crate::ops::Observer;
use crate::plan::Plan;

use super::ApplyOptions;
use super::lanes::stream_auto;
use super::local::copy_here;
use super::outcome::{Left, Phase, fate, interrupted};
use super::route::{ChosenRoute, fallback_reason, fallback_warning, local_copy, route_compression};
use super::stream::{StreamFailure, Way, by_source, stream_parts};

/// What [`transfer`] did: the bytes, and the route they took.
#[derive(Debug, Clone, Default)]
pub struct Transferred {
    pub moved: Moved,
    /// The direct route's destination, if the files took it.
    pub direct: Option<String>,
    /// The direct route fell back to the relay: ssh's reason.
    pub fell_back_from_direct: Option<String>,
    /// Targets that took the same stream of the source (one read fanned
    /// out to them, see `crate::fleet::fanout`); 0 or 1: this target alone.
    pub shared: usize,
}

/// Bytes a stream carried.
#[derive(Debug, Clone, Copy, Default)]
pub struct Moved {
    /// Bytes of files.
    pub raw: u64,
    /// Bytes on the wire.
    pub sent: u64,
    /// The target copied the files itself (the local route): none went
    /// on a wire.
    pub local: bool,
    /// Where both ends spent the stream (none on the local route).
    pub waits: Option<StreamWaits>,
}

/// Stream the added and replaced files from the source into the target's
/// staging. If the source fails, the target discards the generation. A
/// direct route that may fall back ([`ChosenRoute`]) and whose source could
/// not reach the target (nothing was sent) is followed by the relay, with a
/// warning.
pub(super) fn transfer(
    dst: &mut Client,
    plan: &Plan,
    opts: &ApplyOptions,
    generation: &str,
    chosen: &ChosenRoute,
    send: Vec<SendFile>,
    obs: &dyn Observer,
) -> Result<Transferred> {
    let tname = &plan.target.name;
    if interrupt::requested() {
        return Err(match dst.abort() {
            Ok(()) => interrupted(Left::Discarded, tname, &opts.plan),
            Err(_) => interrupted(Left::Pending(generation), tname, &opts.plan),
        });
    }
    if send.is_empty() {
        return Ok(Transferred::default());
    }
    if local_copy(plan, chosen.direct.as_deref()) {
        let moved = copy_here(dst, plan, opts, generation, obs)?;
        return Ok(Transferred {
            moved,
            ..Transferred::default()
        });
    }
    let route = match chosen.direct.as_deref() {
        None => Way::Relay,
        Some(dest) => Way::Direct {
            dest,
            generation,
            timeout: opts.connect.timeout.as_secs(),
        },
    };
    let compression = route_compression(opts.compression, plan);
    let again = chosen.may_fall_back.then(|| send.clone());
    let mut result = match by_source(plan, &send) {
        Some(parts) => stream_parts(plan, &opts.connect, dst, parts, compression, obs),
        None => stream_auto(plan, opts, (dst, generation), send, compression, route, obs),
    };
    let mut fell_back = None;
    if let (Err(failure), Some(send), Some(dest)) = (&result, again, &chosen.direct)
        && let Some(why) = fallback_reason(&failure.error, dst)
    {
        obs.warn(&fallback_warning(plan, dest, &why));
        fell_back = Some(why);
        result = stream_auto(
            plan,
            opts,
            (dst, generation),
            send,
            compression,
            Way::Relay,
            obs,
        );
    }
    let failure = match result {
        Ok(moved) => {
            return Ok(Transferred {
                moved,
                direct: chosen.direct.clone().filter(|_| fell_back.is_none()),
                fell_back_from_direct: fell_back,
                shared: 0,
            });
        }
        Err(f) => f,
    };
    Err(stream_failed(dst, failure, tname, &opts.plan, generation))
}

/// The error of a stream that failed, once the target has discarded what
/// it staged if it still can (Ctrl-C, or the source failed or died); told
/// with where the target stands when an agent died.
pub fn stream_failed(
    dst: &mut Client,
    failure: StreamFailure,
    tname: &str,
    plan_file: &std::path::Path,
    generation: &str,
) -> Error {
    let e = failure.error;
    if e.kind == ErrorKind::Interrupted && !dst.lost() {
        // Ctrl-C: the source was cut off; the target discards the staging.
        return match dst.abort() {
            Ok(()) => interrupted(Left::Discarded, tname, plan_file),
            Err(_) => interrupted(Left::Pending(generation), tname, plan_file),
        };
    }
    if dst.lost() {
        return fate(e, dst.lost(), Phase::Stream, tname, generation);
    }
    // The target is still there: it discards the generation now.
    let aborted = dst.abort();
    if !failure.died {
        return e;
    }
    match aborted {
        Ok(()) => fate(e, dst.lost(), Phase::Aborted, tname, generation),
        Err(_) => fate(e, dst.lost(), Phase::Stream, tname, generation),
    }
}
