//! `overlay apply [PLAN]`: carry out a saved plan on its target, streaming
//! the new files from its source through this controller, then switching
//! them in through the target's journal.
//!
//! If an agent or its connection dies on either host, the apply stops at
//! once (a thread watches the target while this one waits on the source)
//! and the error says where the target stands and what to run next.

use std::path::Path;
use std::time::Instant;

use indicatif::HumanBytes;
use overlay::client::Client;
use overlay::err;
use overlay::error::Result;
use overlay::plan::Plan;
use overlay::protocol::{Frame, Request, Response};

use crate::cli::{ApplyArgs, GlobalArgs};
use crate::commands::plan::connect_options;
use crate::progress::{HashBars, status};
use overlay::error::EXIT_OK;
use overlay::model::{
    Action, Compression, Endpoint, GenChange, LevelWindow, PrepareRequest, SendFile, ShebangRewrite,
};

pub fn load_plan(path: &Path) -> Result<Plan> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        err!(
            hint = "run `overlay plan SRC DST` first, or name the plan file",
            "Failed to read the plan {}: {}",
            path.display(),
            overlay::error::io_cause(&e)
        )
    })?;
    let plan: Plan = serde_json::from_str(&text).map_err(|e| {
        err!(
            hint = "run `overlay plan` again to make a fresh plan",
            "The plan {} is not a valid plan: {e}",
            path.display()
        )
    })?;
    if plan.format != overlay::plan::PLAN_FORMAT {
        return Err(err!(
            hint = "run `overlay plan` again with this version of overlay",
            "The plan {} has format {}, this overlay reads {}",
            path.display(),
            plan.format,
            overlay::plan::PLAN_FORMAT
        ));
    }
    Ok(plan)
}

pub fn endpoint(ssh: &Option<String>) -> Endpoint {
    ssh.clone().map_or(Endpoint::Local, Endpoint::Ssh)
}

/// The generation's change list: the plan's changes plus stale bytecode.
pub fn gen_changes(plan: &Plan) -> Vec<GenChange> {
    let mut out = Vec::new();
    for set in &plan.sets {
        for c in &set.changes {
            out.push(GenChange {
                path: c.path.clone(),
                action: c.action,
                source: c.source.clone(),
                target: c.target.clone(),
                bytecode: false,
                staged: None,
            });
        }
        for p in &set.stale_bytecode {
            out.push(GenChange {
                path: p.clone(),
                action: Action::Delete,
                source: None,
                target: None,
                bytecode: true,
                staged: None,
            });
        }
    }
    out
}

#[derive(serde::Serialize)]
struct ApplyJson {
    generation: Option<String>,
    recovered: Option<String>,
    files: u64,
    changes: u64,
    raw_bytes: u64,
    sent_bytes: u64,
    /// How the files travelled: "relay" (through this machine), "direct"
    /// (source to target, `--direct`), or null when none were sent.
    route: Option<&'static str>,
    seconds: f64,
    backup: bool,
    /// With --verify: whether the check passed.
    verified: Option<bool>,
    /// With --rollback-on-failure: the generation was rolled back.
    rolled_back: bool,
}

