//! The dynamic facts of one ELF object ([`ElfInfo`]), as the agents read
//! them and the target's loader check uses them.
//!
//! The symbols an object defines are kept as 64-bit hashes ([`symbol_key`]),
//! not names: `libtorch_cpu.so` defines some 300,000 mangled names (tens of
//! megabytes), and the check only asks "is this name (at this version)
//! defined?". The hashes are sorted, so that question is a binary search
//! ([`ElfInfo::defines`]), and they travel and are cached as base64 of their
//! little-endian bytes (8 bytes a definition instead of a name).
//! The names of *undefined* symbols are kept: problems name them.

use serde::{Deserialize, Serialize};

/// One undefined dynamic symbol (a reference); definitions are kept as
/// hashes ([`ElfInfo::defined`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct Symbol {
    pub name: String,
    /// The version required.
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
    /// Defined dynamic symbols (global/weak, not local) as the sorted,
    /// deduplicated [`symbol_key`]s of each: `name@version` (the version
    /// empty for an unversioned definition), and for a versioned one also
    /// `name`. Built with [`defined_keys`], asked with [`ElfInfo::defines`].
    #[serde(with = "hashes")]
    pub defined: Vec<u64>,
    /// Undefined dynamic symbols with their needed version and weak flag.
    pub undefined: Vec<Symbol>,
    /// The Python module init functions it defines (`PyInit_<name>`): an
    /// extension module defines the one of its own file name's stem.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inits: Vec<String>,
    /// The GPU code of its `.nv_fatbin` section, if it has one
    /// (headers only; see docs/preflight.md#gpu).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<super::GpuCode>,
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

    /// Does this object define a symbol that satisfies a reference to
    /// `name` at `version`? As glibc's `check_match` (an existence check):
    /// an unversioned reference takes any definition of the name; a
    /// versioned one takes that version or an unversioned definition.
    pub fn defines(&self, name: &str, version: Option<&str>) -> bool {
        self.defines_any(&reference_keys(name, version))
    }

    /// Does this object define one of these keys ([`reference_keys`])?
    pub fn defines_any(&self, keys: &[u64; 2]) -> bool {
        keys.iter().any(|k| self.defined.binary_search(k).is_ok())
    }
}

/// The keys a reference to `name` at `version` is satisfied by (see
/// [`ElfInfo::defines`]): an unversioned definition (`name@`), and `name`
/// (any versioned definition) or `name@version`.
pub fn reference_keys(name: &str, version: Option<&str>) -> [u64; 2] {
    [
        symbol_key(name, Some("")),
        match version {
            None => symbol_key(name, None),
            Some(v) => symbol_key(name, Some(v)),
        },
    ]
}

/// The key of a defined symbol: XXH3-64 (seed 0, the xxHash specification's
/// default) of the bytes of `name`, or of `name`, a NUL byte and `version`
/// when `version` is given (`Some("")` for "defined without a version";
/// ELF names end at a NUL, so no name and version pair reads as another). A fixed hash, so the
/// keys one build computes on the source match those another cached on the
/// target; a new hash means a new [`crate::preflight::ELF_CACHE`] name.
///
/// Two different names share a key with a probability of about 2^-64 per
/// pair; the cost of one would be a missing symbol taken as defined.
pub fn symbol_key(name: &str, version: Option<&str>) -> u64 {
    use twox_hash::XxHash3_64;
    let Some(v) = version else {
        return XxHash3_64::oneshot(name.as_bytes());
    };
    let len = name.len() + 1 + v.len();
    let mut stack = [0u8; 512];
    let mut heap = Vec::new();
    let buf: &mut [u8] = if len <= stack.len() {
        &mut stack[..len]
    } else {
        heap.resize(len, 0);
        &mut heap
    };
    buf[..name.len()].copy_from_slice(name.as_bytes());
    buf[name.len()] = 0;
    buf[name.len() + 1..].copy_from_slice(v.as_bytes());
    XxHash3_64::oneshot(buf)
}

