//! `overlay doctor [HOST]`: check a host's venv as it stands (RECORD,
//! damaged objects, extras, duplicate dist-infos, stale bytecode, broken
//! shebangs, and the preflight's checks). The findings go to stdout grouped
//! by kind (or `--json`), a summary line to stderr; exit 1 when there are any.

use overlay::error::{EXIT_OK, EXIT_PROBLEMS, Result};
use overlay::model::{DoctorReport, FindingKind};
use overlay::ops::Observer;
use overlay::ops::doctor::{DoctorOptions, doctor};
use overlay::text::escape;

use crate::cli::{DoctorArgs, GlobalArgs};
use crate::progress::Console;

pub fn run(global: &GlobalArgs, args: &DoctorArgs) -> Result<u8> {
    let opts = DoctorOptions {
        host: global.host_choice(&args.host, &args.plan),
        connect: global.connect_options(),
    };
    let console = Console::new(global);
    let done = doctor(&opts, &console)?;
    let r = &done.report;
    if args.json {
        let doc = serde_json::json!({
            "host": done.host,
            "ok": r.findings.is_empty(),
            "report": r,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("serializes")
        );
    } else {
        print_report(r);
    }
    console.status(&summary(&done.host, r));
    Ok(if r.findings.is_empty() {
        EXIT_OK
    } else {
        EXIT_PROBLEMS
    })
}

/// The findings on stdout, grouped by kind.
fn print_report(r: &DoctorReport) {
    if r.findings.is_empty() {
        println!("no problems");
        return;
    }
    for kind in FindingKind::ALL {
        let of: Vec<_> = r.findings.iter().filter(|f| f.kind == kind).collect();
        if of.is_empty() {
            continue;
        }
        println!("{} ({}):", kind.heading(), of.len());
        for f in of {
            let dist = f.dist.as_deref().unwrap_or("(no dist)");
            match &f.path {
                Some(p) => println!("  {} {}: {}", escape(dist), escape(p), escape(&f.reason)),
                None => println!("  {}: {}", escape(dist), escape(&f.reason)),
            }
        }
    }
}

/// The stderr summary: what was checked, and how many of each kind were found.
fn summary(host: &str, r: &DoctorReport) -> String {
    let what = format!(
        "{host}: {} distributions, {} files ({} hashed, {} from the cache), {} shared objects checked",
        r.dists, r.files, r.hashed, r.cached, r.elf_checked
    );
    if r.findings.is_empty() {
        return format!("{what}: no problems");
    }
    let counts: Vec<String> = FindingKind::ALL
        .iter()
        .filter_map(|k| {
            let n = r.findings.iter().filter(|f| f.kind == *k).count();
            (n > 0).then(|| format!("{n} {}", k.short()))
        })
        .collect();
    let n = r.findings.len();
    format!(
        "{what}: {n} problem{} ({})",
        if n == 1 { "" } else { "s" },
        counts.join(", ")
    )
}
