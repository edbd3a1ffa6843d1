//! A bundle as the source of plans made on the controller: `overlay plan
//! --bundle FILE TARGET...` plans every target against the bundle as if it
//! were a live source, so a dead source host stops nothing (docs/pack.md,
//! "From the controller").
//!
//! The bundle is checked whole ([`Bundle::open`]) before anything else, then
//! unpacked once into a cache folder on this machine keyed by its BLAKE3
//! ([`ensure_cache`]: `bundles/<blake3>/` beside the plan file, written
//! under a temporary name and renamed when complete, reused when present
//! and intact). The unpacked venv is an ordinary local source: the plan of
//! one target ([`super::plan::plan`]) or of several
//! ([`super::plan_many::plan_many`]) runs against it through a manifest
//! that is the user's (hosts, groups, `[apply]`) with the bundle's sets,
//! `[verify]` and `[preflight]` and one more host, the cache folder. Each
//! plan records the bundle ([`PlanBundle`]) and names the bundle's own
//! manifest (`bundles/<blake3>/overlay.toml`), so `overlay apply` of the
//! saved plan needs no `--bundle`; [`check_cache`] refuses it when the
//! cache folder is gone or altered (the stream's own checks refuse bytes
//! that changed since the plan anyway).

use std::path::{Path, PathBuf};

use crate::bundle::Bundle;
use crate::err;
use crate::error::{Result, io_cause};
use crate::manifest::Manifest;
use crate::model::{BundleKind, ShebangRewrite};
use crate::plan::{Plan, PlanBundle};
use crate::transport::ConnectOptions;

use super::Observer;
use super::pack::Named;
use super::plan::{PlanOptions, Planned, manifest_stamp, plan};
use super::plan_many::{self, PlanManyOptions, PlannedMany};

/// The file in a complete cache folder that holds the bundle's BLAKE3.
const COMPLETE: &str = "bundle.blake3";
/// The bundle's own manifest (sets, `[verify]`, `[preflight]`) in the cache folder.
const MANIFEST: &str = "overlay.toml";
/// The unpacked venv in the cache folder.
const VENV: &str = "venv";
/// The bundle's index in the cache folder, to check it against.
const INDEX: &str = "index.json";

/// What `overlay plan --bundle FILE TARGET...` is asked.
#[derive(Debug, Clone)]
pub struct BundlePlanOptions {
    /// The user's manifest: the targets and groups.
    pub manifest: PathBuf,
    pub bundle: PathBuf,
    /// The targets as named: hosts and `[groups.NAME]`s.
    pub targets: Vec<String>,
    /// `--set`: among the bundle's sets; empty for all.
    pub sets: Vec<String>,
    pub strict: bool,
    pub connect: ConnectOptions,
    /// Where bundles are unpacked (`bundles/` beside the plan file).
    pub cache_root: PathBuf,
}

/// The plans made from a bundle: one target's, or several.
pub enum BundlePlanned {
    One(Box<Planned>),
    Many(PlannedMany),
}

/// The folder bundles are unpacked to for plans saved at `out`:
/// `.overlay/plan.json` → `.overlay/bundles`.
pub fn cache_root(out: &Path) -> PathBuf {
    out.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join("bundles")
}

