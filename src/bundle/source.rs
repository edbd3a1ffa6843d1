//! A bundle read in place as a source (`bundle:/abs/file.ovl`, docs/design.md
//! "Sources"): the source-side requests a live source's agent answers from
//! its venv, answered from the bundle instead, with no folder unpacked
//! anywhere.
//!
//! - `Scan` from the index: the packed distributions as the source's scan
//!   found them at pack time ([`SourceFacts`](crate::model::SourceFacts)),
//!   the glob matches among the index's entries, this host's kernel facts;
//! - `Stat` from the entries: kind, size, mode and BLAKE3 (every file's hash
//!   is known, so every hash mode gets it), the bytecode beside a `.py`, a
//!   path behind a packed symlink as [`Kind::ThroughSymlink`], and a `bin/`
//!   script hashed with its shebang rewritten for the target, as a live
//!   source hashes it (the scripts are the tar's first members, read once);
//! - `ElfInfo` and `RecordCheck` from what the source's agent answered when
//!   the bundle was packed;
//! - `Send` by one pass over the bundle's tar per segment of the stream,
//!   each requested member checked against the plan and appended under its
//!   index in the plan (the target takes entries in any order).
//!
//! [`BundleSource::open`] checks the whole file first ([`Bundle::open`]), so
//! nothing is answered from a bundle that is cut short or altered.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;
use std::sync::OnceLock;

use super::{Bundle, next_member, read_index};
use crate::err;
use crate::error::Result;
use crate::inventory::{ContentHasher, Counters, content_hex, rewrite_shebang};
use crate::model::{
    BundleEntry, BundleKind, Compression, Dist, ElfInfo, Entry, Facts, Finding, Kind,
    RecordCheckRequest, ScanReport, SendFile, Sent, ShebangRewrite, SourceHash, bundle_of,
    in_pycache, venv_relative,
};
use crate::stream::{BlockSink, TarWriter, send_tar};

/// Scripts larger than this are sent as they are (as from a live source).
const SCRIPT_LIMIT: u64 = 1 << 20;

/// A bundle opened as a source: checked whole, its index read.
pub struct BundleSource {
    pub(super) bundle: Bundle,
    /// The "venv" it was opened as (`bundle:/abs/file.ovl`).
    venv: String,
    /// The small `bin/` scripts as packed, read on first use.
    scripts: OnceLock<std::result::Result<BTreeMap<String, Vec<u8>>, String>>,
}

impl BundleSource {
    /// Open the bundle that the "venv" `venv` names (an absolute path).
    pub fn open(venv: &str) -> Result<BundleSource> {
        let Some(file) = bundle_of(venv) else {
            return Err(err!(kind = Internal, "{venv} names no bundle"));
        };
        if !file.starts_with('/') {
            return Err(err!(
                kind = Usage,
                hint = "name the bundle by its absolute path",
                "bundle {file:?} is not an absolute path"
            ));
        }
        let bundle = Bundle::open(Path::new(file))?;
        if let Some(pin) = crate::model::bundle_pin(venv).filter(|p| *p != bundle.blake3) {
            return Err(err!(
                kind = Drift,
                hint = "the file was replaced while overlay ran: check who else writes it, then plan again",
                "The bundle {file} holds another bundle (BLAKE3 {}) than the one checked when the command began ({pin}); nothing is read from it",
                bundle.blake3
            ));
        }
        Ok(BundleSource {
            bundle,
            venv: venv.to_string(),
            scripts: OnceLock::new(),
        })
    }

    /// The "venv" this source answers for.
    pub fn venv(&self) -> &str {
        &self.venv
    }

    /// The bundle's whole-file BLAKE3.
    pub fn blake3(&self) -> &str {
        &self.bundle.blake3
    }

    fn site(&self) -> &str {
        &self.bundle.index.site_packages
    }

    /// The index's entry at `rel` (relative to the venv).
    fn entry(&self, rel: &str) -> Option<&BundleEntry> {
        let entries = &self.bundle.index.entries;
        entries
            .binary_search_by(|e| e.path.as_str().cmp(rel))
            .ok()
            .map(|i| &entries[i])
    }

