//! A stream over several SSH connections ("lanes"), on the relay and on
//! `--direct`: one OpenSSH connection is one `sshd` process, so one core
//! for its cipher at each end; on a fast link between hosts with cores to
//! spare that, not the link or the disks, bounds one stream
//! (docs/apply.md, "Connections").
//!
//! [`stream_auto`] connects the source and decides how many lanes
//! ([`lane_count`]): one, and the stream is the one-connection stream of
//! `super::stream`, unchanged; more, and [`lanes`] cuts the files into
//! parts of about equal bytes (the biggest files first, each into the
//! part with the fewest bytes so far, so that one 1 GB library does not
//! leave the other lanes idle), opens the generation to that many lanes
//! on the target (`OpenLanes`), and runs one thread per lane: its own
//! source agent (its own connection) and, relayed, its own receiving agent
//! on the target (`Receive` with its lane), taking parts from a shared
//! queue until none is left. The target's own agent, which holds the lock,
//! then checks what all lanes staged together (`StagedDirect`), as after
//! one direct stream: one generation, one journal, the same checks.
//!
//! A plan of several targets that share one read of the source
//! (`crate::fleet`'s fan-out) streams the same way ([`stream_fanned`]):
//! each lane's receiving agents are one per target, each part is sent as a
//! small shared stream of its own (`part`: segments by who takes them,
//! each target's map of the part's entries), and a target that fails on
//! any lane drops out while the others go on.
//!
//! With `--connections auto` a first part (up to [`PROBE_MAX`] bytes) goes
//! alone, on the first lane, uncompressed, as a probe: only if it moved at
//! least [`FAST_LINK`] bytes a second on the wire do the other lanes
//! connect and join; on a slower link
//! one connection fills it, the others never connect and the first
//! takes the rest as one stream, so its compression tuner sees the link as
//! it did before.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::client::Client;
use crate::err;
use crate::error::Error;
use crate::model::{
    Compression, Connections, Kind, LevelWindow, Progress, SendFile, SendWaits, SourceHash,
    StageWaits, StreamEntry, StreamWaits, Written,
};
use crate::ops::{Meter, Observer, Step, endpoint};
use crate::plan::{HostInfo, Plan};

use super::ApplyOptions;
use super::stream::{
    Part, StreamFailure, Way, connect_source, show_waits, show_windows, stream_from,
};
use super::transfer::Moved;

mod part;
pub use part::own_hashes;
use part::{PartDone, send_part};

/// The most lanes `auto` opens.
const AUTO_MAX: u32 = 8;
/// Below this many bytes to send, one connection (a lane's start costs more
/// than it can save).
const AUTO_MIN_BYTES: u64 = 512 << 20;
/// Each lane takes about this many bytes, at least, under `auto`.
const AUTO_BYTES_PER_LANE: u64 = 128 << 20;
/// Bytes a second on the wire, in the probe (sent uncompressed under
/// `--compress auto`), above which the link is fast enough for more
/// connections to help: 1.2 Gbit/s, past what a 1 Gbit/s link carries
/// (one connection fills it), and well below what one OpenSSH connection
/// moves on a server core (0.4–1 GB/s).
pub const FAST_LINK: f64 = 150e6;
/// The most bytes the probe takes.
const PROBE_MAX: u64 = 128 << 20;
/// The error of a lane that stopped because another failed (not reported).
const STOPPED: &str = "another connection of the stream failed";
/// Parts per lane: more evens out lanes that go at different speeds.
const PARTS_PER_LANE: usize = 3;

/// How many lanes, and why (for `-v`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneCount {
    pub count: u32,
    /// `auto`: the others wait for the probe's verdict.
    pub probe: bool,
    pub why: String,
}

/// The cores at each end (0: unknown); `here` only on the relay, whose
/// controller passes every byte on.
#[derive(Debug, Clone, Copy)]
pub struct Cores {
    pub src: u32,
    pub dst: u32,
    pub here: Option<u32>,
}