/// Plan every target of `opts.targets` against the bundle.
pub fn plan_from_bundle(opts: &BundlePlanOptions, obs: &dyn Observer) -> Result<BundlePlanned> {
    // The whole file is checked before any connection or write.
    let b = Bundle::open(&opts.bundle)?;
    let shown = opts.bundle.display().to_string();
    let manifest = Manifest::load(&opts.manifest)?;
    let name = source_name(&opts.bundle);
    if manifest.hosts.contains_key(&name) || manifest.is_group(&name) {
        return Err(err!(
            kind = Usage,
            hint = "rename the bundle file, or that host or group",
            "{} names a host or group {name}, the name the bundle {shown} takes as the plan's source",
            manifest.path.display()
        ));
    }
    if let Some(src) = opts
        .targets
        .iter()
        .find(|t| **t == b.index.source_host && manifest.hosts.contains_key(*t))
    {
        return Err(err!(
            kind = Usage,
            hint = format!(
                "--bundle takes the place of SOURCE: name only the targets, e.g. `overlay plan --bundle {} TARGET...`",
                crate::text::shell_quote(&shown)
            ),
            "{src} is the host the bundle {shown} was packed from, not a target"
        ));
    }
    // The targets exist (before anything is unpacked).
    manifest.expand_hosts(&opts.targets)?;
    if let Some(n) = opts.sets.iter().find(|n| !b.index.sets.contains(n)) {
        return Err(err!(
            kind = Usage,
            hint = format!("sets in the bundle {shown}: {}", b.index.sets.join(", ")),
            "Unknown set {n:?}: the bundle {shown} does not carry it"
        ));
    }
    let cache = ensure_cache(&b, &opts.cache_root, obs)?;
    let venv = cache.join(VENV).to_string_lossy().into_owned();

    // The user's manifest with the bundle's sets, [verify] and
    // [preflight], and the cache folder as one more host; beside the
    // user's, so that relative paths in it mean the same.
    let mut table = read_table(&opts.manifest)?;
    for key in ["sets", "verify", "preflight"] {
        table.remove(key);
    }
    let hosts = table
        .entry("hosts")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let Some(h) = hosts.as_table_mut() {
        let mut t = toml::Table::new();
        t.insert("venv".into(), toml::Value::String(venv));
        h.insert(name.clone(), toml::Value::Table(t));
    }
    let text = format!(
        "{}{}",
        toml::to_string(&table).expect("serializes"),
        b.index.manifest
    );
    let dir = opts
        .manifest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".overlay-bundle.")
        .suffix(".toml")
        .tempfile_in(dir)
        .map_err(|e| {
            err!(
                kind = Host,
                hint = "the plan's manifest is written beside yours for a moment: give write access there",
                "Cannot write a manifest in {}: {}",
                dir.display(),
                io_cause(&e)
            )
        })?;
    std::io::Write::write_all(&mut tmp, text.as_bytes()).map_err(|e| {
        err!(
            kind = Host,
            hint = "check the free space there",
            "Cannot write {}: {}",
            tmp.path().display(),
            io_cause(&e)
        )
    })?;
    let obs = &Named {
        inner: obs,
        names: vec![(
            tmp.path().display().to_string(),
            format!("{} (with the sets of {shown})", opts.manifest.display()),
        )],
    };
    let stamp = manifest_stamp(&cache.join(MANIFEST))?;
    let record = PlanBundle {
        file: shown.clone(),
        blake3: b.blake3.clone(),
        cache: cache.to_string_lossy().into_owned(),
        source_venv: Some(b.index.source_venv.clone()),
    };
    let mark = |p: &mut Plan| {
        p.manifest = stamp.path.display().to_string();
        p.manifest_sha256 = Some(stamp.sha256.clone());
        p.bundle = Some(record.clone());
    };
    let single = matches!(opts.targets.as_slice(), [one] if !manifest.is_group(one));
    if single {
        let mut planned = plan(
            &PlanOptions {
                manifest: tmp.path().to_path_buf(),
                source: name,
                target: opts.targets[0].clone(),
                sets: opts.sets.clone(),
                strict: opts.strict,
                connect: opts.connect.clone(),
            },
            obs,
        )
        .map_err(|e| obs.fix_error(e))?;
        mark(&mut planned.plan);
        Ok(BundlePlanned::One(Box::new(planned)))
    } else {
        let mut planned = plan_many::plan_many(
            &PlanManyOptions {
                manifest: tmp.path().to_path_buf(),
                source: name,
                targets: opts.targets.clone(),
                sets: opts.sets.clone(),
                strict: opts.strict,
                connect: opts.connect.clone(),
            },
            obs,
        )
        .map_err(|e| obs.fix_error(e))?;
        planned.plans.iter_mut().for_each(mark);
        Ok(BundlePlanned::Many(planned))
    }
}

/// The plan's name of the bundle's source: its file name.
fn source_name(bundle: &Path) -> String {
    bundle
        .file_name()
        .map_or_else(|| "bundle".into(), |n| n.to_string_lossy().into_owned())
}

fn read_table(path: &Path) -> Result<toml::Table> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        err!(
            hint = "pass --manifest FILE, or create overlay.toml (see docs/manifest.md)",
            "Failed to read manifest {}: {}",
            path.display(),
            io_cause(&e)
        )
    })?;
    text.parse::<toml::Table>()
        .map_err(|e| err!(kind = Usage, "Cannot read {}: {e}", path.display()))
}

