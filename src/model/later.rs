//! What changed in a generation's paths and distributions after its apply
//! ([`LaterChanges`]): what `overlay rollback` checks before undoing, lists
//! when it refuses, and carries in its JSON report.

use serde::{Deserialize, Serialize};

use super::normalize_name;

/// How a path the generation wrote (or deleted) differs now.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum FileChange {
    /// A file or symlink the apply put there has other content (or type) now.
    Modified,
    /// A file or symlink the apply put there is gone.
    Removed,
    /// A path the apply deleted exists again.
    Recreated,
}

impl FileChange {
    pub fn as_str(self) -> &'static str {
        match self {
            FileChange::Modified => "modified",
            FileChange::Removed => "removed",
            FileChange::Recreated => "re-created",
        }
    }
}

/// One path of a generation that changed since the apply.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChangedFile {
    /// Relative to site-packages, as in the plan.
    pub path: String,
    pub change: FileChange,
}

/// Changes since the apply to what the rolled-back generations touched:
/// their files, and the `*.dist-info` directories of their distributions
/// (compared by PEP 503 name with the listing taken right after the newest
/// apply). Distributions the generations did not touch are not looked at.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LaterChanges {
    /// The generations' files that changed, modified first, then removed,
    /// then re-created; those inside a dist-info in the next two lists are
    /// left out (the directory tells it).
    pub changed_files: Vec<ChangedFile>,
    /// dist-info directories (site-packages relative) that appeared since.
    pub dist_infos_added: Vec<String>,
    /// dist-info directories that were there after the apply and are gone.
    pub dist_infos_removed: Vec<String>,
}

impl LaterChanges {
    pub fn is_empty(&self) -> bool {
        self.changed_files.is_empty()
            && self.dist_infos_added.is_empty()
            && self.dist_infos_removed.is_empty()
    }
}

/// The PEP 503 name of a dist-info directory `name-version.dist-info`.
pub fn dist_of(dir: &str) -> Option<String> {
    let stem = dir.strip_suffix(".dist-info")?;
    let name = stem.split_once('-').map_or(stem, |(n, _)| n);
    (!name.is_empty()).then(|| normalize_name(name))
}

/// `name==version` of a dist-info directory, for a pip command line.
pub fn requirement_of(dir: &str) -> Option<String> {
    let (name, version) = dir.strip_suffix(".dist-info")?.split_once('-')?;
    Some(format!("{name}=={version}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dist_info_names_give_the_distribution() {
        assert_eq!(dist_of("six-1.16.0.dist-info").as_deref(), Some("six"));
        assert_eq!(
            dist_of("nvidia_cublas_cu12-12.8.4.1.dist-info").as_deref(),
            Some("nvidia-cublas-cu12")
        );
        assert_eq!(dist_of("minitorch/version.py"), None);
        assert_eq!(
            requirement_of("minitorch-2.11.0.dist-info").as_deref(),
            Some("minitorch==2.11.0")
        );
    }
}
