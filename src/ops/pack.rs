//! `overlay pack`: the sets of a live source written into one bundle
//! (`crate::bundle`, docs/pack.md), and the other way round, a bundle
//! served as a source on the host itself ([`open_for`]).
//!
//! Packing reads the source once ([`super::pack_source`]): the planner
//! decides what the sets would place in an empty venv, the source's agent
//! hashes those files (from its cache where it can) and streams them as it
//! would to a target, and the stream is written straight into the bundle,
//! each file checked against the index as it goes. Nothing is staged and
//! nothing applied; the scripts go as the source has them.
//!
//! Applying is the reverse: the bundle's whole-file hash is checked and its
//! Python minor compared with the venv's; then a local agent serves the
//! bundle in place as the source (`bundle:/abs/file.ovl`,
//! `crate::bundle::BundleSource`: no folder is unpacked), so `plan
//! --bundle` and `apply --bundle` run the same plan and apply (journal,
//! backups, verify) as a live pair, its files streamed from the bundle's tar.

use std::path::{Path, PathBuf};

use crate::bundle::{self, sign::Trust};
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::Venv;
use crate::manifest::Manifest;
use crate::model::{BundleIndex, BundleKind, Compression};
use crate::plan::PlanBundle;
use crate::transport::ConnectOptions;

use super::apply::{ApplyOptions, ApplyReport, apply};
use super::pack_source::{FolderPack, SourceStream, Streams, merge_packs, what_to_pack};
use super::plan::{
    PlanOptions, check_folder_link, folder_error, folder_host, plan, save, select_sets,
    source_groups,
};
use super::{Meter, Observer, Step};

/// The manifest name of the folder a bundle is unpacked to (the source).
pub const BUNDLE_HOST: &str = "bundle";
/// The manifest name of the venv on this host (the target).
pub const LOCAL_HOST: &str = "local";

/// What `overlay pack` is asked.
#[derive(Debug, Clone)]
pub struct PackOptions {
    pub manifest: PathBuf,
    pub source: String,
    /// `--set`; empty for all.
    pub sets: Vec<String>,
    pub out: PathBuf,
    pub connect: ConnectOptions,
    /// `--sign KEY`: sign the bundle once written (`super::trust`).
    pub sign: Option<String>,
}

/// A bundle written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Packed {
    pub bundle: String,
    pub bytes: u64,
    pub blake3: String,
    pub sets: Vec<String>,
    pub files: usize,
    pub file_bytes: u64,
    pub dists: usize,
    pub python: String,
    /// With `--sign`: the signature written beside the bundle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed: Option<super::trust::Signed>,
}

/// Write the bundle of `opts.sets` from the live source, in one read of
/// it: the sets planned as against an empty venv, then the source's stream
/// of their files written straight into the bundle
/// ([`super::pack_source`]).
pub fn pack(opts: &PackOptions, obs: &dyn Observer) -> Result<Packed> {
    let manifest = Manifest::load(&opts.manifest)?;
    let src = manifest.host(&opts.source)?.clone();
    let sets = select_sets(&manifest, &opts.sets)?;
    let set_names: Vec<String> = sets.iter().map(|s| s.name.clone()).collect();
    let (index, mut sources) = what_to_pack_by_source(&manifest, &src, &sets, opts, obs)?;
    let mut index = BundleIndex {
        manifest: manifest_toml(&opts.manifest, &set_names)?,
        sets: set_names.clone(),
        ..index
    };
    let written = write_streams(&mut index, &mut sources, &opts.out, obs)?;
    for s in sources {
        let _ = s.client.close();
    }
    let signed = match &opts.sign {
        Some(key) => Some(
            super::trust::sign_sealed(
                &opts.out,
                &written.blake3,
                written.bytes - bundle::TRAILER,
                key,
            )
            .map_err(|mut e| {
                e.message = format!(
                    "Packed {} but did not sign it: {}",
                    opts.out.display(),
                    e.message
                );
                e
            })?,
        ),
        None => None,
    };
    let files: Vec<_> = index
        .entries
        .iter()
        .filter_map(|e| match e.kind {
            BundleKind::File { size, .. } => Some(size),
            _ => None,
        })
        .collect();
    Ok(Packed {
        bundle: opts.out.display().to_string(),
        bytes: written.bytes,
        blake3: written.blake3,
        sets: set_names,
        files: files.len(),
        file_bytes: files.iter().sum(),
        dists: index.dists.len(),
        python: index.python,
        signed,
    })
}

/// A source of a bundle being packed: its agent, and the files it streams.
struct PackSource {
    client: crate::client::Client,
    host: crate::manifest::Host,
    files: Vec<crate::model::SendFile>,
    /// Its entries' paths in the bundle, each with its path in the
    /// source's own index (different for a `from` folder).
    paths: Vec<(String, String)>,
}

