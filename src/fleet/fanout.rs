//! One read of the source fanned out to several targets, for `overlay
//! apply` of a plan of many ([`super::apply_many`]).
//!
//! Targets whose plans can share a stream ([`share_groups`]: relayed, from
//! the same source venv into the same target venv path, every file the
//! same where two plans send it) are applied together ([`apply_shared`]):
//! each is connected, checked and given its generation exactly as a lone
//! apply does ([`crate::ops::apply::begin`]); then the source streams the
//! union of what they need once, cut into segments of the files the same
//! targets need ([`union_of`]: the files all need first, then each other
//! combination), and the controller passes each segment's frames on only
//! to the targets that need it ([`relay::fan_out`]): a target receives its
//! own files' bytes and the stream's end, nothing of the others'. Each
//! target is told how the stream's entries map onto its own changes
//! ([`StreamEntry`]) and stages and checks its own against its own plan
//! (another's entry, which a hostile source might still send it, it reads
//! and drops). Then each switches, verifies and rolls back on its own
//! ([`crate::ops::apply::finish`]).
//!
//! Over several connections ([`crate::ops::apply::lane_count`], from the
//! fewest cores of the source, this machine and the targets) the union
//! goes in parts, each lane with one source agent and one receiving agent
//! per target ([`stream_lanes`], `ops::apply::lanes`); every target's
//! generation is opened to that many lanes first, and each checks what
//! its lanes staged together (`StagedDirect`).
//!
//! A target that fails during the stream is dropped from it (it discards
//! its generation, or its next command does, as after any failed apply);
//! the others go on. If the source fails, every target discards its
//! generation. The slowest target sets the stream's pace.

use std::collections::HashMap;

use crate::client::{Client, SendRequest};
use crate::error::{Error, Result};
use crate::model::{
    Kind, RouteSetting, SendFile, SendWaits, ShebangRewrite, StreamEntry, StreamWaits,
};
use crate::plan::Plan;

use crate::ops::apply::{
    ApplyOptions, ApplyReport, Began, Cores, FanMaps, LaneCount, LaneTarget, Moved, Ready,
    StreamFailure, TargetTook, Transferred, begin, connect_source, direct_obstacle, finish,
    lane_count, local_copy, own_hashes, pause_hook, route_compression, show_windows, stream_failed,
    stream_fanned,
};
use crate::ops::{Clock, Observer, Step, relay};

/// Whether a target's plan can take a stream shared with other targets:
/// relayed through this machine (not `--direct`, not the local route), and
/// every set from the plan's source (not a folder).
pub(super) fn shareable(plan: &Plan, opts: &ApplyOptions) -> bool {
    let relayed = !opts.direct
        && (opts.relay
            || plan.target.route == RouteSetting::Relay
            || direct_obstacle(plan).is_some());
    relayed && !local_copy(plan, None) && plan.sets.iter().all(|s| s.from.is_none())
}

/// The targets (indexes into `plans`) that can share one stream each, in
/// the order given: the same source host and venv, the same target venv
/// path (the source rewrites shebangs to it), and no path that two of them
/// need in different forms. A target alone in its group streams alone.
pub(super) fn share_groups(plans: &[&Plan]) -> Vec<Vec<usize>> {
    struct Group {
        key: (String, String, String),
        files: HashMap<String, Kind>,
        members: Vec<usize>,
    }
    let mut groups: Vec<Group> = Vec::new();
    for (i, plan) in plans.iter().enumerate() {
        let key = (
            plan.source.name.clone(),
            plan.source.venv.clone(),
            plan.target.venv.clone(),
        );
        let send = SendFile::of_changes(&crate::ops::apply::gen_changes(plan));
        let fits = |g: &Group| {
            g.key == key
                && send
                    .iter()
                    .all(|f| g.files.get(&f.path).is_none_or(|k| same_file(k, &f.kind)))
        };
        let g = match groups.iter().position(fits) {
            Some(g) => g,
            None => {
                groups.push(Group {
                    key,
                    files: HashMap::new(),
                    members: Vec::new(),
                });
                groups.len() - 1
            }
        };
        let g = &mut groups[g];
        g.members.push(i);
        for f in send {
            g.files.entry(f.path).or_insert(f.kind);
        }
    }
    groups.into_iter().map(|g| g.members).collect()
}