/// How many lanes a stream of `bytes` takes: `--connections N`, or under
/// `auto` half the fewest cores of the machines that carry it (each lane
/// costs a core for the cipher at each end, and as much again for reading,
/// packing and writing), at most [`AUTO_MAX`], at most one per
/// [`AUTO_BYTES_PER_LANE`], one below [`AUTO_MIN_BYTES`].
pub fn lane_count(setting: Connections, cores: Cores, bytes: u64) -> LaneCount {
    if let Connections::Fixed(n) = setting {
        return LaneCount {
            count: n,
            probe: false,
            why: "--connections".into(),
        };
    }
    let fewest = [Some(cores.src), Some(cores.dst), cores.here]
        .into_iter()
        .flatten()
        .map(|c| if c == 0 { 1 } else { c })
        .min()
        .unwrap_or(1);
    let by_bytes = (bytes / AUTO_BYTES_PER_LANE).min(u64::from(AUTO_MAX)) as u32;
    let count = if bytes < AUTO_MIN_BYTES {
        1
    } else {
        (fewest / 2).clamp(1, AUTO_MAX).min(by_bytes.max(1))
    };
    let here = cores.here.map_or(String::new(), |h| format!(", {h} here"));
    LaneCount {
        count,
        probe: true,
        why: format!(
            "auto: {} cores at the source, {} at the target{here}, {} MB to send",
            cores.src,
            cores.dst,
            bytes / 1_000_000
        ),
    }
}

/// A test hook: `OVERLAY_TEST_CORES=N` has `auto` count N cores at every
/// end, so that a machine of few cores can exercise the probe
/// (benches/run's 1 Gbit/s phase; docs/generations.md, "Test hooks").
fn test_cores() -> Option<Cores> {
    let n = std::env::var("OVERLAY_TEST_CORES").ok()?.parse().ok()?;
    Some(Cores {
        src: n,
        dst: n,
        here: Some(n),
    })
}

impl Cores {
    /// The cores the agents reported at each end, and this machine's if it
    /// relays (or the test hook's).
    pub fn of(src: u32, dst: u32, relayed: bool) -> Cores {
        let here = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        test_cores().unwrap_or(Cores {
            src,
            dst,
            here: relayed.then_some(here),
        })
    }
}

/// The stream of `files` to the target's staging by `route`, over as many
/// connections as [`lane_count`] says.
pub(super) fn stream_auto(
    plan: &Plan,
    opts: &ApplyOptions,
    (dst, generation): (&mut Client, &str),
    files: Vec<SendFile>,
    compression: Compression,
    route: Way<'_>,
    obs: &dyn Observer,
) -> std::result::Result<Moved, StreamFailure> {
    let src = connect_source(&plan.source, &opts.connect, obs)?;
    let cores = Cores::of(src.cores(), dst.cores(), matches!(route, Way::Relay));
    let bytes = files.iter().map(size).sum();
    let lanes_n = lane_count(opts.connections, cores, bytes);
    let hashes = std::cell::Cell::new(Vec::new());
    if lanes_n.count <= 1 || files.len() < 2 {
        let part = Part::whole(&plan.source, &hashes);
        return stream_from(src, (plan, part), dst, files, compression, route, obs);
    }
    obs.note(&format!(
        "the stream takes up to {} connections ({})",
        lanes_n.count, lanes_n.why
    ));
    let agent = dst.agent_exe().to_string();
    let targets = [LaneTarget {
        host: &plan.target,
        generation,
    }];
    let totals = (files.len() as u64, bytes);
    dst.open_lanes(lanes_n.count)
        .map_err(|e| StreamFailure::new(e, dst.lost()))?;
    let l = Lanes {
        plan,
        opts,
        compression,
        route: &route,
        targets: &targets,
        fan: None,
        agent: &agent,
        obs,
    };
    let end = lanes(&l, src, files, &lanes_n, totals)?;
    let mut took = end.targets.into_iter().next().unwrap_or_default();
    if let Some(e) = took.failed.take() {
        return Err(StreamFailure::new(e, dst.lost()));
    }
    dst.staged_direct(took.hashes, took.written)
        .map_err(|e| StreamFailure::new(e, dst.lost()))?;
    let waits = StreamWaits {
        source: end.source,
        target: took.waits,
    };
    show_waits(obs, &waits);
    Ok(Moved {
        raw: end.raw,
        sent: end.sent,
        local: false,
        waits: Some(waits),
    })
}

