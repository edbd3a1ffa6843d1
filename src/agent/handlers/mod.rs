//! One file per request: each handler takes the [`Session`](super::session::Session)
//! (when the request needs what requests share) and the request's fields,
//! and returns the answer. Handlers that run long write `Progress` frames to
//! the controller's pipe while they work
//! ([`with_progress`](super::session::with_progress)); `Send` writes its data
//! frames there. An error a handler returns is answered as an error by the
//! dispatch that calls them, in [`super::serve`].
//!
//! `Hello`, `Receive` and `Stage` also decide whether the session goes on
//! (they answer with [`Next`](super::session::Next)); `Bye` and a stray
//! `EndData` are answered by the dispatch itself.

mod abort;
mod commit;
mod doctor;
mod elf_info;
mod hello;
mod history;
mod open_lanes;
mod preflight;
mod prepare;
mod prune;
mod receive;
mod recover;
mod rollback;
mod running;
mod scan;
mod send;
mod send_direct;
mod stage;
mod stage_local;
mod staged_direct;
mod stat;
mod stat_members;
mod switch;
mod verify;

pub(super) use abort::abort;
pub(super) use commit::commit;
pub(super) use doctor::{doctor, record_check};
pub(super) use elf_info::{elf_info, prefetch_elf};
pub(super) use hello::hello;
pub(super) use history::history;
pub(super) use open_lanes::open_lanes;
pub(super) use preflight::{prefetch_preflight, preflight};
pub(super) use prepare::prepare;
pub(super) use prune::prune;
pub(super) use receive::receive;
pub(super) use recover::recover;
pub(super) use rollback::rollback;
pub(super) use running::{check, prefetch_running, running};
pub(super) use scan::{machine, scan};
pub(super) use send::{Sending, send};
pub(super) use send_direct::{Peer, send_direct};
pub(super) use stage::stage;
pub(super) use stage_local::stage_local;
pub(super) use staged_direct::staged_direct;
pub(super) use stat::{StatHow, stat};
pub(super) use stat_members::{Members, stat_members};
pub(super) use switch::switch;
pub(super) use verify::verify;
