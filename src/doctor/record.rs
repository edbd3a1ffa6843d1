//! Files against their distribution's RECORD, as `rpm -V` or debsums check
//! system packages: every row's file must exist, have the recorded size and
//! (where RECORD gives one) the recorded sha256. Rows without a hash (the
//! RECORD itself, bytecode pip wrote) get the existence and size checks.
//! Shared objects are also checked for ELF damage ([`super::elf`]), hash or
//! no hash. Files are checked on all cores; each sha256 is remembered in a
//! [`StampCache`] (kind [`SHA256_CACHE`]) by the file's stamp, so a second
//! run reads no unchanged file.
//!
//! Two of these findings are notes: RECORD-listed bytecode that is absent
//! (Python writes it again), and a data file ([`is_code`] says it is not
//! code) that differs from RECORD (a CA bundle the site edits).

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use std::os::fd::AsFd;

use crate::error::{Result, io_cause};
use crate::hashcache::StampCache;
use crate::inventory::{Blocked, Counters, Venv, Walker};
use crate::model::{Dist, Finding, FindingKind, NoteKind, in_pycache};

/// The sha256 cache's kind (its folder under `~/.cache/overlay`); values
/// are RECORD's spelling of the digest (urlsafe base64, no padding).
pub const SHA256_CACHE: &str = "sha256";

/// One RECORD row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// As RECORD writes it, relative to site-packages.
    pub path: String,
    /// The `sha256=` digest (urlsafe base64, no padding), if the row has one.
    pub sha256: Option<String>,
    pub size: Option<u64>,
}

/// Parse a RECORD's rows (hash and size included). Rows with another hash
/// algorithm keep only their size. Errors name the line.
pub fn parse_rows(text: &str) -> std::result::Result<Vec<Row>, String> {
    crate::inventory::record_rows(text)
        .map(|row| {
            let (_, row) = row?;
            Ok(Row {
                path: row.get(0).unwrap_or("").to_string(),
                sha256: row
                    .get(1)
                    .and_then(|h| h.strip_prefix("sha256="))
                    .map(str::to_string),
                size: row.get(2).and_then(|s| s.trim().parse().ok()),
            })
        })
        .collect()
}

/// What checking some distributions' files found.
#[derive(Debug, Default)]
pub struct Checked {
    pub findings: Vec<Finding>,
    /// RECORD rows checked.
    pub files: u64,
    /// Files hashed now.
    pub hashed: u64,
    /// Files whose hash the cache vouched for.
    pub cached: u64,
}

/// How the check hashes.
pub struct Hashing<'a> {
    pub cache: &'a StampCache<String>,
    /// Hash only files up to this size; `None`: every file.
    pub max_bytes: Option<u64>,
    /// Check only these RECORD rows; `None`: all.
    pub only: Option<&'a std::collections::HashSet<&'a str>>,
}

/// Check every file of `dists` against its RECORD. Files are reached from
/// the venv root's fd without following a symlinked parent directory
/// ([`Walker`]): what lies behind one is named, never read.
pub fn check(venv: &Venv, dists: &[&Dist], how: &Hashing, counters: &Counters) -> Result<Checked> {
    let mut findings = Vec::new();
    let mut jobs: Vec<(&str, Row)> = Vec::new();
    for d in dists {
        let record = format!("{}/RECORD", d.dist_info);
        match std::fs::read_to_string(venv.site().join(&record)) {
            Ok(text) => match parse_rows(&text) {
                Ok(rows) => jobs.extend(
                    rows.into_iter()
                        .filter(|r| how.only.is_none_or(|o| o.contains(r.path.as_str())))
                        .map(|r| (d.name.as_str(), r)),
                ),
                Err(e) => findings.push(finding(FindingKind::Changed, d, &record, e)),
            },
            Err(e) => findings.push(finding(
                FindingKind::Missing,
                d,
                &record,
                format!("cannot be read: {}", io_cause(&e)),
            )),
        }
    }
    // In path order, so that each worker's open chain of directories is reused.
    jobs.sort_by(|a, b| a.1.path.cmp(&b.1.path));
    counters
        .total_files
        .fetch_add(jobs.len() as u64, Ordering::Relaxed);
    // At most this much is read (files the cache vouches for are not).
    let to_hash: u64 = jobs
        .iter()
        .filter(|(_, r)| r.sha256.is_some())
        .filter_map(|(_, r)| r.size)
        .filter(|s| how.max_bytes.is_none_or(|m| *s <= m))
        .sum();
    counters.total_bytes.fetch_add(to_hash, Ordering::Relaxed);
    let root = venv.beneath()?;
    let root_fd = root.as_fd();
    let (hashed, cached) = (AtomicU64::new(0), AtomicU64::new(0));
    let found: Vec<Vec<Finding>> = jobs
        .par_iter()
        .with_min_len(32)
        .map_init(
            || Walker::new(root_fd),
            |w, (dist, row)| {
                let out = check_row(venv, w, dist, row, how, counters, (&hashed, &cached));
                counters.files.fetch_add(1, Ordering::Relaxed);
                out
            },
        )
        .collect();
    findings.extend(found.into_iter().flatten());
    Ok(Checked {
        findings,
        files: jobs.len() as u64,
        hashed: hashed.into_inner(),
        cached: cached.into_inner(),
    })
}