/// The stream of a share group's union (`crate::fleet`'s fan-out) over
/// several connections: each lane's source agent streams its parts once,
/// and the controller passes each segment on to that lane's receiving
/// agents of the targets that need it, as one connection's fan-out does.
/// The caller opened every target's generation to `n` lanes and checks
/// what each staged ([`LanesEnd::targets`]). `Err`: the source's side
/// failed, and with it every target.
pub fn stream_fanned(
    (plan, opts): (&Plan, &ApplyOptions),
    src: Client,
    targets: &[LaneTarget<'_>],
    (files, fan): (Vec<SendFile>, &FanMaps),
    (compression, n, agent): (Compression, &LaneCount, &str),
    obs: &dyn Observer,
) -> std::result::Result<LanesEnd, StreamFailure> {
    let totals = (files.len() as u64, files.iter().map(size).sum());
    obs.note(&format!(
        "the stream takes up to {} connections ({})",
        n.count, n.why
    ));
    let l = Lanes {
        plan,
        opts,
        compression,
        route: &Way::Relay,
        targets,
        fan: Some(fan),
        agent,
        obs,
    };
    lanes(&l, src, files, n, totals)
}

/// One target of a stream over lanes: its host and the generation its
/// lanes fill.
pub struct LaneTarget<'a> {
    pub host: &'a HostInfo,
    pub generation: &'a str,
}

/// How the targets of a fan-out take the union's files: by the files'
/// index (their place in the union), which targets need each file, and,
/// per target, the entry each file is for it.
pub struct FanMaps {
    pub takers: Vec<Vec<bool>>,
    pub maps: Vec<Vec<StreamEntry>>,
}

/// What the lanes moved: the source's side, summed, and each target's.
pub struct LanesEnd {
    /// Bytes of the files read, and on the wire from the source.
    pub raw: u64,
    pub sent: u64,
    pub source: SendWaits,
    /// In the order of the targets given.
    pub targets: Vec<TargetTook>,
}

/// What one target took of a stream over lanes: the source's hashes of
/// its files (as its changes), what its receiving agents wrote, the bytes
/// passed on to it and where its side waited; or, in a fan-out, why it
/// dropped out (the others went on).
#[derive(Debug, Default)]
pub struct TargetTook {
    pub hashes: Vec<SourceHash>,
    pub written: Vec<Written>,
    pub received: u64,
    pub waits: StageWaits,
    pub failed: Option<Error>,
}

impl TargetTook {
    fn add(&mut self, o: TargetTook) {
        self.hashes.extend(o.hashes);
        self.written.extend(o.written);
        self.received += o.received;
        self.waits.add(&o.waits);
    }
}

/// What every lane shares.
struct Lanes<'a> {
    /// The source, the target venv's path (the same for every target) and,
    /// on the direct route, the target's jump host.
    plan: &'a Plan,
    opts: &'a ApplyOptions,
    compression: Compression,
    route: &'a Way<'a>,
    targets: &'a [LaneTarget<'a>],
    /// A fan-out's union: parts are cut into segments by who takes them.
    fan: Option<&'a FanMaps>,
    /// The target's agent executable (for the direct route's ssh).
    agent: &'a str,
    obs: &'a dyn Observer,
}

/// What one lane moved: the source's side, and each target's.
#[derive(Default)]
struct LaneDone {
    raw: u64,
    sent: u64,
    source: SendWaits,
    targets: Vec<TargetTook>,
    parts: usize,
    windows: Vec<LevelWindow>,
}

impl LaneDone {
    /// A part this lane sent.
    fn add(&mut self, one: PartDone) {
        self.merge(LaneDone {
            raw: one.raw,
            sent: one.sent,
            source: one.source,
            targets: one.targets,
            parts: 1,
            windows: one.windows,
        });
    }

    /// Another lane's figures (or a part's) added to these.
    fn merge(&mut self, o: LaneDone) {
        self.raw += o.raw;
        self.sent += o.sent;
        self.source.add(&o.source);
        if self.targets.len() < o.targets.len() {
            self.targets
                .resize_with(o.targets.len(), TargetTook::default);
        }
        for (t, o) in self.targets.iter_mut().zip(o.targets) {
            t.add(o);
        }
        self.parts += o.parts;
        self.windows.extend(o.windows);
    }
}

/// The parts still to send, and whether the lanes after the first may take
/// them (`None`: the probe has not ended yet).
struct Queue {
    parts: VecDeque<Vec<SendFile>>,
    open: Option<bool>,
    failed: bool,
}

