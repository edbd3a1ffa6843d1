//! What is installed in a venv, read on the host that has it: the
//! interpreter version, site-packages, every distribution with the files its
//! `*.dist-info/RECORD` lists, files matching globs, and per-path stat and
//! blake3 (hashed on all cores). This runs inside the agent; only the results
//! cross the network.
//!
//! Every path that comes from a RECORD, a glob or a request is checked
//! lexically to stay inside the venv before it is touched, and [`stat`]
//! (with its hashing) reaches it from the venv root's fd without following
//! a symlinked parent directory ([`Walker`]): what lies behind one is
//! reported as [`Kind::ThroughSymlink`], never read.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::err;
use crate::error::{Result, io_cause};
use crate::model::{
    Dist, Entry, Facts, FileStamp, HashMode, Kind, ScanReport, ShebangRewrite, in_pycache,
    normalize_name, venv_relative,
};

/// A located venv: its root and its site-packages directory.
#[derive(Debug, Clone)]
pub struct Venv {
    pub root: PathBuf,
    /// Relative to `root`, e.g. `lib/python3.11/site-packages`.
    pub site_rel: String,
    pub python: String,
}

impl Venv {
    /// Find the venv at `root`: it must exist, have a `pyvenv.cfg`, and one
    /// `lib/pythonX.Y/site-packages`.
    pub fn open(root: &str) -> Result<Venv> {
        let rootp = PathBuf::from(root);
        match std::fs::metadata(&rootp) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(err!(
                    kind = Usage,
                    hint = "check `venv` in the manifest",
                    "venv {root} is not a directory"
                ));
            }
            Err(e) => {
                return Err(err!(
                    kind = Usage,
                    hint = "check `venv` in the manifest, or create it with `python3 -m venv`",
                    "venv {root} cannot be read: {}",
                    io_cause(&e)
                ));
            }
        }
        let cfg = std::fs::read_to_string(rootp.join("pyvenv.cfg")).unwrap_or_default();
        let cfg_version = cfg.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            let k = k.trim();
            (k == "version" || k == "version_info").then(|| v.trim().to_string())
        });
        let mut candidates = Vec::new();
        if let Ok(rd) = std::fs::read_dir(rootp.join("lib")) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(ver) = name.strip_prefix("python")
                    && ver.split('.').count() == 2
                    && e.path().join("site-packages").is_dir()
                {
                    candidates.push(ver.to_string());
                }
            }
        }
        candidates.sort();
        let python = match (candidates.len(), &cfg_version) {
            (0, _) => {
                return Err(err!(
                    kind = Usage,
                    hint = "is this a virtualenv? overlay expects lib/pythonX.Y/site-packages inside it",
                    "venv {root} has no lib/python3.*/site-packages"
                ));
            }
            (1, _) => candidates.remove(0),
            (_, Some(v)) => {
                let minor: String = v.split('.').take(2).collect::<Vec<_>>().join(".");
                if candidates.contains(&minor) {
                    minor
                } else {
                    return Err(err!(
                        "venv {root} has several site-packages ({}) and pyvenv.cfg names none of them",
                        candidates.join(", ")
                    ));
                }
            }
            (_, None) => {
                return Err(err!(
                    "venv {root} has several site-packages ({}) and no pyvenv.cfg version",
                    candidates.join(", ")
                ));
            }
        };
        Ok(Venv {
            site_rel: format!("lib/python{python}/site-packages"),
            root: rootp,
            python,
        })
    }

    /// The venv root, opened for fd-relative, no-follow access ([`crate::beneath`]).
    pub fn beneath(&self) -> Result<crate::beneath::Beneath> {
        crate::beneath::Beneath::open(&self.root).map_err(|e| {
            err!(
                "venv {} cannot be opened: {}",
                self.root.display(),
                io_cause(&e)
            )
        })
    }

    pub fn site(&self) -> PathBuf {
        self.root.join(&self.site_rel)
    }

    /// Resolve a site-packages-relative path (RECORD style, may start with
    /// `../../../bin`) to an absolute path, refusing anything that leaves the
    /// venv. Returns the path relative to the venv root as well.
    pub fn resolve(&self, path: &str) -> Result<(PathBuf, String)> {
        let rel = venv_relative(&self.site_rel, path).ok_or_else(|| {
            err!(
                hint = "a RECORD or glob may only name files inside the venv",
                "path {path:?} escapes the venv {}",
                self.root.display()
            )
        })?;
        Ok((self.root.join(&rel), rel))
    }
}

