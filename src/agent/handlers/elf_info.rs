//! `PrefetchElf` and `ElfInfo`: source side. The first starts reading the
//! ELF facts of the sets' shared objects in the background (on all cores,
//! through the facts cache) and is answered at once; the `ElfInfo` that
//! follows the diff is answered from what it read, reading only the paths
//! it did not cover, with progress frames meanwhile.

use std::collections::HashMap;
use std::io::Write;

use crate::agent::serve::{ElfPrefetch, Session, with_progress};
use crate::error::Result;
use crate::inventory::Counters;
use crate::model::ElfInfo;
use crate::preflight::facts;
use crate::protocol::Response;

pub fn prefetch_elf(session: &mut Session, venv: String, paths: Vec<String>) -> Result<Response> {
    let (root, wanted) = (venv.clone(), paths.clone());
    session.elf_prefetch = Some(ElfPrefetch {
        venv,
        paths,
        read: std::thread::spawn(move || {
            facts::read_source(&root, &wanted, &Counters::default()).ok()
        }),
    });
    Ok(Response::Prefetching)
}

pub fn elf_info(
    session: &mut Session,
    output: &mut dyn Write,
    venv: &str,
    paths: &[String],
) -> Result<Response> {
    let counters = Counters::default();
    let ahead = session.elf_prefetch.take().filter(|p| p.venv == venv);
    with_progress(output, &counters, || -> Result<Vec<Option<ElfInfo>>> {
        let mut known: HashMap<String, Option<ElfInfo>> = match ahead {
            Some(p) => match p.read.join().ok().flatten() {
                Some(read) => p.paths.into_iter().zip(read.infos).collect(),
                None => HashMap::new(),
            },
            None => HashMap::new(),
        };
        let rest: Vec<String> = paths
            .iter()
            .filter(|p| !known.contains_key(*p))
            .cloned()
            .collect();
        if !rest.is_empty() {
            let read = facts::read_source(venv, &rest, &counters)?;
            known.extend(rest.into_iter().zip(read.infos));
        }
        Ok(paths
            .iter()
            .map(|p| known.remove(p).flatten())
            .collect())
    })?
    .map(|infos| Response::ElfInfo { infos })
}