/// Whether two plans saw the same source file (whatever each hashed).
fn same_file(a: &Kind, b: &Kind) -> bool {
    match (a, b) {
        (
            Kind::File {
                size: sa, mode: ma, ..
            },
            Kind::File {
                size: sb, mode: mb, ..
            },
        ) => sa == sb && ma == mb,
        _ => a == b,
    }
}

/// The bytes of an entry's data in the stream: a file's size, a symlink's
/// target.
fn entry_size(kind: &Kind) -> u64 {
    match kind {
        Kind::Symlink { target } => target.len() as u64,
        k => k.size(),
    }
}

/// One target of a shared stream: its options (its own plan) and the
/// observer that names it.
pub(super) struct Member<'a> {
    pub opts: ApplyOptions,
    pub obs: &'a dyn Observer,
}

/// What [`apply_shared`] did: each member's apply, in the order given, and
/// the bytes of files the source read for all of them.
pub(super) struct Shared {
    pub reports: Vec<Result<ApplyReport>>,
    pub source_bytes_read: u64,
}

/// Apply every member's plan with one stream of the source (see the module
/// doc). `obs` hears the shared stream's progress.
pub(super) fn apply_shared(members: &[Member<'_>], obs: &dyn Observer) -> Shared {
    let clocks: Vec<Clock> = members.iter().map(|m| Clock::start(m.obs)).collect();
    let began: Vec<Result<Began>> = std::thread::scope(|s| {
        let handles: Vec<_> = members
            .iter()
            .map(|m| s.spawn(|| begin(&m.opts, m.obs)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(crate::err!("an apply thread failed")))
            })
            .collect()
    });
    let mut reports: Vec<Option<Result<ApplyReport>>> = std::iter::repeat_with(|| None)
        .take(members.len())
        .collect();
    let mut ready: Vec<(usize, Box<Ready>)> = Vec::new();
    for (i, b) in began.into_iter().enumerate() {
        match b {
            Ok(Began::Ready(r)) => {
                clocks[i].mark("connect and prepare");
                ready.push((i, r));
            }
            Ok(Began::Done(report)) => reports[i] = Some(Ok(report)),
            Err(e) => reports[i] = Some(Err(e)),
        }
    }
    let (sent, source_bytes_read) = if ready.is_empty() {
        (Vec::new(), 0)
    } else {
        stream_shared(&mut ready, obs)
    };
    let finished: Vec<(usize, Result<ApplyReport>)> = std::thread::scope(|s| {
        let handles: Vec<_> = ready
            .into_iter()
            .zip(sent)
            .map(|((i, r), t)| {
                let (clock, m) = (&clocks[i], &members[i]);
                s.spawn(move || (i, t.and_then(|t| finish(r, t, clock, m.obs))))
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    for (i, r) in finished {
        reports[i] = Some(r);
    }
    Shared {
        reports: reports
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(crate::err!("an apply thread failed"))))
            .collect(),
        source_bytes_read,
    }
}

/// The one stream several targets share: the union of their files, in
/// segments of the files the same targets need, and how each target takes
/// it.
struct Union {
    files: Vec<SendFile>,
    /// Where each segment starts in `files` (empty: one segment, which
    /// every target needs all of).
    cuts: Vec<usize>,
    routes: relay::Routes,
    /// Per target, the stream's entries as its changes.
    maps: Vec<Vec<StreamEntry>>,
    /// Per target, the bytes of its own files.
    own_bytes: Vec<u64>,
    /// Per file of `files`, which targets need it.
    takers: Vec<Vec<bool>>,
}

/// The union of `sends` (each target's files), grouped into segments by
/// which targets need them: the files every target needs first, then each
/// other combination, in the first target's order within one. A target
/// then receives only the segments holding its files (and the stream's
/// end), never another's bytes.
fn union_of(sends: &[Vec<SendFile>]) -> Union {
    let n = sends.len();
    let mut union: Vec<SendFile> = Vec::new();
    let mut takers: Vec<Vec<bool>> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for (k, f) in sends
        .iter()
        .enumerate()
        .flat_map(|(k, s)| s.iter().map(move |f| (k, f)))
    {
        let u = *at.entry(&f.path).or_insert_with(|| {
            union.push(f.clone());
            takers.push(vec![false; n]);
            union.len() - 1
        });
        takers[u][k] = true;
        // A file one target's plan did not hash goes unhashed (the source
        // then hashes it and checks its stamp): that target needs the
        // source's hash, and the targets whose plans hashed it check their
        // own hash anyway.
        if let (
            Kind::File {
                blake3: Some(_), ..
            },
            Kind::File { blake3: None, .. },
        ) = (&union[u].kind, &f.kind)
        {
            union[u].kind = f.kind.clone();
        }
    }
    // Stable: the first target's order within a segment.
    let mut order: Vec<usize> = (0..union.len()).collect();
    order.sort_by(|a, b| takers[*b].cmp(&takers[*a]));
    let files: Vec<SendFile> = order
        .iter()
        .enumerate()
        .map(|(i, &u)| SendFile {
            index: i,
            ..union[u].clone()
        })
        .collect();
    let mut cuts = Vec::new();
    let mut takes = Vec::new();
    for (i, &u) in order.iter().enumerate() {
        if i == 0 || takers[u] != takers[order[i - 1]] {
            cuts.push(i);
            takes.push(takers[u].clone());
        }
    }
    if takes.len() <= 1 {
        // Every target needs every file: one stream, not cut.
        (cuts, takes) = (Vec::new(), Vec::new());
    } else {
        // The end-of-archive blocks: every target's.
        takes.push(vec![true; n]);
    }
    let pos: HashMap<&str, usize> = files.iter().map(|f| (f.path.as_str(), f.index)).collect();
    let maps = sends
        .iter()
        .map(|send| {
            let mut m: Vec<StreamEntry> = files
                .iter()
                .map(|u| StreamEntry::Skip {
                    size: entry_size(&u.kind),
                })
                .collect();
            for f in send {
                m[pos[f.path.as_str()]] = StreamEntry::Take(f.index);
            }
            m
        })
        .collect();
    let own_bytes = sends
        .iter()
        .map(|s| s.iter().map(|f| entry_size(&f.kind)).sum())
        .collect();
    let takers = order.iter().map(|&u| takers[u].clone()).collect();
    Union {
        files,
        cuts,
        routes: relay::Routes { takes },
        maps,
        own_bytes,
        takers,
    }
}

/// Stream the union of the ready targets' files from their source once,
/// fanned out to all, each target receiving only the segments that hold
/// its files; each target's result, in order, and the bytes of files the
/// source read.
fn stream_shared(
    ready: &mut [(usize, Box<Ready>)],
    obs: &dyn Observer,
) -> (Vec<Result<Transferred>>, u64) {
    let sends: Vec<Vec<SendFile>> = ready
        .iter()
        .map(|(_, r)| SendFile::of_changes(&r.changes))
        .collect();
    let union = union_of(&sends);
    let first = &ready[0].1;
    let src = match connect_source(&first.plan.source, &first.opts.connect, obs) {
        Ok(c) => c,
        Err(f) => return fail_all(ready, f.error, false),
    };
    let dst_cores = ready.iter().map(|(_, r)| r.dst.cores()).min().unwrap_or(0);
    let lanes_n = lane_count(
        ready[0].1.opts.connections,
        Cores::of(src.cores(), dst_cores, true),
        own_bytes_of(&union.files),
    );
    if lanes_n.count > 1 && union.files.len() > 1 {
        return stream_lanes(ready, union, src, &lanes_n, obs);
    }
    stream_one(ready, union, src, obs)
}

/// Every ready target's error after the source failed.
fn fail_all(
    ready: &mut [(usize, Box<Ready>)],
    e: Error,
    died: bool,
) -> (Vec<Result<Transferred>>, u64) {
    let out = ready
        .iter_mut()
        .map(|(_, r)| Err(fail(r, e.clone(), died)))
        .collect();
    (out, 0)
}

/// [`stream_shared`] over one connection: the source streams the union
/// and this machine fans its frames out ([`relay::fan_out`]).
fn stream_one(
    ready: &mut [(usize, Box<Ready>)],
    union: Union,
    src: Client,
    obs: &dyn Observer,
) -> (Vec<Result<Transferred>>, u64) {
    let Union {
        files,
        cuts,
        routes,
        maps,
        own_bytes,
        ..
    } = union;
    let n = ready.len();
    let source = ready[0].1.plan.source.clone();
    let mut src = match start_source(&ready[0].1, src, files, cuts) {
        Ok(c) => c,
        Err((e, died)) => return fail_all(ready, e, died),
    };
    // Each target starts its stage; one that cannot is out of the stream.
    let mut out: Vec<Option<Result<Transferred>>> = (0..n).map(|_| None).collect();
    for (j, (_, r)) in ready.iter_mut().enumerate() {
        if let Err(e) = r.dst.start_stage(Some(maps[j].clone())) {
            out[j] = Some(Err(fail(r, e, true)));
        }
    }
    let taking: Vec<usize> = (0..n).filter(|j| out[*j].is_none()).collect();
    let names: Vec<&str> = taking
        .iter()
        .map(|&j| ready[j].1.plan.target.name.as_str())
        .collect();
    let meter = obs.step(
        Step::Stream,
        &format!("{} -> {}", source.name, names.join(", ")),
    );
    let routes = relay::Routes {
        takes: routes
            .takes
            .iter()
            .map(|t| taking.iter().map(|&j| t[j]).collect())
            .collect(),
    };
    let dsts: Vec<&mut Client> = ready
        .iter_mut()
        .enumerate()
        .filter(|(j, _)| out[*j].is_none())
        .map(|(_, (_, r))| &mut r.dst)
        .collect();
    let fanned = relay::fan_out(
        &mut src,
        dsts,
        &routes,
        relay::Listener {
            first: &mut || pause_hook("stream"),
            progress: &mut |p| meter.update(p),
        },
    );
    let sent = match fanned.ended {
        Ok(ended) => match src.close() {
            Ok(()) => Ok(ended.sent),
            Err(e) => Err((e, true)),
        },
        Err(e) => {
            let died = src.lost();
            drop(src);
            Err((e, died))
        }
    };
    if let Ok(s) = &sent {
        show_windows(obs, &s.windows);
    }
    meter.finish();
    for (k, j) in taking.iter().copied().enumerate() {
        let took = Took {
            failed: fanned.failed[k].clone(),
            map: &maps[j],
            own_bytes: own_bytes[j],
            received: fanned.received[k],
            shared: taking.len(),
        };
        out[j] = Some(end_target(&mut ready[j].1, took, &sent));
    }
    let read = sent.as_ref().map_or(0, |s| s.raw_bytes);
    let out = out
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(crate::err!("a target was left out of the stream"))))
        .collect();
    (out, read)
}