/// Read RFC 822-style headers of a METADATA file (the part before the body).
pub fn parse_metadata(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if line.starts_with([' ', '\t']) {
            if let Some(last) = out.last_mut() {
                last.1.push('\n');
                last.1.push_str(line.trim());
            }
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

/// Parse a RECORD file's paths. Errors name the line.
pub fn parse_record(text: &str, site_rel: &str) -> std::result::Result<Vec<String>, String> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut out = Vec::new();
    for (i, row) in rdr.records().enumerate() {
        let row = row.map_err(|e| format!("line {}: {e}", i + 1))?;
        let line = row.position().map_or(i as u64 + 1, |p| p.line());
        let path = row.get(0).unwrap_or("");
        if path.is_empty() && row.len() <= 1 {
            continue;
        }
        if row.len() != 3 {
            return Err(format!(
                "line {line}: expected 3 fields (path,hash,size), found {}",
                row.len()
            ));
        }
        if venv_relative(site_rel, path).is_none() {
            return Err(format!("line {line}: path {path:?} escapes the venv"));
        }
        if !in_pycache(path) {
            out.push(path.to_string());
        }
    }
    Ok(out)
}

/// Read `<pkg>/version.py` files: the true build (`__version__ =
/// '2.11.0+cu130'`) when it refines the dist-info version, and the CUDA
/// version (`cuda = '13.0'`, or `cuda: Optional[str] = '13.0'` as torch writes it).
fn read_version_py(
    venv: &Venv,
    version: &str,
    files: &[String],
) -> (Option<String>, Option<String>) {
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
    (build, cuda)
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
            let headers = parse_metadata(&text);
            let get = |k: &str| {
                headers
                    .iter()
                    .find(|(h, _)| h.eq_ignore_ascii_case(k))
                    .map(|(_, v)| v.clone())
            };
            match (get("Name"), get("Version")) {
                (Some(n), Some(v)) if !n.is_empty() && !v.is_empty() => {
                    dist.normalized = normalize_name(&n);
                    dist.name = n;
                    dist.version = v;
                    let all = |k: &str| -> Vec<String> {
                        headers
                            .iter()
                            .filter(|(h, _)| h.eq_ignore_ascii_case(k))
                            .map(|(_, v)| v.clone())
                            .collect()
                    };
                    dist.requires_dist = all("Requires-Dist");
                    dist.provides_extra = all("Provides-Extra");
                }
                _ => problems.push(format!(
                    "{dist_info}/METADATA has no Name or Version header"
                )),
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
        (dist.build, dist.cuda) = read_version_py(venv, &dist.version, &dist.files);
    } else {
        dist.problem = Some(problems.join("; "));
    }
    dist
}

/// The literal directory prefix of a glob (`a/b/c*.py` → `a/b`).
fn glob_base(glob: &str) -> &str {
    let first_meta = glob.find(['*', '?', '[', '{']).unwrap_or(glob.len());
    match glob[..first_meta].rfind('/') {
        Some(i) => &glob[..i],
        None => "",
    }
}

/// Scan a venv: interpreter, distributions, glob matches.
pub fn scan(venv_root: &str, file_globs: &[String]) -> Result<ScanReport> {
    let venv = Venv::open(venv_root)?;
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

    let mut globs = Vec::new();
    for g in file_globs {
        if venv_relative(&venv.site_rel, g).is_none_or(|r| !r.starts_with(&venv.site_rel)) {
            return Err(err!(
                kind = Usage,
                hint = "file globs are relative to site-packages",
                "file glob {g:?} escapes site-packages"
            ));
        }
        let matcher = globset::GlobBuilder::new(g)
            .literal_separator(true)
            .build()
            .map_err(|e| err!(kind = Usage, "bad glob {g:?}: {e}"))?
            .compile_matcher();
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
        globs.push(found);
    }
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
    let uname = rustix::system::uname();
    let facts = Facts {
        python_full,
        machine: uname.machine().to_string_lossy().into_owned(),
        release: uname.release().to_string_lossy().into_owned(),
        kernel_version: uname.version().to_string_lossy().into_owned(),
    };
    Ok(ScanReport {
        facts,
        venv: venv_root.to_string(),
        site_packages: venv.site_rel.clone(),
        python: venv.python.clone(),
        dists,
        globs,
    })
}

/// Counters shared with the progress reporter.
#[derive(Default)]
pub struct Counters {
    pub files: AtomicU64,
    pub bytes: AtomicU64,
    pub total_files: AtomicU64,
    pub total_bytes: AtomicU64,
    /// Set by the progress reporter when the controller is gone: work that
    /// only matters to it (a stream) stops.
    pub cancel: std::sync::atomic::AtomicBool,
}

/// Rewrite a script's shebang if it names the `from` venv's `bin/`.
pub fn rewrite_shebang(content: &[u8], rw: &ShebangRewrite) -> Option<Vec<u8>> {
    let prefix = format!("#!{}/bin/", rw.from);
    if rw.from == rw.to || !content.starts_with(prefix.as_bytes()) {
        return None;
    }
    let mut out = format!("#!{}/bin/", rw.to).into_bytes();
    out.extend_from_slice(&content[prefix.len()..]);
    Some(out)
}

/// The content hash every agent takes, wherever it hashes file contents
/// (plan, stream, checks): BLAKE3 (see docs/design.md).
pub type ContentHasher = blake3::Hasher;

/// A finished content hash as the plan and journal carry it: lowercase hex.
pub fn content_hex(h: &ContentHasher) -> String {
    h.finalize().to_hex().to_string()
}

/// Hash a file, optionally with its shebang rewritten. Returns (size, blake3 hex).
pub fn hash_file(
    path: &Path,
    shebang: Option<&ShebangRewrite>,
    counters: &Counters,
) -> std::io::Result<(u64, String)> {
    hash_open(std::fs::File::open(path)?, shebang, counters)
}

/// [`hash_file`] of a file already open (opened beneath the venv by a [`Walker`]).
pub fn hash_open(
    f: std::fs::File,
    shebang: Option<&ShebangRewrite>,
    counters: &Counters,
) -> std::io::Result<(u64, String)> {
    thread_local! {
        // One read buffer per worker thread, not one allocation per file.
        static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; 1 << 20]);
    }
    BUF.with(|buf| hash_file_with(f, shebang, counters, &mut buf.borrow_mut()))
}

