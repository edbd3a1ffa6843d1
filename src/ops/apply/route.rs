//! The route the files take: `--relay`, `--direct` or the plan's route
//! ([`choose_route`]), what keeps the direct route from being taken, the
//! local route's condition, and the fallback from direct to relay.

use crate::client::Client;
use crate::err;
use crate::error::{Error, ErrorKind, Result};
use crate::interrupt;
use crate::model::{Compression, RouteSetting};
use crate::ops::Observer;
use crate::plan::Plan;

use super::ApplyOptions;

/// The route chosen before anything is sent ([`choose_route`]).
#[derive(Debug, Clone, Default)]
pub struct ChosenRoute {
    /// The direct route: the target's ssh destination as the source knows
    /// it. `None`: the relay.
    pub direct: Option<String>,
    /// The direct route comes from the plan (the manifest's `route`), not
    /// from `--direct`: if the source cannot reach the target, the files go
    /// through this machine instead.
    pub may_fall_back: bool,
}

/// How the files go: `--relay` or `--direct` if given, else the plan's
/// route (the manifest's `route` for the target). A direct route from the
/// plan that cannot work (a target behind `sudo`, or this machine) is the
/// relay, with a note at `-v`; one that can may fall back to the relay.
pub fn choose_route(plan: &Plan, opts: &ApplyOptions, obs: &dyn Observer) -> Result<ChosenRoute> {
    if opts.relay && opts.direct {
        return Err(err!(
            kind = Usage,
            hint = "pass one of them",
            "--relay and --direct ask for two routes; {} is unchanged",
            plan.target.name
        ));
    }
    if opts.relay || (!opts.direct && plan.target.route == RouteSetting::Relay) {
        return Ok(ChosenRoute::default());
    }
    if opts.direct && from_bundle(plan) {
        return Err(err!(
            kind = Usage,
            hint = "apply without --direct: a bundle's files go through this machine",
            "--direct cannot send the files of a bundle (it is read on this machine); {} is unchanged",
            plan.target.name
        ));
    }
    if opts.direct && from_folders(plan) {
        return Err(err!(
            kind = Usage,
            hint = "apply without --direct: sets with `from` go through this machine",
            "--direct cannot send the sets whose files come from a folder (`from` in the manifest); {} is unchanged",
            plan.target.name
        ));
    }
    if opts.direct {
        return Ok(ChosenRoute {
            direct: direct_destination(plan, true)?,
            may_fall_back: false,
        });
    }
    if let Some(why) = direct_obstacle(plan) {
        obs.note(&format!(
            "{why}: the manifest's route = \"direct\" is not taken, the files go through this machine"
        ));
        return Ok(ChosenRoute::default());
    }
    Ok(ChosenRoute {
        direct: direct_destination(plan, true)?,
        may_fall_back: true,
    })
}

/// Why the direct route cannot be taken to the plan's target at all, if
/// it cannot: its agent runs through `sudo`, or it is this machine.
pub fn direct_obstacle(plan: &Plan) -> Option<String> {
    let tname = &plan.target.name;
    if let Some(user) = &plan.target.sudo {
        return Some(format!(
            "{tname} runs its agent through sudo (as {user}), which the source's ssh cannot do"
        ));
    }
    if plan.target.direct_ssh.is_none() && plan.target.ssh.is_none() {
        return Some(format!("{tname} is this machine"));
    }
    if from_folders(plan) {
        return Some("some sets come from a folder (`from`)".to_string());
    }
    if from_bundle(plan) {
        return Some("the files come from a bundle on this machine".to_string());
    }
    None
}

/// For `overlay plan`: the route `apply` takes without `--relay` or
/// `--direct`, when the manifest asks for the direct route (the relay,
/// the default, goes unsaid).
pub fn route_note(plan: &Plan) -> Option<String> {
    if plan.target.route != RouteSetting::Direct {
        return None;
    }
    let (src, dst) = (&plan.source.name, &plan.target.name);
    Some(match direct_obstacle(plan) {
        Some(why) => format!(
            "Route: through this machine ({why}, so the manifest's route = \"direct\" is not taken)"
        ),
        None => format!(
            "Route: {src} sends the files straight to {dst} with its own ssh (the manifest's route = \"direct\"), or through this machine if it cannot reach {dst}; `overlay apply --relay` always goes through this machine"
        ),
    })
}

