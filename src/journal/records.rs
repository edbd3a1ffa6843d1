//! RECORD as pip would write it, for the scripts whose shebang the source
//! rewrote for this venv: the staged RECORD of a distribution lists each
//! such script with the source's sha256 and size, which no longer describe
//! the file the target placed. pip records the hash of the script it
//! wrote; so does overlay, here, after the stage and before the switch
//! ([`Generation::staged`]), so that `pip`, `overlay doctor` and a later
//! plan all see a RECORD that agrees with the disk.
//!
//! The planner puts every RECORD that lists a script the plan places into
//! the plan, even one both hosts have alike (`plan::compute`), so each such
//! RECORD is staged here; this module decides its rows.
//!
//! A row is rewritten only when it described the source's script exactly:
//! the script the target will have (staged by this generation, or already
//! in place because the plan found it unchanged), with its shebang put
//! back to the source venv's, has the row's sha256 and size. A script the source had edited by hand keeps
//! its row (and `doctor` names it, as on the source). The new RECORD is
//! written beside the staged one through the generation's directory fd,
//! fsynced, and renamed over it; the change's hash, size and staged stamp
//! follow it, so the switch and the check after it prove the new file.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use base64::Engine;
use sha2::Digest;

use super::format::Generation;
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::{ContentHasher, content_hex, record_rows};
use crate::model::{Action, FileStamp, Kind, ShebangRewrite, SourceHash, Written};

/// The largest RECORD or script read to rewrite rows (bigger ones are left
/// as they are): RECORDs of the biggest wheels are a few MiB.
const LIMIT: u64 = 64 << 20;

impl Generation {
    /// A stage is complete: record what was written ([`Self::record_hashes`]),
    /// bring the staged RECORDs in line with the rewritten scripts, and
    /// journal the generation as staged.
    pub fn staged(&mut self, written: &[Written], hashes: &[SourceHash]) -> Result<()> {
        self.record_hashes(written, hashes)?;
        self.rewrite_script_records()?;
        self.append(super::Record::Staged)
    }

    /// Rewrite the rows of rewritten scripts in every staged RECORD.
    fn rewrite_script_records(&mut self) -> Result<()> {
        let Some(rw) = self.meta.shebang.clone().filter(|rw| rw.from != rw.to) else {
            return Ok(());
        };
        let placed = |c: &crate::model::GenChange| {
            matches!(c.action, Action::Add | Action::Replace)
                && matches!(c.source, Some(Kind::File { .. }))
                && c.staged.is_some()
        };
        let scripts: std::collections::HashMap<&str, usize> = self
            .meta
            .changes
            .iter()
            .enumerate()
            .filter(|(_, c)| placed(c) && c.path.contains("/bin/") && c.path.starts_with("../"))
            .map(|(i, c)| (c.path.as_str(), i))
            .collect();
        let venv = crate::beneath::Beneath::open(&self.root).ok();
        let records: Vec<usize> = self
            .meta
            .changes
            .iter()
            .enumerate()
            .filter(|(_, c)| placed(c) && is_record(&c.path))
            .map(|(i, _)| i)
            .collect();
        let mut changed = Vec::new();
        for i in records {
            let text = self.read_staged(i)?;
            let Ok(text) = String::from_utf8(text) else {
                continue;
            };
            let mut new_rows: Vec<(String, String)> = Vec::new();
            for row in record_rows(&text) {
                let Ok((_, row)) = row else {
                    continue;
                };
                let (Some(path), Some(hash), Some(size)) = (row.get(0), row.get(1), row.get(2))
                else {
                    continue;
                };
                let Some(old) = hash
                    .strip_prefix("sha256=")
                    .filter(|_| path.contains("bin/"))
                else {
                    continue;
                };
                let script = match scripts.get(path) {
                    Some(&j) => self.read_staged(j)?,
                    None => {
                        // A script the generation leaves as it is.
                        let Some(rel) =
                            script_in_venv(&self.rels[i], &self.meta.changes[i].path, path)
                        else {
                            continue;
                        };
                        match venv.as_ref().and_then(|v| v.read(&rel, LIMIT).ok()) {
                            Some(s) => s,
                            None => continue,
                        }
                    }
                };
                if let Some(new) = rewritten_row(&script, &rw, old, size) {
                    new_rows.push((format!(",{hash},{size}"), new));
                }
            }
            if new_rows.is_empty() {
                continue;
            }
            let text = replace_rows(&text, &new_rows);
            changed.push((i, text));
        }
        for (i, text) in changed {
            self.replace_staged(i, text.as_bytes())?;
        }
        Ok(())
    }

    fn read_staged(&self, i: usize) -> Result<Vec<u8>> {
        let rel = format!("staging/{i}");
        self.fs.read(&rel, LIMIT).map_err(|e| {
            err!(
                "Failed to read the staged {} ({}): {}",
                self.meta.changes[i].path,
                self.fs.shown(&rel).display(),
                io_cause(&e)
            )
        })
    }

