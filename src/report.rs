//! Rendering of plans for people (text) and programs (JSON). Pure functions
//! that return strings, so tests can read them back.

use std::fmt::Write;

use indicatif::HumanBytes;
use serde::Serialize;

use std::collections::BTreeMap;

use crate::model::{Action, Check, Problem};
use crate::plan::{Plan, SetPlan, Totals, Warning, totals};
use crate::text::quote;

/// The `--json` document of `overlay plan`.
#[derive(Serialize)]
pub struct PlanJson<'a> {
    pub source: &'a str,
    pub target: &'a str,
    /// The source's NVIDIA driver and GPUs, as its scan read them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_machine: Option<&'a crate::model::Machine>,
    /// The target's, which the GPU check judged the plan against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_machine: Option<&'a crate::model::Machine>,
    pub sets: Vec<SetJson<'a>>,
    pub warnings: &'a [Warning],
    pub problems: &'a [Problem],
    pub strict: bool,
    /// The processes that run from the target's venv (absent in plans
    /// made before overlay listed them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<&'a crate::model::Running>,
}

#[derive(Serialize)]
pub struct SetJson<'a> {
    pub name: &'a str,
    pub versions: &'a [crate::plan::Transition],
    pub changes: Vec<ChangeJson<'a>>,
    pub unchanged: u64,
    pub stale_bytecode: &'a [String],
    /// The `from` folder the set's files come from, as the manifest names
    /// it; absent for the source host's venv.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<&'a str>,
}

#[derive(Serialize)]
pub struct ChangeJson<'a> {
    pub path: &'a str,
    pub action: Action,
    pub size: u64,
}

pub fn plan_json(plan: &Plan) -> String {
    let doc = plan_doc(plan);
    serde_json::to_string_pretty(&doc).expect("plan serializes") + "\n"
}

/// A host of a plan as its header names it: `name (venv, Python X.Y)`.
fn host_line(h: &crate::plan::HostInfo) -> String {
    format!(
        "{} ({}, Python {})",
        quote(&h.name),
        quote(&h.venv),
        quote(&h.python)
    )
}

/// One line per host of what its GPU code runs on (`  ct200: NVIDIA
/// driver 570.172.08 (CUDA ≤ 12.8), 8 × Tesla V100-SXM2-32GB (sm_70, 32
/// GiB)`), when any of `hosts` has an NVIDIA driver or GPUs, or facts that
/// could not be read; a host without either says "no NVIDIA driver".
fn machine_lines(out: &mut String, hosts: &[&crate::plan::HostInfo]) {
    let shown = hosts.iter().any(|h| {
        h.machine
            .as_ref()
            .is_some_and(|m| m.has_nvidia() || !m.notes.is_empty())
    });
    if !shown {
        return;
    }
    for h in hosts {
        let Some(m) = &h.machine else { continue };
        let _ = writeln!(out, "  {}: {}", quote(&h.name), quote(&m.describe()));
        for n in &m.notes {
            let _ = writeln!(out, "    ({})", quote(n));
        }
    }
}

/// The text form: per set, version transitions, counts and bytes, and with
/// `verbose` every changed path. Names, versions and paths are shown with
/// [`quote`]: control characters in them are escaped, git style.
pub fn plan_text(plan: &Plan, verbose: bool, color: bool) -> String {
    let paint = Paint { color };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} -> {}",
        host_line(&plan.source),
        host_line(&plan.target)
    );
    machine_lines(&mut out, &[&plan.source, &plan.target]);
    running_text(&mut out, plan);
    sets_and_summary(&mut out, plan, verbose, paint);
    out
}

/// The processes that run from the target's venv, one line each: pid,
/// user, start, GPU memory where known, how it was found, command.
fn running_text(out: &mut String, plan: &Plan) {
    let Some(running) = &plan.running else {
        return;
    };
    if !running.processes.is_empty() {
        let _ = writeln!(
            out,
            "Running from {}'s venv (apply and rollback refuse while {} run; --allow-running goes on):",
            quote(&plan.target.name),
            if running.processes.len() == 1 {
                "it"
            } else {
                "they"
            }
        );
    }
    for p in &running.processes {
        let how: Vec<&str> = p.how.iter().map(|h| h.name()).collect();
        let _ = writeln!(
            out,
            "  pid {} {} started {}{} [{}] {}",
            p.pid,
            quote(&p.user),
            crate::text::format_time(p.started),
            p.gpu_mib
                .map(|m| format!(", {m} MiB of GPU memory"))
                .unwrap_or_default(),
            how.join(", "),
            crate::text::escape(&p.command)
        );
    }
    if !running.unknown.is_empty() {
        let n = running.unknown.len();
        let _ = writeln!(
            out,
            "  {n} process{} of other users not inspected: whether {} from the venv is unknown",
            if n == 1 { "" } else { "es" },
            if n == 1 { "it runs" } else { "they run" }
        );
    }
}

