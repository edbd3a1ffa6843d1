//! The source's side of `overlay pack` (`super::pack`): what the sets
//! would place in an empty venv ([`what_to_pack`], decided by the planner
//! itself, against an empty target that exists nowhere), and the source
//! agent's stream of those files, read as a bundle's [`Contents`]
//! ([`SourceStream`]).
//!
//! One read of the source: a file the agent's hash cache vouches for goes
//! with that hash, and the bundle's writer checks it as it writes it; any
//! other file the source reads into the stream with its stamp checked
//! before and after (not hashed there: `SendFile`'s empty hash), and the
//! writer hashes it as it writes it and the index records that hash
//! (`bundle::write` puts the index first once every hash is known). Nothing is staged on this machine and no
//! generation is applied anywhere; the scripts travel as the source has
//! them (no shebang rewrite), with their own mtimes. Sets from a `from`
//! folder come from the folder's own agent, their streams read beside the
//! source's ([`Streams`], [`merge_packs`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

use crate::bundle::Contents;
use crate::client::{Client, SendRequest, StreamEvent};
use crate::err;
use crate::error::{Error, Result};
use crate::manifest::Host;
use crate::model::{
    Action, BUNDLE_FORMAT, BundleDist, BundleEntry, BundleIndex, BundleKind, Compression, Entry,
    HashMode, Kind, ScanReport, SendFile, Sent, Set, SourceFacts, venv_relative,
};
use crate::plan::{self, Side};
use crate::stream::{TAR_BLOCK, parse_head, unpack_block};

use super::plan::{StatSide, globs_of, index, members_and_order};
use super::{Observer, Step};

/// What the sets place in an empty venv, in the bundle's order.
pub(super) struct ToPack {
    /// The index, with no manifest or set names yet.
    pub index: BundleIndex,
    /// The files and symlinks the source streams, in the index's order
    /// (each named by its position in this list).
    pub files: Vec<SendFile>,
}

/// Plan the sets as against an empty target: scan and stat the source,
/// let the planner decide (left-out paths, dropped special bits, the
/// bytecode that travels), keep the bytecode the source's RECORD vouches
/// for, and hash every file placed.
pub(super) fn what_to_pack(
    client: &mut Client,
    src: &Host,
    sets: &[Set],
    obs: &dyn Observer,
) -> Result<ToPack> {
    let globs = globs_of(sets);
    let scanning = obs.step(Step::Scan, &src.name);
    let scan = client.scan(&src.venv, &globs)?;
    // The scripts as the source has them: no shebang rewritten, sized and
    // hashed as they are.
    let side = StatSide {
        host: &src.name,
        venv: &src.venv,
        shebang: None,
        pycache: true,
    };
    let (src_members, order) = members_and_order(sets, &scan, &globs);
    let mut src_entries = side
        .stat_members(client, sets, &globs, &[], &order)
        .map(index)?;
    scanning.finish();
    let empty = ScanReport {
        venv: String::new(),
        site_packages: scan.site_packages.clone(),
        python: scan.python.clone(),
        dists: Vec::new(),
        globs: vec![Vec::new(); globs.len()],
        facts: Default::default(),
        machine: Default::default(),
    };
    let mut dst_entries: plan::Entries = order.iter().map(|p| missing(p)).collect();
    let plan::BytecodeToStat { source, target } =
        plan::bytecode_to_stat(&src_entries, &dst_entries);
    src_entries.extend(index(side.stat(
        client,
        source,
        HashMode::None,
        &super::Silent,
    )?));
    dst_entries.extend(target.iter().map(|p| missing(p)));
    let dst_members = plan::members_of(sets, &empty, &globs);
    let computed = plan::compute_with(
        sets,
        &Side {
            host: &src.name,
            scan: &scan,
            globs: &globs,
            entries: &src_entries,
        },
        &Side {
            host: "",
            scan: &empty,
            globs: &globs,
            entries: &dst_entries,
        },
        src_members,
        dst_members,
    )?;
    let mut set_plans = computed.sets;
    // The bytecode that travels is what the source's RECORD vouches for,
    // as a plan's (`plan::preflight`, `Preflighted::settle`).
    let answer = super::record_note::record_request(&src.venv, &scan, &set_plans)
        .map(|r| client.record_check(r));
    let vouched = super::record_note::bytecode_vouched(answer.as_ref(), &scan);
    for s in &mut set_plans {
        s.keep_carried_bytecode(&vouched);
    }
    let (record_checked, record) = match &answer {
        Some(Ok(findings)) => (true, findings.clone()),
        Some(Err(_)) => (false, Vec::new()),
        None => (true, Vec::new()),
    };
    if let Some(answer) = answer {
        super::record_note::record_note(answer, (&src.name, &scan), &set_plans, obs);
    }
    let placed: Vec<(String, Kind)> = set_plans
        .into_iter()
        .flat_map(|s| s.changes)
        .filter(|c| c.action != Action::Delete)
        .filter_map(|c| Some((c.path, c.source?)))
        .collect();
    let elf = elf_facts(client, &src.venv, &placed)?;
    let mut to_pack = index_of(&scan, src, placed);
    to_pack.index.facts = facts_of(&scan, &to_pack.index, elf, record_checked, record);
    Ok(to_pack)
}