/// The shared state of the lanes: the queue (with its condition, on which
/// lanes wait for the probe's verdict), the progress of each, the targets
/// of a fan-out that dropped out, and the connections to cut when one
/// fails.
struct Shared<'m> {
    queue: Mutex<Queue>,
    ready: std::sync::Condvar,
    progress: Mutex<Vec<Progress>>,
    done_bytes: Mutex<(u64, u64)>,
    totals: (u64, u64),
    meter: &'m dyn Meter,
    cut: Mutex<Vec<crate::transport::Watch>>,
    stop: AtomicBool,
    /// Per target of a fan-out: why it dropped out (it failed on some
    /// lane, and takes no further part).
    dropped: Mutex<Vec<Option<Error>>>,
}

fn lanes(
    l: &Lanes<'_>,
    src0: Client,
    files: Vec<SendFile>,
    n: &LaneCount,
    totals: (u64, u64),
) -> std::result::Result<LanesEnd, StreamFailure> {
    let (probe, files) = if n.probe {
        take_probe(files, totals.1 / (u64::from(n.count) * 4))
    } else {
        (Vec::new(), files)
    };
    let mut parts = cut_parts(files, n.count as usize * PARTS_PER_LANE);
    // The biggest parts first, so that none is left for last; the probe
    // before them all.
    parts.sort_by_key(|p| std::cmp::Reverse(p.iter().map(size).sum::<u64>()));
    if !probe.is_empty() {
        parts.insert(0, probe);
    }
    let meter = l.obs.step(Step::Stream, &stream_label(l));
    let shared = Shared {
        queue: Mutex::new(Queue {
            parts: parts.into(),
            open: (!n.probe).then_some(true),
            failed: false,
        }),
        ready: std::sync::Condvar::new(),
        progress: Mutex::new(vec![Progress::default(); n.count as usize]),
        done_bytes: Mutex::new((0, 0)),
        totals,
        meter: &*meter,
        cut: Mutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        dropped: Mutex::new(l.targets.iter().map(|_| None).collect()),
    };
    let results: Vec<std::result::Result<LaneDone, StreamFailure>> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        let mut src0 = Some(src0);
        for lane in 0..n.count {
            let (shared, first) = (&shared, src0.take());
            handles.push(s.spawn(move || run_lane(l, shared, lane, first)));
        }
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(StreamFailure::new(
                        err!(kind = Internal, "a lane of the stream panicked"),
                        false,
                    ))
                })
            })
            .collect()
    });
    meter.finish();
    let mut total = LaneDone::default();
    total
        .targets
        .resize_with(l.targets.len(), TargetTook::default);
    let mut lanes_used = 0;
    let mut failure: Option<StreamFailure> = None;
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(d) => {
                if d.parts > 0 {
                    lanes_used += 1;
                    show_lane(l.obs, i, &d);
                    show_windows(l.obs, &d.windows);
                }
                total.merge(d);
            }
            // A lane that stopped because another failed says nothing more.
            Err(f) if f.error.message == STOPPED => {}
            // Ctrl-C is the cause wherever it was seen; else the first failure.
            Err(f) if failure.is_none() || f.error.kind == crate::error::ErrorKind::Interrupted => {
                failure = Some(f)
            }
            Err(_) => {}
        }
    }
    if let Some(f) = failure {
        return Err(f);
    }
    l.obs
        .note(&format!("the stream took {lanes_used} connections"));
    let dropped = shared.dropped.into_inner().unwrap_or_default();
    for (t, why) in total.targets.iter_mut().zip(dropped) {
        t.failed = why;
    }
    Ok(LanesEnd {
        raw: total.raw,
        sent: total.sent,
        source: total.source,
        targets: total.targets,
    })
}

/// The stream step's label: `src -> dst`, `(direct)`, or every target.
fn stream_label(l: &Lanes<'_>) -> String {
    let names: Vec<&str> = l.targets.iter().map(|t| t.host.name.as_str()).collect();
    let direct = matches!(l.route, Way::Direct { .. });
    format!(
        "{} -> {}{}",
        l.plan.source.name,
        names.join(", "),
        if direct { " (direct)" } else { "" }
    )
}

/// One lane: its connections (the first lane's source is already
/// connected), then parts from the queue until none is left.
fn run_lane(
    l: &Lanes<'_>,
    shared: &Shared<'_>,
    lane: u32,
    src: Option<Client>,
) -> std::result::Result<LaneDone, StreamFailure> {
    let r = lane_parts(l, shared, lane, src);
    if r.is_err() {
        // Stop the others: no lane takes another part, and their
        // connections are cut so that a part in flight ends now.
        shared.stop.store(true, Ordering::SeqCst);
        shared.queue.lock().map(|mut q| q.failed = true).ok();
        shared.ready.notify_all();
        for w in shared.cut.lock().iter().flat_map(|v| v.iter()) {
            w.cut();
        }
    }
    r
}

