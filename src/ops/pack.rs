//! `overlay pack`: the sets of a live source written into one bundle
//! (`crate::bundle`, docs/pack.md), and the other way round, a bundle
//! served as a source on the host itself ([`unpack`]).
//!
//! Packing reuses the live path whole: the source is scanned, hashed and
//! streamed exactly as for `plan` and `apply`, into a fresh venv-shaped
//! folder on this machine (a local target, beside the output file); that
//! folder, with the scripts' shebangs put back as the source has them, and
//! the index taken from it are written as the bundle. The folder is
//! removed afterwards.
//!
//! Unpacking is the reverse: the bundle's whole-file hash is checked, its
//! Python minor compared with the venv's, and its files unpacked (each
//! checked against the index) into a folder beside the venv, which then
//! serves as an ordinary local source: `plan --bundle` and `apply --bundle`
//! run the same plan and apply (journal, backups, verify) as a live pair.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::bundle::{self, Bundle};
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::{self, Venv, rewrite_shebang};
use crate::manifest::Manifest;
use crate::model::{
    BUNDLE_FORMAT, BundleDist, BundleEntry, BundleIndex, BundleKind, Compression, STATE_DIR,
    ShebangRewrite, venv_relative,
};
use crate::transport::ConnectOptions;

use super::apply::{ApplyOptions, ApplyReport, apply};
use super::plan::{PlanOptions, plan, save, select_sets};
use super::{Meter, Observer, Step};

/// The manifest name of the folder a bundle is unpacked to (the source).
pub const BUNDLE_HOST: &str = "bundle";
/// The manifest name of the venv on this host (the target).
pub const LOCAL_HOST: &str = "local";
/// The manifest name of the folder `pack` streams into.
const STAGE_HOST: &str = "overlay-pack-stage";

/// What `overlay pack` is asked.
#[derive(Debug, Clone)]
pub struct PackOptions {
    pub manifest: PathBuf,
    pub source: String,
    /// `--set`; empty for all.
    pub sets: Vec<String>,
    pub out: PathBuf,
    pub connect: ConnectOptions,
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
}

/// Write the bundle of `opts.sets` from the live source.
pub fn pack(opts: &PackOptions, obs: &dyn Observer) -> Result<Packed> {
    let manifest = Manifest::load(&opts.manifest)?;
    let src = manifest.host(&opts.source)?.clone();
    let sets = select_sets(&manifest, &opts.sets)?;
    if let Some((set, from)) = sets
        .iter()
        .find_map(|s| Some((&s.name, manifest.from.get(&s.name)?)))
    {
        return Err(err!(
            kind = Usage,
            hint = "leave the set out with --set (pack the live sets), or apply it from the controller",
            "Set {set} takes its files from a folder ({} at {}): `overlay pack` does not read folders yet",
            from.value,
            from.at
        ));
    }
    if manifest.hosts.contains_key(STAGE_HOST) {
        return Err(err!(
            hint = "rename that host in the manifest",
            "{} names a host {STAGE_HOST}, the name `overlay pack` gives its own folder",
            manifest.path.display()
        ));
    }
    // The source's Python minor, for the folder's layout.
    let mut client = super::connect(
        &super::HostRef {
            name: src.name.clone(),
            endpoint: src.endpoint.clone(),
            venv: src.venv.clone(),
            sudo: src.sudo.clone(),
        },
        &opts.connect,
    )?;
    let scan = client.scan(&src.venv, &[])?;
    let _ = client.close();
    let out_dir = match opts.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let work = tempfile::Builder::new()
        .prefix(".overlay-pack.")
        .tempdir_in(&out_dir)
        .map_err(|e| {
            err!(
                hint = "write the bundle where you can create files (-o)",
                "Cannot make a folder in {} to pack in: {}",
                out_dir.display(),
                io_cause(&e)
            )
        })?;
    let work_path = std::fs::canonicalize(work.path()).map_err(|e| err!("{}", io_cause(&e)))?;
    let stage = work_path.join("venv");
    let mkdir = |p: &Path| {
        std::fs::create_dir_all(p)
            .map_err(|e| err!("Cannot create {}: {}", p.display(), io_cause(&e)))
    };
    mkdir(&stage.join(&scan.site_packages))?;
    let stage_str = stage.to_string_lossy().into_owned();

    // The manifest with one more host, the folder.
    let mut table = read_table(&opts.manifest)?;
    let hosts = table
        .entry("hosts")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let Some(h) = hosts.as_table_mut() {
        let mut t = toml::Table::new();
        t.insert("venv".into(), toml::Value::String(stage_str.clone()));
        h.insert(STAGE_HOST.into(), toml::Value::Table(t));
    }
    let staged_manifest = work_path.join("overlay.toml");
    write_file(
        &staged_manifest,
        &toml::to_string(&table).expect("serializes"),
    )?;
    let set_names: Vec<String> = sets.iter().map(|s| s.name.clone()).collect();
    let planned = plan(
        &PlanOptions {
            manifest: staged_manifest.clone(),
            source: src.name.clone(),
            target: STAGE_HOST.into(),
            sets: set_names.clone(),
            strict: false,
            connect: opts.connect.clone(),
        },
        obs,
    )?;
    planned.closing.wait();
    let plan_file = work_path.join("plan.json");
    save(&planned.plan, &plan_file)?;
    if planned.plan.has_changes() {
        apply(
            &ApplyOptions {
                plan: plan_file,
                manifest: staged_manifest,
                manifest_explicit: false,
                connect: opts.connect.clone(),
                resume: false,
                force: true,
                direct: false,
                relay: false,
                backup: false,
                keep: None,
                same_owner: false,
                compression: Compression::Auto,
                verify: false,
                rollback_on_failure: false,
                compile: true,
                // The scripts are put back as the source has them (below),
                // so their RECORD rows stay the source's too.
                records: false,
            },
            obs,
        )?;
    }
    // The scripts as the source has them.
    let back = ShebangRewrite {
        from: stage_str.clone(),
        to: src.venv.clone(),
    };
    let index = index_of(&stage, &scan.python, &scan.site_packages, &src, &back)?;
    let index = BundleIndex {
        manifest: manifest_toml(&opts.manifest, &set_names)?,
        sets: set_names.clone(),
        ..index
    };
    let written = bundle::write(&stage, &index, &opts.out)?;
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
    })
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