/// The ELF facts a plan from the bundle asks of its source, for the placed
/// files that look like shared objects.
fn elf_facts(
    client: &mut Client,
    venv: &str,
    placed: &[(String, Kind)],
) -> Result<BTreeMap<String, crate::model::ElfInfo>> {
    let shared: Vec<String> = placed
        .iter()
        .filter(|(p, _)| crate::preflight::looks_shared(p))
        .map(|(p, _)| p.clone())
        .collect();
    if shared.is_empty() {
        return Ok(BTreeMap::new());
    }
    // A bundle serves any target: its GPU code is read whole.
    let infos = client.elf_info(venv, shared.clone(), None)?;
    Ok(shared
        .into_iter()
        .zip(infos)
        .filter_map(|(p, i)| Some((p, i?)))
        .collect())
}

/// The source's facts a bundle carries for the distributions it packs.
fn facts_of(
    scan: &ScanReport,
    index: &BundleIndex,
    elf: BTreeMap<String, crate::model::ElfInfo>,
    record_checked: bool,
    record: Vec<crate::model::Finding>,
) -> SourceFacts {
    let packed: BTreeSet<&str> = index.dists.iter().map(|d| d.dist_info.as_str()).collect();
    SourceFacts {
        python_full: scan.facts.python_full.clone(),
        dists: scan
            .dists
            .iter()
            .filter(|d| packed.contains(d.dist_info.as_str()))
            .cloned()
            .collect(),
        elf,
        record_checked,
        record,
    }
}

/// A path the empty target lacks.
fn missing(path: &str) -> (String, Entry) {
    (
        path.to_string(),
        Entry {
            path: String::new(),
            kind: Kind::Missing,
            pyc: Vec::new(),
        },
    )
}

/// Add the directories above `rel` to `dirs` (each chain once: a
/// directory there has its own above it).
fn above(rel: &str, dirs: &mut BTreeSet<String>) {
    let mut at = rel;
    while let Some((parent, _)) = at.rsplit_once('/') {
        if !dirs.insert(parent.to_string()) {
            break;
        }
        at = parent;
    }
}

/// A file as the source sends it into a bundle: read once, into the
/// stream; the bundle's writer hashes what its index has no hash of yet
/// (`SendFile`'s empty hash), and the source only checks its stamp.
fn hashed_by_writer(kind: Kind) -> Kind {
    match kind {
        Kind::File {
            size,
            mode,
            blake3: None,
            stamp,
        } => Kind::File {
            size,
            mode,
            blake3: Some(String::new()),
            stamp,
        },
        k => k,
    }
}

/// The packed distributions (those whose dist-info is among `dirs`), as a
/// scan of the packed venv would find them, sorted by dist-info; and which
/// of them lists each path (relative to the venv) first.
fn packed_dists(
    scan: &ScanReport,
    dirs: &BTreeSet<String>,
) -> (Vec<BundleDist>, BTreeMap<String, String>) {
    let site = &scan.site_packages;
    let packed: Vec<&crate::model::Dist> = scan
        .dists
        .iter()
        .filter(|d| dirs.contains(&under(site, &d.dist_info)))
        .collect();
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for d in &packed {
        for f in &d.files {
            if let Some(rel) = venv_relative(site, f) {
                owner.entry(rel).or_insert_with(|| d.name.clone());
            }
        }
    }
    let mut dists: Vec<BundleDist> = packed
        .iter()
        .map(|d| BundleDist {
            name: d.name.clone(),
            version: d.version.clone(),
            dist_info: d.dist_info.clone(),
        })
        .collect();
    dists.sort_by(|a, b| a.dist_info.cmp(&b.dist_info));
    (dists, owner)
}