    /// What a scan of the source venv found of the packed distributions,
    /// and the matches of `globs` among the packed files.
    pub fn scan(&self, globs: &[String]) -> Result<ScanReport> {
        let index = &self.bundle.index;
        let globs = globs
            .iter()
            .map(|g| self.glob_matches(g))
            .collect::<Result<Vec<_>>>()?;
        let dists: Vec<Dist> = index.facts.dists.clone();
        Ok(ScanReport {
            venv: self.venv.clone(),
            site_packages: index.site_packages.clone(),
            python: index.python.clone(),
            dists,
            globs,
            facts: Facts {
                python_full: index.facts.python_full.clone(),
                ..crate::inventory::host_facts(&index.python)
            },
            // The bundle's source machine is not this one: unknown.
            machine: Default::default(),
        })
    }

    /// The packed files and symlinks under site-packages that the file glob
    /// `g` matches, in the order a walk of the venv finds them.
    fn glob_matches(&self, g: &str) -> Result<Vec<String>> {
        let matcher = crate::inventory::glob_matcher(self.site(), g)?;
        let prefix = format!("{}/", self.site());
        let mut found: Vec<&str> = self
            .bundle
            .index
            .entries
            .iter()
            .filter(|e| !matches!(e.kind, BundleKind::Dir { .. }))
            .filter_map(|e| e.path.strip_prefix(&prefix))
            .filter(|p| !in_pycache(p) && matcher.is_match(p))
            .collect();
        found.sort_by(|a, b| Path::new(a).cmp(Path::new(b)));
        Ok(found.into_iter().map(str::to_string).collect())
    }

    /// The entry of each of `paths` (relative to site-packages, as RECORD
    /// spells them), as a live source's stat gives it with every hash taken.
    pub fn stat(
        &self,
        paths: &[String],
        shebang: Option<&ShebangRewrite>,
        pycache: bool,
    ) -> Result<Vec<Entry>> {
        paths
            .iter()
            .map(|p| {
                let rel = venv_relative(self.site(), p).ok_or_else(|| {
                    err!(
                        kind = Protocol,
                        "path {p:?} leaves the venv of the bundle {}",
                        self.bundle.path.display()
                    )
                })?;
                let kind = self.kind_of(&rel, shebang)?;
                let pyc = if pycache && matches!(kind, Kind::File { .. }) {
                    self.bytecode(p, &rel)
                } else {
                    Vec::new()
                };
                Ok(Entry {
                    path: p.clone(),
                    kind,
                    pyc,
                })
            })
            .collect()
    }

    /// The kind of the venv-relative `rel`: behind a packed symlink, the
    /// index's entry, or missing.
    fn kind_of(&self, rel: &str, shebang: Option<&ShebangRewrite>) -> Result<Kind> {
        let mut at = 0;
        while let Some(i) = rel[at..].find('/') {
            let parent = &rel[..at + i];
            if let Some(BundleEntry {
                kind: BundleKind::Symlink { .. },
                ..
            }) = self.entry(parent)
            {
                return Ok(Kind::ThroughSymlink {
                    link: site_relative(self.site(), parent),
                });
            }
            at += i + 1;
        }
        Ok(match self.entry(rel).map(|e| &e.kind) {
            None => Kind::Missing,
            Some(BundleKind::Dir { mode }) => Kind::Dir { mode: *mode },
            Some(BundleKind::Symlink { target }) => Kind::Symlink {
                target: target.clone(),
            },
            Some(BundleKind::File { size, mode, blake3 }) => {
                let rewritten = match shebang {
                    Some(rw) if rel.starts_with("bin/") && *size < SCRIPT_LIMIT => self
                        .script(rel)?
                        .and_then(|s| rewrite_shebang(s, &self.rewrite(rw))),
                    _ => None,
                };
                let (size, blake3) = match rewritten {
                    Some(s) => (s.len() as u64, blake3::hash(&s).to_hex().to_string()),
                    None => (*size, blake3.clone()),
                };
                Kind::File {
                    size,
                    mode: *mode,
                    blake3: Some(blake3),
                    stamp: None,
                }
            }
        })
    }

    /// The rewrite a plan asks, from the venv the scripts were packed in
    /// (they name it) rather than from the bundle's "venv".
    fn rewrite(&self, asked: &ShebangRewrite) -> ShebangRewrite {
        ShebangRewrite {
            from: self.bundle.index.source_venv.clone(),
            to: asked.to.clone(),
        }
    }

