//! `overlay history [HOST...]`: list the generations on a host, each with
//! the distribution versions it changed (the first few, or with `-v` one
//! line each; `--json` carries every version the generation recorded).
//! With `-v` and in `--json`, where its files came from: the live source,
//! or the bundle with its BLAKE3 and signer.

use indicatif::HumanBytes;
use overlay::error::{EXIT_OK, Result};
use overlay::model::{GenerationInfo, Transition};
use overlay::ops::Observer;
use overlay::ops::history::{HistoryOptions, history};

use crate::cli::{GlobalArgs, HistoryArgs};
use crate::progress::Console;

pub fn run(global: &GlobalArgs, args: &HistoryArgs) -> Result<u8> {
    if args.venv.is_none()
        && let Some(hosts) = global.several_hosts(&args.hosts, &args.plan)?
    {
        return crate::cli::on_each_host(&hosts, args.json, true, |h| {
            run_one(global, args, &Some(h.to_string()))
        });
    }
    run_one(global, args, &args.hosts.first().cloned())
}

/// The command on one host (`None`: the target of the last plan).
fn run_one(global: &GlobalArgs, args: &HistoryArgs, host: &Option<String>) -> Result<u8> {
    let opts = HistoryOptions {
        host: overlay::ops::HostChoice {
            venv: args.venv.clone(),
            ..global.host_choice(host, &args.plan)
        },
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
    print_table(generations, global.verbose > 0);
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

/// How many changed distributions a generation's line shows without `-v`.
const VERSIONS_SHOWN: usize = 3;

/// The generations as a table on stdout, each followed by the versions it
/// changed: one indented line with the first few, or (`verbose`) one line
/// per distribution.
fn print_table(generations: &[GenerationInfo], verbose: bool) {
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
        for line in version_lines(&g.versions, verbose) {
            println!("    {line}");
        }
        if let Some(p) = g.provenance.as_ref().filter(|_| verbose) {
            println!("    from {}", overlay::text::escape(&p.describe()));
        }
        if let Some(d) = g.durability.as_ref().filter(|_| verbose) {
            println!(
                "    on {}: made durable with {}",
                overlay::text::escape(&d.fs),
                d.barrier.words()
            );
        }
    }
}

/// The changed versions of a generation as lines: one line of the first
/// [`VERSIONS_SHOWN`] (and how many more), or one per distribution.
fn version_lines(versions: &[Transition], verbose: bool) -> Vec<String> {
    let changed: Vec<String> = versions
        .iter()
        .filter(|t| t.changes())
        .map(transition)
        .collect();
    if verbose || changed.is_empty() {
        return changed;
    }
    let mut line = changed[..changed.len().min(VERSIONS_SHOWN)].join(", ");
    if changed.len() > VERSIONS_SHOWN {
        line.push_str(&format!(", +{} more", changed.len() - VERSIONS_SHOWN));
    }
    vec![line]
}

/// `name from -> to`, as `plan` shows it.
fn transition(t: &Transition) -> String {
    use overlay::text::quote;
    format!(
        "{} {} -> {}",
        quote(&t.name),
        t.from.as_deref().map_or("(absent)".into(), quote),
        t.to.as_deref().map_or("(removed)".into(), quote)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, from: Option<&str>, to: Option<&str>) -> Transition {
        Transition {
            name: name.into(),
            from: from.map(Into::into),
            to: to.map(Into::into),
        }
    }

    #[test]
    fn the_first_few_changed_versions_then_how_many_more() {
        let v = vec![
            t("torch", Some("2.9.1+cu128"), Some("2.15.0+cu132")),
            t("sglang", Some("0.5.0"), Some("0.5.0")),
            t("triton", Some("3.5.1"), Some("3.9.0")),
            t("nvidia-cublas", None, Some("13.1.0.3")),
            t("nvidia-cublas-cu12", Some("12.8.4.1"), None),
            t("nvidia-nccl", Some("2.27"), Some("2.28")),
        ];
        assert_eq!(
            version_lines(&v, false),
            [
                "torch 2.9.1+cu128 -> 2.15.0+cu132, triton 3.5.1 -> 3.9.0, nvidia-cublas (absent) -> 13.1.0.3, +2 more"
            ]
        );
        let all = version_lines(&v, true);
        assert_eq!(all.len(), 5, "{all:?}");
        assert_eq!(all[3], "nvidia-cublas-cu12 12.8.4.1 -> (removed)");
        assert!(version_lines(&v[1..2], false).is_empty());
        assert!(version_lines(&[], true).is_empty());
    }
}