/// The index of what is placed (paths relative to site-packages, as RECORD
/// spells them) and the files to stream, both sorted by path relative to
/// the venv; every directory above an entry is an entry too (mode 0755),
/// as are site-packages and its parents.
fn index_of(scan: &ScanReport, src: &Host, placed: Vec<(String, Kind)>) -> ToPack {
    let site = &scan.site_packages;
    let mut by_path: BTreeMap<String, (String, Kind)> = BTreeMap::new();
    for (p, k) in placed {
        if let Some(rel) = venv_relative(site, &p) {
            by_path.entry(rel).or_insert((p, k));
        }
    }
    let mut dirs: BTreeSet<String> = BTreeSet::new();
    if !site.is_empty() {
        // A `from` folder is its own site-packages: no directory above.
        dirs.insert(site.clone());
        above(site, &mut dirs);
    }
    for rel in by_path.keys() {
        above(rel, &mut dirs);
    }
    let (dists, owner) = packed_dists(scan, &dirs);
    let mut entries: Vec<BundleEntry> = dirs
        .into_iter()
        .map(|d| BundleEntry {
            owner: owner.get(&d).map(|o| o.to_string()),
            path: d,
            kind: BundleKind::Dir { mode: 0o755 },
        })
        .collect();
    let mut files = Vec::new();
    for (rel, (path, kind)) in by_path {
        let bk = match &kind {
            Kind::File {
                size, mode, blake3, ..
            } => BundleKind::File {
                size: *size,
                mode: mode & 0o777,
                blake3: blake3.clone().unwrap_or_default(),
            },
            Kind::Symlink { target } => BundleKind::Symlink {
                target: target.clone(),
            },
            _ => continue,
        };
        files.push(SendFile {
            index: files.len(),
            path,
            kind: hashed_by_writer(kind),
        });
        entries.push(BundleEntry {
            owner: owner.get(&rel).map(|o| o.to_string()),
            path: rel,
            kind: bk,
        });
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    ToPack {
        index: BundleIndex {
            format: BUNDLE_FORMAT,
            python: scan.python.clone(),
            site_packages: site.clone(),
            source_host: src.name.clone(),
            source_venv: src.venv.clone(),
            manifest: String::new(),
            sets: Vec::new(),
            dists,
            entries,
            facts: SourceFacts::default(),
        },
        files,
    }
}

/// `rel` (relative to site-packages) relative to the venv whose
/// site-packages is `site` (empty: a folder that is its own).
fn under(site: &str, rel: &str) -> String {
    if site.is_empty() {
        rel.to_string()
    } else {
        format!("{site}/{rel}")
    }
}

/// What a `from` folder's sets place, packed beside the source's.
pub(super) struct FolderPack {
    pub to_pack: ToPack,
    /// The folder, as the manifest names it, for errors.
    pub shown: String,
}

/// One bundle of the sets of several sources: the source host's
/// (`main`, whose index names the Python, layout and host) and each `from`
/// folder's (its entries under the source's site-packages, as the target
/// will have them). The index's entries sorted by path, directories once;
/// a path two sources would both place is refused. Returns the index and,
/// per source in the order given (`main` first), the files it streams.
pub(super) fn merge_packs(
    main: ToPack,
    folders: Vec<FolderPack>,
) -> Result<(BundleIndex, Vec<Vec<SendFile>>)> {
    let site = main.index.site_packages.clone();
    let mut index = main.index;
    let mut files = vec![main.files];
    let mut from: BTreeMap<String, String> = index
        .entries
        .iter()
        .map(|e| {
            (
                e.path.clone(),
                format!("{}:{}", index.source_host, index.source_venv),
            )
        })
        .collect();
    for f in folders {
        for mut e in f.to_pack.index.entries {
            e.path = under(&site, &e.path);
            match (from.get(&e.path), &e.kind) {
                (Some(_), BundleKind::Dir { .. }) => continue,
                (Some(other), _) => {
                    return Err(err!(
                        kind = Usage,
                        hint = "name each path in one set only, or give both sets the same source",
                        "{} comes from {other} and from the folder {}: a bundle holds one of them",
                        e.path,
                        f.shown
                    ));
                }
                (None, _) => {
                    from.insert(e.path.clone(), f.shown.clone());
                    index.entries.push(e);
                }
            }
        }
        index.dists.extend(f.to_pack.index.dists);
        // A folder is its own site-packages: its facts' paths are the
        // bundle's already.
        let facts = f.to_pack.index.facts;
        index.facts.dists.extend(facts.dists);
        index.facts.elf.extend(facts.elf);
        index.facts.record.extend(facts.record);
        index.facts.record_checked &= facts.record_checked;
        files.push(f.to_pack.files);
    }
    index.entries.sort_by(|a, b| a.path.cmp(&b.path));
    index.dists.sort_by(|a, b| a.dist_info.cmp(&b.dist_info));
    index
        .facts
        .dists
        .sort_by(|a, b| a.dist_info.cmp(&b.dist_info));
    index.facts.record.sort();
    Ok((index, files))
}

/// The streams of several sources read as one bundle's contents: each
/// entry taken from the stream of the source it comes from (each source
/// streams its own files in the index's order, so each stream is read in
/// its own order).
pub(super) struct Streams<'c> {
    pub streams: Vec<SourceStream<'c>>,
    /// An entry's source (its stream) and its path in that source's
    /// index, by its path in the bundle.
    pub at: std::collections::HashMap<String, (usize, String)>,
}

