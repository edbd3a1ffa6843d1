//! Signed bundles (docs/pack.md, "Signing and trust"): an SSH signature
//! in OpenSSH's SSHSIG format (namespace [`NAMESPACE`]) over the bundle's
//! [`message`], kept beside it as `FILE.sig` ([`sig_path`]), exactly as
//! `ssh-keygen -Y sign -n overlay-bundle` writes one; and its check
//! against an OpenSSH allowed_signers file ([`check`], the file read by
//! `super::allowed`), as `ssh-keygen -Y verify` does.
//!
//! The message is a few lines of text that name the bundle's trailer
//! hash, the BLAKE3 of every byte before the trailer (the index included),
//! and their count: signing it signs every byte of the bundle, and it is
//! checked before any byte of the bundle is parsed. The bundle itself is
//! unchanged by signing, so packing the same sources still gives the same
//! bytes.
//!
//! Keys: an OpenSSH private key file (ed25519, RSA, ...) signs here; a
//! public key file, an encrypted private key, or `agent:` / `agent:SHA256:...`
//! names a key that the ssh-agent at `SSH_AUTH_SOCK` holds, which signs.
//! Passphrases are never asked for.

use std::path::{Path, PathBuf};

use ssh_key::{HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};

use super::allowed;
use crate::err;
use crate::error::{Error, Result, io_cause};
use crate::model::Signer;

/// The SSHSIG namespace of bundle signatures.
pub const NAMESPACE: &str = "overlay-bundle";
/// The allowed_signers file used when nothing else names one.
pub const SYSTEM_TRUST: &str = "/etc/overlay/allowed_signers";
/// The largest signature file read (bytes).
const SIG_LIMIT: u64 = 64 << 10;

/// The bytes a bundle's signature signs: its trailer's BLAKE3 (lowercase
/// hex) and the count of bytes it covers, as text.
pub fn message(blake3: &str, body: u64) -> String {
    format!("overlay-bundle-signature 1\nblake3 {blake3}\nbytes {body}\n")
}

/// Where the signature of `bundle` lives: `FILE.sig` beside it.
pub fn sig_path(bundle: &Path) -> PathBuf {
    let mut s = bundle.as_os_str().to_os_string();
    s.push(".sig");
    PathBuf::from(s)
}

/// Which allowed_signers file decides, and whether an untrusted bundle may
/// pass anyway.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    /// The allowed_signers file and what named it (`--trust`, the
    /// manifest's `[apply] trust`, the system default); `None`: no trust
    /// configured, any bundle passes as before.
    pub file: Option<(PathBuf, String)>,
    /// `--insecure-unsigned`: a bundle the file does not vouch for is
    /// applied anyway, with a warning.
    pub insecure_unsigned: bool,
}

impl Trust {
    /// `--trust` (or `OVERLAY_TRUST`), else the manifest's `[apply] trust`,
    /// else `system` if it exists ([`SYSTEM_TRUST`]), else none.
    pub fn resolve(
        flag: Option<&Path>,
        manifest: Option<&Path>,
        system: &Path,
        insecure_unsigned: bool,
    ) -> Trust {
        let file = match (flag, manifest) {
            (Some(f), _) => Some((f.to_path_buf(), "--trust".to_string())),
            (None, Some(m)) => Some((m.to_path_buf(), "the manifest's [apply] trust".into())),
            (None, None) if system.exists() => {
                Some((system.to_path_buf(), "the system default".into()))
            }
            (None, None) => None,
        };
        Trust {
            file,
            insecure_unsigned,
        }
    }
}

/// What the check of a bundle's signature found (refusals are errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// A key of the allowed_signers file signed it.
    Trusted(Signer),
    /// No trust configured: unsigned.
    Unsigned,
    /// No trust configured: signed, and the signature verifies against its
    /// own key (which proves nothing of who made it).
    Unchecked(Signer),
    /// Passed without trust: no trust configured and a signature that
    /// does not verify, or `--insecure-unsigned` over a refusal (the words
    /// of it).
    Insecure(String),
}

