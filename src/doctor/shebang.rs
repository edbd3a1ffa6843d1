//! Broken `bin/` shebangs: a script whose `#!` interpreter does not exist,
//! or names another venv's interpreter (a copy from a venv elsewhere whose
//! shebang was not rewritten). pip's form for long paths (`#!/bin/sh` and
//! an `'''exec' PYTHON` line) is read for its real interpreter; `#!/usr/bin/env`
//! scripts are left alone.

use std::io::Read;
use std::path::Path;

use crate::model::{Finding, FindingKind};

/// Check the scripts in `venv_root/bin`; `owner` names the distribution of
/// a RECORD-style path (`../../../bin/NAME`, made with `record_prefix`).
pub fn check(
    venv_root: &Path,
    record_prefix: &str,
    owner: &dyn Fn(&str) -> Option<String>,
) -> Vec<Finding> {
    let bin = venv_root.join("bin");
    let Ok(rd) = std::fs::read_dir(&bin) else {
        return Vec::new();
    };
    let this = std::fs::canonicalize(venv_root).ok();
    let mut out = Vec::new();
    for e in rd.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Some(interp) = interpreter(&e.path()) else {
            continue;
        };
        let reason = if !Path::new(&interp).exists() {
            format!("its interpreter {interp} does not exist")
        } else if let Some(other) = venv_of(Path::new(&interp))
            && this.as_ref().is_some_and(|t| *t != other)
        {
            format!(
                "its interpreter {interp} is another venv's ({}), not this one's",
                other.display()
            )
        } else {
            continue;
        };
        let path = format!("{record_prefix}{name}");
        out.push(Finding::problem(
            FindingKind::BrokenShebang,
            owner(&path),
            Some(path),
            reason,
        ));
    }
    out.sort();
    out
}

/// The interpreter a script's first line (or pip's `'''exec'` line) names.
fn interpreter(path: &Path) -> Option<String> {
    let mut head = Vec::with_capacity(1024);
    std::fs::File::open(path)
        .ok()?
        .take(1024)
        .read_to_end(&mut head)
        .ok()?;
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.lines();
    let first = lines.next()?.strip_prefix("#!")?.trim();
    let interp = first.split_whitespace().next()?;
    if interp.ends_with("/env") {
        return None;
    }
    if interp == "/bin/sh"
        && let Some(exec) = lines.next().and_then(|l| l.strip_prefix("'''exec' "))
    {
        return exec.split_whitespace().next().map(str::to_string);
    }
    Some(interp.to_string())
}

/// The venv an interpreter path lies in (`V/bin/python` with `V/pyvenv.cfg`).
fn venv_of(interp: &Path) -> Option<std::path::PathBuf> {
    let root = interp.parent().filter(|b| b.ends_with("bin"))?.parent()?;
    root.join("pyvenv.cfg")
        .exists()
        .then(|| std::fs::canonicalize(root).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_foreign_interpreters_are_broken() {
        let dir = tempfile::tempdir().unwrap();
        let (here, there) = (dir.path().join("here"), dir.path().join("there"));
        for v in [&here, &there] {
            std::fs::create_dir_all(v.join("bin")).unwrap();
            std::fs::write(v.join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
            std::fs::write(v.join("bin/python"), "").unwrap();
        }
        let script =
            |name: &str, text: String| std::fs::write(here.join("bin").join(name), text).unwrap();
        script("ok", format!("#!{}/bin/python\nimport x\n", here.display()));
        script("env", "#!/usr/bin/env python3\n".into());
        script("gone", "#!/nowhere/bin/python\n".into());
        script("other", format!("#!{}/bin/python\n", there.display()));
        script(
            "long",
            "#!/bin/sh\n'''exec' /nowhere/long/bin/python \"$0\" \"$@\"\n' '''\n".into(),
        );
        let found = check(&here, "../../../bin/", &|_| None);
        let named: Vec<(&str, &str)> = found
            .iter()
            .map(|f| (f.path.as_deref().unwrap(), f.reason.as_str()))
            .collect();
        assert_eq!(named.len(), 3, "{named:?}");
        assert!(named[0].0.ends_with("gone") && named[0].1.contains("does not exist"));
        assert!(named[1].0.ends_with("long") && named[1].1.contains("/nowhere/long/bin/python"));
        assert!(named[2].0.ends_with("other") && named[2].1.contains("another venv"));
    }
}
