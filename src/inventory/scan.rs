//! Reading what a venv has installed: every distribution from its
//! `*.dist-info` (METADATA headers, RECORD paths, `version.py` refinements)
//! and the files matching the manifest's globs, with the interpreter and
//! kernel facts ([`scan`]).

use std::collections::BTreeSet;

use rayon::prelude::*;

use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::Venv;
use crate::model::{Dist, Facts, ScanReport, in_pycache, normalize_name, venv_relative};

/// One header of a METADATA file; a folded value keeps its line breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: String,
}

/// Read RFC 822-style headers of a METADATA file (the part before the body).
pub fn parse_metadata(text: &str) -> Vec<Header> {
    let mut out: Vec<Header> = Vec::new();
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if line.starts_with([' ', '\t']) {
            if let Some(last) = out.last_mut() {
                last.value.push('\n');
                last.value.push_str(line.trim());
            }
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            out.push(Header {
                name: k.trim().to_string(),
                value: v.trim().to_string(),
            });
        }
    }
    out
}

/// The values of the headers named `name` (case-insensitive), in order.
fn values<'h>(headers: &'h [Header], name: &'h str) -> impl Iterator<Item = &'h str> {
    headers
        .iter()
        .filter(move |h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

/// The rows of a RECORD file (CSV, no header), blank lines skipped: each
/// with its line number, for errors that name it.
pub fn record_rows(
    text: &str,
) -> impl Iterator<Item = std::result::Result<(u64, csv::StringRecord), String>> + '_ {
    csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes())
        .into_records()
        .enumerate()
        .filter_map(|(i, row)| match row {
            Err(e) => Some(Err(format!("line {}: {e}", i + 1))),
            Ok(row) if row.get(0).unwrap_or("").is_empty() && row.len() <= 1 => None,
            Ok(row) => Some(Ok((row.position().map_or(i as u64 + 1, |p| p.line()), row))),
        })
}

/// Parse a RECORD file's paths. Errors name the line.
pub fn parse_record(text: &str, site_rel: &str) -> std::result::Result<Vec<String>, String> {
    let mut out = Vec::new();
    for row in record_rows(text) {
        let (line, row) = row?;
        let path = row.get(0).unwrap_or("");
        if row.len() != 3 {
            return Err(format!(
                "line {line}: expected 3 fields (path,hash,size), found {}",
                row.len()
            ));
        }
        if venv_relative(site_rel, path).is_none() {
            if site_rel.is_empty() {
                // A `from` folder is site-packages itself: nothing beside it.
                return Err(format!(
                    "line {line}: path {path:?} escapes the folder, which holds only site-packages (carry this distribution from a venv, or its files with `files` globs)"
                ));
            }
            return Err(format!("line {line}: path {path:?} escapes the venv"));
        }
        if !in_pycache(path) {
            out.push(path.to_string());
        }
    }
    Ok(out)
}

/// What a distribution's `version.py` files add to its METADATA.
struct VersionPy {
    /// The true build, e.g. `2.11.0+cu130` for version `2.11.0`.
    build: Option<String>,
    /// The CUDA version it was built for, e.g. `13.0`.
    cuda: Option<String>,
}

/// Read `<pkg>/version.py` files: the true build (`__version__ =
/// '2.11.0+cu130'`) when it refines the dist-info version, and the CUDA
/// version (`cuda = '13.0'`, or `cuda: Optional[str] = '13.0'` as torch writes it).
fn read_version_py(venv: &Venv, version: &str, files: &[String]) -> VersionPy {
    let (mut build, mut cuda) = (None, None);
    for f in files {
        let mut parts = f.split('/');
        let (Some(_pkg), Some("version.py"), None) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(venv.site().join(f)) else {
            continue;
        };
        for line in text.lines() {
            let line = line.trim();
            let Some((lhs, rhs)) = line.split_once('=') else {
                continue;
            };
            let name = lhs.split(':').next().unwrap_or("").trim();
            let value = rhs.trim().trim_matches(|c| c == '\'' || c == '"');
            match name {
                "__version__"
                    if value != version
                        && value.starts_with(version)
                        && value[version.len()..].starts_with('+') =>
                {
                    build.get_or_insert_with(|| value.to_string());
                }
                "cuda"
                    if value != "None"
                        && !value.is_empty()
                        && value.chars().all(|c| c.is_ascii_digit() || c == '.') =>
                {
                    cuda.get_or_insert_with(|| value.to_string());
                }
                _ => {}
            }
        }
    }
    VersionPy { build, cuda }
}

