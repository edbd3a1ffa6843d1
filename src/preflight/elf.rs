//! ELF loadability: would glibc's `ld.so` manage to `dlopen` this shared
//! object after the overlay? Answered by reading facts, never by running the
//! loader.
//!
//! This module owns three things:
//!
//! * [`read_elf`]: the dynamic facts of one 64-bit little-endian ELF file
//!   ([`ElfInfo`]: soname, `DT_NEEDED`, `DT_RPATH`/`DT_RUNPATH`, version needs
//!   and definitions, defined and undefined dynamic symbols). Only the header,
//!   the section headers and the handful of dynamic sections are read, so a
//!   1 GB `libtorch_cuda.so` costs a few megabytes, not a gigabyte.
//! * [`LoaderView`] / [`OverlayView`]: the file system as the loader would
//!   see it once the overlay is applied (files replaced, added or deleted on
//!   top of the real disk, symlinks followed through both).
//! * [`check_object`]: a model of glibc's `_dl_map_object_deps` and symbol
//!   lookup for one root loaded by the interpreter with `RTLD_NOW` (CPython's
//!   default `dlopen` flags): the library search order of `man ld.so`
//!   (inherited `DT_RPATH`, `LD_LIBRARY_PATH`, own `DT_RUNPATH`, ld.so cache,
//!   default directories, `$ORIGIN`), version needs (`dl-version.c`) and every
//!   non-weak undefined symbol against the global scope plus the root's
//!   breadth-first dependency closure.
//!
//! Blind spots, by design or for want of facts:
//!
//! * libraries opened later with `dlopen` by the code itself (CUDA's
//!   `libcuda.so.1`, cuDNN's sub-libraries, NCCL plugins, …) are invisible:
//!   only `DT_NEEDED` is followed;
//! * the GPU driver (`libcuda.so.1`, `libnvidia-*`) is the host's and is not
//!   judged beyond "is it found";
//! * C++ layout/ABI changes that keep the same mangled names (a struct that
//!   grew a field, an inline function that changed) load fine and crash later;
//! * IFUNC resolvers, TLS model and static TLS space, `DT_TEXTREL`, copy
//!   relocations, `DF_1_NODEFLIB`, `glibc-hwcaps` subdirectories, the
//!   `e_machine`/OS ABI of candidates (only 32-bit and non-ELF candidates are
//!   skipped) are not modelled;
//! * `LD_PRELOAD`, `LD_AUDIT`, other extensions already loaded `RTLD_LOCAL`
//!   by the interpreter, and `/etc/ld.so.preload` are unknown unless the
//!   caller lists them in [`LoaderConfig::global`];
//! * symbol matching is an existence check: an unversioned reference is
//!   taken as satisfied by any definition of the name (glibc refuses hidden
//!   non-default versions `foo@V1` in one corner case); objects without
//!   section headers (`sstrip`ped) read as having no dynamic facts.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{self, File};
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use object::LittleEndian;
use object::elf as oelf;
use object::read::elf::{FileHeader, SectionHeader as _, SectionTable, Sym as _};
use object::read::{ReadRef, StringTable, SymbolIndex};

use crate::model::{Check, Problem};
pub use crate::model::{ElfInfo, Symbol};

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

