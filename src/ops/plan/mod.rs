//! Plan: scan and hash both live hosts, decide what changes on the target,
//! and predict what would fail after the overlay. Never writes to either
//! venv; [`save`] writes the plan for `apply`.
//!
//! Sets with `from` (a folder laid out like site-packages) are planned
//! source by source (`plan_by_source`): each folder is read by an
//! ordinary agent, here or on the host `host:/path` names, through the
//! "venv" [`crate::model::folder_venv`]; the plan records each such set's
//! source in [`SetPlan::from`].
//!
//! Layout: `connect` (connect and scan both hosts at once), `stat` (the
//! sides' stat requests and phase 1), `hash` (phase 2), `bytecode` (phase 3),
//! `make` (one source against the target, the phases in order), `sources`
//! (sets with `from`: a plan per source, merged), `preflight` (the predicted
//! problems), `save` (the plan file and the manifest's stamp).

mod bytecode;
mod connect;
mod hash;
mod make;
mod preflight;
mod save;
mod sources;
mod stat;

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::err;
use crate::error::Result;
use crate::manifest::{Host, Manifest};
use crate::model::{Endpoint, ScanReport, Set};
use crate::plan::{HostInfo, Plan};
use crate::transport::ConnectOptions;

use super::Observer;

pub use bytecode::bytecode_phase;
pub use connect::{Scanned, both, connect_scan};
pub use make::shared_files;
pub use preflight::{Preflighted, deleted_and_placed, preflight};
pub use save::{ManifestStamp, manifest_stamp, save, write_atomic};
use sources::plan_by_source;
pub use sources::{
    SourceGroup, check_folder_link, folder_error, folder_host, mark_from_folder, merge_plans,
    source_groups,
};
pub use stat::{StatSide, index, members_and_order, stat_sides};

/// What `overlay plan` is asked.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    pub manifest: PathBuf,
    /// The source and target hosts' manifest names.
    pub source: String,
    pub target: String,
    /// The sets to plan (`--set`); empty for all.
    pub sets: Vec<String>,
    /// Refuse to apply a plan that predicts problems, whatever the manifest says.
    pub strict: bool,
    pub connect: ConnectOptions,
}

/// A plan made, with the hosts' agents still saying goodbye.
pub struct Planned {
    pub plan: Plan,
    /// The agents' goodbyes, which run while the plan is shown and saved.
    pub closing: Closing,
}

/// The goodbyes of a plan's agents, running on their own threads (one
/// per source the plan read: the source host, and each set's `from`).
pub struct Closing(pub Vec<std::thread::JoinHandle<()>>);

impl Closing {
    /// Wait for the agents to exit.
    pub fn wait(self) {
        for h in self.0 {
            let _ = h.join();
        }
    }
}

/// Make a plan: connect to both hosts, scan, hash, decide and preflight.
pub fn plan(opts: &PlanOptions, obs: &dyn Observer) -> Result<Planned> {
    let manifest = Manifest::load(&opts.manifest)?;
    let src_host = manifest.host(&opts.source)?;
    let dst_host = manifest.host(&opts.target)?;
    if src_host.name == dst_host.name {
        return Err(err!(
            hint = "name two different hosts",
            "Source and target are the same host ({})",
            src_host.name
        ));
    }
    let sets = select_sets(&manifest, &opts.sets)?;
    let stamp = manifest_stamp(&opts.manifest)?;
    let mut planned = plan_by_source(&manifest, &sets, src_host, dst_host, &opts.connect, obs)?;
    planned.plan.strict |= opts.strict;
    planned.plan.manifest = stamp.path.display().to_string();
    planned.plan.manifest_sha256 = Some(stamp.sha256);
    Ok(planned)
}

/// The `source` as the plan for `target` records it. A folder (`folder`)
/// has no interpreter: its files are taken to be for the target's Python
/// (docs/design.md, "Sets from a folder").
pub fn source_as_for(source: &HostInfo, folder: bool, target: &HostInfo) -> HostInfo {
    HostInfo {
        python: if folder {
            target.python.clone()
        } else {
            source.python.clone()
        },
        ..source.clone()
    }
}

/// The plan's description of a host.
pub fn host_info(host: &Host, scan: &ScanReport) -> HostInfo {
    HostInfo {
        name: host.name.clone(),
        ssh: match &host.endpoint {
            Endpoint::Ssh(s) => Some(s.target.clone()),
            Endpoint::Local => None,
        },
        proxy_jump: match &host.endpoint {
            Endpoint::Ssh(s) => s.proxy_jump.clone(),
            Endpoint::Local => None,
        },
        venv: host.venv.clone(),
        direct_ssh: host.direct_ssh.clone(),
        sudo: host.sudo.clone(),
        route: host.route,
        site_packages: scan.site_packages.clone(),
        python: scan.python.clone(),
        machine: (scan.machine.driver != crate::model::Driver::Unknown
            || !scan.machine.notes.is_empty())
        .then(|| scan.machine.clone()),
    }
}

/// The sets to plan: all, or those named with `--set`.
pub fn select_sets(manifest: &Manifest, names: &[String]) -> Result<Vec<Set>> {
    if names.is_empty() {
        if manifest.sets.is_empty() {
            return Err(err!(
                hint = "add a [sets.NAME] table with `dists` or `files` (docs/manifest.md)",
                "{} defines no sets",
                manifest.path.display()
            ));
        }
        return Ok(manifest.sets.clone());
    }
    if let Some(n) = names
        .iter()
        .find(|n| !manifest.sets.iter().any(|s| &s.name == *n))
    {
        let known: Vec<&str> = manifest.sets.iter().map(|s| s.name.as_str()).collect();
        return Err(err!(
            hint = format!("sets in {}: {}", manifest.path.display(), known.join(", ")),
            "Unknown set {n:?}"
        ));
    }
    // Manifest order, each set once: the order decides which set carries a shared path.
    Ok(manifest
        .sets
        .iter()
        .filter(|s| names.contains(&s.name))
        .cloned()
        .collect())
}

/// The sets' file globs, each once.
pub fn globs_of(sets: &[Set]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    sets.iter()
        .flat_map(|s| s.files.iter())
        .filter(|g| seen.insert(g.as_str()))
        .cloned()
        .collect()
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
