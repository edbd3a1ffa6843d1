//! `overlay prune [HOST]`: remove old generations and their backups.

use overlay::error::{EXIT_OK, Result};
use overlay::ops::Observer;
use overlay::ops::history::{PruneOptions, prune};

use crate::cli::{GlobalArgs, PruneArgs};
use crate::progress::Console;

pub fn run(global: &GlobalArgs, args: &PruneArgs) -> Result<u8> {
    let opts = PruneOptions {
        host: global.host_choice(&args.host, &args.plan),
        keep: args.keep,
        connect: global.connect_options(),
    };
    let pruned = prune(&opts)?;
    let (name, removed) = (&pruned.host, &pruned.removed);
    let console = Console::new(global);
    if let Some(msg) = &pruned.recovered {
        console.status(&format!("{name}: {msg}"));
    }
    console.status(&format!(
        "Removed {} generation(s) on {name}{}",
        removed.len(),
        if removed.is_empty() {
            String::new()
        } else {
            format!(": {}", removed.join(", "))
        }
    ));
    Ok(EXIT_OK)
}
