//! Plan: scan and hash both live hosts, decide what changes on the target,
//! and predict what would fail after the overlay. Never writes to either
//! venv; [`save`] writes the plan for `apply`.
//!
//! Sets with `from` (a folder laid out like site-packages) are planned
//! source by source (`plan_by_source`): each folder is read by an
//! ordinary agent, here or on the host `host:/path` names, through the
//! "venv" [`crate::model::folder_venv`]; the plan records each such set's
//! source in [`SetPlan::from`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::client::Client;
use crate::err;
use crate::error::{Error, Result};
use crate::manifest::{Host, Manifest, SetFrom};
use crate::model::{
    Action, Check, Dist, ElfInfo, Endpoint, Entry, HashMode, Kind, PreflightRequest, Problem,
    Progress, ScanReport, Set, ShebangRewrite, folder_of,
};
use crate::plan::{self, HostInfo, PLAN_FORMAT, Plan, SetPlan, Side};
use crate::preflight::{cuda, requirements};
use crate::transport::ConnectOptions;

use super::{Clock, Meter, Observer, Step};

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
    }
}

/// One side of the plan's stat rounds.
pub struct StatSide<'a> {
    pub host: &'a str,
    pub venv: &'a str,
    pub shebang: Option<ShebangRewrite>,
    pub pycache: bool,
}

impl StatSide<'_> {
    /// Stat the members of `sets` on this side's host, plus `extra` paths,
    /// with the hashes its cache still vouches for; the answer is for
    /// `order` ([`plan::stat_order`] of the same).
    pub fn stat_members(
        &self,
        client: &mut Client,
        sets: &[Set],
        globs: &[String],
        extra: &[&str],
        order: &[&str],
    ) -> Result<Vec<Entry>> {
        if order.is_empty() {
            return Ok(Vec::new());
        }
        client.stat_members(
            self.venv,
            sets,
            globs,
            extra.iter().map(|p| p.to_string()).collect(),
            order.iter().map(|p| p.to_string()).collect(),
            plan::order_check(order),
            HashMode::Cached,
            self.shebang.clone(),
            self.pycache,
            &mut |_| {},
        )
    }

    /// Stat `paths` on this side's host (hashing them with `HashMode::All`,
    /// with progress on `meter`). An empty list costs no round trip.
    pub fn stat(
        &self,
        client: &mut Client,
        paths: Vec<String>,
        mode: HashMode,
        meter: &dyn Meter,
    ) -> Result<Vec<Entry>> {
        if paths.is_empty() {
            return Ok(Vec::new());
        }
        let mut progress = |p: Progress| {
            if mode == HashMode::All {
                meter.update(&p);
            }
        };
        client.stat(
            self.venv,
            paths,
            mode,
            self.shebang.clone(),
            self.pycache,
            &mut progress,
        )
    }
}

/// The sets' members on one host and the order of their stat.
pub fn members_and_order<'a>(
    sets: &[Set],
    scan: &'a ScanReport,
    globs: &[String],
) -> (Vec<plan::Members<'a>>, Vec<&'a str>) {
    let members = plan::members_of(sets, scan, globs);
    let order = plan::stat_order(&members, &[]);
    (members, order)
}

/// Stat entries by path. (The path moves into the key; the entry's own
/// `path` is left empty.)
pub fn index(v: Vec<Entry>) -> plan::Entries {
    let mut map = plan::Entries::with_capacity_and_hasher(v.len(), Default::default());
    for mut e in v {
        map.insert(std::mem::take(&mut e.path), e);
    }
    map
}