/// A plan's sets (with `verbose`, every changed path) and its summary line.
fn sets_and_summary(out: &mut String, plan: &Plan, verbose: bool, paint: Paint) {
    for set in &plan.sets {
        set_text(out, set, paint);
        if verbose {
            set_paths_text(out, set, paint);
        }
    }
    summary_text(out, plan);
}

/// The `--json` document of `overlay plan SRC T1 T2 ...`: every target's
/// plan (as [`plan_json`] gives it), and the targets grouped by identical
/// plans.
#[derive(Serialize)]
pub struct FleetJson<'a> {
    pub source: &'a str,
    pub targets: Vec<PlanJson<'a>>,
    /// Targets with identical changes, in the order first named.
    pub groups: Vec<Vec<&'a str>>,
}

/// [`PlanJson`] of one plan.
fn plan_doc(plan: &Plan) -> PlanJson<'_> {
    PlanJson {
        source: &plan.source.name,
        target: &plan.target.name,
        source_machine: plan.source.machine.as_ref(),
        target_machine: plan.target.machine.as_ref(),
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
                from: s.from.as_ref().map(|f| f.name.as_str()),
            })
            .collect(),
        warnings: &plan.warnings,
        problems: &plan.problems,
        strict: plan.strict,
        running: plan.running.as_ref(),
    }
}

/// The plans' indexes grouped by identical changes (sets, versions,
/// changed paths, actions and sizes), in the order first seen.
pub fn same_plans(plans: &[Plan]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, p) in plans.iter().enumerate() {
        let key = serde_json::to_string(&plan_doc(p).sets).expect("sets serialize");
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    groups.into_iter().map(|(_, v)| v).collect()
}

pub fn fleet_json(plans: &[Plan]) -> String {
    let doc = FleetJson {
        source: plans.first().map_or("", |p| p.source.name.as_str()),
        targets: plans.iter().map(plan_doc).collect(),
        groups: same_plans(plans)
            .into_iter()
            .map(|g| {
                g.into_iter()
                    .map(|i| plans[i].target.name.as_str())
                    .collect()
            })
            .collect(),
    };
    serde_json::to_string_pretty(&doc).expect("plans serialize") + "\n"
}

/// The text form of several targets' plans: a header, then per group of
/// identical plans one line naming its targets ("dst, dst2: same plan, 12
/// changes") and the plan's sets and summary as [`plan_text`] shows them.
pub fn fleet_text(plans: &[Plan], verbose: bool, color: bool) -> String {
    let paint = Paint { color };
    let mut out = String::new();
    let Some(first) = plans.first() else {
        return out;
    };
    let names: Vec<String> = plans
        .iter()
        .map(|p| quote(&p.target.name).into_owned())
        .collect();
    let _ = writeln!(
        out,
        "{} -> {} target{}: {}",
        host_line(&first.source),
        plans.len(),
        if plans.len() == 1 { "" } else { "s" },
        names.join(", ")
    );
    let groups = same_plans(plans);
    for g in &groups {
        let plan = &plans[g[0]];
        let n: usize = plan.sets.iter().map(|s| s.changes.len()).sum();
        let who: Vec<&str> = g.iter().map(|&i| names[i].as_str()).collect();
        let _ = writeln!(
            out,
            "\n{}: {}{} change{} ({}, Python {})",
            who.join(", "),
            if g.len() > 1 { "same plan, " } else { "" },
            n,
            if n == 1 { "" } else { "s" },
            quote(&plan.target.venv),
            quote(&plan.target.python)
        );
        sets_and_summary(&mut out, plan, verbose, paint);
    }
    let total: usize = plans
        .iter()
        .map(|p| p.sets.iter().map(|s| s.changes.len()).sum::<usize>())
        .sum();
    let _ = writeln!(
        out,
        "\n{} target{}, {} distinct plan{}, {} changes in all",
        plans.len(),
        if plans.len() == 1 { "" } else { "s" },
        groups.len(),
        if groups.len() == 1 { "" } else { "s" },
        total
    );
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
        paint.paint(
            "1",
            &match &set.from {
                None => format!("set {}", quote(&set.name)),
                Some(f) => format!("set {} (from {})", quote(&set.name), quote(&f.name)),
            }
        )
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
    let carried = set
        .changes
        .iter()
        .filter(|c| c.action != Action::Delete && crate::model::in_pycache(&c.path))
        .count();
    if carried > 0 {
        let _ = writeln!(
            out,
            "  bytecode carried with its .py (in the counts above): {carried} .pyc"
        );
    }
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
        plan.new_problems(),
        if plan.new_problems() == 1 { "" } else { "s" }
    );
}