fn lane_parts(
    l: &Lanes<'_>,
    shared: &Shared<'_>,
    lane: u32,
    src: Option<Client>,
) -> std::result::Result<LaneDone, StreamFailure> {
    // The other lanes connect only once the probe found the link fast: on
    // a slow one, logins would cost more than they could bring.
    if lane > 0 && !wait_open(shared, lane) {
        return Ok(LaneDone::default());
    }
    let (mut src, mut rcvs) = match connect_lane(l, shared, lane, src) {
        Ok(c) => c,
        // A host that takes fewer logins at once (sshd's MaxStartups, a
        // rate limit): the other lanes take this one's parts.
        Err(e) if lane > 0 => {
            l.obs.warn(&format!(
                "connection {} of the stream could not be opened ({}); the others carry its share",
                lane + 1,
                e.message.lines().next().unwrap_or_default()
            ));
            return Ok(LaneDone::default());
        }
        Err(e) => return Err(StreamFailure::new(e, false)),
    };
    if let Ok(mut cut) = shared.cut.lock() {
        cut.extend(src.watch());
        cut.extend(rcvs.iter().flatten().filter_map(Client::watch));
    }
    let mut done = LaneDone::default();
    while let Some(files) = next_part(shared, lane) {
        let started = Instant::now();
        // The probe measures what one connection carries as it is: under
        // `--compress auto` it goes uncompressed, so that the tuner's trials
        // (which slow the wire while they pack harder) do not make a fast
        // link look slow.
        let probing = lane == 0 && done.parts == 0 && shared.probing();
        let compression = match l.compression {
            Compression::Auto if probing => Compression::None,
            c => c,
        };
        let one = send_part(l, shared, lane, (&mut src, &mut rcvs), files, compression)?;
        if probing {
            judge_probe(l, shared, one.sent, started.elapsed().as_secs_f64());
        }
        done.add(one);
    }
    let mut closed = src.close();
    for (k, r) in rcvs.into_iter().enumerate() {
        // A target that dropped out may have lost its connection: its
        // error is already kept.
        if let Some(r) = r.filter(|_| !part::dropped(shared, k)) {
            closed = closed.and(r.close());
        }
    }
    if shared.stop.load(Ordering::SeqCst) {
        return Err(StreamFailure::new(
            err!(kind = Internal, "{STOPPED}"),
            false,
        ));
    }
    closed.map_err(|e| StreamFailure::new(e, true))?;
    Ok(done)
}

