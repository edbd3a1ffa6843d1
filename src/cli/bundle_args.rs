//! The command line of signed bundles (docs/pack.md, "Signing and
//! trust"): who may sign a bundle that `plan`/`apply --bundle` accepts
//! ([`TrustArgs`]), and `overlay sign` ([`SignArgs`]).

use std::path::PathBuf;

use clap::Args;

/// `--trust` and `--insecure-unsigned` of `plan` and `apply`.
#[derive(Debug, Clone, Args)]
pub struct TrustArgs {
    /// With --bundle: accept the bundle only if FILE.sig beside it is a
    /// signature by a key of this OpenSSH allowed_signers file (for
    /// namespace overlay-bundle), checked before the bundle is read.
    /// Default: the manifest's `[apply] trust`, else
    /// /etc/overlay/allowed_signers if it exists, else no check.
    #[arg(long, value_name = "ALLOWED_SIGNERS", env = "OVERLAY_TRUST")]
    pub trust: Option<PathBuf>,

    /// With --bundle: accept a bundle that is unsigned, or signed by a key
    /// the allowed_signers file does not trust (a warning says so).
    #[arg(long, requires = "bundle")]
    pub insecure_unsigned: bool,
}

impl TrustArgs {
    pub fn choice(&self) -> overlay::ops::trust::TrustChoice {
        overlay::ops::trust::TrustChoice {
            file: self.trust.clone(),
            insecure_unsigned: self.insecure_unsigned,
        }
    }
}

/// `overlay sign BUNDLE`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("what").required(true).args(["key", "print_message"]))]
pub struct SignArgs {
    /// The bundle, written by `overlay pack`.
    pub bundle: PathBuf,

    /// Sign with this key: an OpenSSH private key file, a public key file
    /// whose private half ssh-agent holds (so does an encrypted private
    /// key), or `agent:` (the only key ssh-agent holds) / `agent:SHA256:...`.
    /// Writes BUNDLE.sig.
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,

    /// Print the message a signature of the bundle signs, for
    /// `ssh-keygen -Y sign -n overlay-bundle` or `-Y verify`.
    #[arg(long)]
    pub print_message: bool,

    /// Print the result as one JSON line on stdout.
    #[arg(long, conflicts_with = "print_message")]
    pub json: bool,
}

pub const SIGN_EXAMPLES: &str = "\
Examples:
  Sign a bundle with your SSH key (writes stack.ovl.sig beside it):
    overlay sign stack.ovl --key ~/.ssh/id_ed25519
  With the key ssh-agent holds for this public key:
    overlay sign stack.ovl --key ~/.ssh/id_ed25519.pub
  Check the signature with OpenSSH itself:
    overlay sign stack.ovl --print-message |
      ssh-keygen -Y verify -f allowed_signers -I ops@example -n overlay-bundle -s stack.ovl.sig";