/// The plan's predicted problems for stderr, one line each (not escaped).
///
/// By default: the new problems, those of one cause (missing soname,
/// undefined symbol, unmet requirement) on one line with how many files or
/// dists have it; then one line for those that existed before the overlay,
/// and one for optional plugins with unmet needs. With `verbose`, every
/// problem on its own line, pre-existing ones and plugins in their own
/// sections. Problems are errors when the plan is strict and they are new.
pub fn problems_text(problems: &[Problem], strict: bool, verbose: bool) -> Vec<String> {
    let level = if strict { "error" } else { "warning" };
    let new: Vec<&Problem> = problems.iter().filter(|p| p.is_new()).collect();
    let old: Vec<&Problem> = problems.iter().filter(|p| p.preexisting).collect();
    let plugins: Vec<&Problem> = problems
        .iter()
        .filter(|p| p.optional && !p.preexisting)
        .collect();
    let mut out = Vec::new();
    if verbose {
        out.extend(new.iter().map(|p| format!("{level}: {}", problem_line(p))));
        if !old.is_empty() {
            out.push(format!(
                "note: {} that existed before this overlay and are unchanged:",
                counted(old.len(), "problem")
            ));
            out.extend(old.iter().map(|p| format!("  {}", problem_line(p))));
        }
        if !plugins.is_empty() {
            out.push(format!(
                "note: {} in optional plugins (shared objects no extension module loads):",
                counted(plugins.len(), "problem")
            ));
            out.extend(plugins.iter().map(|p| format!("  {}", problem_line(p))));
        }
        return out;
    }
    // New problems, grouped by cause, in the order of their first member.
    let mut groups: Vec<(String, Vec<&Problem>)> = Vec::new();
    for p in new {
        let key = format!("{:?}\0{}", p.check, p.cause.as_deref().unwrap_or(&p.reason));
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(p),
            None => groups.push((key, vec![p])),
        }
    }
    for (_, g) in &groups {
        out.push(format!("{level}: {}", group_line(g)));
    }
    if !old.is_empty() {
        let mut by_check: BTreeMap<Check, usize> = BTreeMap::new();
        for p in &old {
            *by_check.entry(p.check).or_default() += 1;
        }
        let parts: Vec<String> = by_check
            .iter()
            .map(|(c, n)| counted(*n, &format!("{} problem", check_name(*c))))
            .collect();
        out.push(format!(
            "note: {} existed before this overlay and {} unchanged; `plan -v` lists them",
            parts.join(" and "),
            if old.len() == 1 { "is" } else { "are" }
        ));
    }
    if !plugins.is_empty() {
        let mut by_dist: BTreeMap<&str, usize> = BTreeMap::new();
        for p in &plugins {
            *by_dist
                .entry(p.dist.as_deref().unwrap_or("(no dist)"))
                .or_default() += 1;
        }
        let parts: Vec<String> = by_dist.iter().map(|(d, n)| format!("{n} in {d}")).collect();
        out.push(format!(
            "note: optional plugins with unmet needs: {}; `plan -v` lists them",
            parts.join(", ")
        ));
    }
    out
}

/// "1 problem", "3 problems".
fn counted(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

fn check_name(c: Check) -> &'static str {
    match c {
        Check::Requirements => "requirement",
        Check::Cuda => "CUDA",
        Check::Elf => "ELF",
        Check::Gpu => "GPU",
    }
}

/// The check's tag in a problem line, as in `--json`.
fn check_tag(c: Check) -> &'static str {
    match c {
        Check::Requirements => "requirements",
        Check::Cuda => "cuda",
        Check::Elf => "elf",
        Check::Gpu => "gpu",
    }
}

