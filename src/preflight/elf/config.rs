//! How the target's loader searches, and what is loaded before the root:
//! [`LoaderConfig`] (`LD_LIBRARY_PATH`, the ld.so cache read from
//! `ldconfig -p`, the trusted default directories, the global scope, the
//! objects earlier imports loaded `RTLD_LOCAL`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// How the target's loader searches, and what is loaded before the root.
#[derive(Debug, Clone, Default)]
pub struct LoaderConfig {
    pub ld_library_path: Vec<PathBuf>,
    /// soname -> path from the ld.so cache; shared, as every root's
    /// configuration is a copy of the host's.
    pub ld_cache: std::sync::Arc<HashMap<String, PathBuf>>,
    /// e.g. /lib/x86_64-linux-gnu, /usr/lib/x86_64-linux-gnu, /lib64, /usr/lib64, /lib, /usr/lib
    pub default_dirs: Vec<PathBuf>,
    /// Objects already in the global scope before the root is loaded: the
    /// Python interpreter (its exported symbols, e.g. PyModule_Create2) and,
    /// for extensions that import torch, the libraries torch preloads. Their
    /// sonames (and those of their own dependencies) count as loaded and
    /// their symbols as defined. `global[0]`, if any, plays the main program:
    /// its `DT_RPATH` is searched as glibc searches the executable's.
    pub global: Vec<PathBuf>,
    /// Objects already loaded `RTLD_LOCAL` (by an earlier import, e.g.
    /// `torch._C` and its closure), by every name they answer to (soname,
    /// names they were requested as): a `DT_NEEDED` of one of these names is
    /// satisfied by that object whatever the search path says, as glibc
    /// matches loaded objects by name first; their symbols are in scope only
    /// for objects whose closure reaches them.
    pub loaded: HashMap<String, PathBuf>,
}

impl LoaderConfig {
    /// The trusted directories of an x86-64 glibc (Debian and Red Hat layouts).
    pub fn default_dirs() -> Vec<PathBuf> {
        [
            "/lib/x86_64-linux-gnu",
            "/usr/lib/x86_64-linux-gnu",
            "/lib64",
            "/usr/lib64",
            "/lib",
            "/usr/lib",
        ]
        .into_iter()
        .map(PathBuf::from)
        .collect()
    }

    /// Default dirs and the ld.so cache of this host (`ldconfig -p`; an
    /// empty cache if that fails). `ld_library_path` and `global` are left
    /// empty for the caller to fill.
    pub fn system() -> LoaderConfig {
        let output = ["/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"]
            .iter()
            .find_map(|prog| {
                let out = Command::new(prog)
                    .arg("-p")
                    .stdin(Stdio::null())
                    .stderr(Stdio::null())
                    .output()
                    .ok()?;
                out.status.success().then_some(out.stdout)
            })
            .unwrap_or_default();
        LoaderConfig {
            ld_library_path: Vec::new(),
            ld_cache: std::sync::Arc::new(parse_ldconfig(&String::from_utf8_lossy(&output))),
            default_dirs: Self::default_dirs(),
            global: Vec::new(),
            loaded: HashMap::new(),
        }
    }
}

/// Parse the output of `ldconfig -p` into soname -> path, x86-64 entries
/// only, the first entry of a name winning (as the loader prefers it).
pub fn parse_ldconfig(output: &str) -> HashMap<String, PathBuf> {
    let mut map = HashMap::new();
    for line in output.lines() {
        let Some((left, path)) = line.split_once(" => ") else {
            continue;
        };
        let Some((name, flags)) = left.trim().split_once(" (") else {
            continue;
        };
        if !flags.contains("x86-64") {
            continue;
        }
        map.entry(name.trim().to_owned())
            .or_insert_with(|| PathBuf::from(path.trim()));
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_ldconfig_keeps_the_first_x86_64_entry() {
        let cache = parse_ldconfig(
            "3 libs found in cache `/etc/ld.so.cache'\n\
             \tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n\
             \tlibz.so.1 (libc6) => /lib/i386-linux-gnu/libz.so.1\n\
             \tlibm.so.6 (libc6,x32) => /libx32/libm.so.6\n",
        );
        assert_eq!(cache.len(), 1);
        assert_eq!(
            cache["libz.so.1"],
            PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1")
        );
    }
}
