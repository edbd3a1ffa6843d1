//! `ElfInfo`: source side. The ELF facts of these files (site-packages
//! relative), with progress frames while they are read.

use std::io::Write;

use crate::agent::serve::with_progress;
use crate::error::Result;
use crate::inventory::Counters;
use crate::protocol::Response;

pub fn elf_info(output: &mut dyn Write, venv: &str, paths: &[String]) -> Result<Response> {
    let counters = Counters::default();
    with_progress(output, &counters, || {
        crate::preflight::elf_infos(venv, paths)
    })?
    .map(|infos| Response::ElfInfo { infos })
}