/// Parse `path`; `Ok(None)` if it is not a 64-bit little-endian ELF (or not
/// ELF at all, or not a regular file). A malformed ELF is an
/// `io::ErrorKind::InvalidData` error.
pub fn read_elf(path: &Path) -> io::Result<Option<ElfInfo>> {
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.len() < 64 {
        return Ok(None);
    }
    let mut header = vec![0u8; 64];
    file.read_exact_at(&mut header, 0)?;
    if header[..4] != oelf::ELFMAG
        || header[4] != oelf::ELFCLASS64.0
        || header[5] != oelf::ELFDATA2LSB.0
    {
        return Ok(None);
    }
    let data = Sparse {
        len: meta.len(),
        regions: vec![(0, header)],
    };
    parse_elf(&file, data).map(Some).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

/// The parts of a file that were read, at their offsets. Implements
/// `object`'s `ReadRef` so that its ELF parsers work on a file of which only
/// the headers and the dynamic sections are in memory.
struct Sparse {
    len: u64,
    regions: Vec<(u64, Vec<u8>)>,
}

impl Sparse {
    /// Read `size` bytes at `offset` from `file` unless already present.
    fn add(&mut self, file: &File, offset: u64, size: u64) -> Result<(), String> {
        if size == 0 || (&*self).read_bytes_at(offset, size).is_ok() {
            return Ok(());
        }
        match offset.checked_add(size) {
            Some(end) if end <= self.len => {}
            _ => return Err(format!("range {offset:#x}+{size:#x} beyond end of file")),
        }
        let mut buf = vec![0u8; size as usize];
        file.read_exact_at(&mut buf, offset)
            .map_err(|e| e.to_string())?;
        self.regions.push((offset, buf));
        Ok(())
    }
}

impl<'a> ReadRef<'a> for &'a Sparse {
    fn len(self) -> Result<u64, ()> {
        Ok(self.len)
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size == 0 {
            return Ok(&[]);
        }
        let end = offset.checked_add(size).ok_or(())?;
        self.regions
            .iter()
            .find_map(|(start, buf)| {
                let rel = offset.checked_sub(*start)? as usize;
                let rel_end = (end - start) as usize;
                buf.get(rel..rel_end)
            })
            .ok_or(())
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        let (start, buf) = self
            .regions
            .iter()
            .find(|(start, buf)| range.start >= *start && range.start - start < buf.len() as u64)
            .ok_or(())?;
        let rel = (range.start - start) as usize;
        let stop = (range.end.saturating_sub(*start) as usize).min(buf.len());
        let hay = buf.get(rel..stop).ok_or(())?;
        let n = hay.iter().position(|&b| b == delimiter).ok_or(())?;
        Ok(&hay[..n])
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn err(e: object::read::Error) -> String {
    e.to_string()
}

fn parse_elf(file: &File, mut data: Sparse) -> Result<ElfInfo, String> {
    type Header = oelf::FileHeader64<LittleEndian>;
    let endian = LittleEndian;

    // Section headers (the first one may carry an extended e_shnum).
    let (shoff, shentsize) = {
        let h = Header::parse(&data).map_err(err)?;
        (h.e_shoff(endian), h.e_shentsize(endian))
    };
    if shoff == 0 {
        return Ok(ElfInfo::default());
    }
    if shentsize as usize != std::mem::size_of::<oelf::SectionHeader64<LittleEndian>>() {
        return Err("unexpected section header size".into());
    }
    data.add(file, shoff, shentsize.into())?;
    let shnum = Header::parse(&data)
        .map_err(err)?
        .shnum(endian, &data)
        .map_err(err)?;
    data.add(file, shoff, u64::from(shnum) * u64::from(shentsize))?;

    // The dynamic sections and the string tables they link to.
    let mut wanted = Vec::new();
    {
        let h = Header::parse(&data).map_err(err)?;
        let headers = h.section_headers(endian, &data).map_err(err)?;
        let range =
            |s: &oelf::SectionHeader64<LittleEndian>| (s.sh_offset(endian), s.sh_size(endian));
        for s in headers {
            let t = s.sh_type(endian);
            if [
                oelf::SHT_DYNAMIC,
                oelf::SHT_DYNSYM,
                oelf::SHT_GNU_VERSYM,
                oelf::SHT_GNU_VERDEF,
                oelf::SHT_GNU_VERNEED,
            ]
            .contains(&t)
            {
                wanted.push(range(s));
                if let Some(linked) = headers.get(s.sh_link(endian) as usize)
                    && linked.sh_type(endian) != oelf::SHT_NOBITS
                {
                    wanted.push(range(linked));
                }
            }
        }
    }
    for (offset, size) in wanted {
        data.add(file, offset, size)?;
    }

    let h = Header::parse(&data).map_err(err)?;
    let headers = h.section_headers(endian, &data).map_err(err)?;
    let sections: SectionTable<'_, Header, &Sparse> =
        SectionTable::new(headers, StringTable::default());
    let mut info = ElfInfo::default();

    let dynamic = sections.dynamic_table(endian, &data).map_err(err)?;
    for d in dynamic.iter() {
        let split = |v: &[u8]| -> Vec<String> {
            text(v)
                .split(':')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        match d.tag {
            oelf::DT_NEEDED => info.needed.push(text(dynamic.string(d).map_err(err)?)),
            oelf::DT_SONAME => info.soname = Some(text(dynamic.string(d).map_err(err)?)),
            oelf::DT_RPATH => info.rpath.extend(split(dynamic.string(d).map_err(err)?)),
            oelf::DT_RUNPATH => info.runpath.extend(split(dynamic.string(d).map_err(err)?)),
            _ => {}
        }
    }

    if let Some((mut needs, link)) = sections.gnu_verneed(endian, &data).map_err(err)? {
        let strings = sections.strings(endian, &data, link).map_err(err)?;
        while let Some((need, mut auxs)) = needs.next().map_err(err)? {
            let file = text(need.file(endian, strings).map_err(err)?);
            while let Some(aux) = auxs.next().map_err(err)? {
                if aux.vna_flags.get(endian).contains(oelf::VER_FLG_WEAK) {
                    continue;
                }
                info.version_needs
                    .push((file.clone(), text(aux.name(endian, strings).map_err(err)?)));
            }
        }
    }
    if let Some((mut defs, link)) = sections.gnu_verdef(endian, &data).map_err(err)? {
        let strings = sections.strings(endian, &data, link).map_err(err)?;
        while let Some((def, mut auxs)) = defs.next().map_err(err)? {
            if def.vd_flags.get(endian).contains(oelf::VER_FLG_BASE) {
                continue;
            }
            if let Some(aux) = auxs.next().map_err(err)? {
                info.version_defs
                    .push(text(aux.name(endian, strings).map_err(err)?));
            }
        }
    }

    let symbols = sections
        .symbols(endian, &data, oelf::SHT_DYNSYM)
        .map_err(err)?;
    let versions = sections.versions(endian, &data).map_err(err)?;
    for (i, sym) in symbols.symbols().iter().enumerate().skip(1) {
        let bind = sym.st_bind();
        let kind = sym.st_type();
        if bind == oelf::STB_LOCAL || kind == oelf::STT_SECTION || kind == oelf::STT_FILE {
            continue;
        }
        let name = sym.name(endian, symbols.strings()).map_err(err)?;
        if name.is_empty() {
            continue;
        }
        let version = versions.as_ref().and_then(|v| {
            let index = v.version_index(endian, SymbolIndex(i)).index();
            v.version(index).ok().flatten().map(|v| text(v.name()))
        });
        let symbol = Symbol {
            name: text(name),
            version,
            weak: bind == oelf::STB_WEAK,
        };
        if sym.is_undefined(endian) {
            info.undefined.push(symbol);
        } else {
            info.defined.push(symbol);
        }
    }
    Ok(info)
}

// ---------------------------------------------------------------------------
// The file system after the overlay
// ---------------------------------------------------------------------------

/// The file system as the loader would see it after the overlay.
pub trait LoaderView {
    /// ELF info of the file at absolute path `p` (following symlinks as the
    /// loader would), or None if absent/not ELF.
    fn elf(&mut self, p: &Path) -> Option<Arc<ElfInfo>>;
}

/// What the disk holds at one path (cached).
#[derive(Debug, Clone)]
enum OnDisk {
    Link(PathBuf),
    File(Option<Arc<ElfInfo>>),
    Absent,
}

/// An overlay of changes on top of the real file system, with a cache of
/// what was read from disk.
#[derive(Debug, Default)]
pub struct OverlayView {
    /// After the overlay: `Some` = this object is there, `None` = deleted.
    overrides: HashMap<PathBuf, Option<Arc<ElfInfo>>>,
    disk: HashMap<PathBuf, OnDisk>,
    /// Directory -> its canonical form on disk (None if it does not exist).
    dirs: HashMap<PathBuf, Option<PathBuf>>,
    /// ELF facts kept between runs, keyed by file stamp.
    persistent: Option<Arc<crate::hashcache::StampCache<Option<ElfInfo>>>>,
}

impl OverlayView {
    pub fn new() -> Self {
        Self::default()
    }

    /// Read disk objects through (and into) a persistent cache.
    pub fn with_cache(cache: Arc<crate::hashcache::StampCache<Option<ElfInfo>>>) -> Self {
        OverlayView {
            persistent: Some(cache),
            ..Self::default()
        }
    }

    /// After the overlay, `p` holds this object (Some) or is gone (None).
    pub fn set(&mut self, p: PathBuf, info: Option<ElfInfo>) {
        self.overrides.insert(normalize(&p), info.map(Arc::new));
    }

    /// Like [`set`](Self::set), sharing an already parsed object.
    pub fn set_shared(&mut self, p: PathBuf, info: Option<Arc<ElfInfo>>) {
        self.overrides.insert(normalize(&p), info);
    }

    fn override_of(&mut self, p: &Path) -> Option<Option<Arc<ElfInfo>>> {
        if let Some(v) = self.overrides.get(p) {
            return Some(v.clone());
        }
        // The same file reached through a symlinked directory.
        let (dir, name) = (p.parent()?, p.file_name()?);
        let canonical = self
            .dirs
            .entry(dir.to_path_buf())
            .or_insert_with(|| fs::canonicalize(dir).ok())
            .clone()?;
        if canonical == dir {
            return None;
        }
        self.overrides.get(&canonical.join(name)).cloned()
    }

    fn lookup(&mut self, p: &Path, depth: u32) -> Option<Arc<ElfInfo>> {
        let p = normalize(p);
        if let Some(v) = self.override_of(&p) {
            return v;
        }
        let persistent = self.persistent.clone();
        let entry = self
            .disk
            .entry(p.clone())
            .or_insert_with(|| match fs::symlink_metadata(&p) {
                Ok(m) if m.file_type().is_symlink() => match fs::read_link(&p) {
                    Ok(target) => OnDisk::Link(p.parent().unwrap_or(Path::new("/")).join(target)),
                    Err(_) => OnDisk::Absent,
                },
                Ok(m) if m.is_file() => {
                    let cached = persistent.as_ref().and_then(|c| c.get(&p, &m));
                    let info = match cached {
                        Some(info) => info,
                        None => {
                            let info = read_elf(&p).ok().flatten();
                            if let Some(c) = &persistent {
                                c.put(&p, &m, &info);
                            }
                            info
                        }
                    };
                    OnDisk::File(info.map(Arc::new))
                }
                _ => OnDisk::Absent,
            });
        match entry.clone() {
            OnDisk::File(info) => info,
            OnDisk::Absent => None,
            OnDisk::Link(_) if depth >= 40 => None,
            OnDisk::Link(target) => self.lookup(&target, depth + 1),
        }
    }
}

impl LoaderView for OverlayView {
    fn elf(&mut self, p: &Path) -> Option<Arc<ElfInfo>> {
        self.lookup(p, 0)
    }
}

/// Remove `.` and resolve `..` as the kernel would: lexically, unless the
/// component before `..` is a symlink on disk (then relative to its target).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                let is_link = fs::symlink_metadata(&out)
                    .map(|m| m.file_type().is_symlink())
                    .unwrap_or(false);
                if is_link && let Ok(real) = fs::canonicalize(&out) {
                    out = real;
                }
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Loader configuration
// ---------------------------------------------------------------------------

/// How the target's loader searches, and what is loaded before the root.
#[derive(Debug, Clone, Default)]
pub struct LoaderConfig {
    pub ld_library_path: Vec<PathBuf>,
    /// soname -> path from the ld.so cache.
    pub ld_cache: HashMap<String, PathBuf>,
    /// e.g. /lib/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu, /lib64, /usr/lib64, /lib, /usr/lib
    pub default_dirs: Vec<PathBuf>,
    /// Objects already in the global scope before the root is loaded: the
    /// Python interpreter (its exported symbols, e.g. PyModule_Create2) and,
    /// for extensions that import torch, the libraries torch preloads. Their
    /// sonames (and those of their own dependencies) count as loaded and
    /// their symbols as defined. `global[0]`, if any, plays the main program:
    /// its `DT_RPATH` is searched as glibc searches the executable's.
    pub global: Vec<PathBuf>,
}

impl LoaderConfig {
    /// The trusted directories of an x86-64 glibc (Debian and Red Hat layouts).
    pub fn default_dirs() -> Vec<PathBuf> {
        [
            "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu",
            "/lib64",
            "/usr/lib64",
            "/lib",
            "/usr/lib",
        ]
        .into_iter()
        .map(PathBuf::from)
        .collect()
    }

    /// Default dirs and the ld.so cache of this host (`ldconfig -p`; an
    /// empty cache if that fails). `ld_library_path` and `global` are left
    /// empty for the caller to fill.
    pub fn system() -> LoaderConfig {
        let output = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
            .iter()
            .find_map(|prog| {
                let out = std::process::Command::new(prog)
                    .arg("-p")
                    .stdin(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .output()
                    .ok()?;
                out.status.success().then_some(out.stdout)
            })
            .unwrap_or_default();
        LoaderConfig {
            ld_library_path: Vec::new(),
            ld_cache: parse_ldconfig(&String::from_utf8_lossy(&output)),
            default_dirs: Self::default_dirs(),
            global: Vec::new(),
        }
    }
}

/// Parse the output of `ldconfig -p` into soname -> path, x86-64 entries
/// only, the first entry of a name winning (as the loader prefers it).
pub fn parse_ldconfig(output: &str) -> HashMap<String, PathBuf> {
    let mut map = HashMap::new();
    for line in output.lines() {
        let Some((left, path)) = line.split_once(" => ") else {
            continue;
        };
        let Some((name, flags)) = left.trim().split_once(" (") else {
            continue;
        };
        if !flags.contains("x86-64") {
            continue;
        }
        map.entry(name.trim().to_owned())
            .or_insert_with(|| PathBuf::from(path.trim()));
    }
    map
}

// ---------------------------------------------------------------------------
// The loader model
// ---------------------------------------------------------------------------

/// One predicted load failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfProblem {
    /// The object that cannot be loaded (the one with the unmet need).
    pub file: PathBuf,
    pub reason: String,
}

impl ElfProblem {
    /// As a preflight [`Problem`] of the ELF check, the file
    /// relative to `site_packages` when it lies under it.
    pub fn to_problem(&self, site_packages: &Path, dist: Option<String>) -> Problem {
        let file = self.file.strip_prefix(site_packages).unwrap_or(&self.file);
        Problem {
            check: Check::Elf,
            dist,
            file: Some(file.to_string_lossy().into_owned()),
            reason: self.reason.clone(),
            preexisting: false,
        }
    }
}

/// At most this many undefined symbols are listed per object; the rest are
/// counted in one more problem.
const MAX_UNDEFINED_PER_FILE: usize = 20;

struct Loaded {
    path: PathBuf,
    info: Arc<ElfInfo>,
    /// `$ORIGIN` of this object.
    origin: PathBuf,
    /// The object whose `DT_NEEDED` loaded this one (`l_loader`).
    loader: Option<usize>,
    /// Loaded for this root (checked), as opposed to already in the global scope.
    new: bool,
    /// Each `DT_NEEDED` name and the object it resolved to.
    deps: Vec<(String, Option<usize>)>,
}

struct Session<'a> {
    view: &'a mut dyn LoaderView,
    cfg: &'a LoaderConfig,
    objs: Vec<Loaded>,
    /// Names an object answers to: soname, names it was requested as, path.
    by_name: HashMap<String, usize>,
    /// The main program (`cfg.global[0]`).
    main: Option<usize>,
}

impl Session<'_> {
    fn add(
        &mut self,
        path: PathBuf,
        info: Arc<ElfInfo>,
        loader: Option<usize>,
        new: bool,
    ) -> usize {
        let index = self.objs.len();
        let origin = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        self.by_name
            .entry(path.to_string_lossy().into_owned())
            .or_insert(index);
        if let Some(soname) = &info.soname {
            self.by_name.entry(soname.clone()).or_insert(index);
        }
        self.objs.push(Loaded {
            path,
            info,
            origin,
            loader,
            new,
            deps: Vec::new(),
        });
        index
    }

    /// The search path of `man ld.so` for a need of object `o`, with
    /// `None` marking the place of the ld.so cache.
    fn search_dirs(&self, o: usize) -> Vec<Option<PathBuf>> {
        let mut dirs = Vec::new();
        let push = |entries: &[String], origin: &Path, dirs: &mut Vec<Option<PathBuf>>| {
            for e in entries {
                let d = PathBuf::from(expand_dst(e, origin));
                if d.is_absolute() {
                    dirs.push(Some(normalize(&d)));
                }
            }
        };
        let obj = &self.objs[o];
        if obj.info.runpath.is_empty() {
            // DT_RPATH of O, then of each loader up the chain (a DT_RUNPATH
            // on an object voids its own DT_RPATH), then of the main program.
            let mut did_main = false;
            let mut l = Some(o);
            while let Some(i) = l {
                let lo = &self.objs[i];
                if lo.info.runpath.is_empty() {
                    push(&lo.info.rpath, &lo.origin, &mut dirs);
                    did_main |= Some(i) == self.main;
                }
                l = lo.loader;
            }
            if let (false, Some(m)) = (did_main, self.main) {
                let mo = &self.objs[m];
                if mo.info.runpath.is_empty() {
                    push(&mo.info.rpath, &mo.origin, &mut dirs);
                }
            }
        }
        dirs.extend(self.cfg.ld_library_path.iter().map(|d| Some(normalize(d))));
        push(&obj.info.runpath, &obj.origin, &mut dirs);
        dirs.push(None);
        dirs.extend(self.cfg.default_dirs.iter().map(|d| Some(d.clone())));
        let mut seen = HashSet::new();
        dirs.retain(|d| seen.insert(d.clone()));
        dirs
    }

    /// Find (loading it if need be) the object `o` asks for as `name`.
    /// `Err` lists what was searched.
    fn resolve(&mut self, o: usize, name: &str, new: bool) -> Result<usize, Vec<String>> {
        if name.contains('/') {
            let p = PathBuf::from(expand_dst(name, &self.objs[o].origin));
            if !p.is_absolute() {
                return Err(vec![format!(
                    "{} (relative to the working directory)",
                    p.display()
                )]);
            }
            let p = normalize(&p);
            return self
                .open(o, name, &p, new)
                .ok_or_else(|| vec![p.display().to_string()]);
        }
        if let Some(&i) = self.by_name.get(name) {
            return Ok(i);
        }
        let mut searched = Vec::new();
        for dir in self.search_dirs(o) {
            let candidate = match dir {
                Some(dir) => {
                    searched.push(dir.display().to_string());
                    dir.join(name)
                }
                None => {
                    searched.push("ld.so cache".to_owned());
                    match self.cfg.ld_cache.get(name) {
                        Some(p) => p.clone(),
                        None => continue,
                    }
                }
            };
            if let Some(i) = self.open(o, name, &candidate, new) {
                return Ok(i);
            }
        }
        Err(searched)
    }

    fn open(&mut self, o: usize, name: &str, path: &Path, new: bool) -> Option<usize> {
        let key = path.to_string_lossy();
        let index = match self.by_name.get(key.as_ref()) {
            Some(&i) => i,
            None => {
                let info = self.view.elf(path)?;
                self.add(path.to_path_buf(), info, Some(o), new)
            }
        };
        self.by_name.entry(name.to_owned()).or_insert(index);
        Some(index)
    }

    /// Breadth-first closure from `start`; not-found problems go to `problems`
    /// when given.
    fn closure(&mut self, start: usize, new: bool, mut problems: Option<&mut Vec<ElfProblem>>) {
        let mut queue = VecDeque::from([start]);
        let mut queued: HashSet<usize> = HashSet::from([start]);
        while let Some(o) = queue.pop_front() {
            let info = self.objs[o].info.clone();
            for name in &info.needed {
                let dep = match self.resolve(o, name, new) {
                    Ok(i) => Some(i),
                    Err(searched) => {
                        if let Some(p) = problems.as_deref_mut() {
                            p.push(ElfProblem {
                                file: self.objs[o].path.clone(),
                                reason: format!(
                                    "needs {name}, which is not found (searched: {})",
                                    searched.join(", ")
                                ),
                            });
                        }
                        None
                    }
                };
                self.objs[o].deps.push((name.clone(), dep));
                if let Some(i) = dep
                    && self.objs[i].new == new
                    && queued.insert(i)
                {
                    queue.push_back(i);
                }
            }
        }
    }
}

/// Expand `$ORIGIN`, `$LIB` and `$PLATFORM` (braced or not) as glibc does.
fn expand_dst(s: &str, origin: &Path) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        let (name, after) = match rest.strip_prefix('{') {
            Some(r) => match r.find('}') {
                Some(j) => (&r[..j], &r[j + 1..]),
                None => ("", rest),
            },
            None => {
                let j = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                (&rest[..j], &rest[j..])
            }
        };
        match name {
            "ORIGIN" => out.push_str(&origin.to_string_lossy()),
            "LIB" => out.push_str("lib"),
            "PLATFORM" => out.push_str("x86_64"),
            _ => {
                out.push('$');
                continue;
            }
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// "up to GLIBC_2.36" for a need of GLIBC_2.99, else the list of versions.
fn defines_summary(needed: &str, defs: &[String]) -> String {
    fn split(v: &str) -> Option<(&str, Vec<u64>)> {
        let at = v.find(|c: char| c.is_ascii_digit())?;
        let nums: Option<Vec<u64>> = v[at..].split('.').map(|n| n.parse().ok()).collect();
        Some((&v[..at], nums?))
    }
    if let Some((prefix, _)) = split(needed) {
        let best = defs
            .iter()
            .filter_map(|d| split(d).filter(|(p, _)| *p == prefix).map(|(_, n)| (n, d)))
            .max();
        if let Some((_, d)) = best {
            return format!("defines up to {d}");
        }
    }
    match defs.len() {
        0 => "defines no versions".to_owned(),
        n if n <= 6 => format!("defines {}", defs.join(", ")),
        n => format!("defines {}, … ({n} versions)", defs[..6].join(", ")),
    }
}

/// `foo::bar(int) (_ZN3foo3barEi@V2)` for C++, `foo@V2` for C.
fn describe_symbol(s: &Symbol) -> String {
    let raw = match &s.version {
        Some(v) => format!("{}@{v}", s.name),
        None => s.name.clone(),
    };
    if s.name.starts_with("_Z")
        && let Ok(sym) = cpp_demangle::Symbol::new(s.name.as_bytes())
        && let Ok(d) = sym.demangle()
    {
        return format!("{d} ({raw})");
    }
    raw
}

/// Simulate loading `root` (dlopen by the interpreter, `RTLD_NOW`) and
/// report every problem: unresolvable `DT_NEEDED`, unmet version needs and
/// non-weak undefined symbols defined nowhere in scope.
pub fn check_object(root: &Path, view: &mut dyn LoaderView, cfg: &LoaderConfig) -> Vec<ElfProblem> {
    let mut problems = Vec::new();
    let mut s = Session {
        view,
        cfg,
        objs: Vec::new(),
        by_name: HashMap::new(),
        main: None,
    };

    // The global scope: each global object and its own closure, silently.
    for (n, g) in cfg.global.iter().enumerate() {
        let g = normalize(g);
        if s.by_name.contains_key(g.to_string_lossy().as_ref()) {
            continue;
        }
        let Some(info) = s.view.elf(&g) else { continue };
        let i = s.add(g.clone(), info, None, false);
        if n == 0 {
            // The executable's $ORIGIN is that of its real path (/proc/self/exe).
            if let Some(dir) = fs::canonicalize(&g)
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf))
            {
                s.objs[i].origin = dir;
            }
            s.main = Some(i);
        }
        s.closure(i, false, None);
    }

    // The root, loaded by path, and its closure.
    let root = normalize(root);
    let Some(info) = s.view.elf(&root) else {
        return vec![ElfProblem {
            file: root,
            reason: "is missing or is not a 64-bit little-endian ELF object".to_owned(),
        }];
    };
    let r = s.add(root, info, None, true);
    s.closure(r, true, Some(&mut problems));

    // Version needs (dl-version.c), per newly loaded object.
    let mut missing_versions: HashMap<usize, HashSet<&str>> = HashMap::new();
    let mut blocked: HashSet<usize> = HashSet::new();
    for (i, o) in s.objs.iter().enumerate().filter(|(_, o)| o.new) {
        if o.deps.iter().any(|(_, d)| d.is_none()) {
            blocked.insert(i);
        }
        for (file, version) in &o.info.version_needs {
            let provider = o
                .deps
                .iter()
                .find(|(n, _)| n == file)
                .and_then(|(_, d)| *d)
                .or_else(|| s.by_name.get(file).copied());
            let Some(p) = provider else { continue };
            let defs = &s.objs[p].info.version_defs;
            // A provider without any version definitions is accepted by glibc.
            if defs.is_empty() || defs.contains(version) {
                continue;
            }
            missing_versions.entry(i).or_default().insert(version);
            problems.push(ElfProblem {
                file: o.path.clone(),
                reason: format!(
                    "needs {version} from {file} ({} {})",
                    s.objs[p].path.display(),
                    defines_summary(version, defs)
                ),
            });
        }
    }

    // Undefined symbols: what the new objects need, against what the scope
    // (global closure and the root's closure) defines. Only definitions of
    // wanted names are indexed.
    let mut wanted: HashSet<&str> = HashSet::new();
    for (i, o) in s.objs.iter().enumerate() {
        if o.new && !blocked.contains(&i) {
            wanted.extend(
                o.info
                    .undefined
                    .iter()
                    .filter(|u| !u.weak)
                    .map(|u| u.name.as_str()),
            );
        }
    }
    let mut defined_any: HashSet<&str> = HashSet::new();
    let mut defined_unversioned: HashSet<&str> = HashSet::new();
    let mut defined_versioned: HashSet<(&str, &str)> = HashSet::new();
    for d in s.objs.iter().flat_map(|o| o.info.defined.iter()) {
        let name = d.name.as_str();
        if !wanted.contains(name) {
            continue;
        }
        defined_any.insert(name);
        match &d.version {
            Some(v) => defined_versioned.insert((name, v.as_str())),
            None => defined_unversioned.insert(name),
        };
    }
    // An unversioned reference takes any definition; a versioned one takes
    // that version or an unversioned definition (glibc's check_match).
    let resolves = |u: &Symbol| match &u.version {
        None => defined_any.contains(u.name.as_str()),
        Some(v) => {
            defined_versioned.contains(&(u.name.as_str(), v.as_str()))
                || defined_unversioned.contains(u.name.as_str())
        }
    };
    for (i, o) in s.objs.iter().enumerate() {
        if !o.new || blocked.contains(&i) {
            continue;
        }
        let reported_versions = missing_versions.get(&i);
        let mut missing = o.info.undefined.iter().filter(|u| {
            let version_reported = u
                .version
                .as_deref()
                .is_some_and(|v| reported_versions.is_some_and(|set| set.contains(v)));
            !u.weak && !version_reported && !resolves(u)
        });
        for u in missing.by_ref().take(MAX_UNDEFINED_PER_FILE) {
            problems.push(ElfProblem {
                file: o.path.clone(),
                reason: format!("undefined symbol: {}", describe_symbol(u)),
            });
        }
        let more = missing.count();
        if more > 0 {
            problems.push(ElfProblem {
                file: o.path.clone(),
                reason: format!("… and {more} more undefined symbols"),
            });
        }
    }
    problems
}

