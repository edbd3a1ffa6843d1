//! `StatMembers`: `Stat` of the sets' members as this agent finds them in
//! the scan it answered last, plus extra paths, in the order
//! [`crate::plan::stat_order`] gives; the controller's count and checksum
//! of that order must match, so a disagreement is an error, not a misread
//! answer.

use std::io::Write;

use super::stat::{StatHow, stat};
use crate::agent::session::Session;
use crate::err;
use crate::error::Result;
use crate::model::Set;
use crate::protocol::Response;

/// Which paths to stat, and the controller's count and check of them.
pub struct Members {
    pub venv: String,
    pub sets: Vec<Set>,
    pub globs: Vec<String>,
    pub extra: Vec<String>,
    pub count: u64,
    pub check: u64,
}

pub fn stat_members(
    session: &mut Session,
    output: &mut dyn Write,
    m: &Members,
    how: &StatHow,
) -> Result<Response> {
    let venv = &m.venv;
    let scan = session
        .scan
        .as_ref()
        .filter(|s| s.venv == *venv)
        .ok_or_else(|| {
            err!(
                kind = Protocol,
                "StatMembers of {venv} without a Scan of it first"
            )
        })?;
    let members = crate::plan::members_of(&m.sets, scan, &m.globs);
    let extra: Vec<&str> = m.extra.iter().map(String::as_str).collect();
    let order = crate::plan::stat_order(&members, &extra);
    if order.len() as u64 != m.count || crate::plan::order_check(&order) != m.check {
        return Err(err!(
            kind = Protocol,
            hint = "use one overlay build on both ends",
            "the agent found {} member paths in {venv}, the controller {} (or in another order)",
            order.len(),
            m.count
        ));
    }
    let paths: Vec<String> = order.iter().map(|p| p.to_string()).collect();
    stat(session, output, venv, &paths, how)
}

#[cfg(test)]
mod tests {
    use crate::agent::testing::exchange;
    use crate::inventory;
    use crate::model::{HashMode, Set};
    use crate::protocol::{Request, Response};

    /// A venv with one distribution `a` of three files plus its dist-info.
    fn venv() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let site = t.path().join("lib/python3.11/site-packages");
        std::fs::create_dir_all(site.join("a/sub")).unwrap();
        std::fs::create_dir_all(site.join("a-1.0.dist-info")).unwrap();
        for (p, text) in [
            ("a/__init__.py", "x = 1\n"),
            ("a/sub/b.py", "y = 2\n"),
            ("a/c.so", "not really\n"),
            (
                "a-1.0.dist-info/METADATA",
                "Metadata-Version: 2.1\nName: a\nVersion: 1.0\n",
            ),
            (
                "a-1.0.dist-info/RECORD",
                "a/__init__.py,,\na/sub/b.py,,\na/c.so,,\na-1.0.dist-info/METADATA,,\na-1.0.dist-info/RECORD,,\n",
            ),
        ] {
            std::fs::write(site.join(p), text).unwrap();
        }
        t
    }

    #[test]
    fn stat_members_answers_in_the_controllers_order_and_refuses_another() {
        let t = venv();
        let v = t.path().to_str().unwrap().to_string();
        let set = Set {
            name: "a".into(),
            dists: vec!["a".into()],
            files: vec![],
        };
        // The controller's side of it, from the same scan.
        let scan = inventory::scan(&v, &[]).unwrap();
        let members = vec![crate::plan::members(&set, &scan, &[])];
        let order = crate::plan::stat_order(&members, &["a/extra.py"]);
        assert_eq!(order.len(), 6);
        let stat = |count: usize, check: u64| Request::StatMembers {
            venv: v.clone(),
            sets: vec![set.clone()],
            globs: vec![],
            extra: vec!["a/extra.py".into()],
            count: count as u64,
            check,
            hash: HashMode::None,
            shebang: None,
            pycache: false,
        };
        let right = || stat(order.len(), crate::plan::order_check(&order));
        let answers = exchange(&[
            right(),
            Request::Scan {
                venv: v.clone(),
                file_globs: vec![],
                machine_later: false,
            },
            right(),
            stat(order.len(), crate::plan::order_check(&order[1..])),
            stat(order.len() - 1, crate::plan::order_check(&order)),
            Request::Bye,
        ]);
        // Before a scan of that venv: refused.
        assert!(
            matches!(&answers[0], Response::Error(e) if e.message.contains("without a Scan")),
            "{:?}",
            answers[0]
        );
        assert!(matches!(answers[1], Response::Scan(_)));
        // In order: one entry per path, the extra one missing.
        let Response::Stat { entries } = &answers[2] else {
            panic!("{:?}", answers[2]);
        };
        let kinds: Vec<Option<crate::model::Kind>> = order
            .iter()
            .zip(entries.clone())
            .map(|(p, e)| e.into_entry(p.to_string()).map(|e| e.kind))
            .collect();
        assert_eq!(kinds.len(), order.len());
        let extra = order.iter().position(|p| *p == "a/extra.py").unwrap();
        assert_eq!(kinds[extra], Some(crate::model::Kind::Missing));
        let b = order.iter().position(|p| *p == "a/sub/b.py").unwrap();
        assert!(
            matches!(kinds[b], Some(crate::model::Kind::File { size: 6, .. })),
            "{:?}",
            kinds[b]
        );
        // Another order (checksum) or another count: refused, with a hint.
        for a in &answers[3..5] {
            assert!(
                matches!(a, Response::Error(e) if e.message.contains("member paths") && e.hint.is_some()),
                "{a:?}"
            );
        }
        assert!(matches!(answers[5], Response::Bye));
    }
}
