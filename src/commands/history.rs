//! `overlay history [HOST]`: list the generations on a host.

use indicatif::HumanBytes;
use overlay::error::{EXIT_OK, Result};
use overlay::model::GenerationInfo;
use overlay::ops::Observer;
use overlay::ops::history::{HistoryOptions, history};

use crate::cli::{GlobalArgs, HistoryArgs};
use crate::progress::Console;

pub fn run(global: &GlobalArgs, args: &HistoryArgs) -> Result<u8> {
    let opts = HistoryOptions {
        host: global.host_choice(&args.host, &args.plan),
        connect: global.connect_options(),
    };
    let found = history(&opts)?;
    let (name, generations) = (&found.host, &found.generations);
    let console = Console::new(global);
    if let Some(msg) = &found.recovered {
        console.status(&format!("{name}: {msg}"));
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(generations).expect("serializes")
        );
        return Ok(EXIT_OK);
    }
    print_table(generations);
    for g in generations {
        if let Some(why) = &g.damaged {
            console.status(&format!("{name}: generation {} is damaged: {why}", g.id));
        }
    }
    if generations.is_empty() {
        console.status(&format!("No generations on {name} ({})", found.venv));
    }
    Ok(EXIT_OK)
}

/// The generations as a table on stdout.
fn print_table(generations: &[GenerationInfo]) {
    println!(
        "{:<22} {:<20} {:<12} {:>6} {:>8} {:>7} {:>10} {:>10}  FROM",
        "ID", "TIME (UTC)", "STATUS", "ADD", "REPLACE", "DELETE", "NEW", "BACKUP"
    );
    for g in generations {
        let status = serde_json::to_value(g.status)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let t = overlay::text::format_time(g.created);
        let when = format!(
            "{}-{}-{} {}:{}:{}",
            &t[0..4],
            &t[4..6],
            &t[6..8],
            &t[9..11],
            &t[11..13],
            &t[13..15]
        );
        println!(
            "{:<22} {:<20} {:<12} {:>6} {:>8} {:>7} {:>10} {:>10}  {}",
            overlay::text::quote(&g.id),
            when,
            status,
            g.adds,
            g.replaces,
            g.deletes,
            HumanBytes(g.bytes).to_string(),
            if g.backup {
                HumanBytes(g.backup_bytes).to_string()
            } else {
                "none".into()
            },
            overlay::text::quote(&g.source)
        );
    }
}
