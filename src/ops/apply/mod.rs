//! Apply: carry out a saved plan on its target, streaming the new files
//! from its source (through this controller, or `--direct`), then
//! switching them in through the target's journal; optionally run the
//! `[verify]` check and roll back when it fails.
//!
//! [`apply`] runs the steps in order, each its own function: the manifest
//! check (an explicit `--manifest` must be the one the plan recorded), the
//! line naming the plan and its target ([`announcement`]), the resume check
//! ([`resume`]), the strict check, prepare (which hands the target the
//! plan's versions to record), stream (`transfer`; with both hosts on this
//! machine, the target's agent copies the files itself instead, `copy_here`:
//! the local route), switch and commit
//! (keeping the backup unless `--no-backup`; the target says its size),
//! verify with rollback on failure. The target refuses at prepare while
//! processes run from its venv, unless `--allow-running`; then the commit
//! names those that still run the old files.
//!
//! When some sets come from a folder ([`crate::plan::SetPlan::from`]), the
//! files are relayed source by source, each source's stream in turn, into
//! one stage of the target (`stream_parts`): one generation as ever.
//!
//! If an agent or its connection dies on either host, the apply stops at
//! once (a thread watches the target while this one waits on the source)
//! and the error says where the target stands and what to run next.
//!
//! Ctrl-C (or SIGTERM) stops it cleanly ([`crate::interrupt`]): the flag is
//! read between the steps, at every event of the stream and at every
//! progress frame of the switch. Before the switch the target discards its
//! staging; during it, the target stops and undoes it (`Abort`, see
//! [`crate::client::Client::switch_unless`]); after the commit the new files stay. The
//! error (kind `Interrupted`, exit 130) names the target's state and the
//! command that undoes or repeats it ([`outcome::Left`]).
//!
//! Layout: `begin` (load and check the plan, connect, open the generation),
//! `route` (which way the files go), `transfer` (the stream or the local
//! copy, and its failure), `stream` (one source's stream while the target
//! is watched), `local` (the local route's copy), `finish` (switch, commit,
//! verify), `outcome` (where a failure or Ctrl-C left the target).

mod begin;
mod finish;
mod lanes;
mod local;
mod outcome;
mod route;
mod stream;
mod transfer;

use std::path::PathBuf;

use serde::Serialize;

use crate::error::Result;
use crate::model::{Action, Compression, GenChange, SendFile, StreamWaits};
use crate::plan::Plan;
use crate::transport::ConnectOptions;

use super::{Clock, Observer};

pub use begin::{Began, Ready, announcement, begin, resume};
pub use finish::{finish, still_running_line};
pub use lanes::{
    Cores, FanMaps, LaneCount, LaneTarget, LanesEnd, TargetTook, lane_count, own_hashes,
    stream_fanned,
};
pub use route::{
    ChosenRoute, choose_route, direct_obstacle, local_copy, route_compression, route_note,
};
pub use stream::{StreamFailure, connect_source, pause_hook, show_windows};
use transfer::transfer;
pub use transfer::{Moved, Transferred, stream_failed};

/// What `overlay apply` is asked.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// The saved plan.
    pub plan: PathBuf,
    /// `--manifest`: checked against the one the plan was made from when
    /// `manifest_explicit`; `[verify]` is read from it when the plan's own is gone.
    pub manifest: PathBuf,
    /// `--manifest` (or OVERLAY_MANIFEST) was given, not defaulted.
    pub manifest_explicit: bool,
    pub connect: ConnectOptions,
    /// Only complete an interrupted generation.
    pub resume: bool,
    /// Apply a strict plan that predicts problems.
    pub force: bool,
    /// `--direct`: stream from the source straight to the target, whatever
    /// the plan's route (no fallback to the relay).
    pub direct: bool,
    /// `--relay`: stream through this machine, whatever the plan's route.
    pub relay: bool,
    /// Keep a backup, to roll back to (the default; off with `--no-backup`).
    pub backup: bool,
    /// Generations to keep after the commit.
    pub keep: Option<usize>,
    /// Keep the source's owners on the target.
    pub same_owner: bool,
    pub compression: Compression,
    /// `--connections`: how many SSH connections the stream takes.
    pub connections: crate::model::Connections,
    /// Run the `[verify]` check after the switch.
    pub verify: bool,
    /// Roll back when that check fails.
    pub rollback_on_failure: bool,
    /// Place the bytecode the plan carries with its `.py` files (off with
    /// `--no-compile`).
    pub compile: bool,
    /// `--allow-running`: go on while processes run from the target's
    /// venv (the target refuses otherwise, before anything is written);
    /// those still running after are named ([`Applied::still_running`]).
    pub allow_running: bool,
}

