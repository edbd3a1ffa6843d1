//! Sets with `from`: a plan per source, each folder read by an agent of
//! its own (`plan_by_source`), merged into one plan; the folder's host and
//! the check of the symlinks a folder would carry.

use std::collections::HashMap;

use crate::err;
use crate::error::{Error, Result};
use crate::manifest::{Host, Manifest, SetFrom};
use crate::model::{Endpoint, Kind, Set};
use crate::ops::Observer;
use crate::plan::{Plan, SetPlan};
use crate::transport::ConnectOptions;

use super::make::make_plan;
use super::{Closing, Planned};

/// Plan the sets source by source: those without `from` from the source
/// host's venv, each `from` folder's from an agent that reads the folder
/// as site-packages (on this machine, or on the host `host:/path` names),
/// each group against the target; then one plan of them all, each set
/// recording the source it comes from ([`SetPlan::from`]). Without any
/// `from` this is [`make_plan`] itself.
pub(super) fn plan_by_source(
    manifest: &Manifest,
    sets: &[Set],
    src_host: &Host,
    dst_host: &Host,
    opts: &ConnectOptions,
    obs: &dyn Observer,
) -> Result<Planned> {
    let groups = source_groups(manifest, sets);
    if let [SourceGroup { from: None, .. }] = groups.as_slice() {
        return make_plan(manifest, sets, src_host, dst_host, opts, obs);
    }
    let mut plans = Vec::new();
    let mut closings = Vec::new();
    for group in &groups {
        let planned = match group.from {
            None => make_plan(manifest, &group.sets, src_host, dst_host, opts, obs)?,
            Some(f) => {
                let folder = folder_host(manifest, f)?;
                let mut p = make_plan(manifest, &group.sets, &folder, dst_host, opts, obs)
                    .map_err(|e| folder_error(e, &folder, f))?;
                if let Err(e) = mark_from_folder(f, &mut p.plan) {
                    p.closing.wait();
                    return Err(e);
                }
                p
            }
        };
        closings.extend(planned.closing.0);
        plans.push(planned.plan);
    }
    let plan = merge_plans(plans, sets);
    let closing = Closing(closings);
    match plan {
        Ok(plan) => Ok(Planned { plan, closing }),
        Err(e) => {
            closing.wait();
            Err(e)
        }
    }
}

/// The sets that take their files from one place: the source host
/// (`from` is `None`) or one `from` folder.
pub struct SourceGroup<'m> {
    pub from: Option<&'m SetFrom>,
    pub sets: Vec<Set>,
}

/// `sets` grouped by where their files come from, the source host's group
/// first (its description is the plan's `source`), empty groups left out.
pub fn source_groups<'m>(manifest: &'m Manifest, sets: &[Set]) -> Vec<SourceGroup<'m>> {
    let mut groups = vec![SourceGroup {
        from: None,
        sets: Vec::new(),
    }];
    for set in sets {
        let from = manifest.from.get(&set.name);
        let key = from.map(|f| (&f.host, &f.path));
        match groups
            .iter_mut()
            .find(|g| g.from.map(|f| (&f.host, &f.path)) == key)
        {
            Some(g) => g.sets.push(set.clone()),
            None => groups.push(SourceGroup {
                from,
                sets: vec![set.clone()],
            }),
        }
    }
    groups.retain(|g| !g.sets.is_empty());
    groups
}

/// An error of the plan of a `from` folder: when its own agent failed,
/// named with the manifest line of the `from`.
pub fn folder_error(e: Error, folder: &Host, f: &SetFrom) -> Error {
    if e.message.starts_with(&folder_context(&folder.name)) {
        e.context(&f.at)
    } else {
        e
    }
}

/// A plan of a `from` folder's sets: its symlinks checked, and each set
/// recording the folder as its source.
pub fn mark_from_folder(f: &SetFrom, plan: &mut Plan) -> Result<()> {
    check_folder_links(f, &plan.sets)?;
    let info = plan.source.clone();
    for s in &mut plan.sets {
        s.from = Some(info.clone());
    }
    Ok(())
}