impl Checked {
    /// The signer to record, if the signature verified.
    pub fn signer(&self) -> Option<&Signer> {
        match self {
            Checked::Trusted(s) | Checked::Unchecked(s) => Some(s),
            _ => None,
        }
    }

    /// A line for stderr about `bundle`, and how loud: a status line for a
    /// trusted signer, a note (`-v`) where no trust is configured, a
    /// warning where a bundle passed without it.
    pub fn line(&self, bundle: &Path) -> (Loudness, String) {
        let b = bundle.display();
        match self {
            Checked::Trusted(s) => (Loudness::Status, format!("Bundle {b}: {}", s.describe())),
            Checked::Unsigned => (
                Loudness::Note,
                format!(
                    "Bundle {b} is not signed (no {}); nothing checks who packed it (see `--trust`, docs/pack.md)",
                    sig_path(bundle).display()
                ),
            ),
            Checked::Unchecked(s) => (
                Loudness::Note,
                format!(
                    "Bundle {b} is {}: give --trust ALLOWED_SIGNERS to check who signed it",
                    s.describe()
                ),
            ),
            Checked::Insecure(why) => (Loudness::Warning, format!("{why}; applied anyway")),
        }
    }
}

/// How loud [`Checked::line`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loudness {
    Status,
    Note,
    Warning,
}

/// Check the signature of `bundle`, whose trailer says `blake3` over `body`
/// bytes, against `trust`. With a trust file, anything but a valid
/// signature by a key it allows for [`NAMESPACE`] is an error of kind
/// `HostKey` (exit 5), unless `trust.insecure_unsigned`.
pub fn check(bundle: &Path, blake3: &str, body: u64, trust: &Trust) -> Result<Checked> {
    let sig = read_sig(bundle)?;
    let msg = message(blake3, body);
    let Some((file, named_by)) = &trust.file else {
        return Ok(match sig {
            None => Checked::Unsigned,
            Some(Err(why)) => Checked::Insecure(why),
            Some(Ok(sig)) => match self_check(&sig, &msg) {
                Ok(s) => Checked::Unchecked(s),
                Err(why) => Checked::Insecure(format!(
                    "{} does not verify ({why}): the bundle's signature proves nothing",
                    sig_path(bundle).display()
                )),
            },
        });
    };
    let signers = allowed::read(file)?;
    let verdict = trusted(bundle, sig, &msg, &signers, file, named_by);
    match verdict {
        Err(e) if trust.insecure_unsigned && e.kind == crate::error::ErrorKind::HostKey => Ok(
            Checked::Insecure(format!("--insecure-unsigned: {}", e.message)),
        ),
        other => other,
    }
}