/// What the sets place, source by source ([`super::plan::source_groups`]):
/// the source host's sets from its venv (the source host is asked even
/// when every set has a `from`: its Python and layout are the bundle's),
/// each `from` folder's from an agent over the folder (on this machine, or
/// on the host `host:/path` names); one index of them all.
fn what_to_pack_by_source(
    manifest: &Manifest,
    src: &crate::manifest::Host,
    sets: &[crate::model::Set],
    opts: &PackOptions,
    obs: &dyn Observer,
) -> Result<(BundleIndex, Vec<PackSource>)> {
    let groups = source_groups(manifest, sets);
    let connect = |host: &crate::manifest::Host| {
        let connecting = obs.step(Step::Connect, &host.name);
        let c = super::connect(
            &super::HostRef {
                name: host.name.clone(),
                endpoint: host.endpoint.clone(),
                venv: host.venv.clone(),
                sudo: host.sudo.clone(),
            },
            &opts.connect,
        )?;
        connecting.finish();
        Ok::<_, crate::error::Error>(c)
    };
    let mut client = connect(src)?;
    let main_sets: Vec<crate::model::Set> = groups
        .iter()
        .find(|g| g.from.is_none())
        .map(|g| g.sets.clone())
        .unwrap_or_default();
    let main = what_to_pack(&mut client, src, &main_sets, obs)?;
    let mut sources = vec![PackSource {
        client,
        host: src.clone(),
        files: Vec::new(),
        paths: paths_of(&main.index, |p| p.to_string()),
    }];
    let mut folders = Vec::new();
    for g in &groups {
        let Some(f) = g.from else { continue };
        let host = folder_host(manifest, f)?;
        let mut client = connect(&host).map_err(|e| folder_error(e, &host, f))?;
        let tp = what_to_pack(&mut client, &host, &g.sets, obs)
            .map_err(|e| folder_error(e, &host, f))?;
        let names: Vec<&str> = g.sets.iter().map(|s| s.name.as_str()).collect();
        for file in &tp.files {
            if let crate::model::Kind::Symlink { target } = &file.kind {
                check_folder_link(f, &names.join(", "), &file.path, target)?;
            }
        }
        let site = &main.index.site_packages;
        sources.push(PackSource {
            client,
            host,
            files: Vec::new(),
            paths: paths_of(&tp.index, |p| format!("{site}/{p}")),
        });
        folders.push(FolderPack {
            to_pack: tp,
            shown: f.value.clone(),
        });
    }
    let (index, files) = merge_packs(main, folders)?;
    for (s, f) in sources.iter_mut().zip(files) {
        s.files = f;
    }
    Ok((index, sources))
}

/// The paths of the files and symlinks of `index` in the bundle
/// (`in_bundle` of each) with their own.
fn paths_of(index: &BundleIndex, in_bundle: impl Fn(&str) -> String) -> Vec<(String, String)> {
    index
        .entries
        .iter()
        .filter(|e| !matches!(e.kind, BundleKind::Dir { .. }))
        .map(|e| (in_bundle(&e.path), e.path.clone()))
        .collect()
}

/// Have every source stream its files and write them into the bundle at
/// `out`, each entry from its source's stream.
fn write_streams(
    index: &mut BundleIndex,
    sources: &mut [PackSource],
    out: &Path,
    obs: &dyn Observer,
) -> Result<bundle::Packed> {
    let mut at = std::collections::HashMap::new();
    let mut streams = Vec::new();
    for (i, s) in sources.iter_mut().enumerate() {
        for (path, own) in &s.paths {
            at.insert(path.clone(), (i, own.clone()));
        }
        let local = matches!(s.host.endpoint, crate::model::Endpoint::Local);
        let files = std::mem::take(&mut s.files);
        streams.push(SourceStream::start(
            &mut s.client,
            &s.host.venv,
            files,
            local,
            obs,
        )?);
    }
    let mut streams = Streams { streams, at };
    let written = bundle::write(index, &mut streams, out)?;
    Ok(written)
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text)
        .map_err(|e| err!("Cannot write {}: {}", path.display(), io_cause(&e)))
}

fn read_table(path: &Path) -> Result<toml::Table> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| err!("Cannot read {}: {}", path.display(), io_cause(&e)))?;
    text.parse::<toml::Table>()
        .map_err(|e| err!("Cannot read {}: {e}", path.display()))
}