/// Scan one dist-info directory.
fn scan_dist(venv: &Venv, dist_info: &str) -> Dist {
    let dir = venv.site().join(dist_info);
    let stem = dist_info.trim_end_matches(".dist-info");
    let guess_name = stem.rsplit_once('-').map_or(stem, |(n, _)| n).to_string();
    let guess_version = stem.rsplit_once('-').map_or("", |(_, v)| v).to_string();
    let mut dist = Dist {
        normalized: normalize_name(&guess_name),
        name: guess_name,
        version: guess_version,
        build: None,
        dist_info: dist_info.to_string(),
        files: Vec::new(),
        problem: None,
        requires_dist: Vec::new(),
        provides_extra: Vec::new(),
        cuda: None,
    };
    let mut problems = Vec::new();
    match std::fs::read_to_string(dir.join("METADATA")) {
        Ok(text) => {
            if let Err(problem) = apply_metadata(&mut dist, &parse_metadata(&text)) {
                problems.push(format!("{dist_info}/METADATA {problem}"));
            }
        }
        Err(e) => problems.push(format!(
            "{dist_info}/METADATA cannot be read: {}",
            io_cause(&e)
        )),
    }
    let mut files = BTreeSet::new();
    match std::fs::read_to_string(dir.join("RECORD")) {
        Ok(text) => match parse_record(&text, &venv.site_rel) {
            Ok(paths) => files.extend(paths),
            Err(e) => problems.push(format!("{dist_info}/RECORD {e}")),
        },
        Err(e) => problems.push(format!(
            "{dist_info}/RECORD cannot be read: {}",
            io_cause(&e)
        )),
    }
    // Everything inside the dist-info directory belongs to the distribution,
    // listed in RECORD or not (INSTALLER, REQUESTED, direct_url.json...).
    for e in walkdir::WalkDir::new(&dir)
        .min_depth(1)
        .follow_links(false)
        .into_iter()
        .flatten()
    {
        if e.file_type().is_dir() {
            continue;
        }
        if let Ok(rel) = e.path().strip_prefix(venv.site())
            && let Some(rel) = rel.to_str()
            && !in_pycache(rel)
        {
            files.insert(rel.to_string());
        }
    }
    dist.files = files.into_iter().collect();
    if problems.is_empty() {
        let found = read_version_py(venv, &dist.version, &dist.files);
        (dist.build, dist.cuda) = (found.build, found.cuda);
    } else {
        dist.problem = Some(problems.join("; "));
    }
    dist
}

/// Take name, version, requirements and extras from METADATA `headers`;
/// without a name and a version, say what is wrong.
fn apply_metadata(dist: &mut Dist, headers: &[Header]) -> std::result::Result<(), &'static str> {
    let first = |k| values(headers, k).next().map(str::to_string);
    match (first("Name"), first("Version")) {
        (Some(n), Some(v)) if !n.is_empty() && !v.is_empty() => {
            dist.normalized = normalize_name(&n);
            dist.name = n;
            dist.version = v;
            let all = |k| values(headers, k).map(str::to_string).collect();
            dist.requires_dist = all("Requires-Dist");
            dist.provides_extra = all("Provides-Extra");
            Ok(())
        }
        _ => Err("has no Name or Version header"),
    }
}

/// The literal directory prefix of a glob (`a/b/c*.py` → `a/b`).
fn glob_base(glob: &str) -> &str {
    let first_meta = glob.find(['*', '?', '[', '{']).unwrap_or(glob.len());
    match glob[..first_meta].rfind('/') {
        Some(i) => &glob[..i],
        None => "",
    }
}

/// Scan a venv: interpreter, distributions, glob matches, and this host's
/// machine facts.
pub fn scan(venv_root: &str, file_globs: &[String]) -> Result<ScanReport> {
    // The machine's facts (nvidia-smi takes a moment) while the dists are read.
    let machine = std::thread::spawn(super::machine);
    let mut report = scan_without_machine(venv_root, file_globs)?;
    report.machine = machine.join().unwrap_or_default();
    Ok(report)
}

/// [`scan`] without the machine facts (left default).
pub fn scan_without_machine(venv_root: &str, file_globs: &[String]) -> Result<ScanReport> {
    let venv = Venv::open_source(venv_root)?;
    let site = venv.site();
    let rd = std::fs::read_dir(&site).map_err(|e| {
        err!(
            "site-packages {} cannot be read: {}",
            site.display(),
            io_cause(&e)
        )
    })?;
    let mut infos: Vec<String> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".dist-info"))
        .collect();
    infos.sort();
    let dists: Vec<Dist> = infos.par_iter().map(|d| scan_dist(&venv, d)).collect();

    let globs = file_globs
        .iter()
        .map(|g| glob_matches(&venv, g))
        .collect::<Result<Vec<_>>>()?;
    Ok(ScanReport {
        facts: facts(&venv),
        venv: venv_root.to_string(),
        site_packages: venv.site_rel.clone(),
        python: venv.python.clone(),
        dists,
        globs,
        machine: Default::default(),
    })
}

