//! Public-key authentication, as OpenSSH does it without a terminal: the
//! keys of ssh-agent (`IdentityAgent`, else `$SSH_AUTH_SOCK`) first, then
//! the identity files (`IdentityFile`, else ~/.ssh/id_ed25519, id_ecdsa,
//! id_rsa) that need no passphrase. When nothing is accepted the error
//! lists every key tried and why it was not used.

use std::path::Path;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use ssh2::{ErrorCode, Session};

use super::config::{AgentSocket, LocalEnv, Resolved};
use super::connect::Route;
use super::known_hosts::{key_type_label, key_type_of_blob, sha256_fingerprint};
use super::libssh2_sys_codes as codes;
use super::{Who, is_timeout};
use crate::err;
use crate::error::Result;

/// What was tried, for the error when nothing is accepted.
#[derive(Default)]
struct Attempts {
    /// One entry per key or source tried, and why it did not do.
    tried: Vec<String>,
    /// The server closed the connection (too many keys offered?).
    disconnected: bool,
}

/// Log in as `r.user` with ssh-agent, then with the key files.
pub(super) fn authenticate(
    who: Who<'_>,
    session: &Session,
    r: &Resolved,
    env: &LocalEnv,
    addr: &Route,
) -> Result<()> {
    if already_authenticated(who, session, r, addr)? {
        return Ok(());
    }
    let mut attempts = Attempts::default();
    if try_ssh_agent(session, r, env, &mut attempts) {
        return Ok(());
    }
    if !attempts.disconnected && try_key_files(session, r, &mut attempts) {
        return Ok(());
    }
    if attempts.disconnected {
        attempts.tried.push(
            "the server closed the connection (too many keys offered? see MaxAuthTries)".into(),
        );
    }
    let user = &r.user;
    Err(err!(
        hint = format!(
            "make sure one of these public keys is in ~{user}/.ssh/authorized_keys on {}, that the user is right (User in ~/.ssh/config, or user@ in the manifest), or load the key into ssh-agent with ssh-add",
            r.hostname
        ),
        "Failed to authenticate as {user} on {who} ({addr}): tried {}",
        attempts.tried.join("; ")
    ))
}

/// Ask the server which methods it accepts: `true` when it let the user in
/// without any (`none`), an error when it takes no public keys.
fn already_authenticated(
    who: Who<'_>,
    session: &Session,
    r: &Resolved,
    addr: &Route,
) -> Result<bool> {
    let user = &r.user;
    match session.auth_methods(user) {
        Ok(methods) => {
            if session.authenticated() {
                return Ok(true);
            }
            if !methods.split(',').any(|m| m == "publickey") {
                return Err(err!(
                    hint = "overlay only uses public keys (ssh-agent or key files); enable PubkeyAuthentication in the server's sshd_config",
                    "Failed to authenticate as {user} on {who} ({addr}): the server does not accept public keys (it offers: {methods})"
                ));
            }
            Ok(false)
        }
        Err(e) => {
            if session.authenticated() {
                return Ok(true);
            }
            Err(err!(
                hint = "the server is slow or overloaded; run again",
                "Failed to authenticate as {user} on {who} ({addr}): {}",
                if is_timeout(&e) {
                    "the server stopped answering".to_string()
                } else {
                    e.message().to_string()
                }
            ))
        }
    }
}

/// Whether a failed call means the server dropped the connection.
fn is_disconnect(e: &ssh2::Error) -> bool {
    matches!(
        e.code(),
        ErrorCode::Session(
            codes::SOCKET_DISCONNECT | codes::SOCKET_SEND | codes::SOCKET_RECV | codes::TIMEOUT
        )
    )
}

/// Offer each key ssh-agent holds; `true` once one is accepted.
fn try_ssh_agent(session: &Session, r: &Resolved, env: &LocalEnv, attempts: &mut Attempts) -> bool {
    let sock = match &r.agent {
        AgentSocket::Disabled => None,
        AgentSocket::Path(p) => Some(p.clone()),
        AgentSocket::FromEnv => env.agent_sock.clone(),
    };
    let Some(sock) = sock else {
        attempts.tried.push(if r.agent == AgentSocket::Disabled {
            "no ssh-agent (IdentityAgent none)".into()
        } else {
            "no ssh-agent (SSH_AUTH_SOCK is not set)".into()
        });
        return false;
    };
    let result = agent_userauth(session, &sock, &r.user);
    if session.authenticated() {
        return true;
    }
    match result {
        Ok(ids) if ids.is_empty() => attempts.tried.push(format!(
            "ssh-agent at {} (it holds no keys)",
            sock.display()
        )),
        Ok(ids) => attempts.tried.push(format!(
            "ssh-agent keys {} (not accepted)",
            describe_agent_keys(&ids)
        )),
        Err(e) if is_disconnect(&e) => attempts.disconnected = true,
        Err(e) => attempts.tried.push(format!(
            "ssh-agent at {} (unusable: {})",
            sock.display(),
            e.message()
        )),
    }
    false
}

