//! Bundles and trust for the operations (docs/pack.md, "Signing and
//! trust"): which allowed_signers file decides ([`TrustChoice`]: `--trust`
//! or `OVERLAY_TRUST`, else the manifest's `[apply] trust`, else
//! `/etc/overlay/allowed_signers` if it exists), opening a bundle with its
//! signature checked first ([`open_bundle`]), what the plan and the
//! generation record of it ([`of_bundle`]), and signing one
//! ([`sign_bundle`], `overlay pack --sign` and `overlay sign`).

use std::path::{Path, PathBuf};

use crate::bundle::Bundle;
use crate::bundle::sign::{self, Loudness, Trust};
use crate::error::Result;
use crate::model::{BundleOrigin, Provenance, Signer};

use super::Observer;

/// What the command line says of trust.
#[derive(Debug, Clone, Default)]
pub struct TrustChoice {
    /// `--trust FILE` (or `OVERLAY_TRUST`).
    pub file: Option<PathBuf>,
    /// `--insecure-unsigned`.
    pub insecure_unsigned: bool,
}

impl TrustChoice {
    /// The trust that decides, given the manifest's `[apply] trust` (none
    /// on a host without a manifest).
    pub fn resolve(&self, manifest: Option<&Path>) -> Trust {
        Trust::resolve(
            self.file.as_deref(),
            manifest,
            Path::new(sign::SYSTEM_TRUST),
            self.insecure_unsigned,
        )
    }
}

/// Open the bundle at `path` with its signature checked against `trust`
/// before anything of it is parsed; say on `obs` what the check found
/// (a warning when it passed without trust).
pub fn open_bundle(path: &Path, trust: &Trust, obs: &dyn Observer) -> Result<Bundle> {
    let b = Bundle::open_trusted(path, trust)?;
    match b.signature.line(path) {
        (Loudness::Status, line) => obs.status(&line),
        (Loudness::Note, line) => obs.note(&line),
        (Loudness::Warning, line) => obs.warn(&line),
    }
    Ok(b)
}

/// Where files from the bundle `b` (named `shown`) come from.
pub fn of_bundle(b: &Bundle, shown: &str) -> Provenance {
    Provenance {
        host: b.index.source_host.clone(),
        venv: b.index.source_venv.clone(),
        folders: Vec::new(),
        bundle: Some(BundleOrigin {
            file: shown.to_string(),
            blake3: b.blake3.clone(),
            signer: b.signature.signer().cloned(),
        }),
    }
}

/// A bundle signed: its signature file and key.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Signed {
    /// The signature file written (`FILE.sig`).
    pub signature: String,
    pub fingerprint: String,
    pub algorithm: String,
}

impl From<(PathBuf, Signer)> for Signed {
    fn from((path, s): (PathBuf, Signer)) -> Signed {
        Signed {
            signature: path.display().to_string(),
            fingerprint: s.fingerprint,
            algorithm: s.algorithm,
        }
    }
}

/// Sign the bundle at `path` (checked whole first, so a damaged one is
/// never signed) with `key` (`--sign KEY`): writes `FILE.sig`.
pub fn sign_bundle(path: &Path, key: &str) -> Result<Signed> {
    let b = Bundle::open(path)?;
    sign_sealed(path, &b.blake3, b.body_len(), key)
}

/// Sign the bundle just written at `path` (its trailer's `blake3` over
/// `body` bytes) with `key`.
pub fn sign_sealed(path: &Path, blake3: &str, body: u64, key: &str) -> Result<Signed> {
    let signer = sign::sign(path, blake3, body, key)?;
    Ok((sign::sig_path(path), signer).into())
}

/// The message a signature of the bundle at `path` signs (checked whole
/// first): for `ssh-keygen -Y sign` and `-Y verify`.
pub fn message(path: &Path) -> Result<String> {
    let b = Bundle::open(path)?;
    Ok(sign::message(&b.blake3, b.body_len()))
}
