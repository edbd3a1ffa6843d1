//! `overlay apply [PLAN]`: carry out a saved plan on its target (see
//! `overlay::ops::apply`), then say what was done: status on stderr, and
//! with `--json` one document on stdout. A plan of several targets is
//! rolled out by `overlay::fleet::apply_many`: a table (or with `--json` one
//! document) of every target's result on stdout. `--bundle FILE TARGET...`
//! plans the targets from the bundle (`overlay::fleet::bundle_plan`) into
//! the default plan file, then applies that; `--bundle FILE --venv PATH`
//! applies a bundle to a venv on this host (`overlay::ops::pack`).

use indicatif::HumanBytes;
use overlay::err;
use overlay::error::{EXIT_OK, ErrorKind, Result};
use overlay::fleet::apply_many::{Rolled, Rollout, apply_many};
use overlay::fleet::bundle_plan::{BundlePlanOptions, BundlePlanned, plan_from_bundle};
use overlay::fleet::plan_many;
use overlay::ops::Observer;
use overlay::ops::apply::{Applied, ApplyOptions, ApplyReport, apply};
use overlay::text;

use crate::cli::{ApplyArgs, DEFAULT_PLAN, GlobalArgs};
use crate::progress::{CheckOutput, Console};

pub fn run(global: &GlobalArgs, args: &ApplyArgs) -> Result<u8> {
    if let Some(bundle) = &args.bundle {
        // With --bundle, the positional names are targets.
        let mut targets: Vec<String> = Vec::new();
        if args.plan != std::path::Path::new(DEFAULT_PLAN) {
            targets.push(args.plan.to_string_lossy().into_owned());
        }
        targets.extend(args.targets.iter().cloned());
        return match (&args.venv, targets.is_empty()) {
            (Some(venv), true) => run_bundle(global, args, bundle, venv),
            (Some(_), false) => Err(err!(
                kind = Usage,
                hint = "drop --venv to apply to those hosts from this machine (`overlay apply --bundle FILE TARGET...`), or name no hosts to apply to the venv on this host",
                "--bundle with --venv applies to a venv on this host: it takes no hosts ({})",
                targets.join(" ")
            )),
            (None, true) => Err(err!(
                kind = Usage,
                hint = "name the targets: `overlay apply --bundle FILE TARGET...`, or give --venv PATH on the host itself",
                "--bundle needs the targets to apply to, or --venv"
            )),
            (None, false) => run_from_bundle(global, args, bundle, targets),
        };
    }
    let opts = options(global, args);
    if let Some((fleet, files)) = overlay::plan::load_fleet(&args.plan) {
        let plans: Vec<(String, std::path::PathBuf)> = fleet
            .targets
            .into_iter()
            .map(|t| t.name)
            .zip(files)
            .collect();
        return run_many(global, args, &opts, &plans);
    }
    run_one(global, args, &opts)
}

/// The apply's options from the command line.
fn options(global: &GlobalArgs, args: &ApplyArgs) -> ApplyOptions {
    ApplyOptions {
        plan: args.plan.clone(),
        manifest: global.manifest.clone(),
        manifest_explicit: global.manifest_explicit,
        connect: global.connect_options(),
        resume: args.resume,
        force: args.force,
        direct: args.direct,
        relay: args.relay,
        // Backups are the default; --backup is accepted and changes nothing.
        backup: !args.no_backup,
        keep: args.keep,
        same_owner: args.same_owner,
        compression: args.compress,
        connections: args.connections,
        verify: args.verify,
        rollback_on_failure: args.rollback_on_failure,
        compile: !args.no_compile,
        allow_running: args.allow_running,
    }
}