/// The [`ElfInfo::defined`] keys of these definitions (name, version).
pub fn defined_keys<'a>(defs: impl IntoIterator<Item = (&'a str, Option<&'a str>)>) -> Vec<u64> {
    let mut keys = Vec::new();
    for (name, version) in defs {
        match version {
            None => keys.push(symbol_key(name, Some(""))),
            Some(v) => {
                keys.push(symbol_key(name, Some(v)));
                keys.push(symbol_key(name, None));
            }
        }
    }
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// Serde for [`ElfInfo::defined`]: one base64 string (standard alphabet,
/// padded) of the keys' little-endian bytes. Reading checks the length and
/// restores the order (a peer's list is not trusted to be sorted).
mod hashes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(keys: &[u64], s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<u8> = keys.iter().flat_map(|k| k.to_le_bytes()).collect();
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
        use serde::de::Error;
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let bytes = STANDARD.decode(text.as_bytes()).map_err(D::Error::custom)?;
        if bytes.len() % 8 != 0 {
            return Err(D::Error::custom(format!(
                "defined symbol keys: {} bytes is not a multiple of 8",
                bytes.len()
            )));
        }
        let mut keys: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        if !keys.is_sorted() {
            keys.sort_unstable();
        }
        keys.dedup();
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(defs: &[(&str, Option<&str>)]) -> ElfInfo {
        ElfInfo {
            defined: defined_keys(defs.iter().copied()),
            ..Default::default()
        }
    }

    #[test]
    fn lookup_keeps_check_match_semantics() {
        let plain = info(&[("f", None)]);
        assert!(plain.defines("f", None));
        assert!(
            plain.defines("f", Some("V1")),
            "unversioned def takes any version"
        );
        assert!(!plain.defines("g", None));

        let v2 = info(&[("f", Some("V2"))]);
        assert!(
            v2.defines("f", None),
            "unversioned ref takes any definition"
        );
        assert!(v2.defines("f", Some("V2")));
        assert!(!v2.defines("f", Some("V1")), "another version does not do");
        assert!(!v2.defines("f@V2", None));
        assert!(!v2.defines("g", Some("V2")));

        let both = info(&[("f", Some("V1")), ("f", Some("V2"))]);
        assert!(both.defines("f", Some("V1")) && both.defines("f", Some("V2")));
        assert_eq!(both.defined.len(), 3, "f, f@V1, f@V2: deduplicated");
    }

    #[test]
    fn keys_are_the_documented_hash() {
        // XXH3-64 with seed 0 of the empty input, from the xxHash test vectors.
        assert_eq!(symbol_key("", None), 0x2D06800538D394C2);
        assert_eq!(symbol_key("f", Some("V1")), symbol_key("f\0V1", None));
    }

    #[test]
    fn serde_round_trip_is_compact() {
        let names: Vec<String> = (0..1000).map(|i| format!("_ZN5torch4funcE{i}")).collect();
        let i = ElfInfo {
            soname: Some("libx.so".into()),
            defined: defined_keys(names.iter().map(|n| (n.as_str(), None))),
            ..Default::default()
        };
        let json = serde_json::to_string(&i).unwrap();
        assert!(json.len() < 1000 * 12, "{} bytes", json.len());
        assert_eq!(serde_json::from_str::<ElfInfo>(&json).unwrap(), i);
        let wire = rmp_serde::to_vec_named(&i).unwrap();
        assert_eq!(rmp_serde::from_slice::<ElfInfo>(&wire).unwrap(), i);
        // A peer's unsorted, duplicated list is put in order.
        let mut shuffled = i.clone();
        shuffled.defined.reverse();
        shuffled.defined.push(shuffled.defined[0]);
        let back: ElfInfo =
            serde_json::from_str(&serde_json::to_string(&shuffled).unwrap()).unwrap();
        assert_eq!(back, i);
        // Bad base64 or a cut key is an error, not a panic.
        let bad = json.replace("\"defined\":\"", "\"defined\":\"A");
        assert!(serde_json::from_str::<ElfInfo>(&bad).is_err());
    }
}