pub fn run(global: &GlobalArgs, args: &ApplyArgs) -> Result<u8> {
    let started = Instant::now();
    let timing = |what: &str| {
        if global.verbose >= 2 {
            eprintln!(
                "timing: {what} done at {:.2}s",
                started.elapsed().as_secs_f64()
            );
        }
    };
    let plan = load_plan(&args.plan)?;
    let opts = connect_options(global);
    let tname = plan.target.name.clone();
    let mut dst = Client::connect(&tname, &endpoint(&plan.target.ssh), &opts)?;

    if args.resume {
        let r = dst.call(
            &Request::Recover {
                venv: plan.target.venv.clone(),
                resume: true,
            },
            &mut |_| {},
        )?;
        let outcome = match r {
            Response::Recovered { outcome } => outcome,
            other => return Err(err!("unexpected answer from {tname}: {other:?}")),
        };
        if args.json {
            println!("{}", serde_json::json!({ "resumed": outcome }));
        }
        match outcome {
            Some(o) => status(global, &format!("{tname}: {o}")),
            None => status(
                global,
                &format!("{tname}: no interrupted generation to resume"),
            ),
        }
        dst.close()?;
        return Ok(EXIT_OK);
    }

    if plan.strict && plan.new_problems() > 0 && !args.force {
        return Err(err!(
            hint = "fix what `overlay plan` predicts, or pass --force to apply anyway",
            "The plan predicts {} problem{} after the overlay and was made with --strict; {tname} is unchanged",
            plan.new_problems(),
            if plan.new_problems() == 1 { "" } else { "s" }
        ));
    }
    let direct = if args.direct {
        match plan.target.direct_ssh.clone().or(plan.target.ssh.clone()) {
            Some(d) => Some(d),
            None => {
                return Err(err!(
                    hint = "give the target an `ssh` or `direct_ssh` in the manifest, or apply without --direct",
                    "--direct needs an ssh destination for {tname}, which is this machine in the plan; {tname} is unchanged"
                ));
            }
        }
    } else {
        None
    };
    // Read the check before touching anything, so a missing [verify] fails early.
    let verify_req = if args.verify {
        // The manifest the plan was made from, if it is still there.
        let m = std::path::Path::new(&plan.manifest);
        let manifest = if m.exists() {
            m
        } else {
            global.manifest.as_path()
        };
        Some(crate::commands::verify::request(
            manifest,
            &plan.target.venv,
            600,
            None,
        )?)
    } else {
        None
    };
    let changes = gen_changes(&plan);
    if changes.is_empty() {
        if args.json {
            println!(
                "{}",
                serde_json::json!({ "generation": null, "changes": 0 })
            );
        }
        status(
            global,
            &format!("Nothing to apply: the plan has no changes for {tname}"),
        );
        dst.close()?;
        return Ok(EXIT_OK);
    }
    let req = PrepareRequest {
        venv: plan.target.venv.clone(),
        source: plan.source.name.clone(),
        target: tname.clone(),
        plan_created: plan.created,
        changes: changes.clone(),
        backup: args.backup,
        resume: false,
        same_owner: args.same_owner,
    };
    let prepared = dst.call(&Request::Prepare(Box::new(req)), &mut |_| {});
    let prepared = prepared.map_err(|e| fate(e, dst.lost(), Phase::Prepare, &tname, ""))?;
    let (generation, recovered) = match prepared {
        Response::Prepared {
            generation,
            recovered,
        } => (generation, recovered),
        other => return Err(err!("unexpected answer from {tname}: {other:?}")),
    };
    if let Some(r) = &recovered {
        status(global, &format!("{tname}: {r}"));
    }
    timing("connect and prepare");

    // Stream the added and replaced files from the source.
    let send: Vec<SendFile> = changes
        .iter()
        .enumerate()
        .filter(|(_, c)| c.action != Action::Delete)
        .filter_map(|(index, c)| {
            Some(SendFile {
                index,
                path: c.path.clone(),
                kind: c.source.clone()?,
            })
        })
        .collect();
    let (mut raw, mut sent) = (0u64, 0u64);
    if !send.is_empty() {
        let route = match &direct {
            None => Route::Relay,
            Some(dest) => Route::Direct {
                dest,
                generation: &generation,
                timeout: opts.timeout.as_secs(),
            },
        };
        let result = stream(
            global,
            &plan,
            &opts,
            &mut dst,
            send.clone(),
            args.compress,
            route,
        );
        match result {
            Ok((r, s)) => {
                raw = r;
                sent = s;
            }
            Err((e, died)) => {
                if dst.lost() {
                    return Err(fate(e, dst.lost(), Phase::Stream, &tname, &generation));
                }
                // The target is still there: it discards the generation now.
                let aborted = dst.call(&Request::Abort, &mut |_| {});
                if !died {
                    return Err(e);
                }
                return Err(match aborted {
                    Ok(Response::Aborted) => {
                        fate(e, dst.lost(), Phase::Aborted, &tname, &generation)
                    }
                    _ => fate(e, dst.lost(), Phase::Stream, &tname, &generation),
                });
            }
        }
    }
    timing(&format!("stream and stage ({})", HumanBytes(sent)));
    let switched = dst.call(&Request::Switch, &mut |_| {});
    match switched.map_err(|e| fate(e, dst.lost(), Phase::Switch, &tname, &generation))? {
        Response::Switched { .. } => {}
        other => return Err(err!("unexpected answer from {tname}: {other:?}")),
    }
    timing("switch and check");
    let committed = dst.call(
        &Request::Commit {
            keep_backup: args.backup,
            keep: args.keep,
        },
        &mut |_| {},
    );
    match committed.map_err(|e| fate(e, dst.lost(), Phase::Switch, &tname, &generation))? {
        Response::Committed { .. } => {}
        other => return Err(err!("unexpected answer from {tname}: {other:?}")),
    }
    timing("commit");
    let secs = started.elapsed().as_secs_f64();
    status(
        global,
        &format!(
            "Applied generation {generation} on {tname}: {} changes, {} files sent{}, {} on the wire for {} of files, in {secs:.1}s",
            changes.len(),
            send.len(),
            match (&direct, send.is_empty()) {
                (_, true) => String::new(),
                (Some(d), false) => format!(" directly from {} to {d:?}", plan.source.name),
                (None, false) => format!(" from {} through this machine", plan.source.name),
            },
            HumanBytes(sent),
            HumanBytes(raw),
        ),
    );
    let mut exit = EXIT_OK;
    let mut rolled_back = false;
    if let Some(mut req) = verify_req {
        req.generation = Some(generation.clone());
        // With --json, the check's output goes to stderr: stdout holds one JSON document.
        let failure =
            match crate::commands::verify::run_check(global, &mut dst, req, false, args.json) {
                Ok(report) if report.ok => None,
                Ok(report) => Some(
                    report
                        .final_line()
                        .unwrap_or("the check failed")
                        .to_string(),
                ),
                Err(e) => Some(format!("the check could not run: {}", e.message)),
            };
        if let Some(why) = failure {
            exit = overlay::error::ErrorKind::VerifyFailed.exit_code();
            if args.rollback_on_failure {
                match dst.call(
                    &Request::Rollback {
                        venv: plan.target.venv.clone(),
                        to: Some(generation.clone()),
                    },
                    &mut |_| {},
                )? {
                    Response::RolledBack(r) => {
                        rolled_back = true;
                        status(
                            global,
                            &format!(
                                "verify failed ({why}): rolled back generation {generation} on {tname} ({} files restored, {} removed, {} paths verified)",
                                r.restored, r.removed, r.verified
                            ),
                        );
                    }
                    other => return Err(err!("unexpected answer from {tname}: {other:?}")),
                }
            }
        }
    }
    dst.close()
        .map_err(|e| fate(e, true, Phase::Applied, &tname, &generation))?;
    if args.backup && !rolled_back {
        status(
            global,
            &format!("Roll back with `overlay rollback {tname}`."),
        );
    }
    if args.json {
        let doc = ApplyJson {
            generation: Some(generation.clone()),
            recovered,
            files: send.len() as u64,
            changes: changes.len() as u64,
            raw_bytes: raw,
            sent_bytes: sent,
            route: match (&direct, send.is_empty()) {
                (_, true) => None,
                (Some(_), false) => Some("direct"),
                (None, false) => Some("relay"),
            },
            seconds: started.elapsed().as_secs_f64(),
            backup: args.backup,
            verified: args.verify.then_some(exit == EXIT_OK),
            rolled_back,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("serializes")
        );
    }
    Ok(exit)
}

