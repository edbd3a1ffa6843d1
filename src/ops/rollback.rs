//! Rollback: restore a target to its state before one or more
//! generations. Needs only that host; the source may be down.

use crate::error::Result;
use crate::model::RollbackReport;
use crate::transport::ConnectOptions;

use super::{HostChoice, connect, resolve};

/// What `overlay rollback` is asked.
#[derive(Debug, Clone)]
pub struct RollbackOptions {
    pub host: HostChoice,
    /// Roll back down to and including this generation (default: the newest).
    pub to: Option<String>,
    pub connect: ConnectOptions,
}

/// What a rollback did, and where.
#[derive(Debug, Clone)]
pub struct RolledBack {
    /// The host's manifest name.
    pub host: String,
    pub venv: String,
    /// The target's own report.
    pub report: RollbackReport,
}

/// Roll back on the chosen host.
pub fn rollback(opts: &RollbackOptions) -> Result<RolledBack> {
    let host = resolve(&opts.host)?;
    let mut c = connect(&host, &opts.connect)?;
    let report = c.rollback(&host.venv, opts.to.clone())?;
    c.close()?;
    Ok(RolledBack {
        host: host.name,
        venv: host.venv,
        report,
    })
}