impl<'c> Streams<'c> {
    /// The stream of `e` and `e` as that stream's index has it.
    fn route(&mut self, e: &BundleEntry) -> Result<(&mut SourceStream<'c>, BundleEntry)> {
        let (i, path) = self.at.get(&e.path).cloned().ok_or_else(|| {
            err!(
                kind = Internal,
                "{} is in no source's part of the bundle",
                e.path
            )
        })?;
        let own = BundleEntry { path, ..e.clone() };
        Ok((&mut self.streams[i], own))
    }
}

impl Contents for Streams<'_> {
    fn file<'a>(&'a mut self, e: &BundleEntry, size: u64) -> Result<(u64, Box<dyn Read + 'a>)> {
        let (s, own) = self.route(e)?;
        s.file(&own, size)
    }

    fn symlink(&mut self, e: &BundleEntry, target: &str) -> Result<()> {
        let (s, own) = self.route(e)?;
        s.symlink(&own, target)
    }

    /// Every stream to its end (its end of archive and its summary): a
    /// source that fails there leaves no bundle.
    fn end(&mut self) -> Result<()> {
        for s in &mut self.streams {
            s.end()?;
        }
        Ok(())
    }

    fn shown(&self, path: &str) -> String {
        match self.at.get(path) {
            Some((i, own)) => self.streams[*i].shown(own),
            None => path.to_string(),
        }
    }
}

/// The source agent's stream of [`ToPack::files`], read as a bundle's
/// contents: the frames decoded one at a time (at most a block held), each
/// tar header checked to be the next file's (its index, type and size).
pub(super) struct SourceStream<'c> {
    client: &'c mut Client,
    venv: String,
    frame: Vec<u8>,
    unz: zstd::bulk::Decompressor<'static>,
    block: Vec<u8>,
    at: usize,
    /// Bytes still to skip before the next header: the last entry's padding.
    pad: u64,
    /// The next entry's index in the list sent.
    next: usize,
    sent: Option<Sent>,
    meter: Box<dyn super::Meter>,
}

