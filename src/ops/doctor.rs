//! Doctor: check one host's venv as it stands, without a source. The work
//! runs in that host's agent ([`crate::doctor`]); this side picks the host
//! (or a local venv, [`HostChoice::venv`], with no manifest), passes the
//! manifest's preflight settings and hands back the report.

use crate::error::Result;
use crate::manifest::Manifest;
use crate::model::{DoctorReport, DoctorRequest};
use crate::transport::ConnectOptions;

use super::{HostChoice, Observer, Step, connect, resolve};

/// What `overlay doctor` is asked.
#[derive(Debug, Clone)]
pub struct DoctorOptions {
    pub host: HostChoice,
    pub connect: ConnectOptions,
}

/// A host's venv, checked.
#[derive(Debug, Clone)]
pub struct Doctored {
    /// The manifest's name of the host.
    pub host: String,
    pub report: DoctorReport,
}

/// Check the chosen host's venv.
pub fn doctor(opts: &DoctorOptions, obs: &dyn Observer) -> Result<Doctored> {
    let host = resolve(&opts.host)?;
    // The manifest's `[preflight]` and `[verify] env` settings, when there
    // is one and a host of it is checked (not a `--venv PATH`).
    let manifest = if opts.host.venv.is_none() && opts.host.manifest.exists() {
        Some(Manifest::load(&opts.host.manifest)?)
    } else {
        None
    };
    let req = DoctorRequest {
        venv: host.venv.clone(),
        ld_library_path: manifest
            .as_ref()
            .and_then(|m| m.verify.as_ref())
            .and_then(|v| v.env.get("LD_LIBRARY_PATH"))
            .map(|v| {
                v.split(':')
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
        cuda_family: manifest
            .map(|m| m.preflight.cuda_family)
            .unwrap_or_default(),
    };
    let mut c = connect(&host, &opts.connect)?;
    obs.status(&format!("Checking {} ({})...", host.name, host.venv));
    let meter = obs.step(Step::Scan, &host.name);
    let report = c.doctor(req, &mut |p| meter.update(&p))?;
    meter.finish();
    c.close()?;
    Ok(Doctored {
        host: host.name,
        report,
    })
}
