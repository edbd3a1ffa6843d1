//! The layer check: every reference from one module of `src/` to another
//! must point down the table in docs/design.md ("Layout"), or across within
//! a layer without forming a cycle. A lower layer that names a higher one
//! fails this test with the file, the line and the rule it breaks.
//!
//! References are read from the source text: every `crate::NAME` in the
//! library (and `overlay::NAME` or `crate::NAME` in the binary), in `use`
//! lines and inline paths alike, outside comments. `super::` stays inside a
//! module and is not counted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, lowest first. A module may use modules of its own layer or
/// any layer below.
const LAYERS: &[(&str, &[&str])] = &[
    ("foundation", &["error", "text", "beneath", "interrupt"]),
    ("model", &["model"]),
    (
        "protocol, manifest, plan, report",
        &["protocol", "manifest", "plan", "report", "validate"],
    ),
    (
        "host side and transport",
        &[
            "bundle",
            "hashcache",
            "inventory",
            "journal",
            "stream",
            "verify",
            "preflight",
            "doctor",
            "running",
            "transport",
        ],
    ),
    ("client", &["client"]),
    ("agent and operations", &["agent", "ops"]),
    ("fleet", &["fleet"]),
    (
        "binary",
        &["main", "cli", "progress", "commands", "musl_memcmp"],
    ),
];

/// Pairs that the layer order allows but the design does not: host-side
/// work knows nothing of the protocol or the transport; the transport knows
/// only the foundation and the model; the agent and the controller's
/// operations do not call each other.
const FORBIDDEN: &[(&[&str], &[&str], &str)] = &[
    (
        &[
            "bundle",
            "hashcache",
            "inventory",
            "journal",
            "stream",
            "verify",
            "preflight",
            "doctor",
            "running",
        ],
        &["protocol", "transport"],
        "host-side work knows nothing of the protocol or the transport",
    ),
    (
        &["transport"],
        &[
            "protocol",
            "manifest",
            "plan",
            "report",
            "validate",
            "hashcache",
            "inventory",
            "journal",
            "stream",
            "verify",
            "preflight",
        ],
        "the transport knows only the foundation and the model",
    ),
    (
        &["agent"],
        &["ops"],
        "the agent does not run controller workflows",
    ),
    (
        &["ops"],
        &["agent"],
        "the controller's operations talk to agents through the client",
    ),
];

/// Modules of the binary crate (`src/main.rs` and what it declares).
const BINARY: &[&str] = &["main", "cli", "progress", "commands", "musl_memcmp"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, mods)| mods.contains(&module))
}

/// One reference from a file to a module.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reference {
    file: String,
    line: usize,
    from: String,
    to: String,
    /// For references between commands: the command module named.
    command: Option<String>,
}

/// The top-level module a file belongs to: `src/journal.rs` and
/// `src/journal/undo.rs` are both `journal`.
fn module_of(file: &str) -> String {
    let rel = file.trim_start_matches("src/");
    let first = rel.split('/').next().unwrap_or(rel);
    first.trim_end_matches(".rs").to_string()
}

/// The command module of a file under `src/commands/`, if any.
fn command_of(file: &str) -> Option<String> {
    let rest = file.strip_prefix("src/commands/")?;
    let name = rest.split('/').next()?.trim_end_matches(".rs");
    (name != "mod").then(|| name.to_string())
}

/// The code of one line: without its comment (line and doc comments) and
/// with string literals emptied, so `"overlay::transport"` in a test's
/// string is not a use. (A string that spans lines is rare enough in `src/`
/// to ignore.)
fn code_of(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        match (in_str, c) {
            (true, '\\') => {
                chars.next();
            }
            (true, '"') => {
                in_str = false;
                out.push(c);
            }
            (true, _) => {}
            (false, '"') => {
                in_str = true;
                out.push(c);
            }
            (false, '/') if chars.peek() == Some(&'/') => break,
            (false, _) => out.push(c),
        }
    }
    out
}