fn hash_file_with(
    mut f: std::fs::File,
    shebang: Option<&ShebangRewrite>,
    counters: &Counters,
    buf: &mut [u8],
) -> std::io::Result<(u64, String)> {
    let mut hasher = ContentHasher::new();
    let mut size = 0u64;
    let mut first = true;
    loop {
        let n = f.read(buf)?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        if first && let Some(rw) = shebang {
            first = false;
            // Scripts are small; a shebang always sits in the first read.
            if let Some(new) = rewrite_shebang(chunk, rw) {
                hasher.update(&new);
                size += new.len() as u64;
                counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
                continue;
            }
        }
        first = false;
        hasher.update(chunk);
        size += n as u64;
        counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }
    Ok((size, content_hex(&hasher)))
}

/// A file's stamp from an `lstat`/`fstat` (the same numbers as [`FileStamp::of`]).
pub fn stamp_of(st: &rustix::fs::Stat) -> FileStamp {
    FileStamp {
        dev: st.st_dev,
        ino: st.st_ino,
        mtime_ns: st
            .st_mtime
            .saturating_mul(1_000_000_000)
            .saturating_add(st.st_mtime_nsec as i64),
        ctime_ns: st
            .st_ctime
            .saturating_mul(1_000_000_000)
            .saturating_add(st.st_ctime_nsec as i64),
    }
}