/// Offer the keys of the ssh-agent at `sock` one by one. Returns the keys
/// it holds when none was accepted (none once one was), and stops at an
/// error that ends the connection.
fn agent_userauth(
    session: &Session,
    sock: &Path,
    user: &str,
) -> std::result::Result<Vec<ssh2::PublicKey>, ssh2::Error> {
    let mut agent = session.agent()?;
    agent.set_identity_path(sock)?;
    agent.connect()?;
    agent.list_identities()?;
    let ids = agent.identities()?;
    for id in &ids {
        match agent.userauth(user, id) {
            Ok(()) => {
                let _ = agent.disconnect();
                return Ok(Vec::new());
            }
            Err(e) => {
                if is_disconnect(&e) {
                    let _ = agent.disconnect();
                    return Err(e);
                }
            }
        }
    }
    let _ = agent.disconnect();
    Ok(ids)
}

/// `ED25519 alice@laptop, RSA SHA256:...`: each key's type and comment
/// (its fingerprint when it has none).
fn describe_agent_keys(ids: &[ssh2::PublicKey]) -> String {
    let names: Vec<String> = ids
        .iter()
        .map(|id| {
            let t = key_type_of_blob(id.blob())
                .map(|t| key_type_label(&t))
                .unwrap_or_default();
            let c = id.comment();
            if c.is_empty() {
                format!("{t} {}", sha256_fingerprint(id.blob()))
            } else {
                format!("{t} {c}")
            }
        })
        .collect();
    names.join(", ")
}

/// Offer each identity file that exists and needs no passphrase; `true`
/// once one is accepted.
fn try_key_files(session: &Session, r: &Resolved, attempts: &mut Attempts) -> bool {
    let tried = &mut attempts.tried;
    for f in &r.identity_files {
        if !f.exists() {
            if r.identity_files_configured {
                tried.push(format!("{} (missing)", f.display()));
            }
            continue;
        }
        if key_file_is_encrypted(f) {
            tried.push(format!(
                "{} (passphrase-protected: load it with `ssh-add {}`)",
                f.display(),
                f.display()
            ));
            continue;
        }
        match session.userauth_pubkey_file(&r.user, None, f, None) {
            Ok(()) if session.authenticated() => return true,
            Ok(()) => tried.push(format!("{} (not accepted)", f.display())),
            Err(e) if is_disconnect(&e) => {
                tried.push(format!("{} (connection closed)", f.display()));
                attempts.disconnected = true;
                break;
            }
            Err(e) => tried.push(format!("{} ({})", f.display(), key_file_failure(&e))),
        }
    }
    if !r.identity_files_configured && !r.identity_files.iter().any(|f| f.exists()) {
        tried.push(format!(
            "no key file ({} do not exist)",
            r.identity_files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    false
}

/// Why a key file was not accepted, in a few words.
fn key_file_failure(e: &ssh2::Error) -> String {
    match e.code() {
        ErrorCode::Session(codes::AUTHENTICATION_FAILED)
        | ErrorCode::Session(codes::PUBLICKEY_UNVERIFIED) => "not accepted".to_string(),
        ErrorCode::Session(codes::FILE) => format!("unreadable key: {}", e.message()),
        _ => e.message().to_string(),
    }
}

/// Base64 as a key file's body may hold it: padding optional, stray bits
/// at the end ignored (whitespace is taken out before).
const KEY_BODY: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// Whether a private key file needs a passphrase (OpenSSH or PEM format).
fn key_file_is_encrypted(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    if text.contains("ENCRYPTED") {
        return true; // "Proc-Type: 4,ENCRYPTED" or "BEGIN ENCRYPTED PRIVATE KEY"
    }
    let body: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .flat_map(|l| l.chars().filter(|c| !c.is_ascii_whitespace()))
        .collect();
    let Ok(bytes) = KEY_BODY.decode(&body) else {
        return false;
    };
    // "openssh-key-v1\0" then string ciphername.
    let Some(rest) = bytes.strip_prefix(b"openssh-key-v1\0") else {
        return false;
    };
    key_type_of_blob(rest).is_some_and(|cipher| cipher != "none")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_key_bodies() {
        assert_eq!(KEY_BODY.decode("Zm9vYmE=").unwrap(), b"fooba");
        assert_eq!(KEY_BODY.decode("Zm9vYmE").unwrap(), b"fooba");
        assert_eq!(KEY_BODY.decode("").unwrap(), b"");
        assert!(KEY_BODY.decode("Zm9v!").is_err());
    }

    #[test]
    fn detects_passphrase_protected_keys() {
        if !Path::new("/usr/bin/ssh-keygen").exists() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        for (name, pass) in [("plain", ""), ("enc", "secret")] {
            let st = std::process::Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", pass, "-f"])
                .arg(dir.path().join(name))
                .status()
                .unwrap();
            assert!(st.success());
        }
        assert!(!key_file_is_encrypted(&dir.path().join("plain")));
        assert!(key_file_is_encrypted(&dir.path().join("enc")));
    }
}
