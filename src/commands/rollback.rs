//! `overlay rollback`, `overlay history` and `overlay prune`: generations on
//! one target host. These need only that host; the source may be down.

use std::path::Path;

use indicatif::HumanBytes;
use overlay::client::Client;
use overlay::err;
use overlay::error::Result;
use overlay::manifest::Manifest;
use overlay::protocol::{Request, Response};

use crate::cli::{GlobalArgs, HistoryArgs, PruneArgs, RollbackArgs};
use crate::commands::apply::{endpoint, load_plan};
use crate::commands::plan::connect_options;
use crate::progress::status;
use overlay::error::EXIT_OK;
use overlay::model::Endpoint;

/// A host by manifest name, or else the target of the last plan.
pub fn resolve(
    global: &GlobalArgs,
    host: Option<&str>,
    plan: &Path,
) -> Result<(String, Endpoint, String)> {
    if (global.manifest.exists() || !plan.exists())
        && let Some(name) = host
    {
        let m = Manifest::load(&global.manifest)?;
        let h = m.host(name)?;
        return Ok((h.name.clone(), h.endpoint.clone(), h.venv.clone()));
    }
    let p = load_plan(plan).map_err(|e| {
        e.hint("name the host (e.g. `overlay history HOST`) with a manifest that defines it, or run from where `overlay plan` saved its plan")
    })?;
    if let Some(name) = host
        && name != p.target.name
    {
        return Err(err!(
            hint = "pass --manifest with a manifest that defines that host",
            "Host {name} is not in {} and is not the target of the plan {}",
            global.manifest.display(),
            plan.display()
        ));
    }
    Ok((
        p.target.name.clone(),
        endpoint(&p.target.ssh),
        p.target.venv.clone(),
    ))
}

pub fn rollback(global: &GlobalArgs, args: &RollbackArgs) -> Result<u8> {
    let (name, ep, venv) = resolve(global, args.host.as_deref(), &args.plan)?;
    let mut c = Client::connect(&name, &ep, &connect_options(global))?;
    let r = c.call(
        &Request::Rollback {
            venv: venv.clone(),
            to: args.to.clone(),
        },
        &mut |_| {},
    )?;
    c.close()?;
    let Response::RolledBack(report) = r else {
        return Err(err!("unexpected answer from {name}: {r:?}"));
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serializes")
        );
    }
    if let Some(msg) = &report.recovered {
        status(global, &format!("{name}: {msg}"));
        return Ok(EXIT_OK);
    }
    for k in &report.kept_edited {
        eprintln!("warning: {}", overlay::text::escape(k));
    }
    status(
        global,
        &format!(
            "Rolled back {} on {name} ({venv}): {} files restored, {} removed; {} paths verified against the listing from before the apply",
            report.generations.join(", "),
            report.restored,
            report.removed,
            report.verified
        ),
    );
    Ok(EXIT_OK)
}

pub fn history(global: &GlobalArgs, args: &HistoryArgs) -> Result<u8> {
    let (name, ep, venv) = resolve(global, args.host.as_deref(), &args.plan)?;
    let mut c = Client::connect(&name, &ep, &connect_options(global))?;
    let r = c.call(&Request::History { venv: venv.clone() }, &mut |_| {})?;
    c.close()?;
    let Response::History {
        generations,
        recovered,
    } = r
    else {
        return Err(err!("unexpected answer from {name}: {r:?}"));
    };
    if let Some(msg) = recovered {
        status(global, &format!("{name}: {msg}"));
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&generations).expect("serializes")
        );
        return Ok(EXIT_OK);
    }
    println!(
        "{:<22} {:<20} {:<12} {:>6} {:>8} {:>7} {:>10} {:>10}  FROM",
        "ID", "TIME (UTC)", "STATUS", "ADD", "REPLACE", "DELETE", "NEW", "BACKUP"
    );
    for g in &generations {
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
    for g in &generations {
        if let Some(why) = &g.damaged {
            status(
                global,
                &format!("{name}: generation {} is damaged: {why}", g.id),
            );
        }
    }
    if generations.is_empty() {
        status(global, &format!("No generations on {name} ({venv})"));
    }
    Ok(EXIT_OK)
}

pub fn prune(global: &GlobalArgs, args: &PruneArgs) -> Result<u8> {
    let (name, ep, venv) = resolve(global, args.host.as_deref(), &args.plan)?;
    let mut c = Client::connect(&name, &ep, &connect_options(global))?;
    let r = c.call(
        &Request::Prune {
            venv,
            keep: args.keep,
        },
        &mut |_| {},
    )?;
    c.close()?;
    let Response::Pruned { removed, recovered } = r else {
        return Err(err!("unexpected answer from {name}: {r:?}"));
    };
    if let Some(msg) = recovered {
        status(global, &format!("{name}: {msg}"));
    }
    status(
        global,
        &format!(
            "Removed {} generation(s) on {name}{}",
            removed.len(),
            if removed.is_empty() {
                String::new()
            } else {
                format!(": {}", removed.join(", "))
            }
        ),
    );
    Ok(EXIT_OK)
}