/// Why a path's parent directories could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// A parent is absent, or is a file: the path does not exist.
    Missing,
    /// A parent is a symlink (its path relative to the venv root): overlay
    /// never goes through one.
    Link(String),
    /// Anything else (permission denied...), as a message naming the directory.
    Error(String),
}

/// Parent directories of venv paths, opened one component at a time from
/// the venv root's fd with `openat(O_PATH | O_DIRECTORY | O_NOFOLLOW)`, so
/// a symlink anywhere in a path's parent chain is seen, never followed. The
/// chain stays open for the next path: paths arrive sorted, a directory's
/// subtree is contiguous in sorted order, so each directory is opened about
/// once per worker and every file costs one `statat` from its parent's fd
/// (cheaper than an `lstat` of the whole path, which walks every component).
pub struct Walker<'a> {
    root: BorrowedFd<'a>,
    /// The open chain below the root: each component's name and fd.
    stack: Vec<(String, OwnedFd)>,
    /// The last chain that could not be opened (venv-relative) and why.
    blocked: Option<(String, Blocked)>,
}

const WALK_FLAGS: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Split a venv-relative path into its parent directory (`""`: the root) and name.
fn split_rel(rel: &str) -> (&str, &str) {
    match rel.rfind('/') {
        Some(i) => (&rel[..i], &rel[i + 1..]),
        None => ("", rel),
    }
}

impl<'a> Walker<'a> {
    /// A walker from `root`, the venv root's fd.
    pub fn new(root: BorrowedFd<'a>) -> Walker<'a> {
        Walker {
            root,
            stack: Vec::new(),
            blocked: None,
        }
    }

    /// The directory `dir` (venv-relative, normalized; `""` is the root),
    /// opened without following any symlink.
    pub fn dir(&mut self, dir: &str) -> std::result::Result<BorrowedFd<'_>, Blocked> {
        if let Some((b, why)) = &self.blocked
            && dir
                .strip_prefix(b.as_str())
                .is_some_and(|r| r.is_empty() || r.starts_with('/'))
        {
            return Err(why.clone());
        }
        self.blocked = None;
        let mut keep = 0;
        let mut parts = if dir.is_empty() {
            None
        } else {
            Some(dir.split('/'))
        }
        .into_iter()
        .flatten()
        .peekable();
        while let Some(c) = parts.peek() {
            match self.stack.get(keep) {
                Some((name, _)) if name == c => {
                    keep += 1;
                    parts.next();
                }
                _ => break,
            }
        }
        self.stack.truncate(keep);
        for c in parts {
            let base = self.stack.last().map_or(self.root, |(_, fd)| fd.as_fd());
            match rustix::fs::openat(base, c, WALK_FLAGS, Mode::empty()) {
                Ok(fd) => self.stack.push((c.to_string(), fd)),
                Err(e) => {
                    let mut prefix: String = self
                        .stack
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join("/");
                    if !prefix.is_empty() {
                        prefix.push('/');
                    }
                    prefix.push_str(c);
                    let why = match e {
                        Errno::NOENT => Blocked::Missing,
                        Errno::LOOP | Errno::NOTDIR => {
                            match rustix::fs::statat(base, c, AtFlags::SYMLINK_NOFOLLOW) {
                                Ok(st) if FileType::from_raw_mode(st.st_mode).is_symlink() => {
                                    Blocked::Link(prefix.clone())
                                }
                                _ => Blocked::Missing,
                            }
                        }
                        e => Blocked::Error(format!("{prefix}: {}", io_cause(&e.into()))),
                    };
                    self.blocked = Some((prefix, why.clone()));
                    return Err(why);
                }
            }
        }
        Ok(self.stack.last().map_or(self.root, |(_, fd)| fd.as_fd()))
    }

