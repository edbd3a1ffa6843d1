//! `overlay apply [PLAN]`: carry out a saved plan on its target (see
//! `overlay::ops::apply`), then say what was done: status on stderr, and
//! with `--json` one document on stdout.

use indicatif::HumanBytes;
use overlay::error::{EXIT_OK, ErrorKind, Result};
use overlay::ops::Observer;
use overlay::ops::apply::{Applied, ApplyOptions, ApplyReport, apply};

use crate::cli::{ApplyArgs, GlobalArgs};
use crate::progress::{CheckOutput, Console};

pub fn run(global: &GlobalArgs, args: &ApplyArgs) -> Result<u8> {
    if let (Some(bundle), Some(venv)) = (&args.bundle, &args.venv) {
        return run_bundle(global, args, bundle, venv);
    }
    let opts = ApplyOptions {
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
        verify: args.verify,
        rollback_on_failure: args.rollback_on_failure,
    };
    // With --json, the check's output goes to stderr: stdout holds one JSON document.
    let console = Console::new(global).check_output(if args.json {
        CheckOutput::Stderr
    } else {
        CheckOutput::Text
    });
    match apply(&opts, &console)? {
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
