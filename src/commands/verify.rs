//! `overlay verify [HOST...]`: run the manifest's `[verify]` check in the
//! target venv and show its whole output: the full traceback (or
//! faulthandler's dump), then why it failed on one line: the exception, the
//! signal with its Python frame, or the timeout
//! ([`overlay::model::VerifyReport::summary`]).

use overlay::error::{EXIT_OK, ErrorKind, Result};
use overlay::ops::verify::{VerifyOptions, verify};

use crate::cli::{GlobalArgs, VerifyArgs};
use crate::progress::{CheckOutput, Console};

pub fn run(global: &GlobalArgs, args: &VerifyArgs) -> Result<u8> {
    if let Some(hosts) = global.several_hosts(&args.hosts, &args.plan)? {
        return crate::cli::on_each_host(&hosts, args.json, true, |h| {
            run_one(global, args, &Some(h.to_string()))
        });
    }
    run_one(global, args, &args.hosts.first().cloned())
}

/// The command on one host (`None`: the target of the last plan).
fn run_one(global: &GlobalArgs, args: &VerifyArgs, host: &Option<String>) -> Result<u8> {
    let opts = VerifyOptions {
        host: global.host_choice(host, &args.plan),
        timeout: args.timeout,
        connect: global.connect_options(),
    };
    // The console shows the check's output as soon as it is known.
    let console = Console::new(global).check_output(if args.json {
        CheckOutput::Json
    } else {
        CheckOutput::Text
    });
    let report = verify(&opts, &console)?;
    Ok(if report.ok {
        EXIT_OK
    } else {
        ErrorKind::VerifyFailed.exit_code()
    })
}
