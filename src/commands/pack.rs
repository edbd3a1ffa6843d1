//! `overlay pack SOURCE -o FILE`: write the sets of a live source into one
//! bundle (see `overlay::ops::pack`): status on stderr, and with `--json`
//! one line on stdout.

use indicatif::HumanBytes;
use overlay::error::{EXIT_OK, Result};
use overlay::ops::Observer;
use overlay::ops::pack::{PackOptions, pack};

use crate::cli::{GlobalArgs, PackArgs};
use crate::progress::Console;

pub fn run(global: &GlobalArgs, args: &PackArgs) -> Result<u8> {
    let opts = PackOptions {
        manifest: global.manifest.clone(),
        source: args.source.clone(),
        sets: args.sets.clone(),
        out: args.out.clone(),
        connect: global.connect_options(),
        sign: args.sign.clone(),
    };
    let console = Console::new(global);
    let packed = pack(&opts, &console)?;
    if args.json {
        println!("{}", serde_json::to_string(&packed).expect("serializes"));
    }
    console.status(&format!(
        "Packed {} files ({}) of {} from {} (Python {}) into {}: {}, BLAKE3 {}",
        packed.files,
        HumanBytes(packed.file_bytes),
        packed.sets.join(", "),
        args.source,
        packed.python,
        overlay::text::escape(&packed.bundle),
        HumanBytes(packed.bytes),
        packed.blake3
    ));
    if let Some(s) = &packed.signed {
        console.status(&format!(
            "Signed with {} {} into {}",
            s.algorithm,
            s.fingerprint,
            overlay::text::escape(&s.signature)
        ));
    }
    Ok(EXIT_OK)
}
