//! Where a generation's files came from ([`Provenance`]): a live source
//! host and venv (and the folders of sets with `from`), or a bundle, with
//! its BLAKE3 and who signed it ([`Signer`]). A plan made from a bundle
//! carries it, the generation records it, and `history -v` / `--json`
//! show it. Generations and plans from before it have none.

use serde::{Deserialize, Serialize};

/// The source of a plan, hence of the generation that applies it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Provenance {
    /// The source host's manifest name: the live source's, or the one the
    /// bundle was packed from.
    pub host: String,
    /// The source's venv (for a bundle: the one it was packed from).
    pub venv: String,
    /// The folders of sets with `from` (`HOST:PATH`, or a path on the
    /// controller).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub folders: Vec<String>,
    /// Set when the files came from a bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<BundleOrigin>,
}

/// The bundle a plan's files came from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BundleOrigin {
    /// The bundle file as given.
    pub file: String,
    /// Its whole-file BLAKE3 (its trailer's).
    pub blake3: String,
    /// Its signature's key; `None`: unsigned (or a signature that did not
    /// verify, with no trust configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<Signer>,
}

/// The key that signed a bundle.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Signer {
    /// `SHA256:...`, as `ssh-keygen -l` prints it.
    pub fingerprint: String,
    /// The key's algorithm, e.g. `ssh-ed25519`.
    pub algorithm: String,
    /// The principals of the allowed_signers line that trusts the key;
    /// `None` when no allowed_signers file was consulted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principals: Option<String>,
    /// The allowed_signers file that trusts the key; `None`: the signature
    /// verified against its own key only, which proves nothing of who
    /// made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_by: Option<String>,
}

impl Provenance {
    /// One line for people: `bundle FILE (BLAKE3 ...), signed by ...;
    /// packed from HOST:VENV`, or `HOST:VENV` (and the folders).
    pub fn describe(&self) -> String {
        let from = format!("{}:{}", self.host, self.venv);
        let folders = if self.folders.is_empty() {
            String::new()
        } else {
            format!(", folders {}", self.folders.join(", "))
        };
        match &self.bundle {
            None => format!("live source {from}{folders}"),
            Some(b) => format!(
                "bundle {} (BLAKE3 {}), {}; packed from {from}{folders}",
                b.file,
                b.blake3,
                match &b.signer {
                    None => "unsigned".to_string(),
                    Some(s) => s.describe(),
                }
            ),
        }
    }
}

impl Signer {
    /// `signed by PRINCIPALS (ALG SHA256:...), trusted by FILE`, or
    /// `signed by ALG SHA256:... (not checked against allowed_signers)`.
    pub fn describe(&self) -> String {
        match (&self.principals, &self.trusted_by) {
            (Some(p), Some(file)) => format!(
                "signed by {p} ({} {}), trusted by {file}",
                self.algorithm, self.fingerprint
            ),
            _ => format!(
                "signed by {} {} (not checked against an allowed_signers file)",
                self.algorithm, self.fingerprint
            ),
        }
    }
}