// ---------------------------------------------------------------------------
// Tests: real objects built by gcc
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Build a shared object `out` in `dir` from C (or C++ if `cpp`) source.
    fn cc(dir: &Path, out: &str, src: &str, cpp: bool, args: &[&str]) -> PathBuf {
        let ext = if cpp { "cc" } else { "c" };
        let src_path = dir.join(format!("{}.{ext}", out.replace('/', "_")));
        fs::write(&src_path, src).unwrap();
        let out_path = dir.join(out);
        fs::create_dir_all(out_path.parent().unwrap()).unwrap();
        let status = Command::new("gcc")
            .current_dir(dir)
            .args(["-shared", "-fPIC", "-o"])
            .arg(&out_path)
            .arg(&src_path)
            .args(args)
            .status()
            .expect("gcc");
        assert!(status.success(), "gcc failed for {out}");
        out_path
    }

    fn reasons(p: &[ElfProblem]) -> Vec<String> {
        p.iter()
            .map(|p| format!("{}: {}", p.file.display(), p.reason))
            .collect()
    }

    /// deps/libbase.so.1 and libuse.so (RPATH $ORIGIN/deps, uses printf).
    fn base_and_user(dir: &Path) -> (PathBuf, PathBuf) {
        let base = cc(
            dir,
            "deps/libbase.so.1",
            "int base(int x) { return x + 1; }\nint other(int x) { return x; }\n",
            false,
            &["-Wl,-soname,libbase.so.1"],
        );
        let user = cc(
            dir,
            "libuse.so",
            "#include <stdio.h>\nextern int base(int);\nint use(int x) { printf(\"%d\", x); return base(x) * 2; }\n",
            false,
            &[
                "deps/libbase.so.1",
                "-Wl,--disable-new-dtags",
                "-Wl,-rpath,$ORIGIN/deps",
            ],
        );
        (base, user)
    }

    #[test]
    fn read_elf_facts() {
        let t = tempfile::tempdir().unwrap();
        let (base, user) = base_and_user(t.path());
        let b = read_elf(&base).unwrap().unwrap();
        assert_eq!(b.soname.as_deref(), Some("libbase.so.1"));
        assert!(
            b.defined
                .iter()
                .any(|s| s.name == "base" && s.version.is_none())
        );
        let u = read_elf(&user).unwrap().unwrap();
        assert_eq!(u.rpath, vec!["$ORIGIN/deps".to_owned()]);
        assert!(u.runpath.is_empty());
        assert!(u.needed.contains(&"libbase.so.1".to_owned()));
        assert!(u.needed.contains(&"libc.so.6".to_owned()));
        assert!(
            u.version_needs
                .iter()
                .any(|(f, v)| f == "libc.so.6" && v.starts_with("GLIBC_2."))
        );
        assert!(u.undefined.iter().any(|s| s.name == "base" && !s.weak));
        assert!(
            u.undefined
                .iter()
                .any(|s| s.name == "printf" && s.version.as_deref().is_some())
        );
        // gcc's weak references (__cxa_finalize, _ITM_*, __gmon_start__).
        assert!(u.undefined.iter().any(|s| s.weak));
        let libc = read_elf(Path::new("/lib/x86_64-linux-gnu/libc.so.6"))
            .unwrap()
            .unwrap();
        assert!(libc.version_defs.contains(&"GLIBC_2.34".to_owned()));
        assert!(
            libc.defined
                .iter()
                .any(|s| s.name == "printf" && s.version.as_deref() == Some("GLIBC_2.2.5"))
        );
    }

    #[test]
    fn non_elf_is_none() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("notes.txt");
        fs::write(
            &p,
            "just some text, long enough to pass the 64 byte header length check....",
        )
        .unwrap();
        assert_eq!(read_elf(&p).unwrap(), None);
        let short = t.path().join("short");
        fs::write(&short, "\x7fELF").unwrap();
        assert_eq!(read_elf(&short).unwrap(), None);
        assert_eq!(read_elf(t.path()).unwrap(), None);
    }

    #[test]
    fn consistent_object_has_no_problem() {
        let t = tempfile::tempdir().unwrap();
        let (_, user) = base_and_user(t.path());
        let cfg = LoaderConfig::system();
        assert!(
            cfg.ld_cache.contains_key("libc.so.6"),
            "ld cache: {:?}",
            cfg.ld_cache.len()
        );
        let problems = check_object(&user, &mut OverlayView::new(), &cfg);
        assert!(problems.is_empty(), "{:#?}", reasons(&problems));
    }

    #[test]
    fn deleted_needed_is_not_found() {
        let t = tempfile::tempdir().unwrap();
        let (base, user) = base_and_user(t.path());
        let mut view = OverlayView::new();
        view.set(base, None);
        let problems = check_object(&user, &mut view, &LoaderConfig::system());
        assert_eq!(problems.len(), 1, "{:#?}", reasons(&problems));
        assert_eq!(problems[0].file, user);
        assert!(
            problems[0]
                .reason
                .starts_with("needs libbase.so.1, which is not found (searched: ")
        );
        assert!(
            problems[0]
                .reason
                .contains(&t.path().join("deps").display().to_string())
        );
    }

    #[test]
    fn symbol_removed_by_replacement_is_undefined() {
        let t = tempfile::tempdir().unwrap();
        let (base, user) = base_and_user(t.path());
        let new = cc(
            t.path(),
            "new/libbase.so.1",
            "int other(int x) { return x; }\n",
            false,
            &["-Wl,-soname,libbase.so.1"],
        );
        let mut view = OverlayView::new();
        view.set(base, read_elf(&new).unwrap());
        let problems = check_object(&user, &mut view, &LoaderConfig::system());
        assert_eq!(
            reasons(&problems),
            vec![format!("{}: undefined symbol: base", user.display())]
        );
    }

    #[test]
    fn missing_cpp_symbol_is_demangled() {
        let t = tempfile::tempdir().unwrap();
        let lib = cc(
            t.path(),
            "libfoo.so.1",
            "namespace foo { int bar(int x) { return x; } }\n",
            true,
            &["-Wl,-soname,libfoo.so.1"],
        );
        let user = cc(
            t.path(),
            "libcxxuse.so",
            "namespace foo { int bar(int); }\nint use() { return foo::bar(1); }\n",
            true,
            &["libfoo.so.1", "-Wl,-rpath,$ORIGIN"],
        );
        let changed = cc(
            t.path(),
            "new/libfoo.so.1",
            "namespace foo { int bar(long x) { return x; } }\n",
            true,
            &["-Wl,-soname,libfoo.so.1"],
        );
        let cfg = LoaderConfig::system();
        assert!(check_object(&user, &mut OverlayView::new(), &cfg).is_empty());
        let mut view = OverlayView::new();
        view.set(lib, read_elf(&changed).unwrap());
        let problems = check_object(&user, &mut view, &cfg);
        assert_eq!(problems.len(), 1, "{:#?}", reasons(&problems));
        assert_eq!(
            problems[0].reason,
            "undefined symbol: foo::bar(int) (_ZN3foo3barEi)"
        );
    }

    #[test]
    fn version_need_nothing_provides() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        fs::write(dir.join("v1.map"), "V1 { global: f1; local: *; };\n").unwrap();
        fs::write(
            dir.join("v2.map"),
            "V1 { global: f1; local: *; };\nV2 { global: f2; } V1;\n",
        )
        .unwrap();
        let src = "int f1(void) { return 1; }\nint f2(void) { return 2; }\n";
        let v2 = cc(
            dir,
            "v2/libv.so.1",
            src,
            false,
            &["-Wl,-soname,libv.so.1", "-Wl,--version-script=v2.map"],
        );
        let v1 = cc(
            dir,
            "libv.so.1",
            src,
            false,
            &["-Wl,-soname,libv.so.1", "-Wl,--version-script=v1.map"],
        );
        let user = cc(
            dir,
            "libvuse.so",
            "extern int f1(void); extern int f2(void);\nint use(void) { return f1() + f2(); }\n",
            false,
            &["v2/libv.so.1", "-Wl,-rpath,$ORIGIN"],
        );
        let info = read_elf(&user).unwrap().unwrap();
        assert!(
            info.version_needs
                .contains(&("libv.so.1".to_owned(), "V2".to_owned()))
        );
        assert!(
            info.undefined
                .iter()
                .any(|s| s.name == "f2" && s.version.as_deref() == Some("V2"))
        );
        assert_eq!(
            read_elf(&v1).unwrap().unwrap().version_defs,
            vec!["V1".to_owned()]
        );

        let cfg = LoaderConfig::system();
        let problems = check_object(&user, &mut OverlayView::new(), &cfg);
        assert_eq!(problems.len(), 1, "{:#?}", reasons(&problems));
        assert_eq!(problems[0].file, user);
        assert_eq!(
            problems[0].reason,
            format!(
                "needs V2 from libv.so.1 ({} defines up to V1)",
                v1.display()
            )
        );

        // The V2 build in its place: fine.
        let mut view = OverlayView::new();
        view.set(v1.clone(), read_elf(&v2).unwrap());
        let problems = check_object(&user, &mut view, &cfg);
        assert!(problems.is_empty(), "{:#?}", reasons(&problems));
    }

    /// root (RPATH or RUNPATH $ORIGIN/deps) -> deps/libB.so.1 (no path) -> deps/libC.so.1
    fn chain(dir: &Path, dtags: &str) -> PathBuf {
        cc(
            dir,
            "deps/libC.so.1",
            "int c(void) { return 3; }\n",
            false,
            &["-Wl,-soname,libC.so.1"],
        );
        cc(
            dir,
            "deps/libB.so.1",
            "extern int c(void);\nint b(void) { return c(); }\n",
            false,
            &["-Wl,-soname,libB.so.1", "deps/libC.so.1"],
        );
        cc(
            dir,
            "root.so",
            "extern int b(void);\nint r(void) { return b(); }\n",
            false,
            &[
                "deps/libB.so.1",
                dtags,
                "-Wl,-rpath,$ORIGIN/deps",
                "-Wl,-rpath-link,deps",
            ],
        )
    }

    #[test]
    fn rpath_is_inherited() {
        let t = tempfile::tempdir().unwrap();
        let root = chain(t.path(), "-Wl,--disable-new-dtags");
        assert_eq!(
            read_elf(&root).unwrap().unwrap().rpath,
            vec!["$ORIGIN/deps".to_owned()]
        );
        let problems = check_object(&root, &mut OverlayView::new(), &LoaderConfig::system());
        assert!(problems.is_empty(), "{:#?}", reasons(&problems));
    }

    #[test]
    fn runpath_is_not_inherited() {
        let t = tempfile::tempdir().unwrap();
        let root = chain(t.path(), "-Wl,--enable-new-dtags");
        assert_eq!(
            read_elf(&root).unwrap().unwrap().runpath,
            vec!["$ORIGIN/deps".to_owned()]
        );
        let problems = check_object(&root, &mut OverlayView::new(), &LoaderConfig::system());
        assert_eq!(problems.len(), 1, "{:#?}", reasons(&problems));
        assert_eq!(problems[0].file, t.path().join("deps/libB.so.1"));
        assert!(
            problems[0]
                .reason
                .starts_with("needs libC.so.1, which is not found")
        );
        // LD_LIBRARY_PATH does reach it.
        let mut cfg = LoaderConfig::system();
        cfg.ld_library_path = vec![t.path().join("deps")];
        assert!(check_object(&root, &mut OverlayView::new(), &cfg).is_empty());
    }

    #[test]
    fn origin_parent_in_runpath() {
        let t = tempfile::tempdir().unwrap();
        let (base, _) = base_and_user(t.path());
        let ext = cc(
            t.path(),
            "pkg/sub/ext.so",
            "extern int base(int);\nint e(void) { return base(1); }\n",
            false,
            &[
                base.to_str().unwrap(),
                "-Wl,--enable-new-dtags",
                "-Wl,-rpath,${ORIGIN}/../../deps",
            ],
        );
        let cfg = LoaderConfig::system();
        let problems = check_object(&ext, &mut OverlayView::new(), &cfg);
        assert!(problems.is_empty(), "{:#?}", reasons(&problems));
        // A replacement added by the overlay next to the old one is what counts.
        let mut view = OverlayView::new();
        view.set(
            t.path().join("pkg/sub/../../deps/libbase.so.1"),
            Some(ElfInfo::default()),
        );
        let problems = check_object(&ext, &mut view, &cfg);
        assert_eq!(
            reasons(&problems),
            vec![format!("{}: undefined symbol: base", ext.display())]
        );
    }

    #[test]
    fn global_scope_defines_interpreter_symbols() {
        let t = tempfile::tempdir().unwrap();
        let ext = cc(
            t.path(),
            "ext.so",
            "extern int PyFake_Create(int);\nint PyInit_ext(void) { return PyFake_Create(3); }\n",
            false,
            &[],
        );
        let interp = cc(
            t.path(),
            "libfakepython.so",
            "int PyFake_Create(int x) { return x; }\n",
            false,
            &[],
        );
        let mut cfg = LoaderConfig::system();
        let problems = check_object(&ext, &mut OverlayView::new(), &cfg);
        assert_eq!(
            reasons(&problems),
            vec![format!(
                "{}: undefined symbol: PyFake_Create",
                ext.display()
            )]
        );
        cfg.global = vec![interp];
        assert!(check_object(&ext, &mut OverlayView::new(), &cfg).is_empty());
    }

    #[test]
    fn overlay_view_follows_symlinks_through_overrides() {
        let t = tempfile::tempdir().unwrap();
        let (base, _) = base_and_user(t.path());
        let real = t.path().join("deps/libbase.so.1.0");
        fs::rename(&base, &real).unwrap();
        std::os::unix::fs::symlink("libbase.so.1.0", &base).unwrap();
        let mut view = OverlayView::new();
        assert_eq!(
            view.elf(&base).unwrap().soname.as_deref(),
            Some("libbase.so.1")
        );
        let mut view = OverlayView::new();
        let replaced = ElfInfo {
            soname: Some("replaced".into()),
            ..Default::default()
        };
        view.set(real.clone(), Some(replaced));
        assert_eq!(view.elf(&base).unwrap().soname.as_deref(), Some("replaced"));
        view.set(real, None);
        assert!(view.elf(&base).is_none());
        // A path with `..` and `.` reaches the same override.
        let odd = t.path().join("deps/../deps/./libbase.so.1.0");
        view.set(odd.clone(), Some(ElfInfo::default()));
        assert!(view.elf(&t.path().join("deps/libbase.so.1")).is_some());
    }

    #[test]
    fn helpers() {
        let cache = parse_ldconfig(
            "3 libs found in cache `/etc/ld.so.cache'\n\
             \tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n\
             \tlibz.so.1 (libc6) => /lib/i386-linux-gnu/libz.so.1\n\
             \tlibm.so.6 (libc6,x32) => /libx32/libm.so.6\n",
        );
        assert_eq!(cache.len(), 1);
        assert_eq!(
            cache["libz.so.1"],
            PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1")
        );
        let o = Path::new("/a/b");
        assert_eq!(expand_dst("$ORIGIN/../lib", o), "/a/b/../lib");
        assert_eq!(expand_dst("${ORIGIN}/x:$LIB", o), "/a/b/x:lib");
        assert_eq!(expand_dst("/opt/$UNKNOWN/x", o), "/opt/$UNKNOWN/x");
        assert_eq!(
            normalize(Path::new("/a/b/../c/./d")),
            PathBuf::from("/a/c/d")
        );
        let defs: Vec<String> = ["GLIBC_2.2.5", "GLIBC_2.36", "GLIBC_2.4", "GLIBC_PRIVATE"]
            .map(String::from)
            .into();
        assert_eq!(
            defines_summary("GLIBC_2.99", &defs),
            "defines up to GLIBC_2.36"
        );
        assert_eq!(
            defines_summary("V2", &["V1".to_owned()]),
            "defines up to V1"
        );
        assert_eq!(defines_summary("FOO", &["V1".to_owned()]), "defines V1");
    }
}