    /// `lstat` of the venv-relative `rel`; `Ok(None)` if it is absent.
    pub fn lstat(&mut self, rel: &str) -> std::result::Result<Option<rustix::fs::Stat>, Blocked> {
        let (dir, name) = split_rel(rel);
        let fd = match self.dir(dir) {
            Ok(fd) => fd,
            Err(Blocked::Missing) => return Ok(None),
            Err(e) => return Err(e),
        };
        match rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::NOENT | Errno::NOTDIR) => Ok(None),
            Err(e) => Err(Blocked::Error(format!("{rel}: {}", io_cause(&e.into())))),
        }
    }

    /// The target of the symlink `rel`.
    pub fn read_link(&mut self, rel: &str) -> std::result::Result<String, Blocked> {
        let (dir, name) = split_rel(rel);
        let fd = self.dir(dir)?;
        rustix::fs::readlinkat(fd, name, Vec::new())
            .map(|t| t.to_string_lossy().into_owned())
            .map_err(|e| Blocked::Error(format!("{rel}: {}", io_cause(&e.into()))))
    }

    /// Open the regular file `rel` for reading (a symlink at its end is refused).
    pub fn open(&mut self, rel: &str) -> std::result::Result<std::fs::File, Blocked> {
        let (dir, name) = split_rel(rel);
        let fd = self.dir(dir)?;
        rustix::fs::openat(
            fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY,
            Mode::empty(),
        )
        .map(std::fs::File::from)
        .map_err(|e| Blocked::Error(format!("{rel}: {}", io_cause(&e.into()))))
    }

    /// The names in the directory `rel`; empty if it is absent or not a
    /// plain directory.
    fn list(&mut self, rel: &str) -> Vec<String> {
        let (dir, name) = split_rel(rel);
        let Ok(fd) = self.dir(dir) else {
            return Vec::new();
        };
        let Ok(d) = rustix::fs::openat(
            fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return Vec::new();
        };
        let Ok(mut entries) = rustix::fs::Dir::read_from(&d) else {
            return Vec::new();
        };
        entries
            .by_ref()
            .flatten()
            .map(|e| String::from_utf8_lossy(e.file_name().to_bytes()).into_owned())
            .filter(|n| n != "." && n != "..")
            .collect()
    }
}

/// What one `lstat` said, kept small: a stat request names every file of
/// a torch stack (35,000), and the first pass holds them all at once.
enum Probe {
    Missing,
    Symlink(String),
    Dir {
        mode: u32,
    },
    File {
        size: u64,
        mode: u32,
        stamp: FileStamp,
    },
    Other,
    /// Behind a symlinked parent (venv-relative).
    Through(String),
}

impl Probe {
    /// `lstat` the venv-relative `rel` from `w`'s open parents; `Err`
    /// carries the message for anything but absence.
    fn at(w: &mut Walker<'_>, rel: &str) -> std::result::Result<Probe, String> {
        let st = match w.lstat(rel) {
            Ok(Some(st)) => st,
            Ok(None) => return Ok(Probe::Missing),
            Err(Blocked::Missing) => return Ok(Probe::Missing),
            Err(Blocked::Link(l)) => return Ok(Probe::Through(l)),
            Err(Blocked::Error(m)) => return Err(m),
        };
        let mode = st.st_mode & 0o7777;
        Ok(match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => match w.read_link(rel) {
                Ok(t) => Probe::Symlink(t),
                Err(Blocked::Error(m)) => return Err(m),
                Err(_) => Probe::Missing,
            },
            FileType::Directory => Probe::Dir { mode },
            FileType::RegularFile => Probe::File {
                size: st.st_size as u64,
                mode,
                stamp: stamp_of(&st),
            },
            _ => Probe::Other,
        })
    }
}

