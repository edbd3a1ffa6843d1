//! Writing the plan file atomically ([`save`], [`write_atomic`]), and the
//! manifest's stamp a plan records ([`manifest_stamp`]).

use std::path::{Path, PathBuf};

use crate::err;
use crate::error::Result;
use crate::plan::Plan;

/// Write the plan atomically (temp file, then rename).
pub fn save(plan: &Plan, out: &Path) -> Result<()> {
    write_atomic(out, |w| {
        // One buffered write: a plan of 35,000 paths is ~10 MB of JSON.
        let mut w = std::io::BufWriter::with_capacity(1 << 20, w);
        serde_json::to_writer_pretty(&mut w, plan).map_err(std::io::Error::other)?;
        std::io::Write::flush(&mut w)
    })
}

/// Write a plan file at `out` atomically: `write` fills a temp file
/// (created 0600, whatever the umask) in the same folder (made 0700 if it
/// is missing), which is then renamed over `out`.
pub fn write_atomic(
    out: &Path,
    write: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> Result<()> {
    let fail = |e: std::io::Error| {
        err!(
            kind = Host,
            hint = "choose another place with --out",
            "Failed to save the plan to {}: {}",
            out.display(),
            crate::error::io_cause(&e)
        )
    };
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(dir)
        .map_err(fail)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(fail)?;
    write(tmp.as_file_mut()).map_err(fail)?;
    tmp.persist(out).map_err(|e| fail(e.error))?;
    Ok(())
}

/// A manifest file as a plan records it: where it is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestStamp {
    /// Absolute, symlinks resolved.
    pub path: PathBuf,
    /// The sha256 of its bytes, in hex.
    pub sha256: String,
}

/// Read the manifest at `path` for its [`ManifestStamp`].
pub fn manifest_stamp(path: &Path) -> Result<ManifestStamp> {
    use sha2::{Digest, Sha256};
    let fail = |e: std::io::Error| {
        err!(
            hint = "pass --manifest FILE, or create overlay.toml (see docs/manifest.md)",
            "Failed to read manifest {}: {}",
            path.display(),
            crate::error::io_cause(&e)
        )
    };
    let bytes = std::fs::read(path).map_err(fail)?;
    let path = std::fs::canonicalize(path).map_err(fail)?;
    Ok(ManifestStamp {
        path,
        sha256: crate::text::hex(&Sha256::digest(&bytes)),
    })
}