fn finding(kind: FindingKind, d: &Dist, path: &str, reason: String) -> Finding {
    Finding::problem(kind, Some(d.name.clone()), Some(path.to_string()), reason)
}

/// The findings of one RECORD row.
fn check_row(
    venv: &Venv,
    w: &mut Walker<'_>,
    dist: &str,
    row: &Row,
    how: &Hashing,
    counters: &Counters,
    (hashed, cached): (&AtomicU64, &AtomicU64),
) -> Vec<Finding> {
    let r = RowFindings {
        dist,
        path: &row.path,
    };
    // The scan refuses a RECORD with paths outside the venv; not read here either.
    let Ok((abs, rel)) = venv.resolve(&row.path) else {
        return r.found(
            FindingKind::Changed,
            "RECORD names a path outside the venv".into(),
        );
    };
    match w.lstat(&rel) {
        Ok(None) => return r.blocked(Blocked::Missing),
        Err(b) => return r.blocked(b),
        // A symlink or directory where RECORD lists a file: pip records
        // neither, so only its absence would matter.
        Ok(Some(st))
            if rustix::fs::FileType::from_raw_mode(st.st_mode)
                != rustix::fs::FileType::RegularFile =>
        {
            return Vec::new();
        }
        Ok(Some(_)) => {}
    }
    let file = match w.open(&rel) {
        Ok(f) => f,
        Err(b) => return r.blocked(b),
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => {
            return r.found(
                FindingKind::Changed,
                format!("cannot be read: {}", io_cause(&e)),
            );
        }
    };
    let mut out = Vec::new();
    if (crate::preflight::looks_shared(&row.path) || meta.mode() & 0o111 != 0)
        && let Some(why) = super::elf::damage(&file)
    {
        out.extend(r.found(FindingKind::Damaged, why));
    }
    let size = meta.len();
    // A file that is not code and differs from RECORD is a note: edited on purpose.
    let edited = |reason: String| {
        let f = r.one(FindingKind::Changed, reason);
        if is_code(&row.path, meta.mode(), &file) {
            f
        } else {
            f.into_note(NoteKind::EditedData)
        }
    };
    if let Some(want) = row.size
        && want != size
    {
        out.push(edited(format!("size {size}, RECORD says {want}")));
        return out;
    }
    let Some(want) = &row.sha256 else {
        return out;
    };
    if how.max_bytes.is_some_and(|max| size > max) {
        return out;
    }
    let have = match sha256_cached(&abs, &file, &meta, how, counters, (hashed, cached)) {
        Ok(h) => h,
        Err(e) => {
            out.extend(r.found(
                FindingKind::Changed,
                format!("cannot be read: {}", io_cause(&e)),
            ));
            return out;
        }
    };
    if have != *want {
        out.push(edited(format!("sha256 differs from RECORD (size {size})")));
    }
    out
}

