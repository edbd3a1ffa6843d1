//! Prediction of breakage before apply: what would fail to import on the
//! target after the overlay. Four checks, each in its own module:
//! [`requirements`] (every `Requires-Dist` satisfied, markers and extras
//! evaluated for the target), [`cuda`] (packages that link together agree on
//! the CUDA major), [`elf`] (every shared object the overlay brings or
//! disturbs can be loaded: DT_NEEDED, version needs, undefined symbols) and
//! [`gpu`] (the target's NVIDIA driver is new enough for the CUDA runtimes,
//! and its GPUs have kernels in the CUDA libraries).
//!
//! [`run_on_target`] applies the ELF check through the **load model**
//! (`load_model`, over the shared objects of `object`, with what earlier
//! imports loaded in `preloads`); the
//! controller tells it which distributions are imported before which
//! (`dists`: [`imported_first`], [`torch_users`]). See docs/preflight.md.
//!
//! The checks read facts, they never run the loader or the interpreter.
//! The ELF facts are read by [`facts`]: on the agents, on all cores, ahead
//! of the requests that need them (on the [`background`] pool), and through
//! a cache keyed by file stamp.

pub mod background;
pub mod cuda;
mod dists;
pub mod elf;
pub mod facts;
pub mod gpu;
mod load_model;
mod object;
mod preloads;
pub mod requirements;

pub use dists::{dists_after, imported_first, owner, torch_users};
pub use facts::{SharedObjects, elf_infos, shared_objects};
pub use load_model::run_on_target;

/// The ELF facts cache's kind (its folder under `~/.cache/overlay`): a new
/// name whenever [`ElfInfo`] gains a fact or changes form (`elf3`: defined
/// symbols as hashes; `elf4`: the GPU code of `.nv_fatbin`), so that no entry written by an older overlay is
/// misread.
pub const ELF_CACHE: &str = "elf4";

/// Does this file name look like a shared object?
pub fn looks_shared(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.ends_with(".so") || name.contains(".so.")
}