/// Every module reference in `text` (the source of `file`).
fn references(file: &str, text: &str) -> Vec<Reference> {
    let from = module_of(file);
    let in_binary = BINARY.contains(&from.as_str());
    let mut out = vec![];
    let mut push = |line: usize, root: &str, name: &str, next: &str| {
        let to = match (root, in_binary) {
            ("overlay", _) | ("crate", false) => name.to_string(),
            ("crate", true) => name.to_string(),
            _ => return,
        };
        let command = (to == "commands").then(|| next.to_string());
        if to != from || command.is_some() {
            out.push(Reference {
                file: file.to_string(),
                line,
                from: from.clone(),
                to,
                command,
            });
        }
    };
    for (n, raw) in text.lines().enumerate() {
        let code = code_of(raw);
        let code = code.as_str();
        for root in ["crate", "overlay"] {
            let pat = format!("{root}::");
            let mut rest = code;
            while let Some(i) = rest.find(&pat) {
                let before = rest[..i].chars().last();
                let after = &rest[i + pat.len()..];
                rest = after;
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                if let Some(group) = after.strip_prefix('{') {
                    // `use crate::{a, b::c};` (one line)
                    let body = group.split('}').next().unwrap_or("");
                    for item in body.split(',') {
                        let mut parts = item.trim().split("::");
                        let name = parts.next().unwrap_or("");
                        if !name.is_empty() && name != "self" {
                            push(n + 1, root, name, parts.next().unwrap_or(""));
                        }
                    }
                    continue;
                }
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                let next: String = after[name.len()..]
                    .strip_prefix("::")
                    .unwrap_or("")
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                // Macros exported at the crate root (`crate::err!`) belong
                // to the foundation.
                let name = if name == "err" { "error".into() } else { name };
                if !name.is_empty() {
                    push(n + 1, root, &name, &next);
                }
            }
        }
    }
    out
}

/// What breaks the layering, in words, one line per offence.
fn violations(refs: &[Reference]) -> Vec<String> {
    let mut out = vec![];
    for r in refs {
        let here = format!("{}:{}: {} uses {}", r.file, r.line, r.from, r.to);
        if r.from == "commands" {
            let own = command_of(&r.file);
            if let (Some(target), Some(own)) = (&r.command, &own)
                && target != own
                && !target.is_empty()
            {
                out.push(format!(
                    "{here}::{target}: commands never import each other"
                ));
            }
            if r.to == "commands" {
                continue;
            }
        }
        let (Some(a), Some(b)) = (layer_of(&r.from), layer_of(&r.to)) else {
            if layer_of(&r.to).is_none() {
                out.push(format!(
                    "{here}: {} is in no layer of tests/layers.rs",
                    r.to
                ));
            }
            if layer_of(&r.from).is_none() {
                out.push(format!(
                    "{here}: {} is in no layer of tests/layers.rs",
                    r.from
                ));
            }
            continue;
        };
        if b > a {
            out.push(format!(
                "{here}: layer \"{}\" may not use layer \"{}\" above it",
                LAYERS[a].0, LAYERS[b].0
            ));
        }
        for (froms, tos, why) in FORBIDDEN {
            if froms.contains(&r.from.as_str()) && tos.contains(&r.to.as_str()) {
                out.push(format!("{here}: {why}"));
            }
        }
    }
    out
}