/// With `--direct`: the target's ssh destination as the source knows it.
pub(super) fn direct_destination(plan: &Plan, direct: bool) -> Result<Option<String>> {
    if !direct {
        return Ok(None);
    }
    if let Some(user) = &plan.target.sudo {
        let tname = &plan.target.name;
        return Err(err!(
            hint = "apply without --direct (the stream then passes through this machine)",
            "--direct cannot start {tname}'s agent through sudo (as {user}): the source's ssh would run it as the login user; {tname} is unchanged"
        ));
    }
    match plan.target.direct_ssh.clone().or(plan.target.ssh.clone()) {
        Some(d) => Ok(Some(d)),
        None => {
            let tname = &plan.target.name;
            Err(err!(
                hint = "give the target an `ssh` or `direct_ssh` in the manifest, or apply without --direct",
                "--direct needs an ssh destination for {tname}, which is this machine in the plan; {tname} is unchanged"
            ))
        }
    }
}

/// With `--direct`: the jump hosts the source's `ssh` goes through (`-J`):
/// the target's `proxy_jump` when the source uses the target's `ssh` value;
/// none when the manifest gives a `direct_ssh` (the source's own
/// ~/.ssh/config then says how it gets there).
pub(super) fn direct_jump(plan: &Plan) -> Option<String> {
    match plan.target.direct_ssh {
        Some(_) => None,
        None => plan.target.proxy_jump.clone(),
    }
}

/// Why the direct route may give way to the relay: the source's ssh could
/// not reach the target, so nothing was sent, and the target is still there
/// with the generation open. Not after Ctrl-C.
pub(super) fn fallback_reason(e: &Error, dst: &Client) -> Option<String> {
    let why = e.unreached.as_ref()?;
    if dst.lost() || e.kind == ErrorKind::Interrupted || interrupt::requested() {
        return None;
    }
    Some(why.clone())
}

/// The warning of a direct route that fell back to the relay: who could not
/// reach whom, ssh's reason, and how to make either route stick.
pub(super) fn fallback_warning(plan: &Plan, dest: &str, why: &str) -> String {
    let (src, dst) = (&plan.source.name, &plan.target.name);
    format!(
        "{src} could not reach {dst} directly (its ssh to {dest:?}: {why}); sending through this machine instead. \
         To relay without trying, apply with --relay or drop route = \"direct\" from the manifest; \
         to go direct, fix {src}'s ~/.ssh until `ssh -o BatchMode=yes {dest} true` works there"
    )
}

/// The local route: both hosts on this machine's local transport (no `ssh`
/// for either), not `--direct`, and the target's agent reads the source
/// venv as the source's agent would (the same `sudo`, or the target's
/// agent runs as root). The target's agent then copies the files itself.
pub fn local_copy(plan: &Plan, direct: Option<&str>) -> bool {
    let local = plan.source.ssh.is_none() && plan.target.ssh.is_none();
    let reads_alike = plan.source.sudo == plan.target.sudo
        || plan.target.sudo.as_deref() == Some("root")
        || (plan.target.sudo.is_none() && rustix::process::geteuid().is_root());
    direct.is_none() && local && reads_alike && !from_folders(plan) && !from_bundle(plan)
}

/// The source is a bundle read in place (`bundle:/abs/file.ovl`): its
/// files are streamed from the bundle's tar by its agent, never copied
/// from a directory.
pub(super) fn from_bundle(plan: &Plan) -> bool {
    crate::model::bundle_of(&plan.source.venv).is_some()
}

/// Some sets come from a folder (the manifest's `from`): their files are
/// relayed through this machine, each source's stream in turn.
pub(super) fn from_folders(plan: &Plan) -> bool {
    plan.sets.iter().any(|s| s.from.is_some())
}

/// `--compress auto` between two venvs of this machine (both hosts on the
/// local transport) sends the files as they are: the stream then runs
/// through pipes, where compressing costs CPU and saves nothing. A fixed
/// `--compress LEVEL` is kept.
pub fn route_compression(asked: Compression, plan: &Plan) -> Compression {
    let local = plan.source.ssh.is_none() && plan.target.ssh.is_none();
    match asked {
        Compression::Auto if local => Compression::None,
        other => other,
    }
}