/// The check against `signers` (the allowed_signers `file`, named by
/// `named_by`).
fn trusted(
    bundle: &Path,
    sig: Option<std::result::Result<SshSig, String>>,
    msg: &str,
    signers: &[allowed::AllowedSigner],
    file: &Path,
    named_by: &str,
) -> Result<Checked> {
    let (b, f, sp) = (
        bundle.display(),
        file.display(),
        sig_path(bundle).display().to_string(),
    );
    let refuse = |message: String, hint: String| Error {
        hint: Some(hint),
        ..err!(
            kind = HostKey,
            "{message}; nothing was read from the bundle or written"
        )
    };
    let sig = match sig {
        None => {
            return Err(refuse(
                format!(
                    "Bundle {b} is not signed (no {sp}), and {named_by} {f} requires a signature"
                ),
                format!(
                    "sign it where it was packed (`overlay sign {b} --key KEY`, or `overlay pack ... --sign KEY`) and copy {sp} beside it; or pass --insecure-unsigned to apply it unsigned"
                ),
            ));
        }
        Some(Err(why)) => {
            return Err(refuse(
                why,
                format!("copy {sp} again from where the bundle was signed, or sign it again"),
            ));
        }
        Some(Ok(sig)) => sig,
    };
    let fp = sig.public_key().fingerprint(HashAlg::Sha256).to_string();
    let alg = sig.public_key().algorithm().to_string();
    if sig.namespace() != NAMESPACE {
        return Err(refuse(
            format!(
                "The signature {sp} (by {alg} {fp}) is for namespace {:?}, not {NAMESPACE}: it does not sign a bundle",
                sig.namespace()
            ),
            format!(
                "sign the bundle with `overlay sign {b} --key KEY` (or `ssh-keygen -Y sign -n {NAMESPACE}` over `overlay sign {b} --print-message`)"
            ),
        ));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let same_key: Vec<_> = signers
        .iter()
        .filter(|s| s.key.key_data() == sig.public_key())
        .collect();
    let Some(line) = same_key.iter().find(|s| s.allows(NAMESPACE, now).is_ok()) else {
        let why = match same_key.first() {
            None => format!("{f} has no line with that key"),
            Some(s) => format!(
                "line {} of {f} has the key, but {}",
                s.line,
                s.allows(NAMESPACE, now).err().unwrap_or_default()
            ),
        };
        return Err(refuse(
            format!(
                "Bundle {b} is signed by {alg} {fp}, which {named_by} {f} does not trust: {why}"
            ),
            format!(
                "if that key may sign bundles, add `PRINCIPAL namespaces=\"{NAMESPACE}\" {}` to {f}; else do not apply this bundle",
                public_line(&sig)
            ),
        ));
    };
    let key = PublicKey::from(sig.public_key().clone());
    if let Err(e) = key.verify(NAMESPACE, msg.as_bytes(), &sig) {
        return Err(refuse(
            format!(
                "The signature {sp}, by {alg} {fp} ({}), does not sign this bundle {b}: {e} (the bundle changed after it was signed, or the signature is another bundle's)",
                line.principals
            ),
            "copy the bundle and its .sig again from where it was packed and signed".into(),
        ));
    }
    Ok(Checked::Trusted(Signer {
        fingerprint: fp,
        algorithm: alg,
        principals: Some(line.principals.clone()),
        trusted_by: Some(file.display().to_string()),
    }))
}

/// The signature's key as an allowed_signers key (`TYPE BASE64`).
fn public_line(sig: &SshSig) -> String {
    PublicKey::from(sig.public_key().clone())
        .to_openssh()
        .unwrap_or_else(|_| "KEYTYPE BASE64".into())
}

/// The signature beside `bundle`: `None` if there is none, `Some(Err)`
/// with words if it cannot be read as one.
fn read_sig(bundle: &Path) -> Result<Option<std::result::Result<SshSig, String>>> {
    use std::io::Read;
    let path = sig_path(bundle);
    let mut text = String::new();
    match std::fs::File::open(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(err!(
                kind = HostKey,
                hint = "give the user overlay runs as read access to it",
                "Cannot read the bundle's signature {}: {}",
                path.display(),
                io_cause(&e)
            ));
        }
        Ok(f) => {
            if let Err(e) = f.take(SIG_LIMIT).read_to_string(&mut text) {
                return Ok(Some(Err(format!(
                    "The bundle's signature {} cannot be read: {}",
                    path.display(),
                    io_cause(&e)
                ))));
            }
        }
    }
    Ok(Some(SshSig::from_pem(text.trim()).map_err(|e| {
        format!(
            "The bundle's signature {} is not an SSH signature (-----BEGIN SSH SIGNATURE-----): {e}",
            path.display()
        )
    })))
}

/// The signer of `sig` if it verifies over `msg` against its own key.
fn self_check(sig: &SshSig, msg: &str) -> std::result::Result<Signer, String> {
    if sig.namespace() != NAMESPACE {
        return Err(format!("namespace {:?}", sig.namespace()));
    }
    let key = PublicKey::from(sig.public_key().clone());
    key.verify(NAMESPACE, msg.as_bytes(), sig)
        .map_err(|e| e.to_string())?;
    Ok(Signer {
        fingerprint: sig.public_key().fingerprint(HashAlg::Sha256).to_string(),
        algorithm: sig.public_key().algorithm().to_string(),
        principals: None,
        trusted_by: None,
    })
}

