//! Signing with a key that a running ssh-agent holds (`SSH_AUTH_SOCK`),
//! through the `ssh-agent-client-rs` crate's SIGN_REQUEST: the agent signs
//! the SSHSIG "signed data" blob (for RSA keys with SHA-512,
//! `rsa-sha2-512`), and the signature is assembled here as
//! `ssh-keygen -Y sign` does when its key is in the agent.

use std::path::Path;

use ssh_key::{HashAlg, PublicKey, SshSig};

use crate::err;
use crate::error::Result;

/// Which of the agent's keys signs.
pub enum Wanted {
    /// This key; the words say where it came from (for errors).
    Key(PublicKey, String),
    /// The key with this fingerprint (`SHA256:...`).
    Fingerprint(String),
}

/// Sign `msg` for `namespace` with the agent's key `want` (`None`: its
/// only key). `shown` is the `--sign` value, for errors.
pub fn sign(shown: &str, want: Option<&Wanted>, namespace: &str, msg: &[u8]) -> Result<SshSig> {
    let why = match want {
        Some(Wanted::Key(_, why)) => format!("{why}, so ssh-agent must sign: "),
        _ => String::new(),
    };
    let Some(sock) = std::env::var_os("SSH_AUTH_SOCK").filter(|s| !s.is_empty()) else {
        return Err(err!(
            kind = Usage,
            hint = "start ssh-agent and `ssh-add` the key (then give its .pub, or agent:), or give an unencrypted private key file",
            "Cannot sign with {shown}: {why}no ssh-agent (SSH_AUTH_SOCK is not set)"
        ));
    };
    let agent_err = |e: &dyn std::fmt::Display| {
        err!(
            kind = Usage,
            hint = "check that ssh-agent runs (`ssh-add -l`) and holds the key",
            "Cannot sign with {shown} through ssh-agent ({}): {why}{e}",
            Path::new(&sock).display()
        )
    };
    let mut client =
        ssh_agent_client_rs::Client::connect(Path::new(&sock)).map_err(|e| agent_err(&e))?;
    let keys: Vec<PublicKey> = client
        .list_all_identities()
        .map_err(|e| agent_err(&e))?
        .into_iter()
        .filter_map(|i| match i {
            ssh_agent_client_rs::Identity::PublicKey(k) => Some(k.into_owned()),
            ssh_agent_client_rs::Identity::Certificate(_) => None,
        })
        .collect();
    let fp = |k: &PublicKey| k.fingerprint(HashAlg::Sha256).to_string();
    let held: Vec<String> = keys.iter().map(fp).collect();
    let key = match want {
        Some(Wanted::Key(k, _)) => keys.iter().find(|h| h.key_data() == k.key_data()),
        Some(Wanted::Fingerprint(f)) => keys.iter().find(|h| fp(h) == *f),
        None if keys.len() == 1 => keys.first(),
        None => {
            return Err(err!(
                kind = Usage,
                hint =
                    "name one: --sign agent:SHA256:... (`ssh-add -l` lists them), or its .pub file",
                "ssh-agent holds {} keys ({}): agent: alone names its only one",
                keys.len(),
                held.join(", ")
            ));
        }
    };
    let Some(key) = key else {
        let wanted = match want {
            Some(Wanted::Key(k, _)) => fp(k),
            Some(Wanted::Fingerprint(f)) => f.clone(),
            None => "a key".into(),
        };
        return Err(err!(
            kind = Usage,
            hint = "add it with `ssh-add KEY` (`ssh-add -l` lists what the agent holds)",
            "Cannot sign with {shown}: {why}ssh-agent does not hold {wanted} (it holds: {})",
            if held.is_empty() {
                "no keys".to_string()
            } else {
                held.join(", ")
            }
        ));
    };
    let data = SshSig::signed_data(namespace, HashAlg::Sha512, msg)
        .map_err(|e| err!(kind = Internal, "Cannot make the data to sign: {e}"))?;
    let signature = client.sign(key, &data).map_err(|e| agent_err(&e))?;
    SshSig::new(
        key.key_data().clone(),
        namespace,
        HashAlg::Sha512,
        signature,
    )
    .map_err(|e| agent_err(&e))
}