/// Have the source of `first`'s plan start streaming `files` in segments
/// from `cuts`, its shebangs rewritten for the targets' venv path (the
/// same for every target of a share group). The error, and whether the
/// source's connection died.
fn start_source(
    first: &Ready,
    mut src: Client,
    files: Vec<SendFile>,
    cuts: Vec<usize>,
) -> std::result::Result<Client, (Error, bool)> {
    let (plan, opts) = (&first.plan, &first.opts);
    let source = &plan.source;
    let request = SendRequest {
        venv: source.venv.clone(),
        files,
        cuts,
        shebang: Some(ShebangRewrite {
            from: source.venv.clone(),
            to: plan.target.venv.clone(),
        }),
        compression: route_compression(opts.compression, plan),
    };
    if let Err(e) = src.start_send(request) {
        let died = src.lost();
        return Err((e, died));
    }
    Ok(src)
}

fn own_bytes_of(files: &[SendFile]) -> u64 {
    files.iter().map(|f| entry_size(&f.kind)).sum()
}

/// The shared stream over several connections ([`stream_fanned`]): every
/// ready target's generation opened to that many lanes, the union's parts
/// streamed once on each lane and passed on to the targets that need
/// them, then each target's stage checked on its own connection. A target
/// that fails drops out; the source failing fails them all.
fn stream_lanes(
    ready: &mut [(usize, Box<Ready>)],
    union: Union,
    src: Client,
    n: &LaneCount,
    obs: &dyn Observer,
) -> (Vec<Result<Transferred>>, u64) {
    let mut out: Vec<Option<Result<Transferred>>> = ready.iter().map(|_| None).collect();
    for (j, (_, r)) in ready.iter_mut().enumerate() {
        if let Err(e) = r.dst.open_lanes(n.count) {
            let died = r.dst.lost();
            out[j] = Some(Err(fail(r, e, died)));
        }
    }
    let taking: Vec<usize> = (0..ready.len()).filter(|j| out[*j].is_none()).collect();
    let fan = FanMaps {
        takers: union
            .takers
            .iter()
            .map(|t| taking.iter().map(|&j| t[j]).collect())
            .collect(),
        maps: taking.iter().map(|&j| union.maps[j].clone()).collect(),
    };
    let end = {
        let targets: Vec<LaneTarget<'_>> = taking
            .iter()
            .map(|&j| LaneTarget {
                host: &ready[j].1.plan.target,
                generation: &ready[j].1.generation,
            })
            .collect();
        let first = &ready[0].1;
        let agent = first.dst.agent_exe().to_string();
        let compression = route_compression(first.opts.compression, &first.plan);
        stream_fanned(
            (&first.plan, &first.opts),
            src,
            &targets,
            (union.files, &fan),
            (compression, n, &agent),
            obs,
        )
    };
    let read = end.as_ref().map_or(0, |e| e.raw);
    let (source, tooks): (SendWaits, Vec<Result<TargetTook>>) = match end {
        Ok(e) => (
            e.source,
            e.targets
                .into_iter()
                .map(|mut t| t.failed.take().map_or(Ok(t), Err))
                .collect(),
        ),
        Err(f) => (
            SendWaits::default(),
            taking.iter().map(|_| Err(f.error.clone())).collect(),
        ),
    };
    for (j, took) in taking.iter().copied().zip(tooks) {
        let r = &mut ready[j].1;
        let staged = took.and_then(|t| {
            r.dst.staged_direct(t.hashes, t.written)?;
            Ok(Transferred {
                moved: Moved {
                    raw: union.own_bytes[j],
                    sent: t.received,
                    local: false,
                    waits: Some(StreamWaits {
                        source,
                        target: t.waits,
                    }),
                },
                shared: taking.len(),
                ..Transferred::default()
            })
        });
        out[j] = Some(staged.map_err(|e| {
            let died = r.dst.lost();
            fail(r, e, died)
        }));
    }
    let out = out
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(crate::err!("a target was left out of the stream"))))
        .collect();
    (out, read)
}

