//! The saved form of a plan of many targets ([`FleetPlan`]): the list of
//! the targets' own plan files, each an ordinary [`super::Plan`]. Written
//! by `crate::fleet::plan_many::save_many`; read here, so that a command of
//! one target can refuse it by name.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The saved form of a plan of many targets: at `--out`, the list of the
/// targets' own plan files (each an ordinary plan, relative to this file's
/// folder).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FleetPlan {
    pub format: u32,
    /// The source's manifest name.
    pub source: String,
    pub targets: Vec<FleetTarget>,
}

/// One target of a [`FleetPlan`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FleetTarget {
    pub name: String,
    /// Its plan file, relative to the fleet plan's folder.
    pub plan: String,
}

/// Read the fleet plan at `path`, if it is one (`None`: it is not, e.g. an
/// ordinary plan). Its targets' plan files, resolved against its folder.
pub fn load_fleet(path: &Path) -> Option<(FleetPlan, Vec<PathBuf>)> {
    let text = std::fs::read_to_string(path).ok()?;
    let fleet: FleetPlan = serde_json::from_str(&text).ok()?;
    let base = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let files = fleet.targets.iter().map(|t| base.join(&t.plan)).collect();
    Some((fleet, files))
}