/// Stat (and optionally hash) paths relative to site-packages.
///
/// Every path is reached from the venv root's fd without following a
/// symlink in its parent chain ([`Walker`]): a path behind a symlinked
/// directory is reported as [`Kind::ThroughSymlink`], never read through.
/// A symlink at the path itself is reported as the symlink it is.
///
/// Answers come in the order of `paths`; the work is done in sorted order,
/// so that each walker's open directory chain serves the paths that follow
/// (a request in another order, such as the hashes a cold plan asks for,
/// would otherwise reopen every directory above every path).
pub fn stat(
    venv_root: &str,
    paths: &[String],
    hash: HashMode,
    shebang: Option<&ShebangRewrite>,
    pycache: bool,
    counters: &Counters,
) -> Result<Vec<Entry>> {
    if paths.is_sorted() {
        return stat_sorted(venv_root, paths, hash, shebang, pycache, counters);
    }
    let mut order: Vec<usize> = (0..paths.len()).collect();
    order.sort_unstable_by(|&a, &b| paths[a].cmp(&paths[b]));
    let sorted: Vec<String> = order.iter().map(|&i| paths[i].clone()).collect();
    let entries = stat_sorted(venv_root, &sorted, hash, shebang, pycache, counters)?;
    let mut out: Vec<Option<Entry>> = std::iter::repeat_with(|| None).take(paths.len()).collect();
    for (e, &i) in entries.into_iter().zip(&order) {
        out[i] = Some(e);
    }
    Ok(out.into_iter().flatten().collect())
}

