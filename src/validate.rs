//! The target's own check of the change list it is asked to carry out.
//!
//! A plan is made by the controller from what two agents reported, saved to
//! a file, and sent to the target's agent in `Prepare`. Any of those may be
//! hostile or damaged: a source whose RECORD names `../../../.overlay/...`,
//! a plan file edited by hand, a controller from another build. So the
//! target agent checks the request itself, before it recovers, locks in a
//! generation or writes anything ([`check_prepare`]), whatever the
//! controller checked before. The check is pure (the request and the venv's
//! site-packages path, nothing from the file system), so it is fuzzed
//! (`proptest` below); what the file system holds now is checked by
//! `State::prepare` (drift) and by every write going through
//! [`crate::beneath`].
//!
//! The same helpers tell the plan what to leave out ([`state_path`],
//! [`canonical`]), so an honest plan never trips the check.

use std::collections::HashSet;

use crate::beneath;
use crate::err;
use crate::error::{Error, Result};
use crate::model::venv_relative;
use crate::model::{Action, GenChange, Kind, PrepareRequest, STATE_DIR};

/// The hint of every refusal.
pub const HINT: &str =
    "the plan is damaged or was made by a hostile source; run `overlay plan` again";

/// The longest distribution name or version a generation records, in bytes.
const MAX_VERSION_TEXT: usize = 1024;

/// The permission bits a plan may carry: setuid, setgid and sticky never travel.
pub const MODE_MASK: u32 = 0o777;

