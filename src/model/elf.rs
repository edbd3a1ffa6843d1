//! The dynamic facts of one ELF object ([`ElfInfo`]), as the source reads
//! them and the target's loader check uses them.

use serde::{Deserialize, Serialize};

/// One dynamic symbol.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Symbol {
    pub name: String,
    /// The version defined (for a definition) or required (for a reference).
    pub version: Option<String>,
    /// `STB_WEAK`: a weak reference may stay unresolved.
    pub weak: bool,
}

/// What overlay knows of one ELF shared object (or executable).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct ElfInfo {
    pub soname: Option<String>,
    pub needed: Vec<String>,
    /// `DT_RPATH` entries, split on ':'.
    pub rpath: Vec<String>,
    /// `DT_RUNPATH` entries, split on ':'.
    pub runpath: Vec<String>,
    /// (file, version) pairs from .gnu.version_r, e.g. ("libc.so.6",
    /// "GLIBC_2.34"); weak needs (`VER_FLG_WEAK`) excluded.
    pub version_needs: Vec<(String, String)>,
    /// Version names from .gnu.version_d (excluding the base/file-name entry).
    pub version_defs: Vec<String>,
    /// Defined dynamic symbols (global/weak, not local), with their version
    /// when versioned.
    pub defined: Vec<Symbol>,
    /// Undefined dynamic symbols with their needed version and weak flag.
    pub undefined: Vec<Symbol>,
    /// The Python module init functions it defines (`PyInit_<name>`): an
    /// extension module defines the one of its own file name's stem.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inits: Vec<String>,
}

impl ElfInfo {
    /// Is the object named `file_name` a Python extension module, one that
    /// `import` loads? It is when it defines `PyInit_<stem>`, the stem being
    /// the file name up to its first dot (`_C.cpython-311-x86_64-linux-gnu.so`:
    /// `PyInit__C`). Plugins and plain libraries define none.
    pub fn is_extension(&self, file_name: &str) -> bool {
        let stem = file_name.split('.').next().unwrap_or(file_name);
        self.inits
            .iter()
            .any(|i| i.strip_prefix("PyInit_") == Some(stem))
    }
}
