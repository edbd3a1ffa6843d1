//! The data that travels between controller and agent or is stored on a
//! host: entries and their kinds, distributions, sets, endpoints, the plan's
//! actions, generations and where they came from, the stream's files, verify and preflight reports,
//! ELF facts, the host's NVIDIA driver and GPUs and a shared object's GPU
//! code, the processes that run from a venv. Plain structs and enums with
//! serde derives and small pure
//! methods; nothing here does I/O beyond reading a `Metadata` it is given.
//!
//! Everything is re-exported flat: `crate::model::Entry`, not
//! `crate::model::entry::Entry`.

mod bundle;
mod dist;
mod doctor;
mod elf;
mod endpoint;
mod entry;
mod generation;
mod later;
mod machine;
mod paths;
mod preflight;
mod provenance;
mod route;
mod running;
mod set;
mod stream;
mod verify;

pub use bundle::*;
pub use dist::*;
pub use doctor::*;
pub use elf::*;
pub use endpoint::*;
pub use entry::*;
pub use generation::*;
pub use later::*;
pub use machine::*;
pub use paths::*;
pub use preflight::*;
pub use provenance::*;
pub use route::*;
pub use running::*;
pub use set::*;
pub use stream::*;
pub use verify::*;
