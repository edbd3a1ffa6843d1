//! The checker: put a crash state in place at the venv's own path (so
//! that every path in the journal, the shebangs and the manifest are the
//! ones of the recorded run), run the recovery a restarted host runs (the
//! next overlay command: `history`, whose agent's start recovers, `apply
//! --resume` or `rollback`, see [`Recovery`]), and judge what it leaves.
//!
//! Files that were there before the run are hard links to the farm (a
//! `cp -al` of the tree before it), so they keep their inode numbers and
//! mtimes, as they would after a real power cut: rollback's check of the
//! old files compares exactly those. Files overlay made during the run
//! are written fresh (their stamps in the journal do not match, and
//! overlay falls back to reading them, as it must). Overlay never writes
//! into an existing inode of the venv; its own state files (`.overlay/`'s
//! and each generation's own) are copied, not linked, since it appends to
//! a generation's journal.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::states::{Entry, Tree};

pub type Snap = BTreeMap<String, String>;

/// Replace whatever stands in the folder `venv` with `tree`.
pub fn materialise(venv: &Path, root_mode: u32, tree: &Tree) {
    // The root stays (a FUSE mount may serve it): only what is in it goes.
    for e in std::fs::read_dir(venv).unwrap().flatten() {
        match e.file_type().unwrap().is_dir() {
            true => std::fs::remove_dir_all(e.path()).unwrap(),
            false => std::fs::remove_file(e.path()).unwrap(),
        }
    }
    for (rel, e) in &tree.entries {
        let p = venv.join(rel);
        let mode = match e {
            Entry::Dir(mode) => {
                std::fs::create_dir(&p).unwrap();
                Some(*mode)
            }
            Entry::Farm(f, _) if !state_file(rel) => {
                std::fs::hard_link(f, &p).unwrap_or_else(|e| panic!("link {}: {e}", f.display()));
                None
            }
            Entry::Farm(f, mode) => {
                std::fs::copy(f, &p).unwrap();
                Some(*mode)
            }
            Entry::File(d, mode) => {
                std::fs::write(&p, d.as_slice()).unwrap();
                Some(*mode)
            }
            Entry::Hard(first) => {
                std::fs::hard_link(venv.join(first), &p).unwrap();
                None
            }
            Entry::Link(t) => {
                let t = std::ffi::OsStr::from_encoded_bytes_unchecked_safe(t);
                std::os::unix::fs::symlink(t, &p).unwrap();
                None
            }
        };
        if let Some(m) = mode {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
        }
    }
    std::fs::set_permissions(venv, std::fs::Permissions::from_mode(root_mode)).unwrap();
}

/// overlay's own state files (the lock, a generation's meta.json,
/// before.json, after.json and journal), which it may append to: copied.
/// Everything else, the backups and staged files included, is linked.
fn state_file(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    parts[0] == ".overlay" && (parts.len() <= 2 || (parts[1] == "generations" && parts.len() == 4))
}

trait FromBytes {
    fn from_encoded_bytes_unchecked_safe(b: &[u8]) -> &std::ffi::OsStr;
}

impl FromBytes for std::ffi::OsStr {
    fn from_encoded_bytes_unchecked_safe(b: &[u8]) -> &std::ffi::OsStr {
        std::os::unix::ffi::OsStrExt::from_bytes(b)
    }
}

/// What recovery must leave after a crash state of one recorded run.
pub struct Expect {
    /// The generation the run worked on.
    pub generation: String,
    /// The venvs allowed after recovery, each with the statuses `history`
    /// may then give the generation (`absent`: not listed).
    pub allowed: Vec<(String, Snap, Vec<&'static str>)>,
    /// Where `rollback` must take the venv when the generation is complete.
    pub rolls_back_to: Snap,
}

/// The first command a restarted host runs on a crash state: each is a
/// recovery an operator may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Recovery {
    /// Any command (`overlay history`): the agent's start finishes an
    /// interrupted generation, rolling back an unfinished switch.
    AgentStart,
    /// `overlay apply --resume`: completes an interrupted switch instead;
    /// it refuses a generation that never staged all its files (the agent
    /// start that follows then rolls that back).
    Resume,
    /// `overlay rollback`: finishes an interrupted generation or rollback
    /// the same way and stops there, or rolls back the newest complete
    /// generation.
    Rollback,
}

impl Recovery {
    pub fn name(self) -> &'static str {
        match self {
            Recovery::AgentStart => "agent start",
            Recovery::Resume => "apply --resume",
            Recovery::Rollback => "rollback",
        }
    }
}

