//! One part of a stream over lanes, on one lane ([`send_part`]): the
//! source agent streams the part's files and the controller passes them on
//! to the lane's receiving agent (relayed), or follows the source's own
//! ssh to the target (`--direct`). In a fan-out the part is a small shared
//! stream of its own ([`cut_for`]): its files indexed within it, cut into
//! segments by which targets take them, each target told how the part's
//! entries map onto its changes.

use crate::client::{Client, DirectTo, SendRequest};
use crate::err;
use crate::error::Error;
use crate::model::{
    Compression, LevelWindow, Progress, SendFile, SendWaits, ShebangRewrite, SourceHash,
    StreamEntry,
};
use crate::ops::relay;

use super::super::route::direct_jump;
use super::super::stream::{StreamFailure, Way, pause_hook};
use super::{FanMaps, Lanes, Shared, TargetTook};

/// What one part moved: the source's side, and each target's (in the
/// order of [`Lanes::targets`]).
pub(super) struct PartDone {
    pub raw: u64,
    pub sent: u64,
    pub source: SendWaits,
    pub targets: Vec<TargetTook>,
    /// The compression tuner's windows of the part.
    pub windows: Vec<LevelWindow>,
}

/// A part as the source sends it.
struct Cut {
    files: Vec<SendFile>,
    /// Where each segment starts (empty: one, which every target takes).
    cuts: Vec<usize>,
    /// Per segment, which targets take it (the last: the end-of-archive
    /// blocks, everyone's).
    takes: Vec<Vec<bool>>,
    /// Per target, the part's entries as its changes (a fan-out only).
    maps: Option<Vec<Vec<StreamEntry>>>,
}

/// The part `files` as the source sends it: as they are for one target;
/// in a fan-out in the union's order (which groups the files by the
/// targets that take them), indexed within the part, cut where the takers
/// change.
fn cut_for(fan: Option<&FanMaps>, mut files: Vec<SendFile>) -> Cut {
    let Some(fan) = fan else {
        return Cut {
            files,
            cuts: Vec::new(),
            takes: Vec::new(),
            maps: None,
        };
    };
    files.sort_by_key(|f| f.index);
    let all = vec![true; fan.maps.len()];
    let takers = |u: usize| fan.takers.get(u).unwrap_or(&all);
    let union: Vec<usize> = files.iter().map(|f| f.index).collect();
    let (mut cuts, mut takes) = (Vec::new(), Vec::new());
    for (i, &u) in union.iter().enumerate() {
        if i == 0 || takers(u) != takers(union[i - 1]) {
            cuts.push(i);
            takes.push(takers(u).clone());
        }
    }
    if takes.len() == 1 && takes[0] == all {
        (cuts, takes) = (Vec::new(), Vec::new());
    } else {
        takes.push(all.clone());
    }
    let skip = StreamEntry::Skip { size: 0 };
    let maps = fan
        .maps
        .iter()
        .map(|m| {
            union
                .iter()
                .map(|&u| m.get(u).unwrap_or(&skip).clone())
                .collect()
        })
        .collect();
    let files = files
        .into_iter()
        .enumerate()
        .map(|(i, f)| SendFile { index: i, ..f })
        .collect();
    Cut {
        files,
        cuts,
        takes,
        maps: Some(maps),
    }
}