/// [`stat`] of paths in sorted order.
fn stat_sorted(
    venv_root: &str,
    paths: &[String],
    hash: HashMode,
    shebang: Option<&ShebangRewrite>,
    pycache: bool,
    counters: &Counters,
) -> Result<Vec<Entry>> {
    let venv = Venv::open(venv_root)?;
    let root = venv.beneath()?;
    let root_fd = root.as_fd();
    // First pass: lstat everything, so progress knows the totals; the hash
    // cache loads meanwhile. Per path: its absolute path (the hash cache's
    // key, messages), its path relative to the venv root, and the lstat.
    type Probed = (PathBuf, String, std::result::Result<Probe, String>);
    let (cache, probed) = std::thread::scope(|s| {
        let cache = s.spawn(|| match hash {
            HashMode::None => crate::hashcache::HashCache::disabled(),
            _ => crate::hashcache::HashCache::open(&venv.root),
        });
        // Jobs of at least 256 consecutive paths: each reuses its open
        // directory chain (a job that starts mid-directory reopens it).
        let probed: Result<Vec<Probed>> = paths
            .par_iter()
            .with_min_len(256)
            .map_init(
                || Walker::new(root_fd),
                |w, p| {
                    let (abs, rel) = venv.resolve(p)?;
                    let probe = Probe::at(w, &rel);
                    Ok((abs, rel, probe))
                },
            )
            .collect();
        let cache = cache.join().expect("the cache loader panicked");
        probed.map(|p| (cache, p))
    })?;
    let total: u64 = probed
        .iter()
        .map(|(_, _, probe)| match probe {
            Ok(Probe::File { size, .. }) => *size,
            _ => 0,
        })
        .sum();
    counters
        .total_files
        .store(paths.len() as u64, Ordering::Relaxed);
    counters.total_bytes.store(
        if hash == HashMode::All { total } else { 0 },
        Ordering::Relaxed,
    );

    // Bytecode listing, one readdir per __pycache__ directory (venv-relative).
    let mut pyc_dirs: HashMap<String, Vec<String>> = HashMap::new();
    if pycache {
        let mut w = Walker::new(root_fd);
        for (p, (_, rel, _)) in paths.iter().zip(&probed) {
            if p.ends_with(".py") {
                let dir = match split_rel(rel).0 {
                    "" => "__pycache__".to_string(),
                    d => format!("{d}/__pycache__"),
                };
                if let std::collections::hash_map::Entry::Vacant(v) = pyc_dirs.entry(dir) {
                    let names = w.list(v.key());
                    v.insert(names);
                }
            }
        }
    }

    // Jobs of consecutive paths here too, so that a walker's open chain is
    // reused (one job per path reopened every directory above it: nine
    // opens per hashed file in a cold plan); small enough that big files
    // still spread over the cores.
    let entries: Vec<Result<Entry>> = paths
        .par_iter()
        .zip(probed.into_par_iter())
        .with_min_len(32)
        .map_init(
            || Walker::new(root_fd),
            |w, (p, (abs, rel, probe))| {
                let kind = match probe.map_err(|e| err!("{}/{e}", venv.root.display()))? {
                    Probe::Missing => Kind::Missing,
                    Probe::Symlink(target) => Kind::Symlink { target },
                    Probe::Through(link) => Kind::ThroughSymlink {
                        link: crate::validate::site_spelling(&venv.site_rel, &link),
                    },
                    Probe::Dir { mode } => Kind::Dir { mode },
                    Probe::Other => Kind::Other,
                    Probe::File { size, mode, stamp } => {
                        let rw = if rel.starts_with("bin/") {
                            shebang
                        } else {
                            None
                        };
                        // A rewritten script's hash is never cached.
                        let cached = || {
                            if rw.is_none() {
                                cache.get_at(&abs, size, &stamp)
                            } else {
                                None
                            }
                        };
                        // A script whose shebang is rewritten is always hashed,
                        // even when only cached hashes are asked for: it is small,
                        // and that spares a second round trip.
                        let read = hash == HashMode::All
                            || (hash == HashMode::Cached && rw.is_some() && size < (1 << 20));
                        let (size_now, blake3) = if read {
                            match cached() {
                                Some(h) => {
                                    counters.bytes.fetch_add(size, Ordering::Relaxed);
                                    (size, Some(h))
                                }
                                None => {
                                    let failed =
                                        |m: String| err!("Failed to read {}: {m}", abs.display());
                                    let f = w.open(&rel).map_err(|b| match b {
                                        Blocked::Error(m) => failed(m),
                                        _ => failed("it changed while it was read".into()),
                                    })?;
                                    let (read_size, h) = hash_open(f, rw, counters)
                                        .map_err(|e| failed(io_cause(&e)))?;
                                    if rw.is_none() && read_size == size {
                                        cache.put_at(&abs, size, &stamp, &h);
                                    }
                                    (read_size, Some(h))
                                }
                            }
                        } else if hash == HashMode::Cached {
                            (size, cached())
                        } else {
                            (size, None)
                        };
                        Kind::File {
                            size: size_now,
                            mode,
                            blake3,
                            stamp: Some(stamp),
                        }
                    }
                };
                counters.files.fetch_add(1, Ordering::Relaxed);
                let mut pyc = Vec::new();
                if let (true, Some(stem)) = (
                    p.ends_with(".py"),
                    p.rsplit('/').next().and_then(|f| f.strip_suffix(".py")),
                ) {
                    let dir_rel = match p.rsplit_once('/') {
                        Some((d, _)) => format!("{d}/__pycache__"),
                        None => "__pycache__".to_string(),
                    };
                    let key = match split_rel(&rel).0 {
                        "" => "__pycache__".to_string(),
                        d => format!("{d}/__pycache__"),
                    };
                    if let Some(names) = pyc_dirs.get(&key) {
                        let want = format!("{stem}.");
                        for n in names {
                            if n.starts_with(&want)
                                && n.ends_with(".pyc")
                                && n[want.len()..].find('.').is_some()
                            {
                                pyc.push(format!("{dir_rel}/{n}"));
                            }
                        }
                        pyc.sort();
                    }
                }
                Ok(Entry {
                    path: p.clone(),
                    kind,
                    pyc,
                })
            },
        )
        .collect();
    cache.save();
    entries.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = "lib/python3.11/site-packages";

    #[test]
    fn relative_paths_stay_in_the_venv() {
        assert_eq!(
            venv_relative(SITE, "torch/__init__.py").unwrap(),
            "lib/python3.11/site-packages/torch/__init__.py"
        );
        assert_eq!(
            venv_relative(SITE, "../../../bin/torchrun").unwrap(),
            "bin/torchrun"
        );
        assert_eq!(venv_relative(SITE, "../../../../etc/passwd"), None);
        assert_eq!(venv_relative(SITE, "/etc/passwd"), None);
        assert_eq!(venv_relative(SITE, "a/../../../../../x"), None);
        assert_eq!(venv_relative(SITE, ""), None);
    }

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
        assert_eq!(h[1], ("Name".into(), "torch".into()));
        assert_eq!(h[3].1, "a\ncontinued");
        assert_eq!(h.len(), 4);
    }

    #[test]
    fn shebangs() {
        let rw = ShebangRewrite {
            from: "/a/venv".into(),
            to: "/b/v".into(),
        };
        assert_eq!(
            rewrite_shebang(b"#!/a/venv/bin/python3\nx", &rw).unwrap(),
            b"#!/b/v/bin/python3\nx"
        );
        assert!(rewrite_shebang(b"#!/usr/bin/python3\n", &rw).is_none());
        assert!(rewrite_shebang(b"#!/a/venv2/bin/python3\n", &rw).is_none());
    }

    #[test]
    fn stat_never_goes_through_a_symlinked_parent() {
        let t = tempfile::tempdir().unwrap();
        let venv = t.path().join("v");
        let site = venv.join(SITE);
        let outside = t.path().join("outside");
        std::fs::create_dir_all(site.join("pkg/sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(venv.join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        std::fs::write(site.join("pkg/a.py"), "a").unwrap();
        std::fs::write(site.join("pkg/sub/b.py"), "bb").unwrap();
        std::os::unix::fs::symlink(&outside, site.join("evil_data")).unwrap();
        std::os::unix::fs::symlink(&outside, site.join("pkg/sub/deep")).unwrap();
        let paths: Vec<String> = [
            "evil_data",
            "evil_data/secret",
            "pkg/a.py",
            "pkg/a.py/x",
            "pkg/gone/x",
            "pkg/sub/b.py",
            "pkg/sub/deep/secret",
            "pkg/sub/deep/secret/more",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let entries = stat(
            venv.to_str().unwrap(),
            &paths,
            HashMode::All,
            None,
            false,
            &Counters::default(),
        )
        .unwrap();
        let kinds: Vec<&Kind> = entries.iter().map(|e| &e.kind).collect();
        assert!(
            matches!(kinds[0], Kind::Symlink { target } if target == outside.to_str().unwrap())
        );
        assert_eq!(
            kinds[1],
            &Kind::ThroughSymlink {
                link: "evil_data".into()
            }
        );
        assert!(matches!(
            kinds[2],
            Kind::File {
                size: 1,
                blake3: Some(_),
                ..
            }
        ));
        assert_eq!(kinds[3], &Kind::Missing);
        assert_eq!(kinds[4], &Kind::Missing);
        assert!(matches!(kinds[5], Kind::File { size: 2, .. }));
        for k in &kinds[6..] {
            assert_eq!(
                *k,
                &Kind::ThroughSymlink {
                    link: "pkg/sub/deep".into()
                }
            );
        }
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