/// Run `f` for the source and the target at the same time.
pub fn both<A: Send, B: Send>(
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    std::thread::scope(|s| {
        let ha = s.spawn(a);
        let rb = b();
        (ha.join().expect("worker thread panicked"), rb)
    })
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

/// A host connected and scanned.
pub struct Scanned {
    pub client: Client,
    pub scan: ScanReport,
    /// The scan step's meter, finished once the members are stated too.
    pub scanning: Box<dyn Meter>,
}

/// Connect to `host` and scan its venv for the sets' `globs`.
pub fn connect_scan(
    host: &Host,
    globs: &[String],
    opts: &ConnectOptions,
    obs: &dyn Observer,
) -> Result<Scanned> {
    let connecting = obs.step(Step::Connect, &host.name);
    let mut client = Client::connect(&host.name, &host.endpoint, host.sudo.as_deref(), opts)?;
    connecting.finish();
    let scanning = obs.step(Step::Scan, &host.name);
    let scan = client.scan(&host.venv, globs)?;
    Ok(Scanned {
        client,
        scan,
        scanning,
    })
}

/// Connect to both hosts and scan them, at the same time.
fn connect_and_scan(
    src_host: &Host,
    dst_host: &Host,
    globs: &[String],
    opts: &ConnectOptions,
    obs: &dyn Observer,
) -> Result<(Scanned, Scanned)> {
    let (s, d) = both(
        || connect_scan(src_host, globs, opts, obs),
        || connect_scan(dst_host, globs, opts, obs),
    );
    Ok((s?, d?))
}

/// Both sides' members and their stat entries.
struct Stated<'s> {
    src_members: Vec<plan::Members<'s>>,
    dst_members: Vec<plan::Members<'s>>,
    src_entries: plan::Entries,
    dst_entries: plan::Entries,
}

/// Phase 1: stat both sides; no content is read, but hashes the hosts'
/// caches still vouch for come along.
fn stat_phase<'s>(
    sets: &[Set],
    globs: &[String],
    (src_side, src, src_scan): (&StatSide, &mut Client, &'s ScanReport),
    (dst_side, dst, dst_scan): (&StatSide, &mut Client, &'s ScanReport),
) -> Result<Stated<'s>> {
    // Which paths each side must describe: the source its members, the
    // target its own and the source's. Each agent works its members out
    // from the scan it sent, as this side does, so only the paths the
    // target lacks travel (a torch stack's 35,000 paths do not).
    let ((src_members, src_order), (dst_members, dst_own)) = both(
        || members_and_order(sets, src_scan, globs),
        || members_and_order(sets, dst_scan, globs),
    );
    let extra = plan::sorted_difference(&src_order, &dst_own);
    // The order the target's agent states them in.
    let dst_order = plan::stat_order(&dst_members, &extra);
    let (s, d) = both(
        || {
            src_side
                .stat_members(src, sets, globs, &[], &src_order)
                .map(index)
        },
        || {
            dst_side
                .stat_members(dst, sets, globs, &extra, &dst_order)
                .map(index)
        },
    );
    Ok(Stated {
        src_entries: s?,
        dst_entries: d?,
        src_members,
        dst_members,
    })
}

/// Phase 2: hash only what decides something, as rsync --checksum does:
/// files on both sides with the same size (a size difference already
/// means "replace"), and scripts whose shebang is rewritten; and of
/// those only the sides the cache did not answer.
fn hash_phase(
    (src_side, src): (&StatSide, &mut Client),
    (dst_side, dst): (&StatSide, &mut Client),
    stated: &mut Stated,
    clock: &Clock,
    obs: &dyn Observer,
) -> Result<()> {
    let unhashed =
        |e: Option<&Entry>| matches!(e.map(|e| &e.kind), Some(Kind::File { blake3: None, .. }));
    let (mut to_hash, mut src_hash, mut dst_hash) = (0usize, Vec::new(), Vec::new());
    for (p, s, d) in plan::needs_hash(&stated.src_entries, &stated.dst_entries) {
        to_hash += 1;
        if unhashed(Some(s)) {
            src_hash.push(p.to_string());
        }
        if unhashed(d) {
            dst_hash.push(p.to_string());
        }
    }
    let (n_src, n_dst) = (src_hash.len(), dst_hash.len());
    let smeter = obs.step(Step::Hash, src_side.host);
    let dmeter = obs.step(Step::Hash, dst_side.host);
    let (s, d) = both(
        || src_side.stat(src, src_hash, HashMode::All, &*smeter),
        || dst_side.stat(dst, dst_hash, HashMode::All, &*dmeter),
    );
    if s.is_ok() && d.is_ok() {
        smeter.finish();
        dmeter.finish();
    }
    stated.src_entries.extend(index(s?));
    stated.dst_entries.extend(index(d?));
    clock.mark(&format!(
        "hash ({} same-size pairs and scripts; read {} + {} files, the rest cached)",
        to_hash, n_src, n_dst
    ));
    Ok(())
}