    /// The packed bytes of the small `bin/` script `rel`, if it is one.
    fn script(&self, rel: &str) -> Result<Option<&[u8]>> {
        let scripts = self.scripts.get_or_init(|| self.read_scripts());
        match scripts {
            Ok(s) => Ok(s.get(rel).map(Vec::as_slice)),
            Err(why) => Err(self.bundle.bad(why)),
        }
    }

    /// Read the small `bin/` scripts: the tar's first members after the
    /// index (the entries are sorted), so only they are decompressed.
    fn read_scripts(&self) -> std::result::Result<BTreeMap<String, Vec<u8>>, String> {
        let mut members = self.bundle.reader().map_err(|e| e.message)?;
        let shown = members.shown.clone();
        let mut entries = members
            .archive
            .entries()
            .map_err(|e| e.to_string())?
            .raw(true);
        read_index(&mut entries, &shown).map_err(|e| e.message)?;
        let mut out = BTreeMap::new();
        while let Some((name, _, entry)) =
            next_member(&mut entries, &shown).map_err(|e| e.message)?
        {
            let name = name.trim_end_matches('/');
            let Some(rel) = name.strip_prefix("venv/") else {
                return Err(format!("member {name:?} is not under venv/"));
            };
            if rel > "bin/" && !rel.starts_with("bin/") {
                break;
            }
            let Some(BundleEntry {
                kind: BundleKind::File { size, .. },
                ..
            }) = self.entry(rel)
            else {
                continue;
            };
            if !rel.starts_with("bin/") || *size >= SCRIPT_LIMIT {
                continue;
            }
            let mut bytes = Vec::with_capacity(*size as usize);
            entry
                .take(*size)
                .read_to_end(&mut bytes)
                .map_err(|e| e.to_string())?;
            out.insert(rel.to_string(), bytes);
        }
        Ok(out)
    }

    /// The bytecode packed beside the `.py` at site-relative `p`
    /// (venv-relative `rel`): `__pycache__/STEM.TAG.pyc`, sorted, site-relative.
    fn bytecode(&self, p: &str, rel: &str) -> Vec<String> {
        let Some(stem) = p
            .strip_suffix(".py")
            .map(|s| s.rsplit('/').next().unwrap_or(s))
        else {
            return Vec::new();
        };
        let (dir_p, dir_rel) = match (p.rsplit_once('/'), rel.rsplit_once('/')) {
            (Some((d, _)), Some((r, _))) => {
                (format!("{d}/__pycache__"), format!("{r}/__pycache__"))
            }
            (None, Some((r, _))) => ("__pycache__".to_string(), format!("{r}/__pycache__")),
            (_, None) => ("__pycache__".to_string(), "__pycache__".to_string()),
        };
        let want = format!("{dir_rel}/{stem}.");
        let entries = &self.bundle.index.entries;
        let from = entries.partition_point(|e| e.path.as_str() < want.as_str());
        let mut pyc: Vec<String> = entries[from..]
            .iter()
            .take_while(|e| e.path.starts_with(&want))
            .filter(|e| matches!(e.kind, BundleKind::File { .. }))
            .filter_map(|e| {
                let name = &e.path[dir_rel.len() + 1..];
                let tail = &name[stem.len() + 1..];
                (name.ends_with(".pyc") && tail.contains('.') && !name.contains('/'))
                    .then(|| format!("{dir_p}/{name}"))
            })
            .collect();
        pyc.sort();
        pyc
    }

    /// The ELF facts of `paths` (site-relative) as the source read them.
    pub fn elf_info(&self, paths: &[String]) -> Vec<Option<ElfInfo>> {
        let elf = &self.bundle.index.facts.elf;
        paths.iter().map(|p| elf.get(p).cloned()).collect()
    }