/// The matcher of the file glob `g` (relative to site-packages `site_rel`,
/// `*` not crossing `/`); a glob that leaves site-packages, or does not
/// parse, is refused.
pub fn glob_matcher(site_rel: &str, g: &str) -> Result<globset::GlobMatcher> {
    if venv_relative(site_rel, g).is_none_or(|r| !r.starts_with(site_rel)) {
        return Err(err!(
            kind = Usage,
            hint = "file globs are relative to site-packages",
            "file glob {g:?} escapes site-packages"
        ));
    }
    Ok(globset::GlobBuilder::new(g)
        .literal_separator(true)
        .build()
        .map_err(|e| err!(kind = Usage, "bad glob {g:?}: {e}"))?
        .compile_matcher())
}

/// The files under site-packages that the file glob `g` matches, sorted
/// (`__pycache__` never searched). A glob that leaves site-packages, or
/// does not parse, is refused.
fn glob_matches(venv: &Venv, g: &str) -> Result<Vec<String>> {
    let matcher = glob_matcher(&venv.site_rel, g)?;
    let site = venv.site();
    let base = glob_base(g);
    let mut found = Vec::new();
    let start = if base.is_empty() {
        site.clone()
    } else {
        site.join(base)
    };
    if start.exists() {
        let walker = walkdir::WalkDir::new(&start)
            .follow_links(false)
            .sort_by_file_name();
        for e in walker
            .into_iter()
            .filter_entry(|e| e.file_name() != "__pycache__")
            .flatten()
        {
            if e.file_type().is_dir() {
                continue;
            }
            let Ok(rel) = e.path().strip_prefix(&site) else {
                continue;
            };
            let Some(rel) = rel.to_str() else { continue };
            if matcher.is_match(rel) {
                found.push(rel.to_string());
            }
        }
    }
    Ok(found)
}

/// The interpreter's full version (from `pyvenv.cfg`; `X.Y.0` if it names
/// none) and the kernel's facts, for preflight.
fn facts(venv: &Venv) -> Facts {
    let python_full = std::fs::read_to_string(venv.root.join("pyvenv.cfg"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            matches!(k.trim(), "version" | "version_info").then(|| v.trim().to_string())
        })
        // virtualenv writes `3.11.2.final.0`: keep the numeric release.
        .map(|v| {
            v.split('.')
                .take_while(|p| p.chars().all(|c| c.is_ascii_digit()) && !p.is_empty())
                .take(3)
                .collect::<Vec<_>>()
                .join(".")
        })
        .filter(|v| v.split('.').count() >= 2)
        .unwrap_or_else(|| format!("{}.0", venv.python));
    Facts {
        python_full,
        ..host_facts(&venv.python)
    }
}

/// This host's kernel facts, with Python `X.Y.0` for an interpreter of
/// minor `python` whose full version is unknown.
pub fn host_facts(python: &str) -> Facts {
    let uname = rustix::system::uname();
    Facts {
        python_full: format!("{python}.0"),
        machine: uname.machine().to_string_lossy().into_owned(),
        release: uname.release().to_string_lossy().into_owned(),
        kernel_version: uname.version().to_string_lossy().into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = "lib/python3.11/site-packages";

    #[test]
    fn record_parsing() {
        let rec = "torch/__init__.py,sha256=abc,12\ntorch/__pycache__/__init__.cpython-311.pyc,,\n\"we,ird.py\",sha256=x,1\n../../../bin/torchrun,sha256=y,5\ntorch-2.dist-info/RECORD,,\n";
        let paths = parse_record(rec, SITE).unwrap();
        assert_eq!(
            paths,
            [
                "torch/__init__.py",
                "we,ird.py",
                "../../../bin/torchrun",
                "torch-2.dist-info/RECORD"
            ]
        );
        let e = parse_record("a.py,,\n../../../../etc/passwd,sha256=x,1\n", SITE).unwrap_err();
        assert!(e.starts_with("line 2:") && e.contains("escapes"), "{e}");
        let e = parse_record("a.py,sha256=x\n", SITE).unwrap_err();
        assert!(e.contains("expected 3 fields"), "{e}");
    }

    #[test]
    fn metadata_headers() {
        let h = parse_metadata(
            "Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\nSummary: a\n  continued\n\nName: body\n",
        );
        assert_eq!(
            h[1],
            Header {
                name: "Name".into(),
                value: "torch".into()
            }
        );
        assert_eq!(h[3].value, "a\ncontinued");
        assert_eq!(h.len(), 4);
    }

    #[test]
    fn glob_bases() {
        assert_eq!(
            glob_base("sglang/srt/speculative/ddtree_*.py"),
            "sglang/srt/speculative"
        );
        assert_eq!(glob_base("*.pth"), "");
        assert_eq!(glob_base("a/b.py"), "a");
    }
}
