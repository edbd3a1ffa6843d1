//! A bundle as the source of plans made on the controller: `overlay plan
//! --bundle FILE TARGET...` plans every target against the bundle as if it
//! were a live source, so a dead source host stops nothing (docs/pack.md,
//! "From the controller").
//!
//! The bundle is checked whole ([`Bundle::open`]) before anything else, then
//! read in place by a local agent (`bundle:/abs/file.ovl`,
//! `crate::bundle::BundleSource`): nothing is unpacked. The plan of one
//! target ([`crate::ops::plan::plan`]) or of several
//! ([`super::plan_many::plan_many`]) runs against it through a manifest
//! that is the user's (hosts, groups, `[apply]`) with the bundle's sets,
//! `[verify]` and `[preflight]` and one more host, the bundle. Each plan
//! records the bundle ([`PlanBundle`]: its file, hash and own manifest)
//! and names the user's manifest, so `overlay apply` of the saved plan
//! needs no `--bundle`; it refuses the plan when the file holds another
//! bundle since (the stream's own checks refuse bytes that changed anyway).

use std::path::{Path, PathBuf};

use crate::bundle::Bundle;
use crate::err;
use crate::error::{Result, io_cause};
use crate::manifest::Manifest;
use crate::plan::{Plan, PlanBundle};
use crate::transport::ConnectOptions;

use crate::ops::Observer;
use crate::ops::pack::Named;
use crate::ops::plan::{PlanOptions, Planned, manifest_stamp, plan};
use crate::ops::trust::{TrustChoice, of_bundle, open_bundle};

use super::plan_many::{self, PlanManyOptions, PlannedMany};

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
    /// `--trust`, `--insecure-unsigned` (with the manifest's `[apply]
    /// trust`, the allowed_signers file the bundle must be signed by).
    pub trust: TrustChoice,
}

/// The plans made from a bundle: one target's, or several.
pub enum BundlePlanned {
    One(Box<Planned>),
    Many(PlannedMany),
}

/// Plan every target of `opts.targets` against the bundle.
pub fn plan_from_bundle(opts: &BundlePlanOptions, obs: &dyn Observer) -> Result<BundlePlanned> {
    // The signature and the whole file are checked before any connection
    // or write (the manifest says who may sign).
    let manifest = Manifest::load(&opts.manifest)?;
    let trust = opts.trust.resolve(manifest.trust.as_deref());
    let b = open_bundle(&opts.bundle, &trust, obs)?;
    let shown = opts.bundle.display().to_string();
    let name = source_name(&opts.bundle);
    check_request(opts, &b, &manifest, &name)?;
    let file = std::path::absolute(&opts.bundle)
        .map_err(|e| err!("Cannot find the bundle {shown}: {}", io_cause(&e)))?;
    // Pinned to the bundle checked (and signed) here: see `bundle_venv_pinned`.
    let venv = crate::model::bundle_venv_pinned(&file.to_string_lossy(), &b.blake3);
    let tmp = write_manifest(&opts.manifest, &b, &name, venv)?;
    let obs = &Named {
        inner: obs,
        names: vec![(
            tmp.path().display().to_string(),
            format!("{} (with the sets of {shown})", opts.manifest.display()),
        )],
    };
    let stamp = manifest_stamp(&opts.manifest)?;
    let record = PlanBundle {
        file: shown.clone(),
        blake3: b.blake3.clone(),
        cache: None,
        source_venv: Some(b.index.source_venv.clone()),
        manifest: b.index.manifest.clone(),
    };
    let provenance = of_bundle(&b, &shown);
    let mark = |p: &mut Plan| {
        p.manifest = stamp.path.display().to_string();
        p.manifest_sha256 = Some(stamp.sha256.clone());
        p.bundle = Some(record.clone());
        p.provenance = Some(provenance.clone());
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

/// Refuse what `opts` asks of the bundle `b` that cannot be: a `manifest`
/// host or group named `name` (the bundle's name as the plan's source), the
/// bundle's source host among the targets, an unknown target, a set the
/// bundle does not carry (all checked before anything is unpacked).
fn check_request(
    opts: &BundlePlanOptions,
    b: &Bundle,
    manifest: &Manifest,
    name: &str,
) -> Result<()> {
    let shown = opts.bundle.display().to_string();
    if manifest.hosts.contains_key(name) || manifest.is_group(name) {
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
    // The targets exist (before any agent starts).
    manifest.expand_hosts(&opts.targets)?;
    if let Some(n) = opts.sets.iter().find(|n| !b.index.sets.contains(n)) {
        return Err(err!(
            kind = Usage,
            hint = format!("sets in the bundle {shown}: {}", b.index.sets.join(", ")),
            "Unknown set {n:?}: the bundle {shown} does not carry it"
        ));
    }
    Ok(())
}

/// Write the plan's manifest beside the user's at `user` (so that relative
/// paths in it mean the same): the user's with the bundle's sets, `[verify]`
/// and `[preflight]`, and the bundle's "venv" as one more host `name`.
/// Gone when the returned file is dropped.
fn write_manifest(
    user: &Path,
    b: &Bundle,
    name: &str,
    venv: String,
) -> Result<tempfile::NamedTempFile> {
    let mut table = read_table(user)?;
    for key in ["sets", "verify", "preflight"] {
        table.remove(key);
    }
    let hosts = table
        .entry("hosts")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let Some(h) = hosts.as_table_mut() {
        let mut t = toml::Table::new();
        t.insert("venv".into(), toml::Value::String(venv));
        h.insert(name.to_string(), toml::Value::Table(t));
    }
    let text = format!(
        "{}{}",
        toml::to_string(&table).expect("serializes"),
        b.index.manifest
    );
    let dir = user
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
    Ok(tmp)
}

/// The plan's name of the bundle's source: its file name.
fn source_name(bundle: &Path) -> String {
    bundle
        .file_name()
        .map_or_else(|| "bundle".into(), |n| n.to_string_lossy().into_owned())
}

/// The TOML table of the manifest at `path`.
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