/// How the stream gets from the source to the target's staging.
enum Route<'a> {
    /// Through this machine: the source's data frames are relayed to the target.
    Relay,
    /// `--direct`: the source streams straight to the target (see
    /// `overlay::transport::openssh`); this machine only follows the progress.
    Direct {
        dest: &'a str,
        generation: &'a str,
        /// The source's connect timeout to the target, in seconds.
        timeout: u64,
    },
}

/// Where the apply stood when a host died: what the target is left with,
/// and what to run next.
#[derive(Clone, Copy)]
enum Phase {
    /// Before the generation was opened.
    Prepare,
    /// While the files were streaming (the target did not abort).
    Stream,
    /// While the files were streaming; the target then discarded the generation.
    Aborted,
    /// Switch or commit asked for, not answered.
    Switch,
    /// Committed; the goodbye failed.
    Applied,
}

/// An error of the apply, told with where it left the target when it says
/// an agent or its connection died (`lost`: the target's, or [`Phase::Aborted`]
/// for a source that died). Other errors are returned as they are.
fn fate(
    e: overlay::error::Error,
    lost: bool,
    phase: Phase,
    tname: &str,
    generation: &str,
) -> overlay::error::Error {
    if !lost && !matches!(phase, Phase::Aborted) {
        return e;
    }
    let (state, hint) = match phase {
        Phase::Prepare => (
            format!("nothing on {tname} was changed"),
            "run `overlay apply` again (a generation it may have opened is discarded first)"
                .to_string(),
        ),
        Phase::Stream => (
            format!(
                "the files were still streaming, so nothing on {tname} was changed; the next overlay command there discards generation {generation}"
            ),
            "run `overlay apply` again".to_string(),
        ),
        Phase::Aborted => (
            format!(
                "the files were still streaming, so nothing on {tname} was changed; it discarded generation {generation}"
            ),
            "run `overlay apply` again".to_string(),
        ),
        Phase::Switch => (
            format!(
                "the switch of generation {generation} on {tname} was interrupted; the next overlay command there rolls it back from its journal"
            ),
            format!(
                "run `overlay history {tname}` to roll it back and see where it stands, or `overlay apply --resume` to complete it"
            ),
        ),
        Phase::Applied => (
            format!("generation {generation} was applied on {tname}"),
            format!("roll it back with `overlay rollback {tname}` if it should not stay"),
        ),
    };
    overlay::error::Error {
        message: format!("{}; {state}", e.message),
        hint: Some(hint),
        ..e
    }
}