/// `overlay apply --bundle FILE TARGET...`: `overlay plan --bundle FILE
/// TARGET...` (saved to the default plan file, its warnings and problems on
/// stderr), then `overlay apply` of it.
fn run_from_bundle(
    global: &GlobalArgs,
    args: &ApplyArgs,
    bundle: &std::path::Path,
    targets: Vec<String>,
) -> Result<u8> {
    let out = std::path::PathBuf::from(DEFAULT_PLAN);
    let console = Console::new(global);
    let planned = plan_from_bundle(
        &BundlePlanOptions {
            manifest: global.manifest.clone(),
            bundle: bundle.to_path_buf(),
            targets,
            sets: Vec::new(),
            strict: false,
            connect: global.connect_options(),
            trust: args.trust.choice(),
        },
        &console,
    )?;
    let findings = |p: &overlay::plan::Plan| {
        for w in &p.warnings {
            let set = w
                .set
                .as_deref()
                .map(|s| format!("[{s}] "))
                .unwrap_or_default();
            console.warn(&format!("{}: {set}{}", p.target.name, w.message));
        }
        for line in overlay::report::problems_text(&p.problems, p.strict, global.verbose > 0) {
            eprintln!("{}: {}", text::escape(&p.target.name), text::escape(&line));
        }
    };
    let opts = ApplyOptions {
        plan: out.clone(),
        ..options(global, args)
    };
    match planned {
        BundlePlanned::One(p) => {
            findings(&p.plan);
            overlay::ops::plan::save(&p.plan, &out)?;
            p.closing.wait();
            run_one(global, args, &opts)
        }
        BundlePlanned::Many(p) => {
            p.plans.iter().for_each(findings);
            let files = plan_many::save_many(&p.plans, &out)?;
            p.closing.wait();
            let plans: Vec<(String, std::path::PathBuf)> = p
                .plans
                .iter()
                .map(|p| p.target.name.clone())
                .zip(files)
                .collect();
            run_many(global, args, &opts, &plans)
        }
    }
}

/// Apply a plan of one target.
fn run_one(global: &GlobalArgs, args: &ApplyArgs, opts: &ApplyOptions) -> Result<u8> {
    // With --json, the check's output goes to stderr: stdout holds one JSON document.
    let console = Console::new(global).check_output(if args.json {
        CheckOutput::Stderr
    } else {
        CheckOutput::Text
    });
    match apply(opts, &console)? {
        ApplyReport::Resumed { target, outcome } => {
            if args.json {
                println!("{}", serde_json::json!({ "resumed": outcome }));
            }
            match outcome {
                Some(o) => console.status(&format!("{target}: {o}")),
                None => console.status(&format!("{target}: no interrupted generation to resume")),
            }
            Ok(EXIT_OK)
        }
        ApplyReport::NothingToApply { target } => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({ "generation": null, "changes": 0 })
                );
            }
            console.status(&format!(
                "Nothing to apply: the plan has no changes for {target}"
            ));
            Ok(EXIT_OK)
        }
        ApplyReport::Applied(applied) => {
            if !applied.rolled_back {
                console.status(&backup_line(&applied));
            }
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&applied).expect("serializes")
                );
            }
            Ok(if applied.verified == Some(false) {
                ErrorKind::VerifyFailed.exit_code()
            } else {
                EXIT_OK
            })
        }
    }
}

/// `overlay apply --bundle FILE --venv PATH` on this host; `--json`
/// prints one line (for pdsh and the like: one line per host).
fn run_bundle(
    global: &GlobalArgs,
    args: &ApplyArgs,
    bundle: &std::path::Path,
    venv: &str,
) -> Result<u8> {
    use overlay::ops::pack::{BundleApply, apply_bundle};
    let console = Console::new(global).check_output(if args.json {
        CheckOutput::Stderr
    } else {
        CheckOutput::Text
    });
    let opts = BundleApply {
        bundle: bundle.to_path_buf(),
        venv: venv.to_string(),
        backup: !args.no_backup,
        keep: args.keep,
        force: args.force,
        verify: args.verify,
        rollback_on_failure: args.rollback_on_failure,
        allow_running: args.allow_running,
        // On the host itself: no manifest, so --trust, else the system's.
        trust: args.trust.choice().resolve(None),
    };
    let done = match apply_bundle(&opts, &console) {
        Ok(done) => done,
        Err(e) => {
            // One line for the fleet's table too; the error itself on stderr.
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "ok": false,
                        "venv": venv,
                        "error": e.to_string(),
                        "exit": e.kind.exit_code(),
                    })
                );
            }
            return Err(e);
        }
    };
    match done {
        ApplyReport::Applied(applied) => {
            if !applied.rolled_back {
                let q = overlay::text::shell_quote(venv);
                console.status(&if applied.backup {
                    format!(
                        "Backup: {} in {venv}; undo with `overlay rollback --venv {q}`, list generations with `overlay history --venv {q}`.",
                        HumanBytes(applied.backup_bytes)
                    )
                } else {
                    format!(
                        "No backup (--no-backup): `overlay rollback` cannot undo generation {} in {venv}.",
                        applied.generation
                    )
                });
            }
            let ok = applied.verified != Some(false);
            if args.json {
                let mut doc = serde_json::to_value(&applied).expect("serializes");
                doc["ok"] = ok.into();
                doc["venv"] = venv.into();
                println!("{doc}");
            }
            Ok(if ok {
                EXIT_OK
            } else {
                ErrorKind::VerifyFailed.exit_code()
            })
        }
        ApplyReport::NothingToApply { .. } | ApplyReport::Resumed { .. } => {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({ "ok": true, "venv": venv, "generation": null, "changes": 0 })
                );
            }
            console.status(&format!(
                "Nothing to apply: {venv} already has the bundle's files"
            ));
            Ok(EXIT_OK)
        }
    }
}