    /// The packed files of `req` that differ from their RECORD, as the
    /// source's agent found them when they were packed.
    pub fn record_check(&self, req: &RecordCheckRequest) -> Result<Vec<Finding>> {
        let facts = &self.bundle.index.facts;
        if !facts.record_checked {
            return Err(err!(
                "the source of the bundle {} could not check its files against their RECORD when it was packed",
                self.bundle.path.display()
            ));
        }
        let paths: std::collections::HashSet<&str> = req.paths.iter().map(String::as_str).collect();
        Ok(facts
            .record
            .iter()
            .filter(|f| req.paths.is_empty() || f.path.as_deref().is_none_or(|p| paths.contains(p)))
            .cloned()
            .collect())
    }

    /// Stream `files` (the plan's, each named by its index) to `sink`: one
    /// pass over the bundle per segment that `cuts` starts (none: one).
    pub fn send(
        &self,
        files: &[SendFile],
        cuts: &[usize],
        shebang: Option<&ShebangRewrite>,
        compression: Compression,
        sink: &mut dyn BlockSink,
        counters: &Counters,
    ) -> Result<Sent> {
        let rewrite = shebang.map(|rw| self.rewrite(rw));
        let mut bounds: Vec<usize> = cuts.to_vec();
        if bounds.first() != Some(&0) {
            bounds.insert(0, 0);
        }
        bounds.push(files.len());
        bounds.dedup();
        let cut = !cuts.is_empty();
        send_tar(files, compression, sink, counters, |w| {
            let (mut raw, mut hashes) = (0, Vec::new());
            for seg in bounds.windows(2) {
                if cut {
                    w.cut().map_err(|e| err!("Failed to stream: {e}"))?;
                }
                let (r, h) = self.send_pass(&files[seg[0]..seg[1]], rewrite.as_ref(), w)?;
                raw += r;
                hashes.extend(h);
            }
            Ok((raw, hashes))
        })
    }

    /// One pass over the bundle's tar, appending the members `files` name.
    fn send_pass(
        &self,
        files: &[SendFile],
        shebang: Option<&ShebangRewrite>,
        w: &mut TarWriter<'_>,
    ) -> Result<(u64, Vec<SourceHash>)> {
        let mut wanted: HashMap<String, &SendFile> = HashMap::with_capacity(files.len());
        for f in files {
            let rel = venv_relative(self.site(), &f.path)
                .ok_or_else(|| err!(kind = Protocol, "path {:?} leaves the venv", f.path))?;
            if wanted.insert(rel, f).is_some() {
                return Err(err!(kind = Protocol, "{} is asked for twice", f.path));
            }
        }
        let (mut raw, mut hashes) = (0u64, Vec::new());
        let mut members = self.bundle.reader()?;
        let shown = members.shown.clone();
        let mut entries = members
            .archive
            .entries()
            .map_err(|e| self.bundle.bad(&e))?
            .raw(true);
        read_index(&mut entries, &shown)?;
        // The members are the index's entries, in its order, each checked
        // as it is passed (as far as the pass goes).
        let mut listed = self.bundle.index.entries.iter();
        while !wanted.is_empty() {
            let Some(e) = listed.next() else { break };
            let want = format!("venv/{}", e.path);
            let (name, link, mut entry) = next_member(&mut entries, &shown)?
                .ok_or_else(|| self.bundle.bad(&format!("it ends before {want}")))?;
            if name.trim_end_matches('/') != want {
                return Err(self
                    .bundle
                    .bad(&format!("member {name:?} where the index has {want}")));
            }
            check_member(e, entry.header(), link.as_deref())
                .map_err(|why| self.bundle.bad(&format!("{want} {why}")))?;
            let rel = e.path.as_str();
            let Some(f) = wanted.remove(rel) else {
                continue;
            };
            hashes.extend(self.pass_member(f, rel, &mut entry, link.as_deref(), shebang, w)?);
            raw += match f.kind {
                Kind::File { size, .. } => size,
                _ => 0,
            };
            w.file_done(f.kind.size());
        }
        if let Some(path) = wanted.into_values().map(|f| f.path.clone()).min() {
            return Err(self.changed(&path));
        }
        Ok((raw, hashes))
    }