/// The manifest's `[sets.NAME]` tables of `sets` (in that order),
/// `[verify]` and `[preflight]`, as TOML.
fn manifest_toml(path: &Path, sets: &[String]) -> Result<String> {
    let table = read_table(path)?;
    let mut out = String::new();
    let all = table.get("sets").and_then(|s| s.as_table());
    for name in sets {
        if let Some(t) = all.and_then(|a| a.get(name)) {
            let mut inner = toml::Table::new();
            inner.insert(name.clone(), t.clone());
            let mut outer = toml::Table::new();
            outer.insert("sets".into(), toml::Value::Table(inner));
            out.push_str(&toml::to_string(&outer).expect("serializes"));
        }
    }
    for key in ["verify", "preflight"] {
        if let Some(t) = table.get(key) {
            let mut outer = toml::Table::new();
            outer.insert(key.into(), t.clone());
            out.push_str(&toml::to_string(&outer).expect("serializes"));
        }
    }
    Ok(out)
}

/// A bundle opened to serve as a source on this host, read in place.
pub struct Opened {
    /// A folder holding the manifest and the plan; removed on drop.
    pub work: tempfile::TempDir,
    /// The manifest naming [`BUNDLE_HOST`] (the bundle, read in place) and
    /// [`LOCAL_HOST`] (the venv), with the bundle's sets and `[verify]`.
    pub manifest: PathBuf,
    pub index: BundleIndex,
    /// What the plan records of the bundle.
    pub record: PlanBundle,
    /// The venv's absolute path (symlinks kept unless it has `..`).
    pub venv: String,
    /// Where its files come from: the bundle, its hash and signer.
    pub provenance: crate::model::Provenance,
}

/// Check `bundle`'s signature against `trust` and the bundle whole, and
/// compare its Python minor with `venv`'s. Nothing is written but a
/// manifest in a folder of its own beside the venv.
pub fn open_for(bundle: &Path, venv: &str, trust: &Trust, obs: &dyn Observer) -> Result<Opened> {
    let b = super::trust::open_bundle(bundle, trust, obs)?;
    let cannot = |e: std::io::Error| {
        err!(
            hint = "give the venv's path with --venv",
            "Cannot open the venv {venv}: {}",
            io_cause(&e)
        )
    };
    // Absolute, symlinks kept: scripts name the venv as given, as a
    // manifest's `venv` would.
    let given = std::path::absolute(venv).map_err(cannot)?;
    let canon = std::fs::canonicalize(&given).map_err(cannot)?;
    let plain = !given
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir));
    let venv_str = if plain { &given } else { &canon }
        .to_string_lossy()
        .into_owned();
    let target = Venv::open(&venv_str)?;
    if target.python != b.index.python {
        return Err(err!(
            kind = Refused,
            hint = "pack the bundle from a source with the venv's Python, or use a venv of the bundle's",
            "Bundle {} was packed from Python {} ({}), but the venv {venv_str} has Python {}",
            bundle.display(),
            b.index.python,
            b.index.source_host,
            target.python
        ));
    }
    let file = std::path::absolute(bundle).map_err(|e| {
        err!(
            "Cannot find the bundle {}: {}",
            bundle.display(),
            io_cause(&e)
        )
    })?;
    let parent = canon.parent().unwrap_or(Path::new("/"));
    let work = tempfile::Builder::new()
        .prefix(".overlay-bundle.")
        .tempdir_in(parent)
        .map_err(|e| {
            err!(
                hint = "the plan of the bundle is written beside the venv for the moment it is applied: give write access there",
                "Cannot make a folder in {} for the bundle's plan: {}",
                parent.display(),
                io_cause(&e)
            )
        })?;
    // Pinned: the agent refuses the file if it no longer holds the bundle
    // checked here (and, with a trust file, signed).
    let source = crate::model::bundle_venv_pinned(&file.to_string_lossy(), &b.blake3);
    let mut hosts = toml::Table::new();
    for (name, path) in [(BUNDLE_HOST, &source), (LOCAL_HOST, &venv_str)] {
        let mut t = toml::Table::new();
        t.insert("venv".into(), toml::Value::String(path.clone()));
        hosts.insert(name.into(), toml::Value::Table(t));
    }
    let mut outer = toml::Table::new();
    outer.insert("hosts".into(), toml::Value::Table(hosts));
    let text = format!(
        "{}{}",
        toml::to_string(&outer).expect("serializes"),
        b.index.manifest
    );
    let manifest = work.path().join("overlay.toml");
    write_file(&manifest, &text)?;
    let provenance = super::trust::of_bundle(&b, &bundle.display().to_string());
    Ok(Opened {
        work,
        manifest,
        provenance,
        record: PlanBundle {
            file: bundle.display().to_string(),
            blake3: b.blake3.clone(),
            cache: None,
            source_venv: Some(b.index.source_venv.clone()),
            manifest: b.index.manifest.clone(),
        },
        index: b.index,
        venv: venv_str,
    })
}

