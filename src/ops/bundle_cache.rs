//! The folders bundles are unpacked to on the controller, for plans whose
//! source is a bundle (`crate::fleet::bundle_plan`): one folder per bundle,
//! keyed by its BLAKE3 (`bundles/<blake3>/` beside the plan file), written
//! under a temporary name and renamed when complete ([`ensure_cache`]),
//! reused while complete and intact. The unpacked venv is an ordinary local
//! source. `overlay apply` of a saved plan from a bundle refuses it when
//! the folder is gone or altered ([`check_cache`]); `plan` knows such a
//! venv ([`is_cache_venv`]) by the stamp beside it.

use std::path::{Path, PathBuf};

use crate::bundle::Bundle;
use crate::err;
use crate::error::{Result, io_cause};
use crate::model::{BundleKind, ShebangRewrite};
use crate::plan::Plan;

use super::Observer;

/// The file in a complete cache folder that holds the bundle's BLAKE3.
pub const COMPLETE: &str = "bundle.blake3";
/// The bundle's own manifest (sets, `[verify]`, `[preflight]`) in the cache folder.
pub const MANIFEST: &str = "overlay.toml";
/// The unpacked venv in the cache folder.
pub const VENV: &str = "venv";
/// The bundle's index in the cache folder, to check it against.
pub const INDEX: &str = "index.json";

/// The folder bundles are unpacked to for plans saved at `out`:
/// `.overlay/plan.json` → `.overlay/bundles`.
pub fn cache_root(out: &Path) -> PathBuf {
    out.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join("bundles")
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
