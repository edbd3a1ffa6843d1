//! One source's stream into the target's staging: connect the source, watch
//! the target from a second thread while this one follows the source
//! ([`stream`]), the stream itself over the relay or `--direct`, and the
//! streams of several sources into one stage (sets with `from`).

use crate::client::{Client, DirectTo, SendRequest};
use crate::err;
use crate::error::{Error, ErrorKind, Result};
use crate::interrupt;
use crate::model::{Compression, LevelWindow, SendFile, ShebangRewrite, SourceHash, StreamWaits};
use crate::ops::{Observer, Step, endpoint, relay};
use crate::plan::{HostInfo, Plan};
use crate::transport::ConnectOptions;

use super::route::direct_jump;
use super::transfer::Moved;

/// How the stream gets from the source to the target's staging.
pub(super) enum Way<'a> {
    /// Through this machine: the source's data frames are relayed to the target.
    Relay,
    /// `--direct`: the source streams straight to the target (see
    /// `crate::transport::openssh`); this machine only follows the progress.
    Direct {
        dest: &'a str,
        generation: &'a str,
        /// The source's connect timeout to the target, in seconds.
        timeout: u64,
    },
}

/// A test hook: with `OVERLAY_TEST_PAUSE_AT=stream`, the stream waits at
/// its first event until Ctrl-C (at most two minutes), having created the
/// file `OVERLAY_TEST_PAUSE_MARK` to say it waits (tests/interrupt.rs).
pub fn pause_hook(point: &str) {
    if std::env::var("OVERLAY_TEST_PAUSE_AT").ok().as_deref() != Some(point) {
        return;
    }
    if let Some(mark) = std::env::var_os("OVERLAY_TEST_PAUSE_MARK") {
        let _ = std::fs::write(mark, b"paused\n");
    }
    let t = std::time::Instant::now();
    while !interrupt::requested() && t.elapsed() < std::time::Duration::from_secs(120) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// How often the target is looked at while this thread waits on the source.
pub(super) const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// A stream that failed, and whether an agent (or its connection) died:
/// the source's (then named in the error) or the target's (then `dst.lost()`).
pub struct StreamFailure {
    pub error: Error,
    pub died: bool,
}

impl StreamFailure {
    pub fn new(error: Error, died: bool) -> Self {
        StreamFailure { error, died }
    }
}

/// Have the source stream `files` into the target's staging by `route`.
///
/// While this thread waits on the source, another looks at the target (over
/// `--direct` the controller reads nothing from it until the source is
/// done): if it dies, the source's connection is cut, which ends the wait
/// and tells the source agent to stop. A source that dies ends the wait by
/// itself (its channel ends); the caller then tells the target to abort.
pub(super) fn stream(
    (plan, part): (&Plan, Part<'_>),
    opts: &ConnectOptions,
    dst: &mut Client,
    files: Vec<SendFile>,
    compression: Compression,
    route: Way<'_>,
    obs: &dyn Observer,
) -> std::result::Result<Moved, StreamFailure> {
    let src = connect_source(part.source, opts, obs)?;
    stream_from(src, (plan, part), dst, files, compression, route, obs)
}

/// Start the agent on the stream's source.
pub fn connect_source(
    source: &HostInfo,
    opts: &ConnectOptions,
    obs: &dyn Observer,
) -> std::result::Result<Client, StreamFailure> {
    let connecting = obs.step(Step::Connect, &source.name);
    let src = Client::connect(
        &source.name,
        &endpoint(source),
        source.sudo.as_deref(),
        opts,
    )
    .map_err(|e| StreamFailure::new(e, false))?;
    connecting.finish();
    Ok(src)
}

/// [`stream`] from a source already connected.
pub(super) fn stream_from(
    mut src: Client,
    (plan, part): (&Plan, Part<'_>),
    dst: &mut Client,
    files: Vec<SendFile>,
    compression: Compression,
    route: Way<'_>,
    obs: &dyn Observer,
) -> std::result::Result<Moved, StreamFailure> {
    let (Some(src_watch), Some(dst_watch)) = (src.watch(), dst.watch()) else {
        let e = err!(
            kind = Connection,
            "The agent on {} is gone",
            plan.target.name
        );
        return Err(StreamFailure::new(e, dst.lost()));
    };
    let dst_died = std::sync::atomic::AtomicBool::new(false);
    let result = std::thread::scope(|scope| {
        // Dropped when the stream ends, which ends the watch at once.
        let (done, stop) = std::sync::mpsc::channel::<()>();
        let (dst_watch, src_watch, dst_died) = (&dst_watch, &src_watch, &dst_died);
        scope.spawn(move || {
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                stop.recv_timeout(WATCH_EVERY)
            {
                if dst_watch.gone().is_some() {
                    dst_died.store(true, std::sync::atomic::Ordering::Relaxed);
                    src_watch.cut();
                    break;
                }
            }
        });
        let r = relay((plan, part), dst, &mut src, files, compression, route, obs);
        drop(done);
        r
    });
    if dst_died.into_inner() || dst.lost() {
        // The target died: say how (it is gone, so this does not wait);
        // the source, whose connection is cut, is left to stop by itself.
        let e = match result {
            Err(e) if dst.lost() => e,
            _ => dst.dead(),
        };
        src_watch.cut();
        return Err(StreamFailure::new(e, true));
    }
    if matches!(&result, Err(e) if e.kind == ErrorKind::Interrupted) {
        // Ctrl-C: the source stops at its next write (or, over --direct,
        // its next progress report), and tells its receiver to abort.
        src_watch.cut();
    }
    match result {
        // Everything was sent and staged: a source that fails its goodbye
        // still fails the apply, which the target then aborts.
        Ok(r) => src
            .close()
            .map(|()| r)
            .map_err(|e| StreamFailure::new(e, true)),
        Err(e) => {
            let died = src.lost();
            Err(StreamFailure::new(e, died))
        }
    }
}

/// The stream itself, on this thread: start it on the source (and, relayed,
/// on the target), then follow the source's events until it has sent
/// everything ([`relay::follow`], which passes data frames on to the target
/// from a second thread), and have the target confirm what it staged.
pub(super) fn relay(
    (plan, part): (&Plan, Part<'_>),
    dst: &mut Client,
    src: &mut Client,
    files: Vec<SendFile>,
    compression: Compression,
    route: Way<'_>,
    obs: &dyn Observer,
) -> Result<Moved> {
    let send = SendRequest {
        venv: part.source.venv.clone(),
        files,
        cuts: Vec::new(),
        shebang: Some(ShebangRewrite {
            from: part.source.venv.clone(),
            to: plan.target.venv.clone(),
        }),
        compression,
    };
    let relayed = matches!(route, Way::Relay);
    match route {
        Way::Relay => {
            src.start_send(send)?;
            if part.first {
                dst.start_stage(None)?;
            }
        }
        Way::Direct {
            dest,
            generation,
            timeout,
        } => {
            let to = DirectTo {
                ssh: dest.to_string(),
                proxy_jump: direct_jump(plan),
                agent: dst.agent_exe().to_string(),
                target_venv: plan.target.venv.clone(),
                generation: generation.to_string(),
                connect_timeout_secs: timeout,
                lane: None,
            };
            src.start_send_direct(send, to)?;
        }
    }
    let (from, to) = (&part.source.name, &plan.target.name);
    let meter = obs.step(
        Step::Stream,
        &if relayed {
            format!("{from} -> {to}")
        } else {
            format!("{from} -> {to} (direct)")
        },
    );
    let relay::Ended { sent, written } = relay::follow(
        src,
        relayed.then_some(&mut *dst),
        relay::Listener {
            first: &mut || pause_hook("stream"),
            progress: &mut |p| meter.update(p),
        },
    )?;
    show_windows(obs, &sent.windows);
    meter.finish();
    if interrupt::requested() {
        return Err(err!(kind = Interrupted, "interrupted"));
    }
    // The relay's end of stream, or the direct route's report of what it staged.
    let mut waits = StreamWaits {
        source: sent.waits,
        target: sent.target_waits,
    };
    if relayed {
        let mut hashes = part.hashes.take();
        hashes.extend(sent.hashes);
        if part.last {
            waits.target = dst.end_stage(hashes)?.waits;
        } else {
            part.hashes.set(hashes);
        }
    } else {
        dst.staged_direct(sent.hashes, written)?;
    }
    show_waits(obs, &waits);
    Ok(Moved {
        raw: sent.raw_bytes,
        sent: sent.packed_bytes,
        local: false,
        waits: Some(waits),
    })
}

/// One source's stream in a stage that several sources share (sets with
/// `from`): the target takes the streams one after another as one stage,
/// opened by the first and closed by the last with every source's hashes.
#[derive(Clone, Copy)]
pub(super) struct Part<'a> {
    pub(super) source: &'a HostInfo,
    pub(super) first: bool,
    pub(super) last: bool,
    /// The hashes of the streams before this one, for the last to hand over.
    pub(super) hashes: &'a std::cell::Cell<Vec<SourceHash>>,
}

impl<'a> Part<'a> {
    /// The one stream of a stage.
    pub(super) fn whole(
        source: &'a HostInfo,
        hashes: &'a std::cell::Cell<Vec<SourceHash>>,
    ) -> Self {
        Part {
            source,
            first: true,
            last: true,
            hashes,
        }
    }
}

/// The files to send, source by source, when some sets come from a folder
/// ([`crate::plan::SetPlan::from`]); `None` when all come from the plan's source.
pub(super) fn by_source<'p>(
    plan: &'p Plan,
    send: &[SendFile],
) -> Option<Vec<(&'p HostInfo, Vec<SendFile>)>> {
    if plan.sets.iter().all(|s| s.from.is_none()) {
        return None;
    }
    // The source of each change index, in `gen_changes`' order.
    let mut source_of: Vec<&HostInfo> = Vec::new();
    for set in &plan.sets {
        let src = set.from.as_ref().unwrap_or(&plan.source);
        source_of.extend(std::iter::repeat_n(
            src,
            set.changes.len() + set.stale_bytecode.len(),
        ));
    }
    let mut parts: Vec<(&HostInfo, Vec<SendFile>)> = Vec::new();
    for f in send {
        let src = source_of.get(f.index).copied().unwrap_or(&plan.source);
        match parts.iter_mut().find(|(s, _)| *s == src) {
            Some((_, files)) => files.push(f.clone()),
            None => parts.push((src, vec![f.clone()])),
        }
    }
    Some(parts)
}

/// Relay each source's files in turn into one stage of the target.
pub(super) fn stream_parts(
    plan: &Plan,
    opts: &ConnectOptions,
    dst: &mut Client,
    parts: Vec<(&HostInfo, Vec<SendFile>)>,
    compression: Compression,
    obs: &dyn Observer,
) -> std::result::Result<Moved, StreamFailure> {
    let hashes = std::cell::Cell::new(Vec::new());
    let n = parts.len();
    let mut total = Moved::default();
    for (i, (source, files)) in parts.into_iter().enumerate() {
        let part = Part {
            source,
            first: i == 0,
            last: i + 1 == n,
            hashes: &hashes,
        };
        let m = stream((plan, part), opts, dst, files, compression, Way::Relay, obs)?;
        total.raw += m.raw;
        total.sent += m.sent;
        if let Some(w) = m.waits {
            total.waits.get_or_insert_default().add(&w);
        }
    }
    Ok(total)
}

/// For `-vv`: where both ends spent the stream (see [`StreamWaits`]).
/// The target's figures of a stream from several sources come with the
/// last one.
pub(super) fn show_waits(obs: &dyn Observer, w: &StreamWaits) {
    let (s, t) = (&w.source, &w.target);
    let mut line = format!(
        "stream waits: source {:.2} s, of it blocked on the connection {:.2} s, waiting for packed blocks {:.2} s",
        s.secs, s.sink_secs, s.starved_secs
    );
    if t.secs > 0.0 {
        line += &format!(
            "; target {:.2} s, of it waiting for input {:.2} s, decompressing {:.2} s, waiting for the unpacker {:.2} s (the unpacker waiting for the disk {:.2} s), fsyncs after the last byte {:.2} s",
            t.secs, t.input_secs, t.decode_secs, t.behind_secs, t.disk_secs, t.durable_secs
        );
    }
    obs.detail(&line);
}

/// For `-vv`: the levels `--compress auto` measured, window by window.
pub fn show_windows(obs: &dyn Observer, windows: &[LevelWindow]) {
    if !windows.is_empty() {
        let w: Vec<String> = windows
            .iter()
            .map(|w| {
                format!(
                    "{}:{:.0}:{:.0}%:{:.2}",
                    w.level,
                    w.bytes_per_sec / 1e6,
                    w.blocked * 100.0,
                    w.ratio
                )
            })
            .collect();
        obs.detail(&format!(
            "compression windows (level:MB/s of files:blocked on the link:ratio): {}",
            w.join(" ")
        ));
    }
}