/// The index of the folder `stage`: every entry but overlay's state,
/// sorted, each file hashed as it will be stored (scripts' shebangs put
/// back with `back`, in place).
fn index_of(
    stage: &Path,
    python: &str,
    site: &str,
    src: &crate::manifest::Host,
    back: &ShebangRewrite,
) -> Result<BundleIndex> {
    let fail =
        |p: &Path, e: &dyn std::fmt::Display| err!("Cannot read {} to pack it: {e}", p.display());
    // RECORD ownership from the folder's own dist-infos.
    let scan = inventory::scan(&stage.to_string_lossy(), &[])?;
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let mut dists = Vec::new();
    for d in &scan.dists {
        for f in &d.files {
            if let Some(rel) = venv_relative(site, f) {
                owner.entry(rel).or_insert_with(|| d.name.clone());
            }
        }
        dists.push(BundleDist {
            name: d.name.clone(),
            version: d.version.clone(),
            dist_info: d.dist_info.clone(),
        });
    }
    dists.sort_by(|a, b| a.dist_info.cmp(&b.dist_info));
    let mut entries = Vec::new();
    for e in walkdir::WalkDir::new(stage).min_depth(1) {
        let e = e.map_err(|e| fail(stage, &e))?;
        let rel = e
            .path()
            .strip_prefix(stage)
            .expect("under the stage")
            .to_string_lossy()
            .into_owned();
        if rel == STATE_DIR || rel.starts_with(&format!("{STATE_DIR}/")) {
            continue;
        }
        let meta = e
            .path()
            .symlink_metadata()
            .map_err(|err| fail(e.path(), &err))?;
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o7777;
        let kind = if meta.file_type().is_symlink() {
            let t = std::fs::read_link(e.path()).map_err(|err| fail(e.path(), &err))?;
            BundleKind::Symlink {
                target: t.to_string_lossy().into_owned(),
            }
        } else if meta.is_dir() {
            BundleKind::Dir { mode: 0o755 }
        } else if meta.is_file() {
            if rel.starts_with("bin/") && meta.len() < (1 << 20) {
                let bytes = std::fs::read(e.path()).map_err(|err| fail(e.path(), &err))?;
                if let Some(orig) = rewrite_shebang(&bytes, back) {
                    std::fs::write(e.path(), orig).map_err(|err| fail(e.path(), &err))?;
                    // The source's mtime back too: the bundle carries it.
                    if let Ok(t) = meta.modified() {
                        let _ = std::fs::File::options()
                            .write(true)
                            .open(e.path())
                            .and_then(|f| f.set_modified(t));
                    }
                }
            }
            let h = inventory::hash_file(e.path(), None, &Default::default())
                .map_err(|err| fail(e.path(), &err))?;
            BundleKind::File {
                size: h.size,
                mode,
                blake3: h.blake3,
            }
        } else {
            continue;
        };
        entries.push(BundleEntry {
            owner: owner.get(&rel).cloned(),
            path: rel,
            kind,
        });
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(BundleIndex {
        format: BUNDLE_FORMAT,
        python: python.to_string(),
        site_packages: site.to_string(),
        source_host: src.name.clone(),
        source_venv: src.venv.clone(),
        manifest: String::new(),
        sets: Vec::new(),
        dists,
        entries,
    })
}

/// A bundle unpacked beside a venv, ready to serve as a local source.
pub struct Unpacked {
    /// The folder holding the unpacked venv and the manifest; removed on drop.
    pub work: tempfile::TempDir,
    /// The manifest naming [`BUNDLE_HOST`] (the unpacked folder) and
    /// [`LOCAL_HOST`] (the venv), with the bundle's sets and `[verify]`.
    pub manifest: PathBuf,
    pub index: BundleIndex,
    /// The bundle's whole-file BLAKE3.
    pub blake3: String,
    /// The venv's absolute path (symlinks kept unless it has `..`).
    pub venv: String,
}

/// Check `bundle` whole, compare its Python minor with `venv`'s, and
/// unpack it beside the venv. Nothing in the venv is touched; a refused
/// bundle leaves nothing behind.
pub fn unpack(bundle: &Path, venv: &str) -> Result<Unpacked> {
    let b = Bundle::open(bundle)?;
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
    let parent = canon.parent().unwrap_or(Path::new("/"));
    let work = tempfile::Builder::new()
        .prefix(".overlay-bundle.")
        .tempdir_in(parent)
        .map_err(|e| {
            err!(
                hint =
                    "the bundle is unpacked beside the venv: make room or give write access there",
                "Cannot make a folder in {} to unpack the bundle: {}",
                parent.display(),
                io_cause(&e)
            )
        })?;
    let stage = work.path().join("venv");
    std::fs::create_dir(&stage)
        .map_err(|e| err!("Cannot create {}: {}", stage.display(), io_cause(&e)))?;
    let stage_str = stage.to_string_lossy().into_owned();
    // Scripts name the venv they go to already (the plan's own rewrite,
    // from this folder, then finds nothing to do): as the live stream
    // writes them, and with the source's RECORD hashes when the paths agree.
    b.extract(
        &stage,
        Some(&ShebangRewrite {
            from: b.index.source_venv.clone(),
            to: venv_str.clone(),
        }),
    )?;
    std::fs::create_dir_all(stage.join(&b.index.site_packages))
        .map_err(|e| err!("Cannot create {}: {}", stage.display(), io_cause(&e)))?;
    let mut hosts = toml::Table::new();
    for (name, path) in [(BUNDLE_HOST, &stage_str), (LOCAL_HOST, &venv_str)] {
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
    Ok(Unpacked {
        work,
        manifest,
        index: b.index,
        blake3: b.blake3,
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
    let u = unpack(&opts.bundle, &opts.venv)?;
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
    )
    .map_err(|e| obs.fix_error(e))?;
    planned.closing.wait();
    let plan_file = u.work.path().join("plan.json");
    save(&planned.plan, &plan_file)?;
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
            verify: opts.verify,
            rollback_on_failure: opts.rollback_on_failure,
            compile: true,
            records: true,
        },
        obs,
    )
    .map_err(|e| obs.fix_error(e))
}

/// Plan the unpacked bundle against the venv (read-only).
pub fn plan_bundle(bundle: &Path, venv: &str, obs: &dyn Observer) -> Result<crate::plan::Plan> {
    let u = unpack(bundle, venv)?;
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
    Ok(planned.plan)
}
