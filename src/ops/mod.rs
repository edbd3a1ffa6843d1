//! The controller's operations on one target: plan, apply, rollback,
//! history, prune, verify and doctor, and `pack` (a source written into a
//! bundle, and a bundle applied on this host), each as one function that
//! takes an options struct (plain data; `trust` holds what signing and
//! checking a bundle's signature share)
//! and an [`Observer`], talks to the hosts' agents through the
//! [`Client`], and returns a typed report. The binary's commands parse
//! arguments into the options, call one operation and print its report.
//!
//! Operations never print: status lines, progress meters, `-vv` details
//! and the `[verify]` check's output go to the [`Observer`], which the
//! binary implements (bars on a terminal, plain lines otherwise). Each
//! [`Step`] of an operation (connecting, scanning, hashing, streaming,
//! switching, verifying) on each host gets its own [`Meter`] from
//! [`Observer::step`], finished when the step is done.
//!
//! This module holds what the operations share: which host a one-host
//! operation works on ([`HostChoice`], [`resolve`]), the saved plan
//! ([`load_plan`]) and connecting ([`connect`]).

pub mod apply;
pub mod doctor;
pub mod history;
pub mod pack;
mod pack_source;
pub mod plan;
mod record_note;
pub mod relay;
pub mod rollback;
pub mod trust;
pub mod verify;

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::client::Client;
use crate::err;
use crate::error::Result;
use crate::manifest::Manifest;
use crate::model::{Endpoint, Progress, SshDest, VerifyReport};
use crate::plan::Plan;
use crate::transport::ConnectOptions;

/// A step of an operation, shown as one line while it runs (on a terminal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Starting the agent on a host.
    Connect,
    /// The venv's scan and the stat of the sets' members.
    Scan,
    /// Reading files whose hash decides something.
    Hash,
    /// The files going from the source into the target's staging.
    Stream,
    /// The generation switched in and committed.
    Switch,
    /// The manifest's `[verify]` check.
    Verify,
}

/// Where an operation's progress goes: the binary's terminal or log.
/// Shared by the threads that work on the two hosts at once.
pub trait Observer: Sync {
    /// A status line (shown on stderr unless `--quiet`).
    fn status(&self, line: &str);
    /// A detail shown with `-vv`: timings, measured compression levels.
    fn detail(&self, line: &str);
    /// A note shown with `-v`: why a choice was made (e.g. the route).
    fn note(&self, line: &str) {
        self.detail(line);
    }
    /// A warning (shown even with `--quiet`): something did not go as
    /// configured, but the operation goes on.
    fn warn(&self, line: &str) {
        self.status(&format!("warning: {line}"));
    }
    /// `step` starts on `on` (a host, or `source -> target`): its meter,
    /// which `finish` ends (dropped unfinished, it goes away without a word).
    fn step(&self, step: Step, on: &str) -> Box<dyn Meter>;
    /// The `[verify]` check ran on `host`; `log` is the local copy of its log.
    fn checked(&self, host: &str, report: &VerifyReport, log: &Path);
}

/// One step's meter: bytes and files of a hash or a transfer, or just
/// that the step is under way.
pub trait Meter: Send + Sync {
    /// Where the work stands.
    fn update(&self, p: &Progress);
    /// The step is done: the meter leaves its summary.
    fn finish(&self);
}

/// An [`Observer`] that shows nothing (for tests and library callers).
pub struct Silent;

impl Observer for Silent {
    fn status(&self, _: &str) {}
    fn detail(&self, _: &str) {}
    fn step(&self, _: Step, _: &str) -> Box<dyn Meter> {
        Box::new(Silent)
    }
    fn checked(&self, _: &str, _: &VerifyReport, _: &Path) {}
}

impl Meter for Silent {
    fn update(&self, _: &Progress) {}
    fn finish(&self) {}
}

/// `-vv` timings: how long into the operation each step was done.
pub struct Clock<'a> {
    started: Instant,
    obs: &'a dyn Observer,
}

impl<'a> Clock<'a> {
    pub(crate) fn start(obs: &'a dyn Observer) -> Self {
        Clock {
            started: Instant::now(),
            obs,
        }
    }

    /// Say that `what` is done, and when.
    pub(crate) fn mark(&self, what: &str) {
        self.obs.detail(&format!(
            "timing: {what} done at {:.2}s",
            self.started.elapsed().as_secs_f64()
        ));
    }