/// The source's hashes of a shared stream's entries, as one target's
/// changes (`map`: the stream's entries for it).
pub fn own_hashes(hashes: &[SourceHash], map: &[StreamEntry]) -> Vec<SourceHash> {
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

/// A target of a fan-out failed on some lane: it takes no further part,
/// and its first error is what it reports.
pub(super) fn drop_target(shared: &Shared<'_>, k: usize, e: Error) {
    if let Ok(mut d) = shared.dropped.lock()
        && let Some(slot) = d.get_mut(k)
        && slot.is_none()
    {
        *slot = Some(e);
    }
}

/// One part on one lane: relayed (the source's frames passed on to this
/// lane's receiving agents) or direct (the source's own ssh to the
/// target). In a fan-out a target that fails is dropped and the part goes
/// on for the others; otherwise any failure fails the part.
pub(super) fn send_part(
    l: &Lanes<'_>,
    shared: &Shared<'_>,
    lane: u32,
    (src, rcvs): (&mut Client, &mut [Option<Client>]),
    files: Vec<SendFile>,
    compression: Compression,
) -> std::result::Result<PartDone, StreamFailure> {
    let fail = |e: Error, c: &Client| StreamFailure::new(e, c.lost());
    let plan = l.plan;
    let count = files.len() as u64;
    let cut = cut_for(l.fan, files);
    let send = SendRequest {
        venv: plan.source.venv.clone(),
        files: cut.files,
        cuts: cut.cuts,
        shebang: Some(ShebangRewrite {
            from: plan.source.venv.clone(),
            to: plan.target.venv.clone(),
        }),
        compression,
    };
    match l.route {
        Way::Relay if rcvs.iter().any(Option::is_some) => src.start_send(send),
        Way::Direct { dest, timeout, .. } => src.start_send_direct(
            send,
            DirectTo {
                ssh: dest.to_string(),
                proxy_jump: direct_jump(plan),
                agent: l.agent.to_string(),
                target_venv: plan.target.venv.clone(),
                generation: l.targets[0].generation.to_string(),
                connect_timeout_secs: *timeout,
                lane: Some(lane),
            },
        ),
        Way::Relay => Err(err!(kind = Internal, "a relayed lane without a receiver")),
    }
    .map_err(|e| fail(e, src))?;
    let mut took: Vec<TargetTook> = l.targets.iter().map(|_| TargetTook::default()).collect();
    let taking = start_receivers(l, shared, lane, rcvs, cut.maps.as_deref())?;
    let ended = follow_part(
        l,
        shared,
        lane,
        (src, rcvs),
        (&cut.takes, &taking),
        &mut took,
    )?;
    lane_finished(shared, lane, count, ended.sent.raw_bytes);
    if matches!(l.route, Way::Direct { .. }) {
        took[0] = TargetTook {
            hashes: ended.sent.hashes.clone(),
            written: ended.written,
            received: ended.sent.packed_bytes,
            waits: ended.sent.target_waits,
            failed: None,
        };
    }
    for k in taking {
        let Some(r) = rcvs[k].as_mut().filter(|_| !dropped(shared, k)) else {
            continue;
        };
        let hashes = match &cut.maps {
            Some(m) => own_hashes(&ended.sent.hashes, &m[k]),
            None => ended.sent.hashes.clone(),
        };
        match r.end_receive(hashes.clone()) {
            Ok((written, waits)) => {
                let t = &mut took[k];
                (t.hashes, t.written, t.waits) = (hashes, written, waits);
                if l.fan.is_none() {
                    t.received = ended.sent.packed_bytes;
                }
            }
            Err(e) if l.fan.is_some() => drop_target(shared, k, e),
            Err(e) => return Err(fail(e, r)),
        }
    }
    Ok(PartDone {
        raw: ended.sent.raw_bytes,
        sent: ended.sent.packed_bytes,
        source: ended.sent.waits,
        targets: took,
        windows: ended.sent.windows,
    })
}

/// Follow the source's stream of one part to its end, passing its frames
/// on to the lane's receiving agents of the targets `taking` it: to the
/// one target's, or fanned out by segment (`takes`) in a fan-out, where a
/// target whose writer fails drops out. Each target's bytes go in `took`.
fn follow_part(
    l: &Lanes<'_>,
    shared: &Shared<'_>,
    lane: u32,
    (src, rcvs): (&mut Client, &mut [Option<Client>]),
    (takes, taking): (&[Vec<bool>], &[usize]),
    took: &mut [TargetTook],
) -> std::result::Result<relay::Ended, StreamFailure> {
    let first_part = lane == 0 && shared.done_bytes.lock().is_ok_and(|d| d.0 == 0);
    let mut first = || {
        // The tests' pause point (tests/interrupt.rs), once.
        if first_part {
            pause_hook("stream")
        }
    };
    let mut progress = |p: &Progress| lane_progress(shared, lane, p);
    let listen = relay::Listener {
        first: &mut first,
        progress: &mut progress,
    };
    if l.fan.is_some() {
        let routes = relay::Routes {
            takes: takes
                .iter()
                .map(|t| taking.iter().map(|&k| t[k]).collect())
                .collect(),
        };
        let dsts: Vec<&mut Client> = rcvs
            .iter_mut()
            .enumerate()
            .filter(|(k, _)| taking.contains(k))
            .filter_map(|(_, r)| r.as_mut())
            .collect();
        let fanned = relay::fan_out(src, dsts, &routes, listen);
        for (i, &k) in taking.iter().enumerate() {
            took[k].received = fanned.received[i];
            if let Some(e) = fanned.failed[i].clone() {
                drop_target(shared, k, e);
            }
        }
        fanned.ended
    } else {
        let rcv = rcvs.first_mut().and_then(Option::as_mut);
        relay::follow(src, rcv, listen)
    }
    .map_err(|e| StreamFailure::new(e, false))
}

/// Whether target `k` of a fan-out dropped out.
pub(super) fn dropped(shared: &Shared<'_>, k: usize) -> bool {
    shared
        .dropped
        .lock()
        .map_or(true, |d| d.get(k).is_some_and(Option::is_some))
}

/// Have each of the lane's receiving agents (of targets still in) take
/// the part; the targets that do.
fn start_receivers(
    l: &Lanes<'_>,
    shared: &Shared<'_>,
    lane: u32,
    rcvs: &mut [Option<Client>],
    maps: Option<&[Vec<StreamEntry>]>,
) -> std::result::Result<Vec<usize>, StreamFailure> {
    let mut taking = Vec::new();
    for (k, r) in rcvs.iter_mut().enumerate() {
        let Some(r) = r.as_mut().filter(|_| !dropped(shared, k)) else {
            continue;
        };
        let map = maps.map(|m| m[k].clone());
        match r.start_receive(
            &l.plan.target.venv,
            l.targets[k].generation,
            Some(lane),
            map,
        ) {
            Ok(()) => taking.push(k),
            Err(e) if l.fan.is_some() => drop_target(shared, k, e),
            Err(e) => return Err(StreamFailure::new(e, r.lost())),
        }
    }
    Ok(taking)
}

/// A lane's progress within its part, added to what every lane finished.
fn lane_progress(shared: &Shared<'_>, lane: u32, p: &Progress) {
    let Ok(mut all) = shared.progress.lock() else {
        return;
    };
    if let Some(slot) = all.get_mut(lane as usize) {
        *slot = *p;
    }
    let (files, bytes) = shared.done_bytes.lock().map_or((0, 0), |d| *d);
    shared.meter.update(&Progress {
        files: files + all.iter().map(|p| p.files).sum::<u64>(),
        bytes: bytes + all.iter().map(|p| p.bytes).sum::<u64>(),
        total_files: shared.totals.0,
        total_bytes: shared.totals.1,
    });
}

/// A lane's part ended: its bytes count as done, its progress starts over.
fn lane_finished(shared: &Shared<'_>, lane: u32, files: u64, bytes: u64) {
    let Ok(mut all) = shared.progress.lock() else {
        return;
    };
    if let Some(slot) = all.get_mut(lane as usize) {
        *slot = Progress::default();
    }
    if let Ok(mut d) = shared.done_bytes.lock() {
        d.0 += files;
        d.1 += bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;

    fn file(index: usize) -> SendFile {
        SendFile {
            index,
            path: format!("f{index}"),
            kind: Kind::File {
                size: 10,
                mode: 0o644,
                blake3: None,
                stamp: None,
            },
        }
    }

    /// A union of 4 files for 2 targets: 0 and 1 both need, 2 only the
    /// first, 3 only the second.
    fn fan() -> FanMaps {
        let (t, f) = (true, false);
        let skip = StreamEntry::Skip { size: 10 };
        FanMaps {
            takers: vec![vec![t, t], vec![t, t], vec![t, f], vec![f, t]],
            maps: vec![
                vec![
                    StreamEntry::Take(7),
                    StreamEntry::Take(8),
                    StreamEntry::Take(9),
                    skip.clone(),
                ],
                vec![
                    StreamEntry::Take(0),
                    StreamEntry::Take(1),
                    skip,
                    StreamEntry::Take(2),
                ],
            ],
        }
    }

    #[test]
    fn a_fan_out_part_is_cut_where_its_takers_change_and_indexed_within_it() {
        let fan = fan();
        // Out of the union's order, as a part can come from the queue.
        let cut = cut_for(Some(&fan), vec![file(3), file(0), file(2)]);
        let index: Vec<(usize, &str)> = cut.files.iter().map(|f| (f.index, &*f.path)).collect();
        assert_eq!(index, [(0, "f0"), (1, "f2"), (2, "f3")]);
        assert_eq!(cut.cuts, [0, 1, 2]);
        let (t, f) = (true, false);
        assert_eq!(
            cut.takes,
            [vec![t, t], vec![t, f], vec![f, t], vec![t, t]],
            "each segment's takers, then the end-of-archive blocks for all"
        );
        let maps = cut.maps.unwrap();
        assert_eq!(maps[0][..2], [StreamEntry::Take(7), StreamEntry::Take(9)]);
        assert_eq!(maps[1][0], StreamEntry::Take(0));
        assert_eq!(maps[1][2], StreamEntry::Take(2));
        // The source's hashes, by the part's index, as each target's changes.
        let hashes: Vec<SourceHash> = (0..3)
            .map(|i| SourceHash {
                index: i,
                blake3: format!("h{i}"),
            })
            .collect();
        let own: Vec<(usize, String)> = own_hashes(&hashes, &maps[1])
            .into_iter()
            .map(|h| (h.index, h.blake3))
            .collect();
        assert_eq!(own, [(0, "h0".into()), (2, "h2".into())]);
    }

    #[test]
    fn a_part_every_target_takes_whole_is_not_cut() {
        let fan = fan();
        let cut = cut_for(Some(&fan), vec![file(1), file(0)]);
        assert!(cut.cuts.is_empty() && cut.takes.is_empty());
        // A part only one target needs is still cut: the other takes only
        // the end of the archive.
        let cut = cut_for(Some(&fan), vec![file(2)]);
        assert_eq!(cut.cuts, [0]);
        assert_eq!(cut.takes, [vec![true, false], vec![true, true]]);
        // One target: the part as it is.
        let cut = cut_for(None, vec![file(5), file(4)]);
        let index: Vec<usize> = cut.files.iter().map(|f| f.index).collect();
        assert_eq!(index, [5, 4]);
        assert!(cut.maps.is_none());
    }
}