/// Phase 3: the bytecode that travels with the `.py` files that may
/// change ([`plan::bytecode_to_stat`]): the source's, and the target's of
/// the same names, stat'ed (not hashed: a carried file is hashed as it is
/// sent, and the target checks what it wrote against that).
pub fn bytecode_phase(
    (src_side, src): (&StatSide, &mut Client),
    (dst_side, dst): (&StatSide, &mut Client),
    src_entries: &mut plan::Entries,
    dst_entries: &mut plan::Entries,
) -> Result<()> {
    let plan::BytecodeToStat { source, target } = plan::bytecode_to_stat(src_entries, dst_entries);
    let (s, d) = both(
        || src_side.stat(src, source, HashMode::None, &super::Silent),
        || dst_side.stat(dst, target, HashMode::None, &super::Silent),
    );
    src_entries.extend(index(s?));
    dst_entries.extend(index(d?));
    Ok(())
}

/// The sides' stat requests. What differs between them: the source's
/// `bin/` scripts are hashed as they would read on the target, and both
/// sides list the bytecode beside their `.py` files (the source's travels
/// with a changed `.py`; the target's is replaced or deleted as stale).
pub fn stat_sides<'a>(src_host: &'a Host, dst_host: &'a Host) -> (StatSide<'a>, StatSide<'a>) {
    let src_side = StatSide {
        host: &src_host.name,
        venv: &src_host.venv,
        shebang: Some(ShebangRewrite {
            from: src_host.venv.clone(),
            to: dst_host.venv.clone(),
        }),
        pycache: true,
    };
    let dst_side = StatSide {
        host: &dst_host.name,
        venv: &dst_host.venv,
        shebang: None,
        pycache: true,
    };
    (src_side, dst_side)
}

/// Connect to both hosts, scan, hash, and decide.
fn make_plan(
    manifest: &Manifest,
    sets: &[Set],
    src_host: &Host,
    dst_host: &Host,
    opts: &ConnectOptions,
    obs: &dyn Observer,
) -> Result<Planned> {
    let clock = Clock::start(obs);
    let globs = globs_of(sets);
    let (mut src, mut dst) = connect_and_scan(src_host, dst_host, &globs, opts, obs)?;
    let mut source = host_info(src_host, &src.scan);
    let target = host_info(dst_host, &dst.scan);
    if folder_of(&src_host.venv).is_some() {
        // A folder has no interpreter: its files are taken to be for the
        // target's Python (docs/design.md, "Sets from a folder").
        source.python = target.python.clone();
    }
    clock.mark("connect and scan");
    plan::check_python(&source, &target)?;

    let (src_side, dst_side) = stat_sides(src_host, dst_host);
    let mut stated = stat_phase(
        sets,
        &globs,
        (&src_side, &mut src.client, &src.scan),
        (&dst_side, &mut dst.client, &dst.scan),
    )?;
    src.scanning.finish();
    dst.scanning.finish();
    clock.mark("stat");
    // The preflight's ELF work can start now, on both agents, while this
    // side hashes and decides: the source reads the facts of the sets'
    // shared objects, the target lists and reads all of site-packages'.
    src.client
        .prefetch_elf(&src_host.venv, shared_files(&stated.src_entries))?;
    dst.client.prefetch_preflight(&dst_host.venv)?;
    hash_phase(
        (&src_side, &mut src.client),
        (&dst_side, &mut dst.client),
        &mut stated,
        &clock,
        obs,
    )?;
    bytecode_phase(
        (&src_side, &mut src.client),
        (&dst_side, &mut dst.client),
        &mut stated.src_entries,
        &mut stated.dst_entries,
    )?;
    clock.mark("bytecode of the .py files that may change");
    let Stated {
        src_members,
        dst_members,
        src_entries,
        dst_entries,
    } = stated;
    let plan::Computed {
        sets: set_plans,
        mut warnings,
    } = plan::compute_with(
        sets,
        &Side {
            host: &src_host.name,
            scan: &src.scan,
            globs: &globs,
            entries: &src_entries,
        },
        &Side {
            host: &dst_host.name,
            scan: &dst.scan,
            globs: &globs,
            entries: &dst_entries,
        },
        src_members,
        dst_members,
    )?;
    clock.mark("decide");
    let preflighted = preflight(
        manifest,
        sets,
        (&mut src.client, &src.scan, &src_host.venv),
        (&mut dst.client, &dst.scan, &dst_host.venv),
        &set_plans,
        None,
        &clock,
    )?;
    clock.mark("preflight, and the carried and replaced files against their RECORD");
    let mut set_plans = set_plans;
    let problems = preflighted.settle(
        (&src_host.name, &src.scan),
        (&dst_host.name, &dst.scan),
        &mut set_plans,
        &mut warnings,
        obs,
    );
    let (src_client, dst_client) = (src.client, dst.client);
    let closing = std::thread::spawn(move || {
        let _ = both(|| src_client.close(), || dst_client.close());
    });
    // Both hosts' listings (two maps of 35,000 entries for a torch stack)
    // are not freed one allocation at a time just before the process exits.
    std::mem::forget((src_entries, dst_entries, src.scan, dst.scan));
    let plan = Plan {
        format: PLAN_FORMAT,
        created: now(),
        manifest: manifest.path.display().to_string(),
        manifest_sha256: None,
        source,
        target,
        sets: set_plans,
        warnings,
        problems,
        strict: manifest.preflight.strict,
        bundle: None,
    };
    Ok(Planned {
        plan,
        closing: Closing(vec![closing]),
    })
}

