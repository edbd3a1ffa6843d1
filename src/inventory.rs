//! What is installed in a venv, read on the host that has it: the
//! interpreter version, site-packages, every distribution with the files its
//! `*.dist-info/RECORD` lists, files matching globs, and per-path stat and
//! blake3 (hashed on all cores). This runs inside the agent; only the results
//! cross the network.
//!
//! Every path that comes from a RECORD, a glob or a request is checked
//! lexically to stay inside the venv before it is touched.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::agent::protocol::{
    Dist, Entry, Facts, FileStamp, HashMode, Kind, ScanReport, ShebangRewrite,
};
use crate::err;
use crate::error::{Result, io_cause};
use crate::manifest::normalize_name;

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
                    hint = "check `venv` in the manifest",
                    "venv {root} is not a directory"
                ));
            }
            Err(e) => {
                return Err(err!(
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

/// Lexically join `site_rel` and `path` and normalize; `None` if the result
/// is absolute, empty, or leaves the venv root.
pub fn venv_relative(site_rel: &str, path: &str) -> Option<String> {
    if path.is_empty() || path.starts_with('/') || path.contains('\0') {
        return None;
    }
    // The common case, a plain relative path (every RECORD line of a file
    // inside site-packages), needs no normalizing.
    if path
        .split('/')
        .all(|c| !c.is_empty() && c != "." && c != "..")
        && site_rel
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
    {
        return Some(format!("{site_rel}/{path}"));
    }
    let mut parts: Vec<&str> = Vec::new();
    let joined = Path::new(site_rel).join(path);
    for c in joined.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_str()?),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(parts.join("/"))
}

/// Is this path (relative to anything) inside a `__pycache__` directory?
pub fn in_pycache(path: &str) -> bool {
    path.split('/').any(|c| c == "__pycache__")
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
                hint = "file globs are relative to site-packages",
                "file glob {g:?} escapes site-packages"
            ));
        }
        let matcher = globset::GlobBuilder::new(g)
            .literal_separator(true)
            .build()
            .map_err(|e| err!("bad glob {g:?}: {e}"))?
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
    thread_local! {
        // One read buffer per worker thread, not one allocation per file.
        static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; 1 << 20]);
    }
    BUF.with(|buf| hash_file_with(path, shebang, counters, &mut buf.borrow_mut()))
}

fn hash_file_with(
    path: &Path,
    shebang: Option<&ShebangRewrite>,
    counters: &Counters,
    buf: &mut [u8],
) -> std::io::Result<(u64, String)> {
    let mut f = std::fs::File::open(path)?;
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

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// What one `lstat` said, kept small: a stat request names every file of
/// a torch stack (35,000), and the first pass holds them all at once.
enum Probe {
    Missing,
    Symlink,
    Dir {
        mode: u32,
    },
    File {
        size: u64,
        mode: u32,
        stamp: FileStamp,
    },
    Other,
}

impl Probe {
    /// `lstat` `abs`; `Err` carries the message for anything but absence.
    fn of(abs: &Path) -> std::result::Result<Probe, String> {
        match std::fs::symlink_metadata(abs) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Probe::Missing),
            Err(e) if e.raw_os_error() == Some(20) => Ok(Probe::Missing), // ENOTDIR: a parent is a file
            Err(e) => Err(format!("{}: {}", abs.display(), io_cause(&e))),
            Ok(m) if m.file_type().is_symlink() => Ok(Probe::Symlink),
            Ok(m) if m.is_dir() => Ok(Probe::Dir {
                mode: m.permissions().mode() & 0o7777,
            }),
            Ok(m) if m.is_file() => Ok(Probe::File {
                size: m.len(),
                mode: m.permissions().mode() & 0o7777,
                stamp: FileStamp::of(&m),
            }),
            Ok(_) => Ok(Probe::Other),
        }
    }
}

/// Stat (and optionally hash) paths relative to site-packages.
pub fn stat(
    venv_root: &str,
    paths: &[String],
    hash: HashMode,
    shebang: Option<&ShebangRewrite>,
    pycache: bool,
    counters: &Counters,
) -> Result<Vec<Entry>> {
    let venv = Venv::open(venv_root)?;
    // First pass: lstat everything, so progress knows the totals; the hash
    // cache loads meanwhile. Per path: its absolute path, whether it is a
    // `bin/` script, and the lstat.
    type Probed = (PathBuf, bool, std::result::Result<Probe, String>);
    let (cache, probed) = std::thread::scope(|s| {
        let cache = s.spawn(|| match hash {
            HashMode::None => crate::hashcache::HashCache::disabled(),
            _ => crate::hashcache::HashCache::open(&venv.root),
        });
        let probed: Result<Vec<Probed>> = paths
            .par_iter()
            .map(|p| {
                let (abs, rel) = venv.resolve(p)?;
                let probe = Probe::of(&abs);
                Ok((abs, rel.starts_with("bin/"), probe))
            })
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

    // Bytecode listing, one readdir per __pycache__ directory.
    let mut pyc_dirs: HashMap<PathBuf, Vec<String>> = HashMap::new();
    if pycache {
        for (p, (abs, _, _)) in paths.iter().zip(&probed) {
            if p.ends_with(".py")
                && let Some(parent) = abs.parent()
            {
                let dir = parent.join("__pycache__");
                pyc_dirs.entry(dir.clone()).or_insert_with(|| {
                    std::fs::read_dir(&dir)
                        .map(|rd| {
                            rd.flatten()
                                .map(|e| e.file_name().to_string_lossy().into_owned())
                                .collect()
                        })
                        .unwrap_or_default()
                });
            }
        }
    }

    let entries: Vec<Result<Entry>> = paths
        .par_iter()
        .zip(probed.into_par_iter())
        .map(|(p, (abs, in_bin, probe))| {
            let kind = match probe.map_err(|e| err!("{e}"))? {
                Probe::Missing => Kind::Missing,
                Probe::Symlink => Kind::Symlink {
                    target: std::fs::read_link(&abs)
                        .map_err(|e| err!("{}: {}", abs.display(), io_cause(&e)))?
                        .to_string_lossy()
                        .into_owned(),
                },
                Probe::Dir { mode } => Kind::Dir { mode },
                Probe::Other => Kind::Other,
                Probe::File { size, mode, stamp } => {
                    let rw = if in_bin { shebang } else { None };
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
                                let (read_size, h) =
                                    hash_file(&abs, rw, counters).map_err(|e| {
                                        err!("Failed to read {}: {}", abs.display(), io_cause(&e))
                                    })?;
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
                if let Some(parent) = abs.parent()
                    && let Some(names) = pyc_dirs.get(&parent.join("__pycache__"))
                {
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
        })
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
    fn glob_bases() {
        assert_eq!(
            glob_base("sglang/srt/speculative/ddtree_*.py"),
            "sglang/srt/speculative"
        );
        assert_eq!(glob_base("*.pth"), "");
        assert_eq!(glob_base("a/b.py"), "a");
    }
}