/// How often the target is looked at while this thread waits on the source.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Have the source stream `files` into the target's staging by `route`.
/// Returns the bytes of files and the bytes sent; an error says whether an
/// agent (or its connection) died: the source's (then named in the error)
/// or the target's (then `dst.lost()`).
///
/// While this thread waits on the source, another looks at the target (over
/// `--direct` the controller reads nothing from it until the source is
/// done): if it dies, the source's connection is cut, which ends the wait
/// and tells the source agent to stop. A source that dies ends the wait by
/// itself (its channel ends); the caller then tells the target to abort.
fn stream(
    global: &GlobalArgs,
    plan: &Plan,
    opts: &overlay::transport::ConnectOptions,
    dst: &mut Client,
    files: Vec<SendFile>,
    compression: Compression,
    route: Route<'_>,
) -> std::result::Result<(u64, u64), (overlay::error::Error, bool)> {
    let sname = plan.source.name.clone();
    let mut src =
        Client::connect(&sname, &endpoint(&plan.source.ssh), opts).map_err(|e| (e, false))?;
    let (Some(src_watch), Some(dst_watch)) = (src.watch(), dst.watch()) else {
        return Err((
            err!("The agent on {} is gone", plan.target.name),
            dst.lost(),
        ));
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
        let r = relay(global, plan, dst, &mut src, files, compression, route);
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
        return Err((e, true));
    }
    match result {
        // Everything was sent and staged: a source that fails its goodbye
        // still fails the apply, which the target then aborts.
        Ok(r) => src.close().map(|()| r).map_err(|e| (e, true)),
        Err(e) => {
            let died = src.lost();
            Err((e, died))
        }
    }
}

