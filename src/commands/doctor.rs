//! `overlay doctor [HOST | --venv PATH]`: check a venv as it stands
//! (RECORD, damaged objects, extras, duplicate dist-infos, stale bytecode,
//! broken shebangs, and the preflight's checks). The problems go to stdout
//! grouped by kind, then the notes (what a healthy venv shows too) one line
//! per kind with a few examples, or with `-v` each in full; `--json` has
//! everything. A summary line goes to stderr; exit 1 when there are
//! problems (notes never fail).

use overlay::error::{EXIT_OK, EXIT_PROBLEMS, Result};
use overlay::model::{DoctorReport, Finding, FindingKind, NoteKind};
use overlay::ops::Observer;
use overlay::ops::doctor::{DoctorOptions, doctor};
use overlay::text::escape;

use crate::cli::{DoctorArgs, GlobalArgs};
use crate::progress::Console;

pub fn run(global: &GlobalArgs, args: &DoctorArgs) -> Result<u8> {
    let opts = DoctorOptions {
        host: overlay::ops::HostChoice {
            venv: args.venv.clone(),
            ..global.host_choice(&args.host, &args.plan)
        },
        connect: global.connect_options(),
    };
    let console = Console::new(global);
    let done = doctor(&opts, &console)?;
    let r = &done.report;
    let ok = r.problems().next().is_none();
    if args.json {
        let doc = serde_json::json!({
            "host": done.host,
            "ok": ok,
            "report": r,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).expect("serializes")
        );
    } else {
        for line in report_lines(r, global.verbose > 0) {
            println!("{line}");
        }
    }
    if r.machine.has_nvidia() || !r.machine.notes.is_empty() {
        console.status(&format!("{}: {}", done.host, escape(&r.machine.describe())));
        for n in &r.machine.notes {
            console.status(&format!("  ({})", escape(n)));
        }
    }
    console.status(&summary(&done.host, r));
    Ok(if ok { EXIT_OK } else { EXIT_PROBLEMS })
}

/// How many paths a note kind's line shows without `-v`.
const EXAMPLES: usize = 3;

/// The report for stdout: the problems grouped by kind (or `no problems`),
/// then the notes: one summary line, and per kind a line with a few
/// examples, or (`verbose`) every note in full.
fn report_lines(r: &DoctorReport, verbose: bool) -> Vec<String> {
    let mut out = Vec::new();
    let problems: Vec<&Finding> = r.problems().collect();
    if problems.is_empty() {
        out.push("no problems".to_string());
    }
    for kind in FindingKind::ALL {
        let of: Vec<&&Finding> = problems.iter().filter(|f| f.kind == kind).collect();
        if of.is_empty() {
            continue;
        }
        out.push(format!("{} ({}):", kind.heading(), of.len()));
        out.extend(of.iter().map(|f| format!("  {}", finding_line(f))));
    }
    let notes: Vec<&Finding> = r.notes().collect();
    if notes.is_empty() {
        return out;
    }
    out.push(format!("notes: {}", note_counts(&notes).join(", ")));
    for kind in NoteKind::ALL {
        let of: Vec<&&Finding> = notes.iter().filter(|f| f.note == Some(kind)).collect();
        if of.is_empty() {
            continue;
        }
        if verbose {
            out.push(format!("  {} ({}):", kind.heading(), of.len()));
            out.extend(of.iter().map(|f| format!("    {}", finding_line(f))));
            continue;
        }
        // A module missing two libraries is one optional backend: each
        // path once.
        let mut paths: Vec<&str> = of
            .iter()
            .map(|f| f.path.as_deref().or(f.dist.as_deref()).unwrap_or("?"))
            .collect();
        paths.dedup();
        let shown: Vec<String> = paths
            .iter()
            .take(EXAMPLES)
            .map(|p| escape(p).into_owned())
            .collect();
        let more = paths.len().saturating_sub(EXAMPLES);
        out.push(format!(
            "  {} ({}): {}{}",
            kind.heading(),
            paths.len(),
            shown.join(", "),
            if more > 0 {
                format!(", and {more} more (-v lists them)")
            } else {
                String::new()
            }
        ));
    }
    out
}

/// One finding: distribution, path, reason.
fn finding_line(f: &Finding) -> String {
    let dist = f.dist.as_deref().unwrap_or("(no dist)");
    match &f.path {
        Some(p) => format!("{} {}: {}", escape(dist), escape(p), escape(&f.reason)),
        None => format!("{}: {}", escape(dist), escape(&f.reason)),
    }
}

/// "2 extensions need torch imported first", ... for each note kind found.
fn note_counts(notes: &[&Finding]) -> Vec<String> {
    NoteKind::ALL
        .iter()
        .filter_map(|k| {
            let of: Vec<&&Finding> = notes.iter().filter(|f| f.note == Some(*k)).collect();
            let mut first: Vec<&str> = of
                .iter()
                .flat_map(|f| f.imported_first.iter().map(String::as_str))
                .collect();
            first.sort_unstable();
            first.dedup();
            let mut paths: Vec<Option<&str>> = of.iter().map(|f| f.path.as_deref()).collect();
            paths.sort_unstable();
            paths.dedup();
            (!of.is_empty()).then(|| k.counted(paths.len(), &first.join(", ")))
        })
        .collect()
}

/// The stderr summary: what was checked, and how many problems of each
/// kind and notes were found.
fn summary(host: &str, r: &DoctorReport) -> String {
    let what = format!(
        "{host}: {} distributions, {} files ({} hashed, {} from the cache), {} shared objects checked",
        r.dists, r.files, r.hashed, r.cached, r.elf_checked
    );
    let notes = r.notes().count();
    let notes = match notes {
        0 => String::new(),
        1 => ", 1 note".to_string(),
        n => format!(", {n} notes"),
    };
    let n = r.problems().count();
    if n == 0 {
        return format!("{what}: no problems{notes}");
    }
    let counts: Vec<String> = FindingKind::ALL
        .iter()
        .filter_map(|k| {
            let n = r.problems().filter(|f| f.kind == *k).count();
            (n > 0).then(|| format!("{n} {}", k.short()))
        })
        .collect();
    format!(
        "{what}: {n} problem{} ({}){notes}",
        if n == 1 { "" } else { "s" },
        counts.join(", ")
    )
}