/// A lane's connections: its source agent (the first lane's is given)
/// and, relayed, its receiving agent on each target. In a fan-out, a
/// target the first lane cannot reach drops out (the others go on).
fn connect_lane(
    l: &Lanes<'_>,
    shared: &Shared<'_>,
    lane: u32,
    src: Option<Client>,
) -> crate::error::Result<(Client, Vec<Option<Client>>)> {
    let connect = |host: &HostInfo| {
        Client::connect(
            &host.name,
            &endpoint(host),
            host.sudo.as_deref(),
            &l.opts.connect,
        )
    };
    let src = match src {
        Some(c) => c,
        None => connect(&l.plan.source)?,
    };
    let mut rcvs = Vec::new();
    if matches!(l.route, Way::Relay) {
        for (k, t) in l.targets.iter().enumerate() {
            if part::dropped(shared, k) {
                rcvs.push(None);
                continue;
            }
            match connect(t.host) {
                Ok(c) => rcvs.push(Some(c)),
                Err(e) if l.fan.is_some() && lane == 0 => {
                    part::drop_target(shared, k, e);
                    rcvs.push(None);
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok((src, rcvs))
}

/// After the probe (the first part, on the first lane alone, `sent` bytes
/// on the wire in `secs`): open the queue to the other lanes if the link
/// is fast, else give the first lane the rest as one part.
fn judge_probe(l: &Lanes<'_>, shared: &Shared<'_>, sent: u64, secs: f64) {
    let Ok(mut q) = shared.queue.lock() else {
        return;
    };
    if q.open.is_some() {
        return;
    }
    let rate = sent as f64 / secs.max(1e-3);
    let fast = rate >= FAST_LINK;
    l.obs.note(&format!(
        "the first part moved {:.0} MB/s on the wire: {}",
        rate / 1e6,
        if fast {
            "the other connections join"
        } else {
            "one connection fills the link"
        }
    ));
    if !fast {
        let rest: Vec<SendFile> = q.parts.drain(..).flatten().collect();
        if !rest.is_empty() {
            q.parts.push_back(rest);
        }
    }
    q.open = Some(fast);
    shared.ready.notify_all();
}

impl Shared<'_> {
    /// The probe's verdict is still to come.
    fn probing(&self) -> bool {
        self.queue.lock().is_ok_and(|q| q.open.is_none())
    }
}

/// The probe: files in the plan's order, none bigger than `want` bytes
/// alone, until they hold `want` (at most [`PROBE_MAX`]); and the rest.
fn take_probe(files: Vec<SendFile>, want: u64) -> (Vec<SendFile>, Vec<SendFile>) {
    let want = want.clamp(1, PROBE_MAX);
    let (mut probe, mut rest) = (Vec::new(), Vec::new());
    let mut bytes = 0;
    for f in files {
        if bytes < want && size(&f) <= want {
            bytes += size(&f);
            probe.push(f);
        } else {
            rest.push(f);
        }
    }
    (probe, rest)
}

/// Wait until `lane` may go on: the first lane at once, the others once
/// the probe's verdict lets them (`false`: it did not, or the stream
/// stopped). Holds the queue's lock when it returns `true`.
fn wait_queue<'q>(shared: &'q Shared<'_>, lane: u32) -> Option<std::sync::MutexGuard<'q, Queue>> {
    let mut q = shared.queue.lock().ok()?;
    loop {
        if q.failed || shared.stop.load(Ordering::SeqCst) || crate::interrupt::requested() {
            return None;
        }
        match q.open {
            Some(false) if lane > 0 => return None,
            None if lane > 0 => {
                q = shared
                    .ready
                    .wait_timeout(q, std::time::Duration::from_millis(100))
                    .ok()?
                    .0;
            }
            _ => return Some(q),
        }
    }
}

/// Wait for the probe's verdict: may `lane` take parts?
fn wait_open(shared: &Shared<'_>, lane: u32) -> bool {
    wait_queue(shared, lane).is_some()
}

/// The next part for `lane`: the first lane takes the probe at once; the
/// others wait for the probe's verdict.
fn next_part(shared: &Shared<'_>, lane: u32) -> Option<Vec<SendFile>> {
    wait_queue(shared, lane)?.parts.pop_front()
}

/// For `-vv`: what one lane moved and where its ends waited.
fn show_lane(obs: &dyn Observer, lane: usize, d: &LaneDone) {
    let s = &d.source;
    let input: f64 = d.targets.iter().map(|t| t.waits.input_secs).sum();
    obs.detail(&format!(
        "connection {}: {} part{}, {:.0} MB of files, {:.0} MB on the wire; source {:.2} s, blocked on the connection {:.2} s; target waiting for input {:.2} s",
        lane + 1,
        d.parts,
        if d.parts == 1 { "" } else { "s" },
        d.raw as f64 / 1e6,
        d.sent as f64 / 1e6,
        s.secs,
        s.sink_secs,
        input
    ));
}

fn size(f: &SendFile) -> u64 {
    match f.kind {
        Kind::File { size, .. } => size,
        _ => 0,
    }
}

/// `files` cut into at most `n` parts of about equal bytes: the biggest
/// files first, each into the part with the fewest bytes so far; each
/// part then in the files' own order (the source reads them in it).
pub fn cut_parts(files: Vec<SendFile>, n: usize) -> Vec<Vec<SendFile>> {
    let n = n.clamp(1, files.len().max(1));
    let mut order: Vec<usize> = (0..files.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(size(&files[i])));
    let mut load = vec![0u64; n];
    let mut part_of = vec![0usize; files.len()];
    for i in order {
        let (p, _) = load
            .iter()
            .enumerate()
            .min_by_key(|(_, b)| **b)
            .unwrap_or((0, &0));
        load[p] += size(&files[i]).max(1);
        part_of[i] = p;
    }
    let mut parts: Vec<Vec<SendFile>> = vec![Vec::new(); n];
    for (i, f) in files.into_iter().enumerate() {
        parts[part_of[i]].push(f);
    }
    parts.retain(|p| !p.is_empty());
    parts
}

#[cfg(test)]
mod tests;
