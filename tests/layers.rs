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
            "transport",
        ],
    ),
    ("client", &["client"]),
    ("agent and operations", &["agent", "ops"]),
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

/// Cycles among the library's modules, each as `a -> b -> a`.
fn cycles(refs: &[Reference]) -> Vec<String> {
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in refs {
        if r.from != r.to {
            graph.entry(&r.from).or_default().insert(&r.to);
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