/// How one crash state recovered (for the counts), or a violation: the
/// recovery `how`, then the judgement below (which recovers again with
/// `history`, as any later command would, and rolls back what is left
/// complete).
pub fn check(
    overlay: &dyn Fn(&[&str]) -> Command,
    venv: &Path,
    expect: &Expect,
    how: Recovery,
) -> Result<&'static str, String> {
    let first = match how {
        Recovery::AgentStart => return judge(overlay, venv, expect),
        Recovery::Resume => ["apply", "--resume"].as_slice(),
        Recovery::Rollback => ["rollback", "dst"].as_slice(),
    };
    let (code, _, err) = run(overlay(first));
    let shown = format!("`overlay {}`", first.join(" "));
    if code.is_none() || code == Some(101) {
        return Err(format!("{shown} crashed ({code:?}): {err}"));
    }
    // `rollback` must finish what it finds; it may only say that there
    // is nothing to roll back (a state from before the generation was
    // made, or one the recovery drops). `apply --resume` may refuse (a
    // generation still streaming) or fail its check after the switch:
    // what it leaves is judged.
    if how == Recovery::Rollback && code != Some(0) && !err.contains("Nothing to roll back") {
        return Err(format!("{shown} failed ({code:?}): {}", err.trim()));
    }
    judge(overlay, venv, expect)
        .map_err(|e| format!("{e}\n  after {shown} ({code:?}): {}", err.trim()))
}

/// Recover with `history` and judge what is left.
fn judge(
    overlay: &dyn Fn(&[&str]) -> Command,
    venv: &Path,
    expect: &Expect,
) -> Result<&'static str, String> {
    let (code, out, err) = run(overlay(&["history", "dst", "--json"]));
    if code != Some(0) {
        return Err(format!(
            "recovery (`overlay history`) failed ({code:?}): {err}"
        ));
    }
    let listed: serde_json::Value =
        serde_json::from_slice(&out).map_err(|e| format!("history --json: {e}"))?;
    let mut status = "absent";
    for g in listed.as_array().into_iter().flatten() {
        let s = g["status"].as_str().unwrap_or("?");
        if s != "complete" && s != "rolled-back" {
            return Err(format!(
                "after recovery, generation {} is {s}: {}; history said: {}",
                g["id"],
                g["damaged"],
                err.trim()
            ));
        }
        if g["id"] == expect.generation.as_str() {
            status = if s == "complete" {
                "complete"
            } else {
                "rolled-back"
            };
        }
    }
    let now = snapshot(venv);
    let Some((name, _, statuses)) = expect.allowed.iter().find(|(_, s, _)| *s == now) else {
        let (n, s, _) = &expect.allowed[0];
        return Err(format!(
            "after recovery the venv is none of the allowed states; against {n}:\n{}",
            differences(s, &now)
        ));
    };
    if !statuses.contains(&status) {
        return Err(format!(
            "the venv is {name} but history says the generation is {status}"
        ));
    }
    if status != "complete" {
        return Ok(if name == "old" { "old" } else { "new" });
    }
    let (code, _, err) = run(overlay(&["rollback", "dst"]));
    if code != Some(0) {
        return Err(format!(
            "the venv is {name}, generation complete, but `rollback` failed ({code:?}): {err}"
        ));
    }
    let after = snapshot(venv);
    if after != expect.rolls_back_to {
        return Err(format!(
            "rollback after recovery did not restore the venv exactly:\n{}",
            differences(&expect.rolls_back_to, &after)
        ));
    }
    Ok(if name == "old" {
        "old, rolled back"
    } else {
        "new, rolled back"
    })
}

fn run(mut c: Command) -> (Option<i32>, Vec<u8>, String) {
    let out = c.output().unwrap();
    (
        out.status.code(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The venv less overlay's state, as `common::snapshot` describes it.
pub fn snapshot(venv: &Path) -> Snap {
    crate::common::snapshot(venv)
}

/// The first differences between two snapshots.
pub fn differences(want: &Snap, got: &Snap) -> String {
    let mut d = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => d.push(format!("  missing {k} ({v})")),
            Some(w) if w != v => d.push(format!("  {k}: {w}, not {v}")),
            _ => {}
        }
    }
    for k in got.keys().filter(|k| !want.contains_key(*k)) {
        d.push(format!("  extra {k}"));
    }
    let n = d.len();
    d.truncate(8);
    if n > 8 {
        d.push(format!("  ... {} differences in all", n));
    }
    d.join("\n")
}

/// A hard-linked copy of `venv` at `farm` (`cp -al`): the inodes of the
/// tree as it stands, kept while states are materialised from it.
pub fn farm(venv: &Path, farm: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(farm);
    let out = Command::new("cp")
        .arg("-al")
        .arg(venv)
        .arg(farm)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cp -al: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    farm.to_path_buf()
}

/// The tree that stands in `farm`, to materialise as it is.
pub fn farm_tree(farm: &Path) -> Tree {
    let mut entries = Vec::new();
    for e in walkdir::WalkDir::new(farm).min_depth(1).sort_by_file_name() {
        let e = e.unwrap();
        let rel = e
            .path()
            .strip_prefix(farm)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let m = e.path().symlink_metadata().unwrap();
        let mode = m.permissions().mode() & 0o7777;
        let entry = if m.is_dir() {
            Entry::Dir(mode)
        } else if m.file_type().is_symlink() {
            let t = std::fs::read_link(e.path()).unwrap();
            Entry::Link(t.into_os_string().into_encoded_bytes())
        } else {
            Entry::Farm(e.path().to_path_buf(), mode)
        };
        entries.push((rel, entry));
    }
    Tree { entries, hash: 0 }
}