/// What `apply --bundle --venv` is asked.
#[derive(Debug, Clone)]
pub struct BundleApply {
    pub bundle: PathBuf,
    pub venv: String,
    pub backup: bool,
    pub keep: Option<usize>,
    pub force: bool,
    pub verify: bool,
    pub rollback_on_failure: bool,
    /// Go on while processes run from the venv.
    pub allow_running: bool,
    /// The allowed_signers file the bundle must be signed by, if any.
    pub trust: Trust,
}

/// An observer that names the bundle where the plan and apply would name
/// the files in the unpack folder (gone when the command ends).
pub struct Named<'a> {
    pub inner: &'a dyn Observer,
    pub names: Vec<(String, String)>,
}

impl Named<'_> {
    fn fix(&self, line: &str) -> String {
        let mut out = line.to_string();
        for (from, to) in &self.names {
            out = out.replace(from.as_str(), to);
        }
        out
    }

    pub fn fix_error(&self, mut e: crate::error::Error) -> crate::error::Error {
        e.message = self.fix(&e.message);
        e.hint = e.hint.map(|h| self.fix(&h));
        if e.message.ends_with("has no [verify] check") {
            e.hint = Some(
                "the bundle carries the [verify] of the manifest it was packed from: pack it again from one with a [verify] table, or apply without --verify".into(),
            );
        }
        e
    }
}

impl Observer for Named<'_> {
    fn status(&self, line: &str) {
        self.inner.status(&self.fix(line));
    }
    fn detail(&self, line: &str) {
        self.inner.detail(&self.fix(line));
    }
    fn note(&self, line: &str) {
        self.inner.note(&self.fix(line));
    }
    fn warn(&self, line: &str) {
        self.inner.warn(&self.fix(line));
    }
    fn step(&self, step: Step, on: &str) -> Box<dyn Meter> {
        self.inner.step(step, on)
    }
    fn checked(&self, host: &str, report: &crate::model::VerifyReport, log: &Path) {
        self.inner.checked(host, report, log);
    }
}

/// Plan the unpacked bundle against the venv and apply it through the
/// journal, as a live local pair.
pub fn apply_bundle(opts: &BundleApply, obs: &dyn Observer) -> Result<ApplyReport> {
    let u = open_for(&opts.bundle, &opts.venv, &opts.trust, obs)?;
    let shown = opts.bundle.display().to_string();
    let obs = &Named {
        inner: obs,
        names: vec![
            (
                u.work.path().join("plan.json").display().to_string(),
                shown.clone(),
            ),
            (u.manifest.display().to_string(), shown),
        ],
    };
    let planned = plan_opened(&u, obs).map_err(|e| obs.fix_error(e))?;
    let plan_file = u.work.path().join("plan.json");
    save(&planned, &plan_file)?;
    apply(
        &ApplyOptions {
            plan: plan_file,
            manifest: u.manifest.clone(),
            manifest_explicit: false,
            connect: ConnectOptions::default(),
            resume: false,
            force: opts.force,
            direct: false,
            relay: false,
            backup: opts.backup,
            keep: opts.keep,
            same_owner: false,
            compression: Compression::Auto,
            connections: Default::default(),
            verify: opts.verify,
            rollback_on_failure: opts.rollback_on_failure,
            compile: true,
            allow_running: opts.allow_running,
        },
        obs,
    )
    .map_err(|e| obs.fix_error(e))
}

/// Plan the unpacked bundle against the venv (read-only).
pub fn plan_bundle(
    bundle: &Path,
    venv: &str,
    trust: &Trust,
    obs: &dyn Observer,
) -> Result<crate::plan::Plan> {
    let u = open_for(bundle, venv, trust, obs)?;
    plan_opened(&u, obs)
}

/// The plan of an opened bundle's sets ([`BUNDLE_HOST`], read in place)
/// against the venv ([`LOCAL_HOST`]), its agents closed.
fn plan_opened(u: &Opened, obs: &dyn Observer) -> Result<crate::plan::Plan> {
    let planned = plan(
        &PlanOptions {
            manifest: u.manifest.clone(),
            source: BUNDLE_HOST.into(),
            target: LOCAL_HOST.into(),
            sets: u.index.sets.clone(),
            strict: false,
            connect: ConnectOptions::default(),
        },
        obs,
    )?;
    planned.closing.wait();
    let mut plan = planned.plan;
    plan.bundle = Some(u.record.clone());
    plan.provenance = Some(u.provenance.clone());
    Ok(plan)
}