    /// Put `bytes` in place of staged file `i` (same owner and mode), and
    /// make the change describe them.
    fn replace_staged(&mut self, i: usize, bytes: &[u8]) -> Result<()> {
        let rel = format!("staging/{i}");
        let tmp = format!("staging/{i}.record");
        let fail = |e: std::io::Error| {
            err!(
                "Failed to write the staged RECORD {} ({}): {}",
                self.meta.changes[i].path,
                self.fs.shown(&rel).display(),
                io_cause(&e)
            )
        };
        let old = self
            .fs
            .open_read(&rel)
            .and_then(|f| f.metadata())
            .map_err(fail)?;
        let _ = self.fs.remove_file(&tmp);
        let mut f = self.fs.create_new(&tmp, 0o600).map_err(fail)?;
        f.write_all(bytes).map_err(fail)?;
        let _ = std::os::unix::fs::fchown(&f, Some(old.uid()), Some(old.gid()));
        f.set_permissions(std::fs::Permissions::from_mode(old.mode() & 0o777))
            .map_err(fail)?;
        f.sync_all().map_err(fail)?;
        let stamp = FileStamp::of(&f.metadata().map_err(fail)?);
        self.fs.rename(&tmp, &self.fs, &rel).map_err(fail)?;
        self.fs
            .dir("staging")
            .and_then(|d| d.sync())
            .map_err(fail)?;
        let c = &mut self.meta.changes[i];
        if let Some(Kind::File {
            size,
            blake3,
            stamp: s,
            ..
        }) = &mut c.source
        {
            *size = bytes.len() as u64;
            *blake3 = Some(content_hex(ContentHasher::new().update(bytes)));
            *s = None;
        }
        c.staged = Some(stamp);
        super::format::write_meta(&self.fs, &self.dir, &self.meta)
    }
}

/// The venv-relative `bin/NAME` of a RECORD row's `path` (relative to
/// site-packages), given the RECORD's own path relative to the venv
/// (`record_rel`) and to site-packages (`record`); `None` for anything
/// but a file directly in `bin/`.
fn script_in_venv(record_rel: &str, record: &str, path: &str) -> Option<String> {
    let site = record_rel.strip_suffix(record)?.trim_end_matches('/');
    let mut parts: Vec<&str> = site.split('/').filter(|c| !c.is_empty()).collect();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            c => parts.push(c),
        }
    }
    match parts.as_slice() {
        ["bin", name] => Some(format!("bin/{name}")),
        _ => None,
    }
}

/// A distribution's RECORD, relative to site-packages.
fn is_record(path: &str) -> bool {
    path.split_once('/')
        .is_some_and(|(dir, file)| dir.ends_with(".dist-info") && file == "RECORD")
}

/// The new `,sha256=...,size` of a script's row, if the row described the
/// source's script: the staged `script` with its shebang put back (`to` →
/// `from`) has sha256 `old` and size `size`.
fn rewritten_row(script: &[u8], rw: &ShebangRewrite, old: &str, size: &str) -> Option<String> {
    let back = ShebangRewrite {
        from: rw.to.clone(),
        to: rw.from.clone(),
    };
    let original = crate::inventory::rewrite_shebang(script, &back)?;
    if sha256_b64(&original) != old || original.len().to_string() != size.trim() {
        return None;
    }
    Some(format!(",sha256={},{}", sha256_b64(script), script.len()))
}

/// RECORD's digest form: urlsafe base64 of the sha256, no padding.
fn sha256_b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(bytes))
}

/// `text` with each line that ends with an old `,hash,size` of `rows`
/// ending with its new one instead; every other byte as it was.
fn replace_rows(text: &str, rows: &[(String, String)]) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix("\r\n") {
            Some(b) => (b, "\r\n"),
            None => match line.strip_suffix('\n') {
                Some(b) => (b, "\n"),
                None => (line, ""),
            },
        };
        match rows
            .iter()
            .find_map(|(old, new)| body.strip_suffix(old.as_str()).map(|head| (head, new)))
            .filter(|(head, _)| head.contains("bin/"))
        {
            Some((head, new)) => {
                out.push_str(head);
                out.push_str(new);
                out.push_str(end);
            }
            None => out.push_str(line),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_rows_of_scripts_rewritten_from_the_source_change() {
        let rw = ShebangRewrite {
            from: "/src/venv".into(),
            to: "/dst/venv".into(),
        };
        let original = b"#!/src/venv/bin/python3\nimport x\n";
        let staged = b"#!/dst/venv/bin/python3\nimport x\n";
        let old = sha256_b64(original);
        let size = original.len().to_string();
        let new = rewritten_row(staged, &rw, &old, &size).expect("rewritten");
        assert_eq!(
            new,
            format!(",sha256={},{}", sha256_b64(staged), staged.len())
        );
        // A script edited on the source: its row stays.
        assert!(rewritten_row(staged, &rw, &sha256_b64(b"other"), &size).is_none());
        // A script not rewritten: its row stays.
        assert!(rewritten_row(original, &rw, &old, &size).is_none());

        let text = format!(
            "x/__init__.py,sha256=abc,3\n\"../../../bin/a,b\",sha256={old},{size}\nx-1.dist-info/RECORD,,\n"
        );
        let out = replace_rows(&text, &[(format!(",sha256={old},{size}"), new.clone())]);
        assert_eq!(
            out,
            format!(
                "x/__init__.py,sha256=abc,3\n\"../../../bin/a,b\"{new}\nx-1.dist-info/RECORD,,\n"
            )
        );
        assert_eq!(
            script_in_venv(
                "lib/python3.11/site-packages/x-1.dist-info/RECORD",
                "x-1.dist-info/RECORD",
                "../../../bin/x"
            )
            .as_deref(),
            Some("bin/x")
        );
        for outside in ["../../../../etc/x", "../../x", "x/y.py", "../../../bin/a/b"] {
            assert_eq!(
                script_in_venv(
                    "lib/python3.11/site-packages/x-1.dist-info/RECORD",
                    "x-1.dist-info/RECORD",
                    outside
                ),
                None,
                "{outside}"
            );
        }
        assert!(is_record("x-1.dist-info/RECORD"));
        assert!(!is_record("x-1.dist-info/sub/RECORD"));
        assert!(!is_record("x/RECORD"));
    }
}