    /// Append one wanted member (the plan's `f`, the bundle's `rel`) to the
    /// stream, checked against the plan; returns the hash the target is to
    /// check it by when the plan has none.
    fn pass_member(
        &self,
        f: &SendFile,
        rel: &str,
        entry: &mut tar::Entry<'_, Box<dyn Read>>,
        link: Option<&str>,
        shebang: Option<&ShebangRewrite>,
        w: &mut TarWriter<'_>,
    ) -> Result<Option<SourceHash>> {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(entry.header().mtime().unwrap_or(0));
        let name = f.index.to_string();
        let failed = |e: std::io::Error| err!("Failed to stream {}: {e}", f.path);
        match &f.kind {
            Kind::Symlink { target } => {
                if !entry.header().entry_type().is_symlink() || link != Some(target.as_str()) {
                    return Err(self.changed(&f.path));
                }
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(target.len() as u64);
                h.set_mode(0o777);
                w.append(&mut h, &name, target.as_bytes()).map_err(failed)?;
                Ok(None)
            }
            Kind::File {
                size, mode, blake3, ..
            } => {
                let packed = entry.header().size().map_err(|e| self.bundle.bad(&e))?;
                if !entry.header().entry_type().is_file() {
                    return Err(self.changed(&f.path));
                }
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(*size);
                let script = rel.starts_with("bin/") && packed < SCRIPT_LIMIT;
                match shebang.filter(|_| script) {
                    Some(rw) => {
                        let mut bytes = Vec::with_capacity(packed as usize);
                        (&mut *entry)
                            .take(packed)
                            .read_to_end(&mut bytes)
                            .map_err(|e| self.bundle.bad(&e))?;
                        let bytes = rewrite_shebang(&bytes, rw).unwrap_or(bytes);
                        if bytes.len() as u64 != *size {
                            return Err(self.changed(&f.path));
                        }
                        w.append(&mut h, &name, bytes.as_slice()).map_err(failed)?;
                        Ok(Some(SourceHash {
                            index: f.index,
                            blake3: content_hex(ContentHasher::new().update(&bytes)),
                        }))
                    }
                    None => {
                        if packed != *size {
                            return Err(self.changed(&f.path));
                        }
                        // The target hashes what it writes against the
                        // plan; a file the plan did not hash gets the
                        // index's hash, which the target checks the same way.
                        w.append(&mut h, &name, (&mut *entry).take(packed))
                            .map_err(failed)?;
                        if blake3.as_deref().is_some_and(|h| !h.is_empty()) {
                            return Ok(None);
                        }
                        Ok(match self.entry(rel) {
                            Some(BundleEntry {
                                kind: BundleKind::File { blake3, .. },
                                ..
                            }) => Some(SourceHash {
                                index: f.index,
                                blake3: blake3.clone(),
                            }),
                            _ => None,
                        })
                    }
                }
            }
            other => Err(err!(
                kind = Protocol,
                "Cannot send {}: it is {other:?} in the plan",
                f.path
            )),
        }
    }

    /// The error of a file the plan asks for that the bundle does not hold
    /// as the plan saw it.
    fn changed(&self, path: &str) -> crate::error::Error {
        err!(
            kind = Drift,
            hint = "plan again against this bundle",
            "{path} in the bundle {} is not what the plan saw",
            self.bundle.path.display()
        )
    }
}

/// Whether the member with `header` (and long `link`) is the index's
/// entry `e`: its type, and a file's size or a symlink's target.
fn check_member(
    e: &BundleEntry,
    header: &tar::Header,
    link: Option<&str>,
) -> std::result::Result<(), &'static str> {
    let ty = header.entry_type();
    let same = match &e.kind {
        BundleKind::Dir { .. } => ty.is_dir(),
        BundleKind::Symlink { target } => ty.is_symlink() && link == Some(target.as_str()),
        BundleKind::File { size, .. } => ty.is_file() && header.size().ok() == Some(*size),
    };
    if same {
        Ok(())
    } else {
        Err("is not the index's entry")
    }
}

/// The venv-relative `rel` relative to site-packages `site`, as RECORD
/// spells it (`../../../bin/x` for a script).
fn site_relative(site: &str, rel: &str) -> String {
    if site.is_empty() {
        return rel.to_string();
    }
    match rel.strip_prefix(site).and_then(|r| r.strip_prefix('/')) {
        Some(r) => r.to_string(),
        None => format!("{}{rel}", "../".repeat(site.split('/').count())),
    }
}

#[cfg(test)]
#[path = "source_tests.rs"]
mod tests;