/// Whether the venv-relative `rel` is overlay's state folder or inside it.
pub fn in_state_dir(rel: &str) -> bool {
    rel.strip_prefix(STATE_DIR)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Whether the site-relative `path` (RECORD style) points into overlay's
/// state folder. Cheap for the common path (no `.overlay` in it at all).
pub fn state_path(site_rel: &str, path: &str) -> bool {
    path.contains(STATE_DIR) && venv_relative(site_rel, path).is_some_and(|r| in_state_dir(&r))
}

/// How the venv-relative `rel` is spelled relative to site-packages, the
/// way RECORD spells it: `torch/x.py`, or `../../../bin/torchrun`.
pub fn site_spelling(site_rel: &str, rel: &str) -> String {
    if let Some(rest) = rel.strip_prefix(site_rel).and_then(|r| r.strip_prefix('/')) {
        return rest.to_string();
    }
    let depth = site_rel.split('/').count();
    let mut out = "../".repeat(depth);
    out.push_str(rel);
    out
}

/// The venv-relative form of the site-relative `path` if `path` is spelled
/// the one canonical way (no empty, `.` or needless `..` component, no
/// trailing `/`) and stays inside the venv; `None` otherwise.
pub fn canonical(site_rel: &str, path: &str) -> Option<String> {
    let rel = venv_relative(site_rel, path)?;
    beneath::normalize(&rel)?;
    (site_spelling(site_rel, &rel) == path).then_some(rel)
}

fn file_or_link(k: &Option<Kind>) -> bool {
    matches!(k, Some(Kind::File { .. } | Kind::Symlink { .. }))
}

/// Why one change is refused on its own, if it is.
fn bad_change(c: &GenChange) -> Option<String> {
    if let Some(Kind::File { mode, .. }) = &c.source
        && mode & !MODE_MASK != 0
    {
        return Some(format!(
            "its mode {mode:o} has setuid, setgid or sticky bits, which overlay never carries"
        ));
    }
    if let Some(Kind::Symlink { target }) = &c.source
        && (target.is_empty() || target.contains('\0'))
    {
        return Some("its symlink target is empty or holds a NUL".into());
    }
    let ok = match c.action {
        Action::Add => !c.bytecode && file_or_link(&c.source) && c.target.is_none(),
        Action::Replace => !c.bytecode && file_or_link(&c.source) && file_or_link(&c.target),
        Action::Delete if c.bytecode => {
            c.source.is_none()
                && (c.target.is_none() || file_or_link(&c.target))
                && c.path.ends_with(".pyc")
                && c.path.split('/').any(|p| p == "__pycache__")
        }
        Action::Delete => c.source.is_none() && file_or_link(&c.target),
    };
    (!ok).then(|| {
        let shown = |k: &Option<Kind>| match k {
            None => "nothing",
            Some(Kind::File { .. }) => "a file",
            Some(Kind::Symlink { .. }) => "a symlink",
            Some(Kind::Dir { .. }) => "a directory",
            Some(Kind::Missing) => "missing",
            Some(_) => "something else",
        };
        format!(
            "{} {}with {} on the source and {} on the target is not a change overlay makes (only files and symlinks are added, replaced or deleted)",
            c.action.as_str(),
            if c.bytecode { "of bytecode " } else { "" },
            shown(&c.source),
            shown(&c.target)
        )
    })
}

/// Check a `Prepare` request against the venv whose site-packages is
/// `site_rel` (relative to the venv root), before anything is written.
///
/// Refused, naming the first offending path, with the hint [`HINT`]:
/// - a path that is not the canonical site-relative spelling of a path
///   inside the venv ([`canonical`]: absolute, empty, with empty, `.` or
///   needless `..` components, a NUL, or leaving the venv);
/// - a path in overlay's state folder `.overlay/`, or naming site-packages
///   or one of its parents;
/// - the same path twice;
/// - an action that does not fit the kinds: add needs a file or symlink on
///   the source and nothing on the target; replace a file or symlink on
///   both; delete nothing on the source and a file or symlink on the target
///   (never a directory; stale bytecode: a `.pyc` in a `__pycache__`);
/// - a source mode with bits above `0o777` (setuid, setgid, sticky);
/// - a change below a path the same list makes a file or a symlink.
///
/// Accepted requests name only normalized paths outside `.overlay`.
pub fn check_prepare(req: &PrepareRequest, site_rel: &str) -> Result<()> {
    let refuse = |path: &str, why: &str| -> Error {
        err!(
            hint = HINT,
            "Refusing the plan for {}: {path:?}: {why}; nothing was changed",
            req.venv
        )
    };
    // The versions are only recorded and shown (escaped), but kept small.
    if let Some(t) = req.versions.iter().find(|t| {
        [Some(&t.name), t.from.as_ref(), t.to.as_ref()]
            .into_iter()
            .flatten()
            .any(|s| s.len() > MAX_VERSION_TEXT)
    }) {
        return Err(refuse(&t.name, "its version record is too long"));
    }
    let mut rels: Vec<String> = Vec::with_capacity(req.changes.len());
    let mut seen: HashSet<&str> = HashSet::with_capacity(req.changes.len());
    // Paths the list turns into a file or a symlink.
    let mut leaves: HashSet<&str> = HashSet::new();
    for c in &req.changes {
        let rel = canonical(site_rel, &c.path).ok_or_else(|| {
            refuse(
                &c.path,
                "not a plain path inside the venv, spelled as RECORD spells it",
            )
        })?;
        if in_state_dir(&rel) {
            return Err(refuse(&c.path, "it points into overlay's state folder"));
        }
        if site_rel == rel
            || site_rel
                .strip_prefix(rel.as_str())
                .is_some_and(|r| r.starts_with('/'))
        {
            return Err(refuse(&c.path, "it names site-packages or a parent of it"));
        }
        if let Some(why) = bad_change(c) {
            return Err(refuse(&c.path, &why));
        }
        rels.push(rel);
    }
    for (c, rel) in req.changes.iter().zip(&rels) {
        if !seen.insert(rel) {
            return Err(refuse(&c.path, "it is listed twice"));
        }
        if c.action != Action::Delete {
            leaves.insert(rel);
        }
    }
    for (c, rel) in req.changes.iter().zip(&rels) {
        for (i, _) in rel.match_indices('/') {
            if leaves.contains(&rel[..i]) {
                return Err(refuse(
                    &c.path,
                    &format!(
                        "the same plan makes its parent {:?} a file or symlink",
                        site_spelling(site_rel, &rel[..i])
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GenChange;
    use proptest::prelude::*;

    const SITE: &str = "lib/python3.11/site-packages";

    fn file(mode: u32) -> Kind {
        Kind::File {
            size: 1,
            mode,
            blake3: Some("h".into()),
            stamp: None,
        }
    }

    fn link() -> Kind {
        Kind::Symlink { target: "x".into() }
    }

    fn change(path: &str, action: Action, source: Option<Kind>, target: Option<Kind>) -> GenChange {
        GenChange {
            path: path.into(),
            action,
            source,
            target,
            bytecode: false,
            staged: None,
        }
    }

    fn req(changes: Vec<GenChange>) -> PrepareRequest {
        PrepareRequest {
            venv: "/v".into(),
            source: "s".into(),
            target: "t".into(),
            plan_created: 0,
            changes,
            backup: false,
            resume: false,
            same_owner: false,
            versions: Vec::new(),
            shebang: None,
            provenance: None,
            machine: None,
            allow_running: false,
        }
    }

    fn refused(changes: Vec<GenChange>) -> String {
        let e = check_prepare(&req(changes), SITE).unwrap_err();
        assert_eq!(e.hint.as_deref(), Some(HINT));
        e.message
    }

    #[test]
    fn an_honest_plan_passes() {
        let mut bc = change(
            "torch/__pycache__/a.cpython-311.pyc",
            Action::Delete,
            None,
            None,
        );
        bc.bytecode = true;
        check_prepare(
            &req(vec![
                change("torch/a.py", Action::Add, Some(file(0o644)), None),
                change(
                    "torch/b.so",
                    Action::Replace,
                    Some(file(0o755)),
                    Some(link()),
                ),
                change("torch/old.py", Action::Delete, None, Some(file(0o4755))),
                change(
                    "../../../bin/torchrun",
                    Action::Add,
                    Some(file(0o755)),
                    None,
                ),
                change("torch", Action::Delete, None, Some(link())),
                bc,
            ]),
            SITE,
        )
        .unwrap();
    }

    #[test]
    fn paths_must_be_plain_and_inside() {
        for p in [
            "",
            "/etc/passwd",
            "a//b",
            "a/./b",
            "a/../b",
            "a/",
            "../../../../etc/passwd",
            "../../../lib/python3.11/site-packages/a",
            "a\0b",
        ] {
            let m = refused(vec![change(p, Action::Add, Some(file(0o644)), None)]);
            assert!(
                m.contains("not a plain path") && m.contains("/v"),
                "{p:?}: {m}"
            );
        }
        for p in [
            "../../../.overlay/generations/20000101T000000Z-0000/journal",
            "../../../.overlay",
        ] {
            let m = refused(vec![change(p, Action::Add, Some(file(0o644)), None)]);
            assert!(m.contains("state folder"), "{m}");
        }
        for p in ["../../../lib", "../../../lib/python3.11/site-packages"] {
            let m = refused(vec![change(p, Action::Delete, None, Some(link()))]);
            assert!(m.contains("names site-packages"), "{m}");
        }
        // `.overlay` elsewhere is an ordinary name.
        check_prepare(
            &req(vec![change(
                ".overlay/x",
                Action::Add,
                Some(file(0o644)),
                None,
            )]),
            SITE,
        )
        .unwrap();
    }

    #[test]
    fn kinds_must_fit_the_action() {
        let dir = Some(Kind::Dir { mode: 0o755 });
        let cases = vec![
            change("shared", Action::Delete, None, dir.clone()),
            change("a", Action::Replace, Some(file(0o644)), dir.clone()),
            change("a", Action::Add, Some(file(0o644)), Some(file(0o644))),
            change("a", Action::Add, dir.clone(), None),
            change("a", Action::Add, None, None),
            change("a", Action::Delete, Some(file(0o644)), Some(file(0o644))),
            change("a", Action::Delete, None, Some(Kind::Missing)),
        ];
        for c in cases {
            let m = refused(vec![c.clone()]);
            assert!(m.contains("not a change overlay makes"), "{c:?}: {m}");
        }
        let mut bc = change("a.py", Action::Delete, None, None);
        bc.bytecode = true;
        assert!(refused(vec![bc]).contains("bytecode"));
    }

    #[test]
    fn setuid_bits_are_refused() {
        let m = refused(vec![change("a", Action::Add, Some(file(0o6755)), None)]);
        assert!(m.contains("6755") && m.contains("setuid"), "{m}");
    }

    #[test]
    fn duplicates_and_changes_below_a_new_leaf_are_refused() {
        let m = refused(vec![
            change("a", Action::Add, Some(file(0o644)), None),
            change("a", Action::Add, Some(file(0o644)), None),
        ]);
        assert!(m.contains("twice"), "{m}");
        let m = refused(vec![
            change("d", Action::Add, Some(link()), None),
            change("d/f", Action::Add, Some(file(0o644)), None),
        ]);
        assert!(m.contains("\"d/f\"") && m.contains("parent \"d\""), "{m}");
        let m = refused(vec![
            change("d/e/f", Action::Delete, None, Some(file(0o644))),
            change("d", Action::Replace, Some(file(0o644)), Some(link())),
        ]);
        assert!(m.contains("parent \"d\""), "{m}");
        // A file deleted and a directory made in its place is a shape the switch does.
        check_prepare(
            &req(vec![
                change("d", Action::Delete, None, Some(file(0o644))),
                change("d/f", Action::Add, Some(file(0o644)), None),
            ]),
            SITE,
        )
        .unwrap();
    }

    #[test]
    fn spelling_round_trips() {
        for rel in [
            "bin/x",
            "lib/python3.11/site-packages/a/b",
            "share/x",
            "lib/y",
        ] {
            let p = site_spelling(SITE, rel);
            assert_eq!(canonical(SITE, &p).as_deref(), Some(rel), "{p}");
        }
        assert!(state_path(SITE, "../../../.overlay/plan.json"));
        assert!(!state_path(SITE, ".overlay/plan.json"));
        assert!(!state_path(SITE, "torch/a.py"));
    }

    /// A path component a hostile plan might use.
    fn component() -> impl Strategy<Value = String> {
        prop_oneof![
            12 => "[a-z]{1,3}",
            1 => Just(".".to_string()),
            1 => Just("..".to_string()),
            1 => Just(String::new()),
            1 => Just(".overlay".to_string()),
            1 => Just("lib".to_string()),
            1 => Just("python3.11".to_string()),
            1 => Just("site-packages".to_string()),
            1 => Just("__pycache__".to_string()),
            1 => Just("x.pyc".to_string()),
            1 => Just("bin".to_string()),
            1 => Just("\n\u{1}\u{7f}".to_string()),
            1 => Just("a\0b".to_string()),
            1 => "[a-z]{200,300}",
            1 => "\\PC{0,6}",
        ]
    }

    fn path() -> impl Strategy<Value = String> {
        (
            prop::bool::weighted(0.1),
            prop::collection::vec(component(), 1..8),
        )
            .prop_map(|(abs, parts)| {
                let p = parts.join("/");
                if abs { format!("/{p}") } else { p }
            })
    }

    fn kind() -> impl Strategy<Value = Option<Kind>> {
        prop_oneof![
            Just(None),
            (0u32..0o10000).prop_map(|m| Some(file(m))),
            Just(Some(link())),
            Just(Some(Kind::Dir { mode: 0o755 })),
            Just(Some(Kind::Missing)),
            Just(Some(Kind::Other)),
        ]
    }

    fn changes() -> impl Strategy<Value = Vec<GenChange>> {
        prop::collection::vec(
            (
                path(),
                prop_oneof![
                    Just(Action::Add),
                    Just(Action::Replace),
                    Just(Action::Delete)
                ],
                kind(),
                kind(),
                prop::bool::weighted(0.5),
                prop::bool::weighted(0.1),
            )
                .prop_map(|(path, action, source, target, fitting, bytecode)| {
                    // Half of them with kinds that fit the action, so that
                    // plenty of requests pass and their paths are checked.
                    let (source, target) = match (fitting, action) {
                        (false, _) => (source, target),
                        (true, Action::Add) => (Some(file(0o644)), None),
                        (true, Action::Replace) => (Some(link()), Some(file(0o755))),
                        (true, Action::Delete) => (None, Some(file(0o644))),
                    };
                    let mut c = change(&path, action, source, target);
                    c.bytecode = bytecode;
                    c
                }),
            0..6,
        )
    }

    /// Resolve `path` against site-packages with a string stack of its own
    /// (not `venv_relative`): `None` if it leaves the venv or is not plain.
    fn resolved(path: &str) -> Option<String> {
        if path.starts_with('/') {
            return None;
        }
        let mut stack: Vec<&str> = SITE.split('/').collect();
        for part in path.split('/') {
            match part {
                ".." => {
                    stack.pop()?;
                }
                "" | "." => return None,
                p => stack.push(p),
            }
        }
        Some(stack.join("/"))
    }

    /// The generator is worth something only if many of its requests pass.
    #[test]
    fn the_fuzzed_requests_are_often_accepted() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let (mut ok, n) = (0, 256);
        for _ in 0..n {
            let changes = changes().new_tree(&mut runner).unwrap().current();
            ok += check_prepare(&req(changes), SITE).is_ok() as usize;
        }
        assert!(ok * 10 > n, "only {ok} of {n} accepted");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Random requests are refused, or name only normalized paths outside `.overlay`.
        #[test]
        fn accepted_requests_name_only_plain_paths_outside_the_state(changes in changes()) {
            let r = req(changes);
            if check_prepare(&r, SITE).is_ok() {
                let mut seen = HashSet::new();
                for c in &r.changes {
                    let rel = resolved(&c.path);
                    prop_assert!(rel.is_some(), "{:?} accepted", c.path);
                    let rel = rel.unwrap();
                    prop_assert!(beneath::normalize(&rel).is_some(), "{rel:?}");
                    prop_assert!(!rel.contains('\0'));
                    prop_assert!(rel != ".overlay" && !rel.starts_with(".overlay/"), "{rel:?}");
                    prop_assert!(SITE != rel && !SITE.starts_with(&format!("{rel}/")), "{rel:?}");
                    prop_assert!(seen.insert(rel.clone()), "{rel:?} twice");
                    if let Some(Kind::File { mode, .. }) = &c.source {
                        prop_assert!(*mode <= 0o777);
                    }
                    let dir_target = matches!(c.target, Some(Kind::Dir { .. }));
                    prop_assert!(!dir_target, "a directory target accepted");
                }
            }
        }

        /// Every plain path inside the venv and outside the state is spelled canonically once.
        #[test]
        fn canonical_spelling_is_unique(p in path()) {
            if let Some(rel) = canonical(SITE, &p) {
                prop_assert_eq!(site_spelling(SITE, &rel), p.clone());
                prop_assert_eq!(resolved(&p), Some(rel));
            }
        }
    }
}