/// What the apply kept to roll back with: the backup's size and the
/// commands that use or free it, or that there is none.
fn backup_line(applied: &Applied) -> String {
    let t = &applied.target;
    if applied.backup {
        format!(
            "Backup: {} on {t}; undo with `overlay rollback {t}`, free older backups with `overlay prune {t} --keep N`.",
            HumanBytes(applied.backup_bytes)
        )
    } else {
        format!(
            "No backup (--no-backup): `overlay rollback` cannot undo generation {} on {t}.",
            applied.generation
        )
    }
}

/// Roll out a plan of several targets; the table (or `--json`) on stdout.
/// Exit 0 only if every target succeeded, else the error of kind
/// `TargetsFailed` that lists the others.
fn run_many(
    global: &GlobalArgs,
    args: &ApplyArgs,
    opts: &ApplyOptions,
    plans: &[(String, std::path::PathBuf)],
) -> Result<u8> {
    // The checks' output goes to stderr: stdout holds the table (or JSON).
    let console = Console::new(global).check_output(CheckOutput::Stderr);
    let policy = Rollout {
        parallel: usize::try_from(args.parallel).unwrap_or(usize::MAX),
        canary: args.canary,
        max_fail: args
            .max_fail
            .map(|k| usize::try_from(k).unwrap_or(usize::MAX)),
    };
    let rolled = apply_many(plans, opts, policy, &console)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rolled).expect("serializes")
        );
    } else {
        print!("{}", table(&rolled));
    }
    if overlay::interrupt::requested() {
        return Err(err!(
            kind = Interrupted,
            hint =
                "the table above says where each target stands; `overlay history HOST` shows one",
            "interrupted: targets not started are untouched"
        ));
    }
    let failed = rolled.failed();
    if failed.is_empty() {
        return Ok(EXIT_OK);
    }
    let list: Vec<String> = failed
        .iter()
        .map(|t| format!("{} ({})", t.target, t.error.as_deref().unwrap_or("failed")))
        .collect();
    Err(err!(
        kind = TargetsFailed,
        hint = "see each target's lines above; `overlay history HOST` shows where it stands, and `overlay apply .overlay/plan.d/HOST.json` carries out one target's plan again",
        "{} of {} targets did not succeed: {}",
        failed.len(),
        rolled.targets.len(),
        list.join("; ")
    ))
}

/// The final table: target, result, changes, bytes, time, generation.
fn table(rolled: &Rolled) -> String {
    use std::fmt::Write;
    let rows: Vec<[String; 6]> = rolled
        .targets
        .iter()
        .map(|t| {
            let result = serde_json::to_value(t.result)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default();
            [
                text::escape(&t.target).into_owned(),
                if t.rolled_back {
                    format!("{result}, rolled back")
                } else if t.canary {
                    format!("{result} (canary)")
                } else {
                    result
                },
                t.changes.to_string(),
                // Fixed widths: a longer number never shifts the columns after it.
                format!("{:>10}", HumanBytes(t.bytes).to_string()),
                format!("{:>7.1}s", t.seconds),
                t.generation.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let head = ["TARGET", "RESULT", "CHANGES", "BYTES", "TIME", "GENERATION"];
    let mut width = head.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(head.map(String::from)).chain(rows) {
        let cells: Vec<String> = r
            .iter()
            .zip(width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}