/// What one target of a shared stream took of it.
struct Took<'a> {
    /// Its writer's error, if its connection failed.
    failed: Option<Error>,
    map: &'a [StreamEntry],
    own_bytes: u64,
    /// Bytes of data frames written to it.
    received: u64,
    /// Targets that took the stream.
    shared: usize,
}

/// End one target's part of a shared stream: its stage ended with the
/// source's hashes of its files, or its error.
fn end_target(
    r: &mut Ready,
    took: Took<'_>,
    sent: &std::result::Result<crate::model::Sent, (Error, bool)>,
) -> Result<Transferred> {
    match (took.failed, sent) {
        (Some(e), _) => Err(fail(r, e, true)),
        (None, Err((e, died))) => Err(fail(r, e.clone(), *died)),
        (None, Ok(s)) => match r.dst.end_stage(own_hashes(&s.hashes, took.map)) {
            Ok(staged) => Ok(Transferred {
                moved: Moved {
                    raw: took.own_bytes,
                    sent: took.received,
                    local: false,
                    waits: Some(StreamWaits {
                        source: s.waits,
                        target: staged.waits,
                    }),
                },
                shared: took.shared,
                ..Transferred::default()
            }),
            Err(e) => {
                let lost = r.dst.lost();
                Err(fail(r, e, lost))
            }
        },
    }
}

/// A target's error after the shared stream failed for it: it discards its
/// generation if it can, and the error says where it stands.
fn fail(r: &mut Ready, e: Error, died: bool) -> Error {
    let tname = r.plan.target.name.clone();
    stream_failed(
        &mut r.dst,
        StreamFailure::new(e, died),
        &tname,
        &r.opts.plan,
        &r.generation,
    )
}
