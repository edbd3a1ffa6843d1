//! A package set (distribution and file globs) and the PEP 503 name
//! normalization the globs are matched under.

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Set {
    pub name: String,
    /// Distribution name globs, PEP 503-normalized.
    pub dists: Vec<String>,
    /// File globs relative to site-packages.
    pub files: Vec<String>,
}

/// PEP 503 normalization: lowercase, runs of `-`, `_` and `.` become one `-`.
pub fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.extend(c.to_lowercase());
        }
    }
    out
}
