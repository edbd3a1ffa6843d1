//! The plan of one source against the target (`make_plan`): connect and
//! scan, the stat, hash and bytecode phases, the decision, the preflight.

use crate::client::Client;
use crate::error::Result;
use crate::manifest::{Host, Manifest};
use crate::model::{Kind, ScanReport, Set, folder_of};
use crate::ops::{Clock, Meter, Observer};
use crate::plan::{self, PLAN_FORMAT, Plan, Side};
use crate::transport::ConnectOptions;

use super::bytecode::bytecode_phase;
use super::connect::{both, connect_and_scan};
use super::hash::hash_phase;
use super::preflight::preflight;
use super::stat::{Stated, stat_phase, stat_sides};
use super::{Closing, Planned, globs_of, host_info, now, source_as_for};

/// Connect to both hosts, scan, hash, and decide.
pub(super) fn make_plan(
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
    let mut target = host_info(dst_host, &dst.scan);
    let folder = folder_of(&src_host.venv).is_some();
    let mut source = source_as_for(&host_info(src_host, &src.scan), folder, &target);
    clock.mark("connect and scan");
    plan::check_python(&source, &target)?;

    let stated = read_sides(
        sets,
        &globs,
        (src_host, &mut src.client, &src.scan, &*src.scanning),
        (dst_host, &mut dst.client, &dst.scan, &*dst.scanning),
        &clock,
        obs,
    )?;
    let Stated {
        src_members,
        dst_members,
        src_entries,
        dst_entries,
        dst_machine,
    } = stated;
    let plan::Computed {
        sets: mut set_plans,
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
    dst.scan.machine = dst_machine;
    target.machine = host_info(dst_host, &dst.scan).machine;
    let preflighted = preflight(
        manifest,
        sets,
        (&mut src.client, &src.scan, &src_host.venv),
        (&mut dst.client, &dst.scan, &dst_host.venv),
        &dst_host.name,
        &set_plans,
        None,
        &clock,
    )?;
    clock.mark("preflight, and the carried and replaced files against their RECORD");
    let running = preflighted.running.clone();
    let problems = preflighted.settle(
        (&src_host.name, &src.scan),
        (&dst_host.name, &dst.scan),
        &mut set_plans,
        &mut warnings,
        obs,
    );
    // The source's machine facts, read since its scan: only shown.
    src.scan.machine = src.client.machine()?;
    source.machine = host_info(src_host, &src.scan).machine;
    let closing = close_both(src.client, dst.client);
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
        provenance: None,
        running: Some(running),
    };
    Ok(Planned { plan, closing })
}

/// Say goodbye to both agents on a thread of their own (the plan is
/// saved and printed meanwhile).
fn close_both(src: Client, dst: Client) -> Closing {
    Closing(vec![std::thread::spawn(move || {
        let _ = both(|| src.close(), || dst.close());
    })])
}
/// Phases 1 to 3 on both hosts: stat, hash and the bytecode that travels;
/// between the first and the second, the preflight's ELF work starts on
/// both agents.
fn read_sides<'s>(
    sets: &[Set],
    globs: &[String],
    (src_host, src, src_scan, src_scanning): (&Host, &mut Client, &'s ScanReport, &dyn Meter),
    (dst_host, dst, dst_scan, dst_scanning): (&Host, &mut Client, &'s ScanReport, &dyn Meter),
    clock: &Clock,
    obs: &dyn Observer,
) -> Result<Stated<'s>> {
    let (src_side, dst_side) = stat_sides(src_host, dst_host);
    let mut stated = stat_phase(
        sets,
        globs,
        (&src_side, src, src_scan),
        (&dst_side, dst, dst_scan),
    )?;
    src_scanning.finish();
    dst_scanning.finish();
    clock.mark("stat");
    // The preflight's ELF work can start now, on both agents, while this
    // side hashes and decides: the source reads the facts of the sets'
    // shared objects, the target lists and reads all of site-packages'.
    // GPU code is read for the target's GPUs (docs/preflight.md#gpu).
    stated.dst_machine = dst.machine()?;
    let gpus = stated.dst_machine.capabilities();
    src.prefetch_elf(
        &src_host.venv,
        shared_files(&stated.src_entries),
        Some(gpus.clone()),
    )?;
    // GPU code only of the target's objects in the sets: an object the
    // overlay leaves has no new finding (docs/preflight.md#gpu).
    dst.prefetch_preflight(
        &dst_host.venv,
        Some(gpus),
        Some(shared_files(&stated.dst_entries)),
    )?;
    hash_phase((&src_side, src), (&dst_side, dst), &mut stated, clock, obs)?;
    bytecode_phase(
        (&src_side, src),
        (&dst_side, dst),
        &mut stated.src_entries,
        &mut stated.dst_entries,
    )?;
    clock.mark("bytecode of the .py files that may change");
    Ok(stated)
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