/// The stream itself, on this thread: start it on the source (and, relayed,
/// on the target), then follow the source's frames until it has sent
/// everything, and have the target confirm what it staged.
fn relay(
    global: &GlobalArgs,
    plan: &Plan,
    dst: &mut Client,
    src: &mut Client,
    files: Vec<SendFile>,
    compression: Compression,
    route: Route<'_>,
) -> Result<(u64, u64)> {
    let sname = plan.source.name.clone();
    let opts_timeout = match &route {
        Route::Direct { timeout, .. } => *timeout,
        Route::Relay => 0,
    };
    let venv = plan.source.venv.clone();
    let shebang = Some(ShebangRewrite {
        from: plan.source.venv.clone(),
        to: plan.target.venv.clone(),
    });
    let relay = matches!(route, Route::Relay);
    match route {
        Route::Relay => {
            src.request(&Request::Send {
                venv,
                files,
                shebang,
                compression,
            })?;
            dst.request(&Request::Stage)?;
        }
        Route::Direct {
            dest, generation, ..
        } => src.request(&Request::SendDirect {
            venv,
            files,
            shebang,
            compression,
            ssh: dest.to_string(),
            agent: dst.agent_exe().to_string(),
            target_venv: plan.target.venv.clone(),
            generation: generation.to_string(),
            connect_timeout_secs: opts_timeout,
        })?,
    }
    let bars = HashBars::new(global.quiet);
    let bar = bars.bar(if relay {
        "transfer"
    } else {
        "transfer (direct)"
    });
    let (raw, compressed, hashes, written) = loop {
        match src.next_frame()? {
            Frame::Data(d) if relay => dst.write_data(&d)?,
            Frame::Data(_) => {
                return Err(err!(
                    "unexpected stream data from {sname} on the direct route"
                ));
            }
            Frame::Msg(Response::Progress(p)) => {
                bar.set_length(p.total_bytes);
                bar.set_position(p.bytes);
                bar.set_message(format!("{}/{} files", p.files, p.total_files));
            }
            Frame::Msg(Response::Sent {
                raw_bytes,
                compressed_bytes,
                hashes,
                windows,
                written,
                ..
            }) => {
                print_windows(global, &windows);
                break (raw_bytes, compressed_bytes, hashes, written);
            }
            Frame::Msg(other) => return Err(err!("unexpected answer from {sname}: {other:?}")),
        }
    };
    bar.finish_and_clear();
    // The relay's end of stream, or the direct route's report of what it staged.
    let staged = if relay {
        dst.request(&Request::EndData { hashes })?;
        dst.response(&mut |_| {})?
    } else {
        dst.call(&Request::StagedDirect { hashes, written }, &mut |_| {})?
    };
    match staged {
        Response::Staged { .. } => {}
        other => {
            return Err(err!(
                "unexpected answer from {}: {other:?}",
                plan.target.name
            ));
        }
    }
    Ok((raw, compressed))
}

/// With -vv: the levels `--compress auto` measured, window by window.
fn print_windows(global: &GlobalArgs, windows: &[LevelWindow]) {
    if global.verbose >= 2 && !windows.is_empty() {
        let w: Vec<String> = windows
            .iter()
            .map(|w| format!("{}:{:.0}", w.level, w.bytes_per_sec / 1e6))
            .collect();
        eprintln!("compression windows (level:MB/s of files): {}", w.join(" "));
    }
}