/// The file's sha256 from the hash cache by its stamp, or read (and then
/// cached); `hashed` or `cached` counts which.
fn sha256_cached(
    abs: &Path,
    file: &std::fs::File,
    meta: &std::fs::Metadata,
    how: &Hashing,
    counters: &Counters,
    (hashed, cached): (&AtomicU64, &AtomicU64),
) -> std::io::Result<String> {
    if let Some(h) = how.cache.get(abs, meta) {
        cached.fetch_add(1, Ordering::Relaxed);
        return Ok(h);
    }
    let h = sha256_of(file, counters)?;
    hashed.fetch_add(1, Ordering::Relaxed);
    how.cache.put(abs, meta, &h);
    Ok(h)
}

/// The findings of one RECORD row, worded for its distribution and path.
struct RowFindings<'a> {
    dist: &'a str,
    path: &'a str,
}

impl RowFindings<'_> {
    fn one(&self, kind: FindingKind, reason: String) -> Finding {
        Finding::problem(
            kind,
            Some(self.dist.to_string()),
            Some(self.path.to_string()),
            reason,
        )
    }

    fn found(&self, kind: FindingKind, reason: String) -> Vec<Finding> {
        vec![self.one(kind, reason)]
    }

    /// The row's file could not be reached.
    fn blocked(&self, b: Blocked) -> Vec<Finding> {
        match b {
            // Python writes bytecode again at the next import; pip never fails on it.
            Blocked::Missing if is_bytecode(self.path) => vec![
                self.one(FindingKind::Missing, "listed in RECORD, not on disk".into())
                    .into_note(NoteKind::RegenerableBytecode),
            ],
            Blocked::Missing => {
                self.found(FindingKind::Missing, "listed in RECORD, not on disk".into())
            }
            Blocked::Link(l) => self.found(
                FindingKind::Changed,
                format!("lies behind the symlink {l}: not read"),
            ),
            Blocked::Error(e) => self.found(FindingKind::Changed, format!("cannot be read: {e}")),
        }
    }
}

/// Is this RECORD path compiled bytecode (`__pycache__/*.pyc`)?
fn is_bytecode(path: &str) -> bool {
    in_pycache(path) && path.ends_with(".pyc")
}

/// File name endings of what the interpreter or the loader runs.
const CODE_SUFFIXES: &[&str] = &[".py", ".pyc", ".pyo", ".pth", ".so", ".pyd"];

/// Is the file at RECORD path `path` (`mode`, open as `file`) code: Python
/// source or bytecode, a `.pth` file (run at startup), a shared object (by
/// name or ELF by content), a script (`#!`, or anything executable, or in
/// `bin/`), or metadata in a dist-info directory? What is not (`.pem`,
/// `.txt`, `.json`, `.cfg`, ...) is data.
pub fn is_code(path: &str, mode: u32, file: &std::fs::File) -> bool {
    use std::os::unix::fs::FileExt;
    let name = path.rsplit('/').next().unwrap_or(path);
    if CODE_SUFFIXES.iter().any(|s| name.ends_with(s))
        || crate::preflight::looks_shared(path)
        || mode & 0o111 != 0
        || path.starts_with("../") && path.contains("/bin/")
        || path.split('/').any(|c| c.ends_with(".dist-info"))
    {
        return true;
    }
    let mut head = [0u8; 4];
    let n = file.read_at(&mut head, 0).unwrap_or(0);
    head[..n].starts_with(b"#!") || &head[..n] == b"\x7fELF"
}

/// A file's sha256 as RECORD writes it (urlsafe base64, no padding).
pub fn sha256_file(path: &Path, counters: &Counters) -> std::io::Result<String> {
    sha256_of(&std::fs::File::open(path)?, counters)
}

