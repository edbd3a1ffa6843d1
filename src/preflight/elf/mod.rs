//! ELF loadability: would glibc's `ld.so` manage to `dlopen` this shared
//! object after the overlay? Answered by reading facts, never by running the
//! loader.
//!
//! This file owns the facts themselves ([`ElfInfo`], [`Symbol`]) and the
//! overview; the work is split by job into submodules, whose items are
//! re-exported here:
//!
//! * `read`: [`read_elf`], the dynamic facts of one 64-bit little-endian
//!   ELF file (soname, `DT_NEEDED`, `DT_RPATH`/`DT_RUNPATH`, version needs
//!   and definitions, undefined dynamic symbols, and the hashes of the
//!   defined ones: [`ElfInfo::defined`]). Only the
//!   header, the section headers and the handful of dynamic sections are
//!   read, so a 1 GB `libtorch_cuda.so` costs a few megabytes, not a gigabyte.
//! * `fatbin`: the GPU code of a `.nv_fatbin` section (its containers'
//!   and entries' headers), read with the dynamic facts.
//! * `view`: [`LoaderView`] / [`OverlayView`], the file system as the loader
//!   would see it once the overlay is applied (files replaced, added or
//!   deleted on top of the real disk, symlinks followed through both), with
//!   the cache of what was read from disk.
//! * `config`: [`LoaderConfig`], how the target's loader searches (ld.so
//!   cache, `LD_LIBRARY_PATH`, default directories) and what is loaded before
//!   the root.
//! * `search`: library resolution, the library search order of `man ld.so`
//!   (inherited `DT_RPATH`, `LD_LIBRARY_PATH`, own `DT_RUNPATH`, ld.so cache,
//!   default directories, `$ORIGIN`) and the breadth-first `DT_NEEDED`
//!   closure of glibc's `_dl_map_object_deps`.
//! * `symbols`: version needs (`dl-version.c`) and every non-weak undefined
//!   symbol against the global scope plus the root's dependency closure,
//!   each a binary search in the objects' sorted definition hashes.
//! * `check`: [`check_object`], the model of one root loaded by the
//!   interpreter with `RTLD_NOW` (CPython's default `dlopen` flags), turning
//!   the above into [`ElfProblem`]s; [`closure_of`], the same root's
//!   closure without any judging (what it loads, by which names); and
//!   [`cause_of`], a problem's grouping key.
//!
//! Blind spots, by design or for want of facts:
//!
//! * libraries opened later with `dlopen` by the code itself (CUDA's
//!   `libcuda.so.1`, cuDNN's sub-libraries, NCCL plugins, …) are invisible:
//!   only `DT_NEEDED` is followed;
//! * the GPU driver (`libcuda.so.1`, `libnvidia-*`) is the host's and is not
//!   judged beyond "is it found";
//! * C++ layout/ABI changes that keep the same mangled names (a struct that
//!   grew a field, an inline function that changed) load fine and crash later;
//! * IFUNC resolvers, TLS model and static TLS space, `DT_TEXTREL`, copy
//!   relocations, `DF_1_NODEFLIB`, `glibc-hwcaps` subdirectories, the
//!   `e_machine`/OS ABI of candidates (only 32-bit and non-ELF candidates are
//!   skipped) are not modelled;
//! * `LD_PRELOAD`, `LD_AUDIT`, objects already loaded by earlier imports,
//!   and `/etc/ld.so.preload` are unknown unless the caller lists them in
//!   [`LoaderConfig::global`] (`RTLD_GLOBAL`: names and symbols for all) or
//!   [`LoaderConfig::loaded`] (`RTLD_LOCAL`: names for all, symbols only for
//!   the objects that need them);
//! * symbol matching is an existence check: an unversioned reference is
//!   taken as satisfied by any definition of the name (glibc refuses hidden
//!   non-default versions `foo@V1` in one corner case), and definitions are
//!   compared by 64-bit hash (a collision, ~2^-64 a pair, would hide a
//!   missing symbol); objects without
//!   section headers (`sstrip`ped) read as having no dynamic facts.

mod check;
mod config;
pub mod fatbin;
mod read;
mod search;
mod symbols;
mod view;

#[cfg(test)]
pub(crate) mod testutil;

pub use crate::model::{ElfInfo, Symbol};
pub use check::{Closure, ElfProblem, Unmet, cause_of, check_object, closure_of};
pub use config::{LoaderConfig, parse_ldconfig};
pub use read::read_elf;
pub use view::{LoaderView, OverlayView};
