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
//! A target that fails during the stream is dropped from it (it discards
//! its generation, or its next command does, as after any failed apply);
//! the others go on. If the source fails, every target discards its
//! generation. The slowest target sets the stream's pace.

use std::collections::HashMap;

use crate::client::{Client, SendRequest};
use crate::error::{Error, Result};
use crate::model::{
    Kind, RouteSetting, SendFile, ShebangRewrite, SourceHash, StreamEntry, StreamWaits,
};
use crate::plan::Plan;

use crate::ops::apply::{
    ApplyOptions, ApplyReport, Began, Moved, Ready, StreamFailure, Transferred, begin,
    direct_obstacle, finish, local_copy, pause_hook, route_compression, show_windows,
    stream_failed,
};
use crate::ops::{Clock, Observer, Step, endpoint, relay};

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
    Union {
        files,
        cuts,
        routes: relay::Routes { takes },
        maps,
        own_bytes,
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
    let Union {
        files,
        cuts,
        routes,
        maps,
        own_bytes,
    } = union_of(&sends);
    let n = ready.len();
    let source = ready[0].1.plan.source.clone();
    let mut src = match start_source(&ready[0].1, files, cuts, obs) {
        Ok(c) => c,
        Err((e, died)) => {
            let out = ready
                .iter_mut()
                .map(|(_, r)| Err(fail(r, e.clone(), died)))
                .collect();
            return (out, 0);
        }
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

/// Connect to the source of `first`'s plan and have it start streaming
/// `files` in segments from `cuts`, its shebangs rewritten for the targets'
/// venv path (the same for every target of a share group). The error, and
/// whether the source's connection died.
fn start_source(
    first: &Ready,
    files: Vec<SendFile>,
    cuts: Vec<usize>,
    obs: &dyn Observer,
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
    let connecting = obs.step(Step::Connect, &source.name);
    let mut src = Client::connect(
        &source.name,
        &endpoint(source),
        source.sudo.as_deref(),
        &opts.connect,
    )
    .map_err(|e| (e, false))?;
    connecting.finish();
    if let Err(e) = src.start_send(request) {
        let died = src.lost();
        return Err((e, died));
    }
    Ok(src)
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

/// The source's hashes of the union's entries, as one target's changes.
fn own_hashes(hashes: &[SourceHash], map: &[StreamEntry]) -> Vec<SourceHash> {
    hashes
        .iter()
        .filter_map(|h| match map.get(h.index) {
            Some(StreamEntry::Take(i)) => Some(SourceHash {
                index: *i,
                blake3: h.blake3.clone(),
            }),
            _ => None,
        })
        .collect()
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
