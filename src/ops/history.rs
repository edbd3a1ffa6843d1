//! History and prune: list a target's generations, and remove old ones
//! with their backups. Need only that host.

use crate::error::Result;
use crate::model::GenerationInfo;
use crate::transport::ConnectOptions;

use super::{HostChoice, connect, resolve};

/// What `overlay history` is asked.
#[derive(Debug, Clone)]
pub struct HistoryOptions {
    pub host: HostChoice,
    pub connect: ConnectOptions,
}

/// A host's generations.
#[derive(Debug, Clone)]
pub struct HistoryReport {
    /// The host's manifest name.
    pub host: String,
    pub venv: String,
    /// Oldest first.
    pub generations: Vec<GenerationInfo>,
    /// What was done first to an interrupted generation, if there was one.
    pub recovered: Option<String>,
}

/// List the generations on the chosen host.
pub fn history(opts: &HistoryOptions) -> Result<HistoryReport> {
    let host = resolve(&opts.host)?;
    let mut c = connect(&host, &opts.connect)?;
    let answer = c.history(&host.venv)?;
    c.close()?;
    Ok(HistoryReport {
        host: host.name,
        venv: host.venv,
        generations: answer.generations,
        recovered: answer.recovered,
    })
}

/// What `overlay prune` is asked.
#[derive(Debug, Clone)]
pub struct PruneOptions {
    pub host: HostChoice,
    /// How many of the newest generations to keep.
    pub keep: usize,
    pub connect: ConnectOptions,
}

/// What a prune removed.
#[derive(Debug, Clone)]
pub struct PruneReport {
    /// The host's manifest name.
    pub host: String,
    /// The generations removed.
    pub removed: Vec<String>,
    /// What was done first to an interrupted generation, if there was one.
    pub recovered: Option<String>,
}

/// Remove old generations on the chosen host.
pub fn prune(opts: &PruneOptions) -> Result<PruneReport> {
    let host = resolve(&opts.host)?;
    let mut c = connect(&host, &opts.connect)?;
    let answer = c.prune(&host.venv, opts.keep)?;
    c.close()?;
    Ok(PruneReport {
        host: host.name,
        removed: answer.removed,
        recovered: answer.recovered,
    })
}
