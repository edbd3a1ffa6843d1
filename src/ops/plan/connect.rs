//! Connecting to the hosts and scanning their venvs for the sets' globs:
//! one host ([`connect_scan`]) or both at the same time ([`both`]).

use crate::client::Client;
use crate::error::Result;
use crate::manifest::Host;
use crate::model::ScanReport;
use crate::ops::{Meter, Observer, Step};
use crate::transport::ConnectOptions;

/// Run `f` for the source and the target at the same time.
pub fn both<A: Send, B: Send>(
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    std::thread::scope(|s| {
        let ha = s.spawn(a);
        let rb = b();
        (ha.join().expect("worker thread panicked"), rb)
    })
}

/// A host connected and scanned.
pub struct Scanned {
    pub client: Client,
    pub scan: ScanReport,
    /// The scan step's meter, finished once the members are stated too.
    pub scanning: Box<dyn Meter>,
}

/// Connect to `host` and scan its venv for the sets' `globs`.
pub fn connect_scan(
    host: &Host,
    globs: &[String],
    opts: &ConnectOptions,
    obs: &dyn Observer,
) -> Result<Scanned> {
    connect_scan_with(host, globs, opts, obs, false)
}

/// [`connect_scan`]; with `machine_later`, the scan comes without the
/// host's machine facts (see [`Client::scan_with`]).
fn connect_scan_with(
    host: &Host,
    globs: &[String],
    opts: &ConnectOptions,
    obs: &dyn Observer,
    machine_later: bool,
) -> Result<Scanned> {
    let connecting = obs.step(Step::Connect, &host.name);
    let mut client = Client::connect(&host.name, &host.endpoint, host.sudo.as_deref(), opts)?;
    connecting.finish();
    let scanning = obs.step(Step::Scan, &host.name);
    let scan = client.scan_with(&host.venv, globs, machine_later)?;
    Ok(Scanned {
        client,
        scan,
        scanning,
    })
}

/// Connect to both hosts and scan them, at the same time; their machine
/// facts come later (`Client::machine`): the target's once the stat is
/// done, the source's at the end.
pub(super) fn connect_and_scan(
    src_host: &Host,
    dst_host: &Host,
    globs: &[String],
    opts: &ConnectOptions,
    obs: &dyn Observer,
) -> Result<(Scanned, Scanned)> {
    let (s, d) = both(
        || connect_scan_with(src_host, globs, opts, obs, true),
        || connect_scan_with(dst_host, globs, opts, obs, true),
    );
    Ok((s?, d?))
}