/// What an apply did.
#[derive(Debug, Clone)]
pub enum ApplyReport {
    /// `--resume`: what was done to an interrupted generation, if there was one.
    Resumed {
        target: String,
        outcome: Option<String>,
    },
    /// The plan has no changes.
    NothingToApply { target: String },
    /// A generation was applied.
    Applied(Applied),
}

/// How the files travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Route {
    /// Through this machine.
    Relay,
    /// From the source to the target (`--direct`).
    Direct,
    /// Copied by the target's agent from the source venv on this machine
    /// (both hosts local: the local route).
    Local,
}

/// A generation applied (also `apply --json`'s document).
#[derive(Debug, Clone, Serialize)]
pub struct Applied {
    /// The target's manifest name.
    #[serde(skip)]
    pub target: String,
    pub generation: String,
    /// What was done first to an interrupted generation, if there was one.
    pub recovered: Option<String>,
    /// Files sent.
    pub files: u64,
    /// Changes in the generation (with stale bytecode deleted).
    pub changes: u64,
    pub raw_bytes: u64,
    pub sent_bytes: u64,
    /// How the files travelled; `None` when none were sent.
    pub route: Option<Route>,
    /// The plan's route was direct but the source could not reach the
    /// target, so the files went through this machine: ssh's reason.
    pub fell_back_from_direct: Option<String>,
    pub seconds: f64,
    pub backup: bool,
    /// Bytes the backup holds on the target (0 without one).
    pub backup_bytes: u64,
    /// With `verify`: whether the check passed.
    pub verified: Option<bool>,
    /// With `rollback_on_failure`: the generation was rolled back.
    pub rolled_back: bool,
    /// Where both ends spent the stream (`None` on the local route, or
    /// when nothing was sent).
    pub waits: Option<Box<StreamWaits>>,
    /// With `--allow-running`: the processes that ran from the venv and
    /// still run, with the old files loaded (restart them).
    pub still_running: Vec<crate::model::VenvProcess>,
}

/// The generation's change list: the plan's changes plus stale bytecode.
pub fn gen_changes(plan: &Plan) -> Vec<GenChange> {
    let mut out = Vec::new();
    for set in &plan.sets {
        for c in &set.changes {
            out.push(GenChange {
                path: c.path.clone(),
                action: c.action,
                source: c.source.clone(),
                target: c.target.clone(),
                bytecode: false,
                staged: None,
            });
        }
        for p in &set.stale_bytecode {
            out.push(GenChange {
                path: p.clone(),
                action: Action::Delete,
                source: None,
                target: None,
                bytecode: true,
                staged: None,
            });
        }
    }
    out
}

/// Carry out the saved plan `opts.plan`.
pub fn apply(opts: &ApplyOptions, obs: &dyn Observer) -> Result<ApplyReport> {
    let clock = Clock::start(obs);
    let mut ready = match begin(opts, obs)? {
        Began::Ready(r) => r,
        Began::Done(report) => return Ok(report),
    };
    clock.mark("connect and prepare");
    let send = SendFile::of_changes(&ready.changes);
    let sent = transfer(
        &mut ready.dst,
        &ready.plan,
        opts,
        &ready.generation,
        &ready.chosen,
        send,
        obs,
    )?;
    finish(ready, sent, &clock, obs)
}
