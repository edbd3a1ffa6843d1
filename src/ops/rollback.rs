//! Rollback: restore a target to its state before one or more
//! generations. Needs only that host; the source may be down.
//!
//! The target refuses (and changes nothing) when the generations' files or
//! distributions changed since the apply, unless `force`; then
//! [`later_lines`] lists what changed and [`refusal`] is the error to end with.

use crate::err;
use crate::error::{Error, Result};
use crate::model::{LaterChanges, RollbackReport, requirement_of};
use crate::transport::ConnectOptions;

use super::{HostChoice, connect, resolve};

/// What `overlay rollback` is asked.
#[derive(Debug, Clone)]
pub struct RollbackOptions {
    pub host: HostChoice,
    /// Roll back down to and including this generation (default: the newest).
    pub to: Option<String>,
    /// Also over changes made since the apply.
    pub force: bool,
    /// Also while processes run from the venv (the target refuses
    /// otherwise, before anything is written).
    pub allow_running: bool,
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
    let report = c.rollback(&host.venv, opts.to.clone(), opts.force, opts.allow_running)?;
    c.close()?;
    Ok(RolledBack {
        host: host.name,
        venv: host.venv,
        report,
    })
}

/// How many entries of each group are shown without `-v`.
const SHOWN: usize = 5;

/// What changed since the apply, one group per line: changed files,
/// dist-infos added, dist-infos removed; the first few of each and a
/// count, or all of them with `all`.
pub fn later_lines(later: &LaterChanges, all: bool) -> Vec<String> {
    let files: Vec<String> = later
        .changed_files
        .iter()
        .map(|f| format!("{} ({})", f.path, f.change.as_str()))
        .collect();
    [
        ("changed files", &files),
        ("dist-infos added", &later.dist_infos_added),
        ("dist-infos removed", &later.dist_infos_removed),
    ]
    .into_iter()
    .filter(|(_, l)| !l.is_empty())
    .map(|(what, l)| {
        let n = if all { l.len() } else { l.len().min(SHOWN) };
        let more = if n < l.len() {
            format!(", and {} more (-v lists all)", l.len() - n)
        } else {
            String::new()
        };
        format!("  {what} ({}): {}{more}", l.len(), l[..n].join(", "))
    })
    .collect()
}

/// The error a refused rollback ends with: what changed, in counts, and
/// the two ways on (`--force`, or pip back first).
pub fn refusal(done: &RolledBack, to: Option<&str>) -> Error {
    let later = done.report.later.clone().unwrap_or_default();
    let (files, dists) = (
        later.changed_files.len(),
        later.dist_infos_added.len() + later.dist_infos_removed.len(),
    );
    let mut what = Vec::new();
    if files > 0 {
        what.push(format!(
            "{files} of its file{}",
            if files == 1 { "" } else { "s" }
        ));
    }
    if dists > 0 {
        what.push(format!(
            "{dists} dist-info director{} of its distributions",
            if dists == 1 { "y" } else { "ies" }
        ));
    }
    let gens = &done.report.generations;
    let command = match to {
        Some(id) => format!("overlay rollback {} --to {id} --force", done.host),
        None => format!("overlay rollback {} --force", done.host),
    };
    let pip: Vec<String> = later
        .dist_infos_removed
        .iter()
        .filter_map(|d| requirement_of(d))
        .collect();
    let pip = if pip.is_empty() {
        String::new()
    } else {
        format!(" (`pip install {}`)", pip.join(" "))
    };
    err!(
        kind = Conflict,
        "Rollback on {} ({}) refused: since generation{} {} {} applied, {} changed (pip ran?); nothing was changed",
        done.host,
        done.venv,
        if gens.len() == 1 { "" } else { "s" },
        gens.join(", "),
        if gens.len() == 1 { "was" } else { "were" },
        what.join(" and ")
    )
    .hint(format!(
        "`{command}` restores the files from before the apply anyway: what was written over them since is kept in the generation's undone/ folder, and a dist-info added since for these distributions is moved out with its own files to displaced/ (one version per distribution); or first put back what changed{pip}"
    ))
}
