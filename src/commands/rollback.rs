//! `overlay rollback [HOST]`: restore the target to its state before a
//! generation. Needs only that host; the source may be down.

use overlay::error::{EXIT_OK, Result};
use overlay::ops::Observer;
use overlay::ops::rollback::{RollbackOptions, rollback};

use crate::cli::{GlobalArgs, RollbackArgs};
use crate::progress::Console;

pub fn run(global: &GlobalArgs, args: &RollbackArgs) -> Result<u8> {
    let opts = RollbackOptions {
        host: global.host_choice(&args.host, &args.plan),
        to: args.to.clone(),
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
    for k in &report.kept_edited {
        eprintln!("warning: {}", overlay::text::escape(k));
    }
    console.status(&format!(
        "Rolled back {} on {name} ({}): {} files restored, {} removed; {} paths verified against the listing from before the apply",
        report.generations.join(", "),
        done.venv,
        report.restored,
        report.removed,
        report.verified
    ));
    Ok(EXIT_OK)
}
