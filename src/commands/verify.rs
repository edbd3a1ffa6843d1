//! `overlay verify [HOST]`: run the manifest's `[verify]` check in the
//! target venv and show its whole output: the full traceback, then the
//! final exception line on its own.

use overlay::client::Client;
use overlay::err;
use overlay::error::Result;
use overlay::manifest::Manifest;
use overlay::protocol::{Request, Response};

use crate::cli::{GlobalArgs, VerifyArgs};
use crate::commands::plan::connect_options;
use crate::commands::rollback::resolve;
use crate::progress::status;
use overlay::error::{EXIT_OK, ErrorKind};
use overlay::model::{Endpoint, VerifyReport, VerifyRequest};

/// The manifest's check, ready to send.
pub fn request(
    manifest: &std::path::Path,
    venv: &str,
    timeout: u64,
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
        timeout_secs: timeout,
        generation,
    })
}

/// Run the check on a connected host; print the whole output; save a local log.
pub fn run_check(
    global: &GlobalArgs,
    client: &mut Client,
    req: VerifyRequest,
    json: bool,
    output_to_stderr: bool,
) -> Result<VerifyReport> {
    let host = client.host.clone();
    status(global, &format!("Verifying {host} ({})...", req.venv));
    let r = client.call(&Request::Verify(Box::new(req)), &mut |_| {})?;
    let Response::Verified(report) = r else {
        return Err(err!("unexpected answer from {host}: {r:?}"));
    };
    // A local copy of the log, next to the plan.
    let local = std::path::Path::new(".overlay").join(format!("verify-{host}.log"));
    // Private like the target's state directory (0700, 0600).
    let _ = overlay::verify::private_dir(std::path::Path::new(".overlay")).and_then(|()| {
        let mut tmp = tempfile::NamedTempFile::new_in(".overlay")?;
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
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serializes")
        );
    } else if output_to_stderr {
        eprint!("{}", report.stdout);
        eprint!("{}", report.stderr);
    } else {
        print!("{}", report.stdout);
        // The whole error output, then the final line on its own.
        eprint!("{}", report.stderr);
    }
    if report.ok {
        status(
            global,
            &format!(
                "verify passed on {host} in {:.1}s (log: {host}:{}, {})",
                report.millis as f64 / 1000.0,
                report.log,
                local.display()
            ),
        );
    } else if !json {
        eprintln!();
        eprintln!(
            "verify failed on {host}: {}",
            overlay::text::escape(report.final_line().unwrap_or("(no error output)"))
        );
        eprintln!(
            "{}",
            overlay::text::escape(&format!(
                "logs: {host}:{} and {}",
                report.log,
                local.display()
            ))
        );
    }
    Ok(report)
}

pub fn run(global: &GlobalArgs, args: &VerifyArgs) -> Result<u8> {
    let (name, ep, venv): (String, Endpoint, String) =
        resolve(global, args.host.as_deref(), &args.plan)?;
    let req = request(&global.manifest, &venv, args.timeout, None)?;
    let mut c = Client::connect(&name, &ep, &connect_options(global))?;
    let report = run_check(global, &mut c, req, args.json, false)?;
    c.close()?;
    Ok(if report.ok {
        EXIT_OK
    } else {
        ErrorKind::VerifyFailed.exit_code()
    })
}