#[cfg(test)]
mod system_tests {
    use super::*;
    use std::time::Instant;

    /// Every shared library of this host's system directories should load:
    /// a false-positive hunt (run with `--ignored`).
    #[test]
    #[ignore]
    fn system_libraries_load() {
        let dir =
            std::env::var("ELF_SCAN_DIR").unwrap_or_else(|_| "/usr/lib/x86_64-linux-gnu".into());
        let depth = std::env::var("ELF_SCAN_DEPTH")
            .ok()
            .and_then(|d| d.parse().ok())
            .unwrap_or(1);
        let mut cfg = LoaderConfig::system();
        if let Ok(g) = std::env::var("ELF_GLOBAL") {
            cfg.global = g.split(':').map(PathBuf::from).collect();
        }
        let mut view = OverlayView::new();
        let start = Instant::now();
        let mut n = 0;
        let mut bad = Vec::new();
        for e in walkdir::WalkDir::new(&dir).max_depth(depth) {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if !e.file_type().is_file() || !name.contains(".so") {
                continue;
            }
            if view.elf(e.path()).is_none() {
                continue;
            }
            n += 1;
            let p = check_object(e.path(), &mut view, &cfg);
            bad.extend(p);
        }
        eprintln!("{n} objects in {:?}", start.elapsed());
        for p in &bad {
            eprintln!("{}: {}", p.file.display(), p.reason);
        }
    }
}
