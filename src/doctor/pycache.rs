//! Stale bytecode: a `__pycache__/NAME.cpython-XY[.opt-N].pyc` of this
//! venv's interpreter whose header (PEP 552: flags, then the source's mtime
//! and size) does not match `NAME.py` beside it, or whose source is gone.
//! Hash-based pycs (flags bit 0) are skipped: they carry a SipHash of the
//! source, which is not worth recomputing here.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rayon::prelude::*;

use crate::model::{Finding, FindingKind};

/// The source of a pyc path of interpreter `tag` (`cpython-311`), if the
/// path is one.
pub fn source_of(pyc: &str, tag: &str) -> Option<String> {
    // Top-level modules (`six.py`) have theirs in site-packages' own `__pycache__`.
    let (dir, name) = match pyc.rsplit_once("/__pycache__/") {
        Some((dir, name)) => (format!("{dir}/"), name),
        None => (String::new(), pyc.strip_prefix("__pycache__/")?),
    };
    let stem = name.strip_suffix(".pyc")?;
    let (module, rest) = stem.split_once('.')?;
    let ok = rest == tag
        || rest
            .strip_prefix(tag)
            .is_some_and(|o| o.starts_with(".opt-"));
    ok.then(|| format!("{dir}{module}.py"))
}

/// Check the pyc files among `pycache` (site-packages relative);
/// `owner` names the distribution of a source path.
pub fn check(
    site: &Path,
    python: &str,
    pycache: &[String],
    owner: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Vec<Finding> {
    let tag = format!("cpython-{}", python.replace('.', ""));
    pycache
        .par_iter()
        .filter_map(|pyc| {
            let source = source_of(pyc, &tag)?;
            let reason = stale(&site.join(pyc), &site.join(&source), &source)?;
            Some(Finding::problem(
                FindingKind::StaleBytecode,
                owner(&source),
                Some(pyc.clone()),
                reason,
            ))
        })
        .collect()
}

/// Why the pyc at `pyc` does not match `source` (`shown` in messages).
fn stale(pyc: &Path, source: &Path, shown: &str) -> Option<String> {
    let mut head = [0u8; 16];
    std::fs::File::open(pyc).ok()?.read_exact(&mut head).ok()?;
    let word = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().expect("4 bytes"));
    if word(4) & 1 != 0 {
        return None;
    }
    let name = shown.rsplit('/').next().unwrap_or(shown);
    let src = match std::fs::metadata(source) {
        Ok(m) => m,
        Err(_) => return Some(format!("its source {name} is gone")),
    };
    let (mtime, size) = (word(8), word(12));
    let (src_mtime, src_size) = (src.mtime() as u32, src.size() as u32);
    (mtime != src_mtime || size != src_size).then(|| {
        format!(
            "compiled from another {name} (recorded mtime {mtime}, size {size}; the source has mtime {src_mtime}, size {src_size})"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_of_this_interpreters_pycs() {
        let t = "cpython-311";
        assert_eq!(
            source_of("a/b/__pycache__/x.cpython-311.pyc", t).as_deref(),
            Some("a/b/x.py")
        );
        assert_eq!(
            source_of("a/__pycache__/x.cpython-311.opt-1.pyc", t).as_deref(),
            Some("a/x.py")
        );
        assert_eq!(source_of("a/__pycache__/x.cpython-310.pyc", t), None);
        assert_eq!(source_of("a/x.pyc", t), None);
        assert_eq!(
            source_of("__pycache__/six.cpython-311.pyc", t).as_deref(),
            Some("six.py")
        );
    }
}