impl<'c> SourceStream<'c> {
    /// Ask the source for `files`, as they are (no shebang rewritten);
    /// `local`: the source is this machine, and the stream runs through a
    /// pipe, where compressing costs CPU and saves nothing (as
    /// `apply::route_compression` decides for two local venvs).
    pub(super) fn start(
        client: &'c mut Client,
        venv: &str,
        files: Vec<SendFile>,
        local: bool,
        obs: &dyn Observer,
    ) -> Result<SourceStream<'c>> {
        let meter = obs.step(Step::Stream, &client.host);
        client.start_send(SendRequest {
            venv: venv.to_string(),
            files,
            cuts: Vec::new(),
            shebang: None,
            compression: if local {
                Compression::None
            } else {
                Compression::Auto
            },
        })?;
        Ok(SourceStream {
            client,
            venv: venv.to_string(),
            frame: Vec::new(),
            unz: zstd::bulk::Decompressor::new()
                .map_err(|e| err!(kind = Internal, "Cannot start zstd: {e}"))?,
            block: Vec::new(),
            at: 0,
            pad: 0,
            next: 0,
            sent: None,
            meter,
        })
    }

    /// The rest of the stream (its end of archive), and what the source
    /// says it sent.
    fn end(&mut self) -> Result<Sent> {
        std::io::copy(&mut *self, &mut std::io::sink()).map_err(|e| self.broken(&e))?;
        self.meter.finish();
        self.sent.take().ok_or_else(|| {
            err!(
                kind = Protocol,
                "The source's stream ended without its summary"
            )
        })
    }

    /// The next entry's header, which must be entry `self.next`.
    fn head(&mut self, path: &str, symlink: bool, size: u64) -> Result<u64> {
        let pad = std::mem::take(&mut self.pad);
        let skipped = std::io::copy(&mut (&mut *self).take(pad), &mut std::io::sink());
        skipped.map_err(|e| self.broken(&e))?;
        let mut raw = [0u8; TAR_BLOCK];
        self.read_exact(&mut raw).map_err(|e| self.broken(&e))?;
        let head = parse_head(&raw)?;
        let expected = |h: &crate::stream::EntryHead| {
            h.index == self.next && h.symlink == symlink && h.size == size
        };
        match head {
            Some(h) if expected(&h) => {
                self.next += 1;
                self.pad = (TAR_BLOCK as u64 - size % TAR_BLOCK as u64) % TAR_BLOCK as u64;
                Ok(h.mtime.unwrap_or(0))
            }
            _ => Err(err!(
                kind = Protocol,
                hint =
                    "the source's agent is not this overlay's; pack with the same overlay on both",
                "The source's stream does not hold {}/{path} where it should",
                self.venv
            )),
        }
    }

    fn broken(&self, e: &std::io::Error) -> Error {
        match e.get_ref().and_then(|i| i.downcast_ref::<Error>()) {
            Some(inner) => inner.clone(),
            None => err!("The source's stream broke off: {e}"),
        }
    }

    /// The next decoded block, or `false` at the end of the stream.
    fn fill(&mut self) -> Result<bool> {
        loop {
            if self.sent.is_some() {
                return Ok(false);
            }
            match self.client.stream_event(&mut self.frame)? {
                StreamEvent::Data(n) => {
                    let (bytes, start) = unpack_block(self.frame[4..n].to_vec(), &mut self.unz)?;
                    self.block = bytes;
                    self.at = start;
                    return Ok(true);
                }
                StreamEvent::Progress(p) => self.meter.update(&p),
                StreamEvent::Segment(i) => {
                    return Err(crate::err!(
                        kind = Protocol,
                        "unexpected segment mark {i} from {} in a stream that was not cut",
                        self.client.host
                    ));
                }
                StreamEvent::Sent { sent, .. } => self.sent = Some(sent),
            }
        }
    }
}

impl Read for SourceStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at >= self.block.len() {
            if !self.fill().map_err(std::io::Error::other)? {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.block.len() - self.at);
        buf[..n].copy_from_slice(&self.block[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl Contents for SourceStream<'_> {
    fn file<'a>(&'a mut self, e: &BundleEntry, size: u64) -> Result<(u64, Box<dyn Read + 'a>)> {
        let mtime = self.head(&e.path, false, size)?;
        Ok((mtime, Box::new(self.take(size))))
    }

    fn symlink(&mut self, e: &BundleEntry, target: &str) -> Result<()> {
        self.head(&e.path, true, target.len() as u64)?;
        let mut got = Vec::with_capacity(target.len());
        let read = (&mut *self).take(target.len() as u64).read_to_end(&mut got);
        read.map_err(|err| self.broken(&err))?;
        if got != target.as_bytes() {
            return Err(err!(
                kind = Drift,
                hint = "the source changed while it was packed; run `overlay pack` again",
                "Source symlink {}/{} changed while it was packed",
                self.venv,
                e.path
            ));
        }
        Ok(())
    }

    fn shown(&self, path: &str) -> String {
        format!("{}:{}/{path}", self.client.host, self.venv)
    }
}
