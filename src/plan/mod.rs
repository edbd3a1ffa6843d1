//! The plan as data, and the set semantics that decide it. Nothing here
//! touches a host: [`compute`] takes what the agents reported (scans and
//! per-path entries) and returns each set's changes, from which the
//! controller makes the [`Plan`] that `overlay apply` carries out.
//!
//! A set mirrors the source onto the target, file by file. A path the source
//! set has is added or replaced; a path only the target set has is deleted
//! unless a target distribution outside the set owns it (then it is kept and
//! a warning names the owner). `__pycache__` is never part of a set; the
//! bytecode of every `.py` file that changes is deleted with it.
//!
//! Only files and symlinks are carried. Left out, each with a warning
//! (docs/plan.md, "What is left out"): paths into overlay's state folder
//! `.overlay/`, paths not spelled plainly, directories named by a RECORD row
//! (on either side: a directory goes only when the deletes leave it empty),
//! paths behind a symlinked parent directory, devices and fifos. Modes are
//! carried without setuid, setgid and sticky bits. The target's agent checks
//! the result again (`validate::check_prepare`).
//!
//! This file holds the saved plan format ([`Plan`] and its parts), the
//! [`totals`] of a set and the interpreter check. The rest, by job:
//! `members` (which paths a set names on a host, and the sorted order a stat
//! answers in), `compute` (deciding each set), `paths` (the per-path rules
//! and their warnings), `versions` (the version column).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::err;
use crate::error::Result;
use crate::model::{Action, Kind, Problem};

mod compute;
mod fleet;
mod members;
mod paths;
mod side;
mod versions;

pub use compute::{BytecodeToStat, Computed, bytecode_to_stat, compute, compute_with, needs_hash};
pub use fleet::{FleetPlan, FleetTarget, load_fleet};
pub use members::{Members, members, members_of, order_check, sorted_difference, stat_order};
pub use side::{Entries, Side};

/// Version of the saved plan format.
pub const PLAN_FORMAT: u32 = 2;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    pub format: u32,
    /// Seconds since the epoch when the plan was made.
    pub created: u64,
    /// The manifest the plan was made from: its absolute path (as given,
    /// in plans made before overlay recorded its hash).
    pub manifest: String,
    /// The sha256 of the manifest's bytes when the plan was made: `apply`
    /// refuses an explicit `--manifest` whose bytes differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_sha256: Option<String>,
    pub source: HostInfo,
    pub target: HostInfo,
    pub sets: Vec<SetPlan>,
    pub warnings: Vec<Warning>,
    /// Predicted breakage after the overlay (see `preflight`).
    #[serde(default)]
    pub problems: Vec<Problem>,
    /// `--strict` or `[preflight] strict`: problems are errors, and apply refuses the plan without `--force`.
    #[serde(default)]
    pub strict: bool,
    /// The source is a bundle (`overlay plan --bundle FILE TARGET...`),
    /// unpacked on this machine: `source` is its unpacked folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<PlanBundle>,
    /// Where the files come from when not the live `source` (and its
    /// sets' `from` folders): a bundle, with its hash and signer. The
    /// generation records it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<crate::model::Provenance>,
    /// The processes that ran from the target's venv when the plan was
    /// made (`None` in plans made before overlay listed them). `apply`
    /// asks the target again when it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<crate::model::Running>,
}

/// The bundle a plan's source was unpacked from, and where (see
/// `crate::fleet::bundle_plan`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PlanBundle {
    /// The bundle file as given to `overlay plan --bundle`.
    pub file: String,
    /// Its whole-file BLAKE3 (its trailer's).
    pub blake3: String,
    /// The folder an older overlay unpacked it to; such a plan is refused
    /// (a bundle is read in place now: plan again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// The venv the bundle was packed from, which its scripts' shebangs and
    /// its RECORDs' script rows name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_venv: Option<String>,
    /// The bundle's own manifest (its sets, `[verify]` and `[preflight]`),
    /// as TOML: `apply --verify` of the plan runs its check.
    #[serde(default)]
    pub manifest: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HostInfo {
    pub name: String,
    /// The manifest's `ssh` value; absent for the local machine.
    pub ssh: Option<String>,
    /// The manifest's `direct_ssh` value (see `apply --direct`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_ssh: Option<String>,
    /// The manifest's `sudo` user (`"root"` for `sudo = true`): the agent
    /// runs as that user through `sudo -n` (docs/sudo.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sudo: Option<String>,
    /// The manifest's `proxy_jump` value (jump hosts to reach `ssh`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_jump: Option<String>,
    /// The manifest's route into this host (its `route`, else `[apply]
    /// route`): on the target, how `apply` streams without `--relay` or
    /// `--direct`. Plans that do not say it take the relay.
    #[serde(default, skip_serializing_if = "crate::model::RouteSetting::is_relay")]
    pub route: crate::model::RouteSetting,
    pub venv: String,
    /// Relative to the venv.
    pub site_packages: String,
    pub python: String,
    /// The host's NVIDIA driver and GPUs as its scan read them (absent
    /// from plans that predate it, and for a bundle's source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<crate::model::Machine>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SetPlan {
    pub name: String,
    pub versions: Vec<Transition>,
    pub changes: Vec<Change>,
    pub unchanged: u64,
    pub unchanged_bytes: u64,
    /// Compiled bytecode on the target deleted because its `.py` changes.
    pub stale_bytecode: Vec<String>,
    /// Where this set's files come from when not the plan's `source`: a
    /// folder laid out like site-packages (the manifest's `from`), served
    /// by an agent on this machine or on a manifest host. `venv` is then
    /// [`crate::model::folder_venv`] of the folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<HostInfo>,
}