/// What an error of a `from` folder's agent starts with (the client names
/// the agent's host, here the `from` value).
pub(super) fn folder_context(name: &str) -> String {
    format!("on {name}: ")
}

/// The agent that serves a `from` folder, as a host: this machine, or the
/// manifest host `host:/path` names (its ssh, jump hosts and sudo).
pub fn folder_host(manifest: &Manifest, f: &SetFrom) -> Result<Host> {
    let (endpoint, sudo) = match &f.host {
        Some(h) => {
            let host = manifest.host(h)?;
            (host.endpoint.clone(), host.sudo.clone())
        }
        None => {
            // On this machine the folder is checked here, before any agent starts.
            let hint = match std::fs::metadata(&f.path) {
                Ok(m) if m.is_dir() => None,
                Ok(_) => Some((
                    "is not a directory".to_string(),
                    "point `from` at a folder laid out like site-packages (docs/manifest.md)",
                )),
                Err(e) => Some((
                    format!("cannot be read: {}", crate::error::io_cause(&e)),
                    "create the folder, or fix `from` (a relative path is relative to the manifest's directory)",
                )),
            };
            if let Some((why, hint)) = hint {
                return Err(err!(
                    kind = Usage,
                    hint = hint,
                    "{}: from {:?}: {} {why}",
                    f.at,
                    f.value,
                    f.path
                ));
            }
            (Endpoint::Local, None)
        }
    };
    Ok(Host {
        name: f.value.clone(),
        endpoint,
        venv: crate::model::folder_venv(&f.path),
        direct_ssh: None,
        sudo,
        route: crate::model::RouteSetting::Relay,
    })
}

/// A symlink a `from` folder would carry must stay inside the folder: one
/// whose target is absolute or climbs out of it would point the target's
/// venv at whatever lies there on the target.
pub(super) fn check_folder_links(f: &SetFrom, set_plans: &[SetPlan]) -> Result<()> {
    for s in set_plans {
        for c in &s.changes {
            if let Some(Kind::Symlink { target }) = &c.source {
                check_folder_link(f, &s.name, &c.path, target)?;
            }
        }
    }
    Ok(())
}

/// One symlink of a `from` folder, at `path` (relative to the folder) in
/// set(s) `sets`: refused when it points outside the folder.
pub fn check_folder_link(f: &SetFrom, sets: &str, path: &str, target: &str) -> Result<()> {
    let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
    let joined = if dir.is_empty() {
        target.to_string()
    } else {
        format!("{dir}/{target}")
    };
    if target.starts_with('/') || crate::model::venv_relative("", &joined).is_none() {
        return Err(err!(
            kind = Usage,
            hint = "replace the symlink in the folder by the file it points to, or point it inside the folder",
            "{}: set {sets}: {path} in the folder {} is a symlink to {target:?}, which leaves the folder",
            f.at,
            f.path
        ));
    }
    Ok(())
}

/// One plan of plans made source by source: the sets in the manifest's
/// order, warnings and problems together. A path two sources would both
/// write is refused.
pub fn merge_plans(plans: Vec<Plan>, order: &[Set]) -> Result<Plan> {
    let mut plans = plans.into_iter();
    let Some(mut merged) = plans.next() else {
        return Err(err!(kind = Internal, "no sets to plan"));
    };
    for p in plans {
        merged.sets.extend(p.sets);
        merged.warnings.extend(p.warnings);
        merged.problems.extend(p.problems);
    }
    merged.problems.sort();
    merged.problems.dedup();
    merged
        .sets
        .sort_by_key(|s| order.iter().position(|o| o.name == s.name));
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for s in &merged.sets {
        for c in &s.changes {
            if let Some(other) = seen.insert(c.path.as_str(), s.name.as_str())
                && other != s.name
            {
                return Err(err!(
                    kind = Usage,
                    hint = "name each path in one set only, or give both sets the same source",
                    "{} is in set {other} and in set {}, which come from different sources",
                    c.path,
                    s.name
                ));
            }
        }
    }
    Ok(merged)
}