/// The cache folder of bundle `b` under `root`, unpacked now unless a
/// complete and intact one is there. Returns its absolute path.
pub fn ensure_cache(b: &Bundle, root: &Path, obs: &dyn Observer) -> Result<PathBuf> {
    let cannot = |p: &Path, e: std::io::Error| {
        err!(
            kind = Host,
            hint = "the bundle is unpacked beside the plan file: make room or give write access there, or choose another place with --out",
            "Cannot unpack the bundle {} into {}: {}",
            b.path.display(),
            p.display(),
            io_cause(&e)
        )
    };
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(root)
        .map_err(|e| cannot(root, e))?;
    let root = std::fs::canonicalize(root).map_err(|e| cannot(root, e))?;
    let dir = root.join(&b.blake3);
    match intact(&dir, &b.blake3, &b.index) {
        Ok(()) => return Ok(dir),
        Err(why) if dir.symlink_metadata().is_ok() => {
            obs.warn(&format!(
                "{}: {why}; unpacking the bundle {} again",
                dir.display(),
                b.path.display()
            ));
            // Out of the way first, so that the name never holds a half folder.
            let aside = tempfile::Builder::new()
                .prefix(".old.")
                .tempdir_in(&root)
                .map_err(|e| cannot(&root, e))?;
            std::fs::rename(&dir, aside.path().join("old")).map_err(|e| cannot(&dir, e))?;
            drop(aside);
        }
        Err(_) => {}
    }
    let tmp = tempfile::Builder::new()
        .prefix(".unpack.")
        .tempdir_in(&root)
        .map_err(|e| cannot(&root, e))?;
    let venv = tmp.path().join(VENV);
    std::fs::create_dir(&venv).map_err(|e| cannot(&venv, e))?;
    // Scripts name the folder's final venv, as a live source's name its
    // own: the plan rewrites them for each target's venv.
    b.extract(
        &venv,
        Some(&ShebangRewrite {
            from: b.index.source_venv.clone(),
            to: dir.join(VENV).to_string_lossy().into_owned(),
        }),
    )?;
    std::fs::create_dir_all(venv.join(&b.index.site_packages)).map_err(|e| cannot(&venv, e))?;
    let index = serde_json::to_string(&b.index).expect("serializes");
    // The stamp last: a folder with it is complete.
    for (file, text) in [
        (MANIFEST, &b.index.manifest),
        (INDEX, &index),
        (COMPLETE, &b.blake3),
    ] {
        let p = tmp.path().join(file);
        std::fs::write(&p, text).map_err(|e| cannot(&p, e))?;
    }
    let tmp = tmp.keep();
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        // Another plan unpacked the same bundle meanwhile: use its folder.
        let _ = std::fs::remove_dir_all(&tmp);
        if intact(&dir, &b.blake3, &b.index).is_err() {
            return Err(cannot(&dir, e));
        }
    }
    Ok(dir)
}

/// Whether the cache folder `dir` holds bundle `blake3` complete: its
/// stamp, and every entry of the index with its kind (and, but for the
/// scripts whose shebang was rewritten, its size). The bytes themselves
/// are checked when they are streamed, against the plan.
fn intact(
    dir: &Path,
    blake3: &str,
    index: &crate::model::BundleIndex,
) -> std::result::Result<(), String> {
    match std::fs::read_to_string(dir.join(COMPLETE)) {
        Ok(s) if s == blake3 => {}
        Ok(_) => return Err("it holds another bundle".into()),
        Err(e) => return Err(format!("it is incomplete ({})", io_cause(&e))),
    }
    let venv = dir.join(VENV);
    for e in &index.entries {
        let p = venv.join(&e.path);
        let meta = p
            .symlink_metadata()
            .map_err(|err| format!("{} is missing ({})", e.path, io_cause(&err)))?;
        let same = match &e.kind {
            BundleKind::Dir { .. } => meta.is_dir(),
            BundleKind::Symlink { .. } => meta.file_type().is_symlink(),
            BundleKind::File { size, .. } => {
                meta.is_file() && (e.path.starts_with("bin/") || meta.len() == *size)
            }
        };
        if !same {
            return Err(format!("{} was altered", e.path));
        }
    }
    Ok(())
}

/// Whether `venv` is the venv of a bundle unpacked on this machine by
/// [`ensure_cache`] (its folder holds the stamp).
pub fn is_cache_venv(venv: &str) -> bool {
    let p = Path::new(venv);
    p.file_name().is_some_and(|n| n == VENV)
        && p.parent().is_some_and(|d| d.join(COMPLETE).is_file())
}

/// A plan whose source is a bundle: its cache folder must still be there,
/// complete and unaltered (`overlay apply` checks before connecting).
pub fn check_cache(plan: &Plan, planfile: &Path) -> Result<()> {
    let Some(b) = &plan.bundle else {
        return Ok(());
    };
    let dir = Path::new(&b.cache);
    let why = match std::fs::read_to_string(dir.join(COMPLETE)) {
        Ok(s) if s == b.blake3 => {
            let index = std::fs::read_to_string(dir.join(INDEX))
                .map_err(|e| io_cause(&e))
                .and_then(|t| {
                    serde_json::from_str::<crate::model::BundleIndex>(&t).map_err(|e| e.to_string())
                });
            match index {
                Ok(i) => intact(dir, &b.blake3, &i).err(),
                Err(e) => Some(format!("its index cannot be read ({e})")),
            }
        }
        Ok(_) => Some("it holds another bundle".to_string()),
        Err(e) => Some(format!("it is gone or incomplete ({})", io_cause(&e))),
    };
    match why {
        None => Ok(()),
        Some(why) => Err(err!(
            kind = Drift,
            hint = format!(
                "plan again: `overlay plan --bundle {} {}` unpacks the bundle again",
                crate::text::shell_quote(&b.file),
                crate::text::shell_quote(&plan.target.name)
            ),
            "The plan {} takes its files from the bundle {} unpacked in {}, but {why}; {} is unchanged",
            planfile.display(),
            b.file,
            b.cache,
            plan.target.name
        )),
    }
}