impl SetPlan {
    /// Keep the bytecode carried with a `.py` only where `keep(py)` (the
    /// `.py`'s path): the rest stays behind, and a target file it would
    /// have replaced is deleted as stale instead.
    pub fn keep_carried_bytecode(&mut self, keep: impl Fn(&str) -> bool) {
        let mut stale = Vec::new();
        self.changes.retain(|c| {
            let carried = c.action != Action::Delete && crate::model::in_pycache(&c.path);
            if !carried || source_of_bytecode(&c.path).is_some_and(|py| keep(&py)) {
                return true;
            }
            if c.action == Action::Replace {
                stale.push(c.path.clone());
            }
            false
        });
        self.stale_bytecode.extend(stale);
        self.stale_bytecode.sort();
        self.stale_bytecode.dedup();
    }
}

/// The `.py` a `__pycache__/STEM.TAG[.opt-N].pyc` was compiled from.
pub fn source_of_bytecode(pyc: &str) -> Option<String> {
    let (dir, name) = pyc
        .rsplit_once("/__pycache__/")
        .map_or_else(|| pyc.strip_prefix("__pycache__/").map(|n| ("", n)), Some)?;
    let stem = name.strip_suffix(".pyc")?.split('.').next()?;
    Some(if dir.is_empty() {
        format!("{stem}.py")
    } else {
        format!("{dir}/{stem}.py")
    })
}

/// A distribution's version before and after (in `model`: generations record them too).
pub use crate::model::Transition;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Change {
    /// Relative to the target's site-packages, as RECORD writes it.
    pub path: String,
    pub action: Action,
    /// Bytes: the source file's for add and replace, the target's for delete.
    pub size: u64,
    /// What the source has (add, replace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Kind>,
    /// What the target has now (replace, delete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Kind>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Warning {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    pub message: String,
}

/// How many files of a set one action touches, and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub files: u64,
    pub bytes: u64,
}

/// Totals of a set's changes for add, replace and delete (each present).
pub fn totals(set: &SetPlan) -> BTreeMap<Action, Totals> {
    let mut t = BTreeMap::new();
    for a in [Action::Add, Action::Replace, Action::Delete] {
        t.insert(a, Totals::default());
    }
    for c in &set.changes {
        let e: &mut Totals = t.get_mut(&c.action).expect("all actions present");
        e.files += 1;
        e.bytes += c.size;
    }
    t
}

/// Check the interpreters agree; compiled extensions are built per minor version.
pub fn check_python(src: &HostInfo, dst: &HostInfo) -> Result<()> {
    if src.python != dst.python {
        return Err(err!(
            "Python {} on {} but {} on {}: compiled extensions (cpython-{}) built for one will not load in the other",
            src.python,
            src.name,
            dst.python,
            dst.name,
            src.python.replace('.', "")
        )
        .hint(format!(
            "overlay between venvs of the same Python minor version, or rebuild the venv on {} with Python {}",
            dst.name, src.python
        )));
    }
    Ok(())
}

impl Plan {
    /// `apply --no-compile` (as `pip install --no-compile`): the bytecode
    /// the plan carries with its `.py` files stays behind; a target file it
    /// would have replaced is deleted as stale instead, as before overlay
    /// carried bytecode.
    pub fn without_carried_bytecode(&mut self) {
        for set in &mut self.sets {
            set.keep_carried_bytecode(|_| false);
        }
    }

    /// Predicted problems the overlay would cause (not those the target has
    /// already, nor those of optional plugins).
    pub fn new_problems(&self) -> usize {
        self.problems.iter().filter(|p| p.is_new()).count()
    }

    pub fn has_changes(&self) -> bool {
        self.sets
            .iter()
            .any(|s| !s.changes.is_empty() || !s.stale_bytecode.is_empty())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bytecode_names_its_source() {
        assert_eq!(
            super::source_of_bytecode("a/b/__pycache__/m.cpython-311.opt-1.pyc").as_deref(),
            Some("a/b/m.py")
        );
        assert_eq!(
            super::source_of_bytecode("__pycache__/m.cpython-311.pyc").as_deref(),
            Some("m.py")
        );
        assert_eq!(super::source_of_bytecode("a/m.pyc"), None);
    }

    use super::*;

    /// Plans saved before the manifest's hash was recorded still load.
    #[test]
    fn a_plan_without_the_manifest_hash_loads() {
        let host = r#"{"name":"a","ssh":null,"venv":"/v","site_packages":"lib","python":"3.11"}"#;
        let text = format!(
            r#"{{"format":2,"created":1,"manifest":"overlay.toml","source":{host},"target":{host},"sets":[],"warnings":[]}}"#
        );
        let plan: Plan = serde_json::from_str(&text).unwrap();
        assert_eq!(plan.manifest_sha256, None);
        let again = serde_json::to_string(&plan).unwrap();
        assert!(!again.contains("manifest_sha256"), "{again}");
    }

    #[test]
    fn python_minor_must_match() {
        let h = |n: &str, py: &str| HostInfo {
            name: n.into(),
            ssh: None,
            direct_ssh: None,
            sudo: None,
            proxy_jump: None,
            route: Default::default(),
            venv: "/v".into(),
            site_packages: String::new(),
            python: py.into(),
            machine: None,
        };
        assert!(check_python(&h("a", "3.11"), &h("b", "3.11")).is_ok());
        let e = check_python(&h("a", "3.11"), &h("b", "3.12")).unwrap_err();
        assert!(e.message.contains("will not load"), "{}", e.message);
    }
}