    /// Seconds since the start.
    pub(crate) fn seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// Which host a one-host operation (rollback, history, prune, verify)
/// works on: a host the manifest names, or else the target of the saved plan.
#[derive(Debug, Clone)]
pub struct HostChoice {
    pub manifest: PathBuf,
    /// The host's name; `None` for the plan's target.
    pub host: Option<String>,
    /// The saved plan.
    pub plan: PathBuf,
    /// `--venv PATH`: a venv on this machine, with no manifest or plan
    /// (a host that applied a bundle itself); named `host` or "local".
    pub venv: Option<String>,
}

/// A host to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRef {
    /// The manifest's name for it.
    pub name: String,
    pub endpoint: Endpoint,
    pub venv: String,
    /// The user the agent runs as through sudo (the manifest's `sudo`).
    pub sudo: Option<String>,
}

/// The host of `choice`: by manifest name, or else the target of the last plan.
pub fn resolve(choice: &HostChoice) -> Result<HostRef> {
    if let Some(venv) = &choice.venv {
        return Ok(HostRef {
            name: choice.host.clone().unwrap_or_else(|| "local".into()),
            endpoint: Endpoint::Local,
            venv: venv.clone(),
            sudo: None,
        });
    }
    let (manifest, plan) = (&choice.manifest, &choice.plan);
    if (manifest.exists() || !plan.exists())
        && let Some(name) = &choice.host
    {
        let m = Manifest::load(manifest)?;
        let h = m.host(name)?;
        return Ok(HostRef {
            name: h.name.clone(),
            endpoint: h.endpoint.clone(),
            venv: h.venv.clone(),
            sudo: h.sudo.clone(),
        });
    }
    let p = load_plan(plan).map_err(|e| {
        e.hint("name the host (e.g. `overlay history HOST`) with a manifest that defines it, or run from where `overlay plan` saved its plan")
    })?;
    if let Some(name) = &choice.host
        && *name != p.target.name
    {
        return Err(err!(
            hint = "pass --manifest with a manifest that defines that host",
            "Host {name} is not in {} and is not the target of the plan {}",
            manifest.display(),
            plan.display()
        ));
    }
    Ok(HostRef {
        name: p.target.name.clone(),
        endpoint: endpoint(&p.target),
        venv: p.target.venv.clone(),
        sudo: p.target.sudo.clone(),
    })
}

/// Start the agent on `host` and shake hands.
pub fn connect(host: &HostRef, opts: &ConnectOptions) -> Result<Client> {
    Client::connect(&host.name, &host.endpoint, host.sudo.as_deref(), opts)
}

/// Read a saved plan, refusing one of another format.
pub fn load_plan(path: &Path) -> Result<Plan> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        err!(
            hint = "run `overlay plan SRC DST` first, or name the plan file",
            "Failed to read the plan {}: {}",
            path.display(),
            crate::error::io_cause(&e)
        )
    })?;
    if let Some((fleet, files)) = crate::plan::load_fleet(path) {
        let first = files
            .first()
            .map_or_else(String::new, |f| f.display().to_string());
        return Err(err!(
            kind = Usage,
            hint = format!(
                "name one target's plan (e.g. `{}`), or the target host",
                crate::text::shell_quote(&first)
            ),
            "{} is a plan of {} targets ({}), not of one",
            path.display(),
            fleet.targets.len(),
            fleet
                .targets
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let plan: Plan = serde_json::from_str(&text).map_err(|e| {
        err!(
            hint = "run `overlay plan` again to make a fresh plan",
            "The plan {} is not a valid plan: {e}",
            path.display()
        )
    })?;
    if plan.format != crate::plan::PLAN_FORMAT {
        return Err(err!(
            hint = "run `overlay plan` again with this version of overlay",
            "The plan {} has format {}, this overlay reads {}",
            path.display(),
            plan.format,
            crate::plan::PLAN_FORMAT
        ));
    }
    Ok(plan)
}

/// A plan's host as an endpoint: over SSH (through its jump hosts, if
/// any), or this machine.
pub fn endpoint(host: &crate::plan::HostInfo) -> Endpoint {
    match &host.ssh {
        Some(target) => Endpoint::Ssh(SshDest {
            target: target.clone(),
            proxy_jump: host.proxy_jump.clone(),
        }),
        None => Endpoint::Local,
    }
}
