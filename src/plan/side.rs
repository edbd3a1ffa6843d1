//! What the planner knows of one host ([`Side`]): its name, its scan, the
//! globs sent with it and its stat entries by path ([`Entries`]). Shared by
//! the decision (`super::compute`) and its per-path rules (`super::paths`).

use std::collections::HashMap;

use crate::model::{Entry, ScanReport};

/// What one host reported.
pub struct Side<'a> {
    pub host: &'a str,
    pub scan: &'a ScanReport,
    /// The file globs sent with the scan, in the same order as `scan.globs`.
    pub globs: &'a [String],
    pub entries: &'a Entries,
}

/// A host's stat entries by path. (Fx-hashed: the plan looks paths up
/// ~200,000 times, and SipHash's DoS resistance buys nothing against the
/// controller's own input.)
pub type Entries = HashMap<String, Entry, rustc_hash::FxBuildHasher>;
