//! `overlay rollback [HOST...]`: restore the target to its state before a
//! generation. Needs only that host; the source may be down. Refused, with
//! the list of what changed since the apply, unless `--force`; forced, it
//! names what it moved out of the way and what is still not consistent.
//! Refused by the target while processes run from the venv, unless
//! `--allow-running`; then it names those that still run the files it
//! replaced.

use overlay::error::{EXIT_OK, Result};
use overlay::ops::Observer;
use overlay::ops::rollback::{RollbackOptions, later_lines, refusal, rollback};
use overlay::text::escape;

use crate::cli::{GlobalArgs, RollbackArgs};
use crate::progress::Console;

pub fn run(global: &GlobalArgs, args: &RollbackArgs) -> Result<u8> {
    if args.venv.is_none()
        && let Some(hosts) = global.several_hosts(&args.hosts, &args.plan)?
    {
        if let Some(to) = &args.to {
            return Err(overlay::err!(
                kind = Usage,
                hint = "name one host with --to, or leave --to out to undo each host's newest generation",
                "--to {to} names a generation of one host, but {} hosts are named ({})",
                hosts.len(),
                hosts.join(", ")
            ));
        }
        return crate::cli::on_each_host(&hosts, args.json, false, |h| {
            run_one(global, args, &Some(h.to_string()))
        });
    }
    run_one(global, args, &args.hosts.first().cloned())
}

/// The command on one host (`None`: the target of the last plan).
fn run_one(global: &GlobalArgs, args: &RollbackArgs, host: &Option<String>) -> Result<u8> {
    let opts = RollbackOptions {
        host: overlay::ops::HostChoice {
            venv: args.venv.clone(),
            ..global.host_choice(host, &args.plan)
        },
        to: args.to.clone(),
        force: args.force,
        allow_running: args.allow_running,
        connect: global.connect_options(),
    };
    let done = rollback(&opts)?;
    let (name, report) = (&done.host, &done.report);
    let console = Console::new(global);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).expect("serializes")
        );
    }
    if let Some(msg) = &report.recovered {
        console.status(&format!("{name}: {msg}"));
        return Ok(EXIT_OK);
    }
    let all = global.verbose > 0;
    if report.refused {
        // Part of the error: shown even with --quiet.
        eprintln!("Changed since the apply, on {name} ({}):", done.venv);
        for line in later_lines(report.later.as_ref().expect("refused over changes"), all) {
            eprintln!("{}", escape(&line));
        }
        return Err(refusal(&done, args.to.as_deref()));
    }
    if let Some(later) = &report.later {
        console.status(&format!(
            "Rolling back over changes made since the apply, on {name} ({}):",
            done.venv
        ));
        for line in later_lines(later, all) {
            console.status(&line);
        }
    }
    for k in &report.kept_edited {
        eprintln!("warning: {}", escape(k));
    }
    if let Some(to) = &report.displaced_to {
        eprintln!(
            "warning: {} added since the apply: moved out, with the files only {} RECORD lists, to {to}",
            escape(&report.displaced.join(", ")),
            if report.displaced.len() == 1 {
                "its"
            } else {
                "their"
            }
        );
    }
    for p in &report.inconsistent {
        eprintln!("warning: not consistent after the rollback: {}", escape(p));
    }
    if let Some(line) = overlay::ops::apply::still_running_line(name, &report.running) {
        console.warn(&line);
    }
    console.status(&format!(
        "Rolled back {} on {name} ({}): {} files restored, {} removed; {} paths verified against the listing from before the apply",
        report.generations.join(", "),
        done.venv,
        report.restored,
        report.removed,
        report.verified
    ));
    if !report.inconsistent.is_empty() {
        console.status(&format!(
            "hint: `overlay doctor {name}` checks every distribution's files against its RECORD"
        ));
    }
    Ok(EXIT_OK)
}
