//! `overlay apply [PLAN]`: carry out a saved plan on its target, streaming
//! the new files from its source through this controller, then switching
//! them in through the target's journal.

use std::path::Path;
use std::time::Instant;

use indicatif::HumanBytes;
use overlay::agent::client::Client;
use overlay::agent::protocol::{Compression, Frame, Request, Response, SendFile, ShebangRewrite};
use overlay::err;
use overlay::error::Result;
use overlay::journal::{GenChange, PrepareRequest};
use overlay::plan::{Action, Plan};
use overlay::transport::Endpoint;

use crate::EXIT_OK;
use crate::cli::{ApplyArgs, GlobalArgs};
use crate::commands::plan::connect_options;
use crate::progress::{HashBars, status};

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
    let (generation, recovered) = match dst.call(&Request::Prepare(Box::new(req)), &mut |_| {})? {
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
            Err(e) => {
                let _ = dst.call(&Request::Abort, &mut |_| {});
                return Err(e);
            }
        }
    }
    timing(&format!("stream and stage ({})", HumanBytes(sent)));
    match dst.call(&Request::Switch, &mut |_| {})? {
        Response::Switched { .. } => {}
        other => return Err(err!("unexpected answer from {tname}: {other:?}")),
    }
    timing("switch and check");
    match dst.call(
        &Request::Commit {
            keep_backup: args.backup,
            keep: args.keep,
        },
        &mut |_| {},
    )? {
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
            exit = crate::EXIT_VERIFY_FAILED;
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
    dst.close()?;
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
    Direct { dest: &'a str, generation: &'a str },
}

/// Have the source stream `files` into the target's staging by `route`.
/// Returns the bytes of files and the bytes sent.
fn stream(
    global: &GlobalArgs,
    plan: &Plan,
    opts: &overlay::transport::ConnectOptions,
    dst: &mut Client,
    files: Vec<SendFile>,
    compression: Compression,
    route: Route<'_>,
) -> Result<(u64, u64)> {
    let sname = plan.source.name.clone();
    let mut src = Client::connect(&sname, &endpoint(&plan.source.ssh), opts)?;
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
        Route::Direct { dest, generation } => src.request(&Request::SendDirect {
            venv,
            files,
            shebang,
            compression,
            ssh: dest.to_string(),
            agent: dst.agent_exe().to_string(),
            target_venv: plan.target.venv.clone(),
            generation: generation.to_string(),
            connect_timeout_secs: opts.timeout.as_secs(),
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
    src.close()?;
    Ok((raw, compressed))
}

/// With -vv: the levels `--compress auto` measured, window by window.
fn print_windows(global: &GlobalArgs, windows: &[(i32, f64)]) {
    if global.verbose >= 2 && !windows.is_empty() {
        let w: Vec<String> = windows
            .iter()
            .map(|(l, r)| format!("{l}:{:.0}", r / 1e6))
            .collect();
        eprintln!("compression windows (level:MB/s of files): {}", w.join(" "));
    }
}