/// [`sha256_file`] of a file already open.
fn sha256_of(mut f: &std::fs::File, counters: &Counters) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_hash_and_size() {
        let rows = parse_rows(
            "a/x.py,sha256=abc,12\na/__pycache__/x.cpython-311.pyc,,\n\"we,ird.py\",sha512=zz,3\n\n",
        )
        .unwrap();
        assert_eq!(
            rows,
            vec![
                Row {
                    path: "a/x.py".into(),
                    sha256: Some("abc".into()),
                    size: Some(12)
                },
                Row {
                    path: "a/__pycache__/x.cpython-311.pyc".into(),
                    sha256: None,
                    size: None
                },
                Row {
                    path: "we,ird.py".into(),
                    sha256: None,
                    size: Some(3)
                },
            ]
        );
    }

    /// Code is what the interpreter or loader runs; the rest is data.
    #[test]
    fn code_and_data() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, body: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, body).unwrap();
            std::fs::File::open(p).unwrap()
        };
        let text = file("t", b"-----BEGIN CERTIFICATE-----\n");
        let script = file("s", b"#!/usr/bin/python\n");
        let elf = file("e", b"\x7fELF\x02\x01");
        for (path, mode, f, code) in [
            ("certifi/cacert.pem", 0o644, &text, false),
            ("pkg/data/table.json", 0o644, &text, false),
            ("pkg/x.py", 0o644, &text, true),
            ("pkg/__pycache__/x.cpython-311.pyc", 0o644, &text, true),
            ("distutils-precedence.pth", 0o644, &text, true),
            ("pkg/lib/libx.so.1", 0o644, &text, true),
            ("pkg/tool", 0o644, &script, true),
            ("pkg/blob", 0o644, &elf, true),
            ("pkg/run.txt", 0o755, &text, true),
            ("../../../bin/tool", 0o644, &text, true),
            ("pkg-1.0.dist-info/entry_points.txt", 0o644, &text, true),
        ] {
            assert_eq!(is_code(path, mode, f), code, "{path}");
        }
    }

    #[test]
    fn sha256_is_spelled_as_record_spells_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x");
        std::fs::write(&f, b"hello\n").unwrap();
        // python3 -c 'import hashlib,base64;print(base64.urlsafe_b64encode(hashlib.sha256(b"hello\n").digest()).rstrip(b"="))'
        assert_eq!(
            sha256_file(&f, &Counters::default()).unwrap(),
            "WJG1tSLV3whtD_CxEPvZ0hu0_HFjrzTQgoai6Eb2vgM"
        );
    }

    #[test]
    fn rows_are_checked_beneath_the_venv_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("venv");
        let site = root.join("lib/python3.11/site-packages");
        std::fs::create_dir_all(site.join("pkg")).unwrap();
        std::fs::create_dir_all(site.join("d-1.dist-info")).unwrap();
        std::fs::write(root.join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), "s3cret\n").unwrap();
        std::os::unix::fs::symlink(&outside, site.join("link")).unwrap();
        std::fs::write(site.join("pkg/ok.py"), "hello\n").unwrap();
        std::fs::write(site.join("pkg/edited.py"), "HELLO\n").unwrap();
        let h = "WJG1tSLV3whtD_CxEPvZ0hu0_HFjrzTQgoai6Eb2vgM";
        std::fs::write(
            site.join("d-1.dist-info/RECORD"),
            format!(
                "pkg/ok.py,sha256={h},6\npkg/edited.py,sha256={h},6\npkg/gone.py,sha256={h},6\n\
                 link/secret,sha256={h},7\nd-1.dist-info/RECORD,,\n"
            ),
        )
        .unwrap();
        let venv = Venv::open(root.to_str().unwrap()).unwrap();
        let mut d = Dist::for_test("d", "1");
        d.dist_info = "d-1.dist-info".into();
        let cache = StampCache::disabled();
        let how = Hashing {
            cache: &cache,
            max_bytes: None,
            only: None,
        };
        let checked = check(&venv, &[&d], &how, &Counters::default()).unwrap();
        assert_eq!(checked.files, 5);
        assert_eq!(checked.hashed, 2, "ok.py and edited.py; never the secret");
        let mut got: Vec<(FindingKind, String, String)> = checked
            .findings
            .into_iter()
            .map(|f| (f.kind, f.path.unwrap(), f.reason))
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                (
                    FindingKind::Changed,
                    "link/secret".into(),
                    "lies behind the symlink lib/python3.11/site-packages/link: not read".into()
                ),
                (
                    FindingKind::Changed,
                    "pkg/edited.py".into(),
                    "sha256 differs from RECORD (size 6)".into()
                ),
                (
                    FindingKind::Missing,
                    "pkg/gone.py".into(),
                    "listed in RECORD, not on disk".into()
                ),
            ]
        );
    }
}
