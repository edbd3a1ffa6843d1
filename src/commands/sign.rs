//! `overlay sign BUNDLE --key KEY`: sign a bundle (BUNDLE.sig beside it,
//! see `overlay::ops::trust`), or `--print-message`: print on stdout the
//! message its signature signs, for `ssh-keygen -Y sign` and `-Y verify`.

use overlay::error::{EXIT_OK, Result};
use overlay::ops::Observer;
use overlay::ops::trust::{message, sign_bundle};

use crate::cli::{GlobalArgs, SignArgs};
use crate::progress::Console;

pub fn run(global: &GlobalArgs, args: &SignArgs) -> Result<u8> {
    if args.print_message {
        print!("{}", message(&args.bundle)?);
        return Ok(EXIT_OK);
    }
    let Some(key) = &args.key else {
        return Err(overlay::err!(
            kind = Usage,
            hint = "`overlay sign BUNDLE --key KEY`, or `--print-message`",
            "overlay sign needs --key or --print-message"
        ));
    };
    let signed = sign_bundle(&args.bundle, key)?;
    if args.json {
        println!("{}", serde_json::to_string(&signed).expect("serializes"));
    }
    Console::new(global).status(&format!(
        "Signed {} with {} {} into {}",
        overlay::text::escape(&args.bundle.to_string_lossy()),
        signed.algorithm,
        signed.fingerprint,
        overlay::text::escape(&signed.signature)
    ));
    Ok(EXIT_OK)
}