/// The file-level node of `file`: its module path under `src/`, two
/// levels deep at most (`src/ops/apply.rs` is `ops::apply`,
/// `src/plan/compute/tests.rs` is `plan::compute`, `src/ops/mod.rs` is
/// `ops`).
fn node_of(file: &str) -> Vec<String> {
    let rel = file.trim_start_matches("src/").trim_end_matches(".rs");
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The node a module path names, as far as files exist for it: `ops::apply`
/// when `src/ops/apply.rs` (or `src/ops/apply/`) is there, else `ops`.
fn existing_node(path: &[String], exists: &dyn Fn(&str) -> bool) -> String {
    let mut node: Vec<&str> = Vec::new();
    for part in path.iter().take(2) {
        let candidate = [node.as_slice(), &[part.as_str()]].concat().join("/");
        if exists(&format!("src/{candidate}.rs")) || exists(&format!("src/{candidate}")) {
            node.push(part);
        } else {
            break;
        }
    }
    node.join("::")
}

/// Every reference from one file-level node to another (see [`node_of`]):
/// `crate::a::b` and `super::b` paths, outside the file's test module. A `mod.rs` naming its own
/// submodules by bare name is not read, so a parent never forms a cycle
/// with its children; the cycles this finds run between siblings or
/// across modules.
fn file_references(file: &str, text: &str, exists: &dyn Fn(&str) -> bool) -> Vec<(String, String)> {
    let here = node_of(file);
    let from = existing_node(&here, exists);
    // `super` of a file module is its parent; of a `mod.rs`, its parent's.
    let mut parent = here.clone();
    parent.pop();
    let mut out = BTreeSet::new();
    let lines: Vec<&str> = text.lines().collect();
    for (n, raw) in lines.iter().enumerate() {
        // A file's test module (`#[cfg(test)]` then `mod ...`) ends what is
        // read: a test may drive its module through the serve loop above it.
        if raw.trim() == "#[cfg(test)]"
            && lines
                .get(n + 1)
                .is_some_and(|l| l.trim_start().starts_with("mod "))
        {
            break;
        }
        let code = code_of(raw);
        for (pat, base) in [("crate::", Vec::new()), ("super::", parent.clone())] {
            let mut rest = code.as_str();
            while let Some(i) = rest.find(pat) {
                let before = rest[..i].chars().last();
                let after = &rest[i + pat.len()..];
                rest = after;
                if before.is_some_and(|c| {
                    c.is_alphanumeric() || c == '_' || (c == ':' && pat == "crate::")
                }) {
                    continue;
                }
                let mut targets: Vec<Vec<String>> = Vec::new();
                let word = |s: &str| -> Vec<String> {
                    s.split("::")
                        .map(|p| {
                            p.chars()
                                .take_while(|c| c.is_alphanumeric() || *c == '_')
                                .collect::<String>()
                        })
                        .take_while(|p| !p.is_empty())
                        .collect()
                };
                // `a::b::{c, d::e}` (one line): the prefix, then each item.
                match after.find('{') {
                    Some(open) if open == 0 || after[..open].ends_with("::") => {
                        let prefix = word(&after[..open]);
                        for item in after[open + 1..].split('}').next().unwrap_or("").split(',') {
                            let item = word(item.trim());
                            let item = if item.first().is_some_and(|i| i == "self") {
                                Vec::new()
                            } else {
                                item
                            };
                            targets.push(prefix.iter().cloned().chain(item).collect());
                        }
                    }
                    _ => targets.push(word(after)),
                }
                for t in targets {
                    let path: Vec<String> = base.iter().cloned().chain(t).collect();
                    let to = existing_node(&path, exists);
                    if !to.is_empty() && to != from {
                        out.insert((from.clone(), to));
                    }
                }
            }
        }
    }
    out.into_iter().collect()
}

/// Cycles among the library's modules, each as `a -> b -> a`.
fn cycles(refs: &[Reference]) -> Vec<String> {
    let edges: Vec<(&str, &str)> = refs
        .iter()
        .map(|r| (r.from.as_str(), r.to.as_str()))
        .collect();
    cycles_of(&edges)
}

/// Cycles in a graph given by its edges, each named once as `a -> b -> a`.
fn cycles_of(edges: &[(&str, &str)]) -> Vec<String> {
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for &(from, to) in edges {
        if from != to {
            graph.entry(from).or_default().insert(to);
        }
    }
    let mut found = BTreeSet::new();
    for &start in graph.keys() {
        // Depth-first search for a path back to `start`.
        let mut stack = vec![(start, vec![start])];
        let mut seen = BTreeSet::new();
        while let Some((node, path)) = stack.pop() {
            for &next in graph.get(node).into_iter().flatten() {
                if next == start {
                    let mut cycle = path.clone();
                    // Name each cycle once, from its smallest module.
                    let min = cycle.iter().enumerate().min_by_key(|(_, m)| **m).unwrap().0;
                    cycle.rotate_left(min);
                    cycle.push(cycle[0]);
                    found.insert(cycle.join(" -> "));
                } else if seen.insert(next) {
                    let mut p = path.clone();
                    p.push(next);
                    stack.push((next, p));
                }
            }
        }
    }
    found.into_iter().collect()
}

fn rust_files(dir: &Path, out: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::env::set_current_dir(root).unwrap();
    let mut files = vec![];
    rust_files(Path::new("src"), &mut files);
    let mut refs = vec![];
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        refs.extend(references(f, &text));
    }
    let mut problems = violations(&refs);
    problems.extend(
        cycles(&refs)
            .into_iter()
            .map(|c| format!("import cycle: {c}")),
    );
    // The same among the files of the modules (`ops::apply`, ...).
    let exists = |p: &str| Path::new(p).exists();
    let mut edges = vec![];
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        edges.extend(file_references(f, &text, &exists));
    }
    let edges: Vec<(&str, &str)> = edges
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    problems.extend(
        cycles_of(&edges)
            .into_iter()
            .map(|c| format!("import cycle between files: {c}")),
    );
    assert!(
        problems.is_empty(),
        "{} layering problems (the table is in tests/layers.rs and docs/design.md#layout):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_check_catches_a_lower_layer_using_a_higher_one() {
    // The journal (host side) reaching for the client, the transport for
    // the journal, one command for another, and a cycle.
    let refs: Vec<Reference> = [
        ("src/journal/undo.rs", "use crate::client::Client;\n"),
        (
            "src/transport/ssh/pipe.rs",
            "let x = crate::journal::STATE_DIR;\n",
        ),
        (
            "src/commands/verify.rs",
            "use crate::commands::rollback::resolve;\n",
        ),
        ("src/plan.rs", "use crate::{model::Entry, report};\n"),
        (
            "src/report.rs",
            "// crate::agent in a comment is not a use\nuse crate::plan::Plan;\n",
        ),
        (
            "src/model/entry.rs",
            "use crate::error::Result; crate::err!(\"x\");\n",
        ),
    ]
    .iter()
    .flat_map(|(f, t)| references(f, t))
    .collect();
    let v = violations(&refs);
    assert_eq!(
        v,
        [
            "src/journal/undo.rs:1: journal uses client: layer \"host side and transport\" may not use layer \"client\" above it",
            "src/transport/ssh/pipe.rs:1: transport uses journal: the transport knows only the foundation and the model",
            "src/commands/verify.rs:1: commands uses commands::rollback: commands never import each other",
        ],
        "{v:#?}"
    );
    assert_eq!(cycles(&refs), ["plan -> report -> plan"]);
}

#[test]
fn the_check_catches_fleet_below_ops_and_a_cycle_between_files() {
    // An operation of one target reaching up into the fleet.
    let refs = references("src/ops/apply.rs", "use crate::fleet::fanout;\n");
    assert_eq!(
        violations(&refs),
        [
            "src/ops/apply.rs:1: ops uses fleet: layer \"agent and operations\" may not use layer \"fleet\" above it"
        ]
    );
    // apply -> pack -> apply, by `super::` and by `crate::` paths.
    let files = [
        "src/ops/apply.rs",
        "src/ops/pack.rs",
        "src/ops/mod.rs",
        "src/ops",
    ];
    let exists = |p: &str| files.contains(&p);
    let mut edges = file_references("src/ops/apply.rs", "use super::pack::Named;\n", &exists);
    edges.extend(file_references(
        "src/ops/pack.rs",
        "use crate::ops::{Observer, apply::apply};\n",
        &exists,
    ));
    let edges: Vec<(&str, &str)> = edges
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(cycles_of(&edges), ["ops::apply -> ops::pack -> ops::apply"]);
}