/// Sign the bundle at `bundle` (trailer hash `blake3` over `body` bytes)
/// with `key` ([`signing_key`]), writing [`sig_path`] atomically. Returns
/// the signer (no principals: no allowed_signers file says them here).
pub fn sign(bundle: &Path, blake3: &str, body: u64, key: &str) -> Result<Signer> {
    let msg = message(blake3, body);
    let sig = match signing_key(key)? {
        KeySource::Private(k) => sign_private(&k, msg.as_bytes()).map_err(|e| {
            err!(
                kind = Usage,
                hint = "use an ed25519 or RSA key (`ssh-keygen -t ed25519`)",
                "Cannot sign with the key {key}: {e}"
            )
        })?,
        KeySource::Agent(want) => {
            super::agent::sign(key, want.as_ref(), NAMESPACE, msg.as_bytes())?
        }
    };
    let signer = self_check(&sig, &msg).map_err(|why| {
        err!(
            kind = Internal,
            "The signature made with {key} does not verify: {why}"
        )
    })?;
    let pem = sig
        .to_pem(LineEnding::LF)
        .map_err(|e| err!(kind = Internal, "Cannot encode the signature: {e}"))?;
    let path = sig_path(bundle);
    write_atomic(&path, pem.as_bytes())?;
    Ok(signer)
}

/// An SSHSIG of `msg` by the private key `k`. RSA keys sign through the
/// `rsa` crate here (`rsa-sha2-512`, as ssh-keygen): ssh-key 0.6 builds
/// the RSA key from p twice instead of p and q, so its own RSA signing
/// fails (fixed in its 0.7).
fn sign_private(k: &PrivateKey, msg: &[u8]) -> ssh_key::Result<SshSig> {
    let ssh_key::private::KeypairData::Rsa(rsa_key) = k.key_data() else {
        return k.sign(NAMESPACE, HashAlg::Sha512, msg);
    };
    use rsa::signature::SignatureEncoding as _;
    use rsa::signature::Signer as _;
    let big = |m: &ssh_key::Mpint| rsa::BigUint::try_from(m);
    let key = rsa::RsaPrivateKey::from_components(
        big(&rsa_key.public.n)?,
        big(&rsa_key.public.e)?,
        big(&rsa_key.private.d)?,
        vec![big(&rsa_key.private.p)?, big(&rsa_key.private.q)?],
    )
    .map_err(|_| ssh_key::Error::Crypto)?;
    let data = SshSig::signed_data(NAMESPACE, HashAlg::Sha512, msg)?;
    let signed = rsa::pkcs1v15::SigningKey::<rsa::sha2::Sha512>::new(key)
        .try_sign(&data)
        .map_err(|_| ssh_key::Error::Crypto)?;
    let signature = ssh_key::Signature::new(
        ssh_key::Algorithm::Rsa {
            hash: Some(HashAlg::Sha512),
        },
        signed.to_vec(),
    )?;
    SshSig::new(
        k.public_key().key_data().clone(),
        NAMESPACE,
        HashAlg::Sha512,
        signature,
    )
}

/// Write `bytes` to `path` through a temporary file beside it.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let failed = |e: std::io::Error| {
        err!(
            hint = "check that the folder exists and is writable",
            "Cannot write the signature {}: {}",
            path.display(),
            io_cause(&e)
        )
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".overlay-sig.")
        .tempfile_in(&dir)
        .map_err(failed)?;
    tmp.write_all(bytes).map_err(failed)?;
    tmp.as_file().sync_all().map_err(failed)?;
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .map_err(failed)?;
    tmp.persist(path).map_err(|e| failed(e.error))?;
    Ok(())
}