/// Plan the sets source by source: those without `from` from the source
/// host's venv, each `from` folder's from an agent that reads the folder
/// as site-packages (on this machine, or on the host `host:/path` names),
/// each group against the target; then one plan of them all, each set
/// recording the source it comes from ([`SetPlan::from`]). Without any
/// `from` this is [`make_plan`] itself.
fn plan_by_source(
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
fn folder_context(name: &str) -> String {
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
fn check_folder_links(f: &SetFrom, set_plans: &[SetPlan]) -> Result<()> {
    for s in set_plans {
        for c in &s.changes {
            let Some(Kind::Symlink { target }) = &c.source else {
                continue;
            };
            let dir = c.path.rsplit_once('/').map_or("", |(d, _)| d);
            let joined = if dir.is_empty() {
                target.clone()
            } else {
                format!("{dir}/{target}")
            };
            if target.starts_with('/') || crate::model::venv_relative("", &joined).is_none() {
                return Err(err!(
                    kind = Usage,
                    hint = "replace the symlink in the folder by the file it points to, or point it inside the folder",
                    "{}: set {}: {} in the folder {} is a symlink to {target:?}, which leaves the folder",
                    f.at,
                    s.name,
                    c.path,
                    f.path
                ));
            }
        }
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

/// The regular files among `entries` that look like shared objects, sorted.
pub fn shared_files(entries: &plan::Entries) -> Vec<String> {
    let mut out: Vec<String> = entries
        .iter()
        .filter(|(p, e)| matches!(e.kind, Kind::File { .. }) && crate::preflight::looks_shared(p))
        .map(|(p, _)| p.clone())
        .collect();
    out.sort_unstable();
    out
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The paths the plan deletes, and those it places (adds or replaces).
pub fn deleted_and_placed(set_plans: &[SetPlan]) -> (HashSet<&str>, Vec<&str>) {
    let mut deleted: HashSet<&str> = HashSet::new();
    let mut placed: Vec<&str> = Vec::new();
    for s in set_plans {
        for c in &s.changes {
            match c.action {
                Action::Delete => {
                    deleted.insert(c.path.as_str());
                }
                _ => placed.push(c.path.as_str()),
            }
        }
    }
    (deleted, placed)
}

/// Requirements, for the target's interpreter and platform. Problems the
/// target already has are marked as such.
fn requirement_problems(dst_scan: &ScanReport, after: &[&Dist]) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Some(env) = requirements::environment(&dst_scan.facts, &dst_scan.python) {
        let before: Vec<&Dist> = dst_scan.dists.iter().collect();
        let already: HashSet<String> = requirements::check(&before, &env)
            .into_iter()
            .map(|p| p.reason)
            .collect();
        for mut p in requirements::check(after, &env) {
            if already.contains(&p.reason) {
                p.reason.push_str(" (already so before the overlay)");
                p.preexisting = true;
            }
            problems.push(p);
        }
    }
    problems
}

/// The `[verify]` check's `LD_LIBRARY_PATH` on the target, as the loader
/// simulation should see it.
fn ld_library_path(manifest: &Manifest, dst_scan: &ScanReport, dst_venv: &str) -> Vec<String> {
    manifest
        .verify
        .as_ref()
        .and_then(|v| v.env.get("LD_LIBRARY_PATH"))
        .map(|v| {
            let site = format!(
                "{}/{}",
                dst_venv.trim_end_matches('/'),
                dst_scan.site_packages
            );
            v.replace("{site_packages}", &site)
                .replace("{venv}", dst_venv)
                .split(':')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// The predicted problems, and the source's answer to the RECORD check
/// that ran beside the target's loader check.
pub struct Preflighted {
    pub problems: Vec<Problem>,
    pub record: Option<Result<Vec<crate::model::Finding>>>,
    /// The target's answer to its RECORD check of the files the plan
    /// replaces or deletes ([`super::record_note::target_record_request`]).
    pub target_record: Option<Result<Vec<crate::model::Finding>>>,
}

impl Preflighted {
    /// The plan's problems, after the RECORD answers of both sides have
    /// been folded into `set_plans` (which carried bytecode the source
    /// vouches for) and into `warnings` (the source's notes, the target's
    /// edited files).
    pub fn settle(
        self,
        (src_host, src_scan): (&str, &ScanReport),
        (dst_host, dst_scan): (&str, &ScanReport),
        set_plans: &mut [SetPlan],
        warnings: &mut Vec<crate::plan::Warning>,
        obs: &dyn Observer,
    ) -> Vec<Problem> {
        let vouched = super::record_note::bytecode_vouched(self.record.as_ref(), src_scan);
        for s in set_plans.iter_mut() {
            s.keep_carried_bytecode(&vouched);
        }
        if let Some(answer) = self.record {
            warnings.extend(super::record_note::record_note(
                answer,
                (src_host, src_scan),
                set_plans,
                obs,
            ));
        }
        if let Some(answer) = self.target_record {
            warnings.extend(super::record_note::target_record_note(
                answer,
                (dst_host, dst_scan),
                set_plans,
                obs,
            ));
        }
        self.problems
    }
}

/// Predict what would fail after the overlay: requirements, CUDA majors, ELF
/// loading. While the target simulates its loader, the source checks the
/// files the plan carries against their RECORD
/// ([`super::record_note::record_request`]). `known`: ELF facts of the
/// source's shared objects already read (a plan of many targets reads
/// them once for all); those it lacks are asked of the source.
pub fn preflight(
    manifest: &Manifest,
    sets: &[Set],
    (src, src_scan, src_venv): (&mut Client, &ScanReport, &str),
    (dst, dst_scan, dst_venv): (&mut Client, &ScanReport, &str),
    set_plans: &[SetPlan],
    known: Option<&HashMap<String, Option<ElfInfo>>>,
    clock: &Clock,
) -> Result<Preflighted> {
    let (deleted, placed) = deleted_and_placed(set_plans);
    let after = crate::preflight::dists_after(&dst_scan.dists, &src_scan.dists, sets, &deleted);
    // 1. Requirements.
    let mut problems = requirement_problems(dst_scan, &after);

    // 2. ELF: facts of the shared objects the overlay brings, then the target simulates its loader.
    let shared: Vec<String> = placed
        .iter()
        .filter(|p| crate::preflight::looks_shared(p))
        .map(|p| p.to_string())
        .collect();
    // Read by the source's agent ahead (see `make_plan`): only compact
    // facts (symbol hashes, not names) travel and are kept here.
    let infos = match known {
        _ if shared.is_empty() => Vec::new(),
        Some(known) if shared.iter().all(|p| known.contains_key(p)) => {
            shared.iter().map(|p| known[p].clone()).collect()
        }
        _ => src.elf_info(src_venv, shared.clone())?,
    };
    clock.mark(&format!(
        "preflight: requirements, and ELF facts of {} shared objects",
        shared.len()
    ));
    let mut infos: HashMap<String, Option<ElfInfo>> = shared.into_iter().zip(infos).collect();
    let req = PreflightRequest {
        venv: dst_venv.to_string(),
        // Only what concerns the loader: the shared objects placed or deleted.
        placed: placed
            .iter()
            .filter(|p| crate::preflight::looks_shared(p))
            .map(|p| (p.to_string(), infos.remove(*p).flatten()))
            .collect(),
        deleted: deleted
            .iter()
            .filter(|p| crate::preflight::looks_shared(p))
            .map(|p| p.to_string())
            .collect(),
        ld_library_path: ld_library_path(manifest, dst_scan, dst_venv),
        torch_users: crate::preflight::torch_users(&after),
        imported_first: crate::preflight::imported_first(&after),
        whole: false,
    };
    let record = super::record_note::record_request(src_venv, src_scan, set_plans);
    let target_record = super::record_note::target_record_request(dst_venv, dst_scan, set_plans);
    let (record, report) = both(
        || record.map(|r| src.record_check(r)),
        || {
            let report = dst.preflight(req)?;
            Ok((report, target_record.map(|r| dst.record_check(r))))
        },
    );
    let (report, target_record) = report?;
    // A module that needs another package imported first (the load
    // model's last rule, docs/preflight.md) is no predicted failure.
    for f in report
        .problems
        .into_iter()
        .filter(|f| f.imported_first.is_empty())
    {
        problems.push(Problem {
            check: Check::Elf,
            dist: crate::preflight::owner(&after, &f.file).map(|d| d.name.clone()),
            file: Some(f.file),
            reason: f.reason,
            preexisting: f.preexisting,
            optional: f.optional,
            cause: Some(f.cause),
        });
    }

    // 3. CUDA majors of the packages that link together.
    problems.extend(cuda::check(
        &after,
        &manifest.preflight.cuda_family,
        &report.cudart,
    ));
    problems.sort();
    problems.dedup();
    Ok(Preflighted {
        problems,
        record,
        target_record,
    })
}

/// Write the plan atomically (temp file, then rename).
pub fn save(plan: &Plan, out: &Path) -> Result<()> {
    write_atomic(out, |w| {
        // One buffered write: a plan of 35,000 paths is ~10 MB of JSON.
        let mut w = std::io::BufWriter::with_capacity(1 << 20, w);
        serde_json::to_writer_pretty(&mut w, plan).map_err(std::io::Error::other)?;
        std::io::Write::flush(&mut w)
    })
}

/// Write a plan file at `out` atomically: `write` fills a temp file
/// (created 0600, whatever the umask) in the same folder (made 0700 if it
/// is missing), which is then renamed over `out`.
pub fn write_atomic(
    out: &Path,
    write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> Result<()> {
    let fail = |e: std::io::Error| {
        err!(
            kind = Host,
            hint = "choose another place with --out",
            "Failed to save the plan to {}: {}",
            out.display(),
            crate::error::io_cause(&e)
        )
    };
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(dir)
        .map_err(fail)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(fail)?;
    write(tmp.as_file_mut()).map_err(fail)?;
    tmp.persist(out).map_err(|e| fail(e.error))?;
    Ok(())
}

/// A manifest file as a plan records it: where it is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestStamp {
    /// Absolute, symlinks resolved.
    pub path: PathBuf,
    /// The sha256 of its bytes, in hex.
    pub sha256: String,
}

/// Read the manifest at `path` for its [`ManifestStamp`].
pub fn manifest_stamp(path: &Path) -> Result<ManifestStamp> {
    use sha2::{Digest, Sha256};
    let fail = |e: std::io::Error| {
        err!(
            hint = "pass --manifest FILE, or create overlay.toml (see docs/manifest.md)",
            "Failed to read manifest {}: {}",
            path.display(),
            crate::error::io_cause(&e)
        )
    };
    let bytes = std::fs::read(path).map_err(fail)?;
    let path = std::fs::canonicalize(path).map_err(fail)?;
    Ok(ManifestStamp {
        path,
        sha256: crate::text::hex(&Sha256::digest(&bytes)),
    })
}