/// One problem: `[check] dist: file: reason`, the file left out when the
/// reason names it already.
fn problem_line(p: &Problem) -> String {
    let dist = p
        .dist
        .as_deref()
        .map(|d| format!("{d}: "))
        .unwrap_or_default();
    let file = match &p.file {
        Some(f)
            if !p.reason.starts_with(f.as_str())
                && !p.reason.contains(&format!("(loaded by {f})")) =>
        {
            format!("{f}: ")
        }
        _ => String::new(),
    };
    format!("[{}] {dist}{file}{}", check_tag(p.check), p.reason)
}

/// Problems of one cause: the problem itself when alone, else the cause
/// with how many files (or dists) have it and the first two named.
fn group_line(g: &[&Problem]) -> String {
    if g.len() == 1 {
        return problem_line(g[0]);
    }
    let p = g[0];
    let by_file = g.iter().all(|p| p.file.is_some());
    let mut names: Vec<&str> = g
        .iter()
        .filter_map(|p| {
            if by_file {
                p.file.as_deref()
            } else {
                p.dist.as_deref()
            }
        })
        .collect();
    names.dedup();
    let shown: Vec<&str> = names.iter().take(2).copied().collect();
    let more = names.len().saturating_sub(2);
    let cause = p.cause.as_deref().unwrap_or(&p.reason);
    let what = match p.check {
        Check::Requirements => format!("requires {cause}"),
        _ => cause.to_owned(),
    };
    format!(
        "[{}] {what}: {} ({}{})",
        check_tag(p.check),
        counted(names.len(), if by_file { "file" } else { "dist" }),
        shown.join(", "),
        if more > 0 {
            format!(", and {more} more")
        } else {
            String::new()
        }
    )
}

/// "file " or "files", keeping the columns aligned.
fn files(n: u64) -> &'static str {
    if n == 1 { "file " } else { "files" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(dist: &str, reason: &str, preexisting: bool) -> Problem {
        Problem {
            check: Check::Requirements,
            dist: Some(dist.into()),
            cause: reason.split_once(" requires ").map(|(_, c)| c.to_owned()),
            reason: reason.into(),
            preexisting,
            ..Problem::default()
        }
    }

    fn plugin(dist: &str, file: &str) -> Problem {
        Problem {
            check: Check::Elf,
            dist: Some(dist.into()),
            file: Some(file.into()),
            reason: "needs libmpi.so.40, which is not found (searched: ld.so cache)".into(),
            cause: Some("needs libmpi.so.40, which is not found".into()),
            optional: true,
            ..Problem::default()
        }
    }

    #[test]
    fn causes_are_grouped_and_the_rest_summarized() {
        let pin = "requires torch==2.14.1, but torch 2.15.0 is installed";
        let problems = vec![
            req("sglang", &format!("sglang 0.5 {pin}"), false),
            req("sglang-kernel", &format!("sglang-kernel 0.4 {pin}"), false),
            req(
                "torch",
                "torch 2.15.0 requires setuptools>=77.0.3, but setuptools 70.0 is installed",
                false,
            ),
            req("a", "a 1 requires b, but b is not installed", true),
            req("c", "c 1 requires b, but b is not installed", true),
            plugin(
                "nvidia-nvshmem-cu13",
                "nvidia/nvshmem/lib/nvshmem_transport_ucx.so.1",
            ),
            plugin(
                "nvidia-nvshmem-cu13",
                "nvidia/nvshmem/lib/nvshmem_bootstrap_mpi.so.3",
            ),
            plugin("triton", "triton/plugins/libx.so"),
        ];
        assert_eq!(
            problems_text(&problems, false, false),
            vec![
                "warning: [requirements] requires torch==2.14.1, but torch 2.15.0 is installed: 2 dists (sglang, sglang-kernel)",
                "warning: [requirements] torch: torch 2.15.0 requires setuptools>=77.0.3, but setuptools 70.0 is installed",
                "note: 2 requirement problems existed before this overlay and are unchanged; `plan -v` lists them",
                "note: optional plugins with unmet needs: 2 in nvidia-nvshmem-cu13, 1 in triton; `plan -v` lists them",
            ]
        );
        let verbose = problems_text(&problems, true, true);
        assert_eq!(verbose.len(), 3 + 1 + 2 + 1 + 3, "{verbose:#?}");
        assert!(verbose[0].starts_with("error: [requirements] sglang: sglang 0.5 requires"));
    }
}
