//! Verify: run the manifest's `[verify]` check in a host's venv (with
//! `--timeout`, else the manifest's `[verify] timeout`), keep a local copy
//! of its log, and hand its whole output to the observer.

use std::path::{Path, PathBuf};

use crate::client::Client;
use crate::err;
use crate::error::Result;
use crate::manifest::Manifest;
use crate::model::{DEFAULT_VERIFY_TIMEOUT, VerifyReport, VerifyRequest};
use crate::transport::ConnectOptions;

use super::{HostChoice, Observer, Step, connect, resolve};

/// What `overlay verify` is asked.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// The host; the manifest also holds the check.
    pub host: HostChoice,
    /// Seconds the check may run (`--timeout`); `None`: the manifest's
    /// `[verify] timeout`, else [`DEFAULT_VERIFY_TIMEOUT`].
    pub timeout: Option<u64>,
    pub connect: ConnectOptions,
}

/// Where the local copies of check logs go (next to the plan).
const LOG_DIR: &str = ".overlay";

/// The manifest's check, ready to send, with `timeout` seconds if given,
/// else the manifest's `[verify] timeout`, else [`DEFAULT_VERIFY_TIMEOUT`].
pub fn request(
    manifest: &Path,
    venv: &str,
    timeout: Option<u64>,
    generation: Option<String>,
) -> Result<VerifyRequest> {
    let manifest = Manifest::load(manifest)?;
    let v = manifest
        .verify
        .as_ref()
        .and_then(|v| v.python.as_ref().map(|p| (v, p)))
        .ok_or_else(|| {
            err!(
                hint = "add a [verify] table with `python = '''...'''` (docs/verify.md)",
                "{} has no [verify] check",
                manifest.path.display()
            )
        })?;
    Ok(VerifyRequest {
        venv: venv.to_string(),
        env: v.0.env.clone(),
        python: v.1.clone(),
        timeout_secs: timeout
            .or(v.0.timeout)
            .unwrap_or(DEFAULT_VERIFY_TIMEOUT)
            .max(1),
        generation,
    })
}

/// Run the manifest's check on the chosen host.
pub fn verify(opts: &VerifyOptions, obs: &dyn Observer) -> Result<VerifyReport> {
    let host = resolve(&opts.host)?;
    let req = request(&opts.host.manifest, &host.venv, opts.timeout, None)?;
    let mut c = connect(&host, &opts.connect)?;
    let report = check(&mut c, req, obs)?;
    c.close()?;
    Ok(report)
}

/// Run the check on a connected host, save a local copy of its log, and
/// hand the result to the observer.
pub fn check(client: &mut Client, req: VerifyRequest, obs: &dyn Observer) -> Result<VerifyReport> {
    let host = client.host.clone();
    obs.status(&format!("Verifying {host} ({})...", req.venv));
    let verifying = obs.step(Step::Verify, &host);
    let report = client.verify(req)?;
    verifying.finish();
    let local = save_log(&host, &report);
    obs.checked(&host, &report, &local);
    Ok(report)
}

/// Keep a local copy of the check's log; returns where it goes. A copy
/// that cannot be written is skipped: the host keeps its own.
fn save_log(host: &str, report: &VerifyReport) -> PathBuf {
    let local = Path::new(LOG_DIR).join(format!("verify-{host}.log"));
    // Private like the target's state directory (0700, 0600).
    let _ = crate::verify::private_dir(Path::new(LOG_DIR)).and_then(|()| {
        let mut tmp = tempfile::NamedTempFile::new_in(LOG_DIR)?;
        std::io::Write::write_all(
            &mut tmp,
            format!(
                "--- stdout ---\n{}\n--- stderr ---\n{}",
                report.stdout, report.stderr
            )
            .as_bytes(),
        )?;
        tmp.persist(&local).map(drop).map_err(|e| e.error)
    });
    local
}