/// Where a signature comes from.
enum KeySource {
    /// An unencrypted private key, read from its file.
    Private(Box<PrivateKey>),
    /// The ssh-agent: this public key, or (`None`) its only key, or the
    /// one with the fingerprint `agent:SHA256:...` names.
    Agent(Option<super::agent::Wanted>),
}

/// `KEY` of `--sign KEY`: `agent:` (the agent's only key),
/// `agent:SHA256:...` (the agent's key with that fingerprint), or a file:
/// an OpenSSH private key (unencrypted: signed here; encrypted: by the
/// agent, which must hold it), or a public key (the agent holds its
/// private half).
fn signing_key(key: &str) -> Result<KeySource> {
    use super::agent::Wanted;
    if let Some(fp) = key.strip_prefix("agent:") {
        return Ok(KeySource::Agent(
            (!fp.is_empty()).then(|| Wanted::Fingerprint(fp.to_string())),
        ));
    }
    let path = match (key.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Path::new(&home).join(rest),
        _ => PathBuf::from(key),
    };
    let text = std::fs::read_to_string(&path).map_err(|e| {
        err!(
            kind = Usage,
            hint = "give an OpenSSH key file (e.g. ~/.ssh/id_ed25519), its .pub for a key ssh-agent holds, or agent:",
            "Cannot read the key {key}: {}",
            io_cause(&e)
        )
    })?;
    if text.contains("PRIVATE KEY-----") {
        let k = PrivateKey::from_openssh(&text).map_err(|e| {
            err!(
                kind = Usage,
                hint = "overlay reads OpenSSH's own key format (-----BEGIN OPENSSH PRIVATE KEY-----); convert a PEM key with `ssh-keygen -p -f KEY`",
                "Cannot read the private key {key}: {e}"
            )
        })?;
        if !k.is_encrypted() {
            return Ok(KeySource::Private(Box::new(k)));
        }
        return Ok(KeySource::Agent(Some(Wanted::Key(
            k.public_key().clone(),
            format!("{key} is passphrase-protected (overlay asks for no passphrase)"),
        ))));
    }
    let k = PublicKey::from_openssh(text.trim()).map_err(|e| {
        err!(
            kind = Usage,
            hint = "give an OpenSSH private key file, a public key file (its private half in ssh-agent), or agent:",
            "{key} is neither an OpenSSH private key nor a public key: {e}"
        )
    })?;
    Ok(KeySource::Agent(Some(Wanted::Key(
        k,
        format!("{key} is a public key"),
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_comes_from_the_flag_then_the_manifest_then_the_system_file() {
        let t = tempfile::tempdir().unwrap();
        let system = t.path().join("allowed_signers");
        let (flag, manifest) = (Path::new("/f"), Path::new("/m"));
        let file = |tr: Trust| tr.file.map(|(p, by)| (p.display().to_string(), by));
        assert_eq!(
            file(Trust::resolve(Some(flag), Some(manifest), &system, false)),
            Some(("/f".into(), "--trust".into()))
        );
        assert_eq!(
            file(Trust::resolve(None, Some(manifest), &system, false)),
            Some(("/m".into(), "the manifest's [apply] trust".into()))
        );
        assert_eq!(file(Trust::resolve(None, None, &system, false)), None);
        std::fs::write(&system, "").unwrap();
        let got = Trust::resolve(None, None, &system, true);
        assert!(got.insecure_unsigned);
        assert_eq!(
            file(got),
            Some((system.display().to_string(), "the system default".into()))
        );
    }

    #[test]
    fn the_message_names_the_hash_and_the_length() {
        assert_eq!(
            message(&"ab".repeat(32), 123),
            format!(
                "overlay-bundle-signature 1\nblake3 {}\nbytes 123\n",
                "ab".repeat(32)
            )
        );
        assert_eq!(
            sig_path(Path::new("/v/stack.ovl")),
            Path::new("/v/stack.ovl.sig")
        );
    }
}
