//! Rendering of plans for people (text) and programs (JSON). Pure functions
//! that return strings, so tests can read them back.

use std::fmt::Write;

use indicatif::HumanBytes;
use serde::Serialize;

use crate::model::{Action, Problem};
use crate::plan::{Plan, SetPlan, Totals, Warning, totals};
use crate::text::quote;

/// The `--json` document of `overlay plan`.
#[derive(Serialize)]
pub struct PlanJson<'a> {
    pub source: &'a str,
    pub target: &'a str,
    pub sets: Vec<SetJson<'a>>,
    pub warnings: &'a [Warning],
    pub problems: &'a [Problem],
    pub strict: bool,
}

#[derive(Serialize)]
pub struct SetJson<'a> {
    pub name: &'a str,
    pub versions: &'a [crate::plan::Transition],
    pub changes: Vec<ChangeJson<'a>>,
    pub unchanged: u64,
    pub stale_bytecode: &'a [String],
}

#[derive(Serialize)]
pub struct ChangeJson<'a> {
    pub path: &'a str,
    pub action: Action,
    pub size: u64,
}

pub fn plan_json(plan: &Plan) -> String {
    let doc = PlanJson {
        source: &plan.source.name,
        target: &plan.target.name,
        sets: plan
            .sets
            .iter()
            .map(|s| SetJson {
                name: &s.name,
                versions: &s.versions,
                changes: s
                    .changes
                    .iter()
                    .map(|c| ChangeJson {
                        path: &c.path,
                        action: c.action,
                        size: c.size,
                    })
                    .collect(),
                unchanged: s.unchanged,
                stale_bytecode: &s.stale_bytecode,
            })
            .collect(),
        warnings: &plan.warnings,
        problems: &plan.problems,
        strict: plan.strict,
    };
    serde_json::to_string_pretty(&doc).expect("plan serializes") + "\n"
}

/// The text form: per set, version transitions, counts and bytes, and with
/// `verbose` every changed path. Names, versions and paths are shown with
/// [`quote`]: control characters in them are escaped, git style.
pub fn plan_text(plan: &Plan, verbose: bool, color: bool) -> String {
    let paint = Paint { color };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} ({}, Python {}) -> {} ({}, Python {})",
        quote(&plan.source.name),
        quote(&plan.source.venv),
        quote(&plan.source.python),
        quote(&plan.target.name),
        quote(&plan.target.venv),
        quote(&plan.target.python)
    );
    for set in &plan.sets {
        set_text(&mut out, set, paint);
        if verbose {
            set_paths_text(&mut out, set, paint);
        }
    }
    summary_text(&mut out, plan);
    out
}

/// ANSI colors for the text form, or none.
#[derive(Clone, Copy)]
struct Paint {
    color: bool,
}

impl Paint {
    /// `s` in the SGR color `code`, if colors are on.
    fn paint(self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
}

/// A set's heading, version transitions, and per action its files and bytes.
fn set_text(out: &mut String, set: &SetPlan, paint: Paint) {
    let _ = writeln!(
        out,
        "\n{}",
        paint.paint("1", &format!("set {}", quote(&set.name)))
    );
    for v in &set.versions {
        let from = v.from.as_deref().map_or("(absent)".into(), quote);
        let to = v.to.as_deref().map_or("(removed)".into(), quote);
        let note = if v.from == v.to {
            "  (same version)"
        } else {
            ""
        };
        let _ = writeln!(out, "  {} {from} -> {to}{note}", quote(&v.name));
    }
    let t = totals(set);
    for (action, label, code) in [
        (Action::Add, "add", "32"),
        (Action::Replace, "replace", "33"),
        (Action::Delete, "delete", "31"),
    ] {
        let Totals { files: n, bytes } = t[&action];
        let _ = writeln!(
            out,
            "  {} {:>7} {}  {:>10}",
            paint.paint(code, &format!("{label:<9}")),
            n,
            files(n),
            HumanBytes(bytes).to_string()
        );
    }
    let _ = writeln!(
        out,
        "  {:<9} {:>7} {}  {:>10}",
        "unchanged",
        set.unchanged,
        files(set.unchanged),
        HumanBytes(set.unchanged_bytes).to_string()
    );
    if !set.stale_bytecode.is_empty() {
        let _ = writeln!(
            out,
            "  stale bytecode to delete: {} .pyc",
            set.stale_bytecode.len()
        );
    }
}

/// Every changed path of a set, and its stale bytecode (`--verbose`).
fn set_paths_text(out: &mut String, set: &SetPlan, paint: Paint) {
    for c in &set.changes {
        let (mark, code) = match c.action {
            Action::Add => ("+", "32"),
            Action::Replace => ("~", "33"),
            Action::Delete => ("-", "31"),
        };
        let _ = writeln!(
            out,
            "    {} {} ({})",
            paint.paint(code, mark),
            quote(&c.path),
            HumanBytes(c.size)
        );
    }
    for p in &set.stale_bytecode {
        let _ = writeln!(
            out,
            "    {} {} (stale bytecode)",
            paint.paint("31", "-"),
            quote(p)
        );
    }
}

/// The last line: changes, bytes to send, warnings and predicted problems.
fn summary_text(out: &mut String, plan: &Plan) {
    let (mut n, mut send) = (0u64, 0u64);
    for set in &plan.sets {
        for c in &set.changes {
            n += 1;
            if c.action != Action::Delete {
                send += c.size;
            }
        }
    }
    let _ = writeln!(
        out,
        "\n{n} changes, {} to transfer, {} warning{}, {} predicted problem{}",
        HumanBytes(send),
        plan.warnings.len(),
        if plan.warnings.len() == 1 { "" } else { "s" },
        plan.problems.len(),
        if plan.problems.len() == 1 { "" } else { "s" }
    );
}

/// "file " or "files", keeping the columns aligned.
fn files(n: u64) -> &'static str {
    if n == 1 { "file " } else { "files" }
}
