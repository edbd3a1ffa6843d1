//! Host keys: the known_hosts files of the resolved target (and the
//! system-wide ones) parsed as OpenSSH writes them (markers, host pattern
//! lists with `*`, `?` and `!`, hashed `|1|` names), the check of the key
//! the server offers ([`verify_host_key`]: a known key passes, a revoked
//! or changed one is refused, an unknown one is recorded only with
//! `--accept-new-host-key`), and OpenSSH's fingerprints and key type names.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use base64::prelude::{BASE64_STANDARD, BASE64_STANDARD_NO_PAD, Engine as _};
use sha2::{Digest, Sha256};
use ssh2::{CheckResult, KnownHostFileKind, Session};

use super::config::{LocalEnv, Resolved};
use super::connect::Route;
use super::{ConnectOptions, Who, sh_quote};
use crate::err;
use crate::error::Result;

#[derive(Debug, Clone)]
struct KhEntry {
    file: PathBuf,
    line: usize,
    /// `@revoked` or `@cert-authority`.
    marker: Option<String>,
    hosts: String,
    keytype: String,
    key: String,
}

struct KnownHostsDb {
    entries: Vec<KhEntry>,
    /// The files read, for messages.
    files: Vec<PathBuf>,
}

/// A valid key, only used to let libssh2 match hashed (`|1|...`) host names.
const PROBE_KEY: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";

impl KnownHostsDb {
    fn load(r: &Resolved, env: &LocalEnv) -> KnownHostsDb {
        let mut entries = Vec::new();
        let mut files = Vec::new();
        for f in r.known_hosts_files.iter().chain(&env.global_known_hosts) {
            if let Ok(text) = std::fs::read_to_string(f) {
                entries.extend(parse_known_hosts(f, &text));
                files.push(f.clone());
            }
        }
        KnownHostsDb { entries, files }
    }

    fn matches(&self, session: &Session, e: &KhEntry, name: &str) -> bool {
        if e.hosts.starts_with('|') {
            // Hashed: let libssh2 compute the HMAC.
            let Ok(mut kh) = session.known_hosts() else {
                return false;
            };
            let line = format!("{} ssh-ed25519 {PROBE_KEY}", e.hosts);
            if kh.read_str(&line, KnownHostFileKind::OpenSSH).is_err() {
                return false;
            }
            matches!(
                kh.check(name, b"not the probe key"),
                CheckResult::Match | CheckResult::Mismatch
            )
        } else {
            match_host_patterns(&e.hosts, name)
        }
    }
}

fn parse_known_hosts(file: &Path, text: &str) -> Vec<KhEntry> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut f = line.split_whitespace();
        let mut first = f.next();
        let marker = match first {
            Some(m) if m.starts_with('@') => {
                first = f.next();
                Some(m.to_string())
            }
            _ => None,
        };
        let (Some(hosts), Some(keytype), Some(key)) = (first, f.next(), f.next()) else {
            continue;
        };
        out.push(KhEntry {
            file: file.to_path_buf(),
            line: i + 1,
            marker,
            hosts: hosts.to_string(),
            keytype: keytype.to_string(),
            key: key.to_string(),
        });
    }
    out
}

/// OpenSSH's host pattern list: comma-separated, `*` and `?` wildcards,
/// `!` negates (a negated match rejects the whole line), case-insensitive.
fn match_host_patterns(patterns: &str, name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    let mut matched = false;
    for p in patterns.split(',') {
        let (neg, p) = match p.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, p),
        };
        if wildmatch(&p.to_ascii_lowercase(), &name) {
            if neg {
                return false;
            }
            matched = true;
        }
    }
    matched
}

fn wildmatch(pattern: &str, s: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = s.chars().collect();
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// The key types known_hosts holds for this host (unmarked lines), in the
/// order of the lines.
pub(super) fn known_key_types(session: &Session, r: &Resolved, env: &LocalEnv) -> Vec<String> {
    let known = KnownHostsDb::load(r, env);
    let name = r.known_hosts_name();
    known
        .entries
        .iter()
        .filter(|e| e.marker.is_none() && known.matches(session, e, &name))
        .map(|e| e.keytype.clone())
        .collect()
}

/// The algorithm name at the start of an SSH public key blob.
pub(super) fn key_type_of_blob(blob: &[u8]) -> Option<String> {
    let len = u32::from_be_bytes(blob.get(..4)?.try_into().ok()?) as usize;
    let name = blob.get(4..4 + len)?;
    String::from_utf8(name.to_vec()).ok()
}

/// `ssh-ed25519` -> `ED25519`, as OpenSSH prints key types.
pub(super) fn key_type_label(t: &str) -> String {
    match t {
        "ssh-ed25519" => "ED25519".into(),
        "ssh-rsa" => "RSA".into(),
        "ssh-dss" => "DSA".into(),
        t if t.starts_with("ecdsa-") => "ECDSA".into(),
        t => t.to_string(),
    }
}

/// OpenSSH's fingerprint: `SHA256:` and unpadded base64 of the blob's sha256.
pub fn sha256_fingerprint(blob: &[u8]) -> String {
    let d = Sha256::digest(blob);
    format!("SHA256:{}", BASE64_STANDARD_NO_PAD.encode(d.as_slice()))
}

/// The key the server offered, in the forms known_hosts and messages use.
struct OfferedKey {
    /// `ssh-ed25519`, ...
    keytype: String,
    /// `ED25519`, ...
    label: String,
    /// The blob in base64, as known_hosts holds it.
    key64: String,
    fp: String,
}

impl OfferedKey {
    fn new(blob: &[u8]) -> OfferedKey {
        let keytype = key_type_of_blob(blob).unwrap_or_else(|| "unknown".into());
        OfferedKey {
            label: key_type_label(&keytype),
            key64: BASE64_STANDARD.encode(blob),
            fp: sha256_fingerprint(blob),
            keytype,
        }
    }
}

/// What the known_hosts lines for one host name say about the offered key.
#[derive(Default)]
struct Lookup<'a> {
    /// The first `@revoked` line that holds this very key (the search stops there).
    revoked: Option<&'a KhEntry>,
    /// A line holds this key.
    matched: bool,
    /// The first line with another key of the same type.
    changed: Option<&'a KhEntry>,
    /// The first line with a key of another type.
    other_type: Option<&'a KhEntry>,
}

fn lookup<'a>(db: &'a KnownHostsDb, session: &Session, name: &str, key: &OfferedKey) -> Lookup<'a> {
    let mut found = Lookup::default();
    for e in &db.entries {
        if !db.matches(session, e, name) {
            continue;
        }
        match e.marker.as_deref() {
            Some("@revoked") if e.key == key.key64 => {
                found.revoked = Some(e);
                break;
            }
            Some(_) => {}
            None if e.keytype == key.keytype && e.key == key.key64 => found.matched = true,
            None if e.keytype == key.keytype => {
                found.changed.get_or_insert(e);
            }
            None => {
                found.other_type.get_or_insert(e);
            }
        }
    }
    found
}

/// Check the server's host key against known_hosts; record it when it is
/// new and `opts.accept_new_host_key` allows.
pub(super) fn verify_host_key(
    who: Who<'_>,
    session: &Session,
    r: &Resolved,
    opts: &ConnectOptions,
    env: &LocalEnv,
    addr: &Route,
) -> Result<()> {
    let (blob, _) = session.host_key().ok_or_else(|| {
        err!(
            kind = HostKey,
            hint = "check the server's sshd logs",
            "Failed to check the host key of {who} at {addr}: the server sent none"
        )
    })?;
    let key = OfferedKey::new(blob);
    let OfferedKey { label, fp, .. } = &key;
    let name = r.known_hosts_name();
    let db = KnownHostsDb::load(r, env);
    let found = lookup(&db, session, &name, &key);

    if let Some(e) = found.revoked {
        return Err(err!(
            kind = HostKey,
            hint = "ask the host's administrator; never remove a @revoked line to get past this",
            "Refusing to connect to {who} at {addr}: its {label} host key {fp} is marked @revoked in {}:{}",
            e.file.display(),
            e.line
        ));
    }
    if found.matched {
        return Ok(());
    }
    let remove_hint = |e: &KhEntry| {
        format!(
            "ssh-keygen -R {} -f {}",
            sh_quote(&name),
            sh_quote(&e.file.display().to_string())
        )
    };
    if let Some(e) = found.changed {
        return Err(err!(
            kind = HostKey,
            hint = format!(
                "someone may be intercepting the connection. Only if you know {} was reinstalled or re-keyed, remove the old key with `{}` and run again",
                r.hostname,
                remove_hint(e)
            ),
            "Refusing to connect to {who} at {addr}: the host key CHANGED. {}:{} holds another {label} key for {name}; the server now offers {label} key {fp}",
            e.file.display(),
            e.line
        ));
    }
    if let Some(e) = found.other_type {
        return Err(err!(
            kind = HostKey,
            hint = format!(
                "if {} was re-keyed, remove the old entry with `{}` and run again (with --accept-new-host-key to record the new key)",
                r.hostname,
                remove_hint(e)
            ),
            "Refusing to connect to {who} at {addr}: {}:{} knows {name} by a {} key, but the server offers only {label} key {fp}",
            e.file.display(),
            e.line,
            key_type_label(&e.keytype)
        ));
    }
    unknown_host_key(who, r, opts, addr, &db, &key)
}

/// A host key not known at all: refused, or recorded in the first
/// known_hosts file with `--accept-new-host-key`.
fn unknown_host_key(
    who: Who<'_>,
    r: &Resolved,
    opts: &ConnectOptions,
    addr: &Route,
    db: &KnownHostsDb,
    key: &OfferedKey,
) -> Result<()> {
    let OfferedKey {
        keytype,
        label,
        key64,
        fp,
    } = key;
    let name = r.known_hosts_name();
    let Some(file) = r.known_hosts_files.first() else {
        return Err(err!(
            kind = HostKey,
            hint = "set UserKnownHostsFile in ~/.ssh/config to a file overlay can read and write",
            "Refusing to connect to {who} at {addr}: its host key {fp} is unknown and UserKnownHostsFile is none"
        ));
    };
    if !opts.accept_new_host_key {
        let looked = if db.files.is_empty() {
            format!("{} does not exist", file.display())
        } else {
            format!(
                "not in {}",
                db.files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return Err(err!(
            kind = HostKey,
            hint = format!(
                "verify that {fp} is the host's key (connect once with `{}`, or run `ssh-keygen -lf /etc/ssh/ssh_host_{}_key.pub` on the host), then run again with --accept-new-host-key",
                ssh_command_for(who.target, r),
                keytype_file_stem(keytype)
            ),
            "Refusing to connect to {who} at {addr}: the host key of {name} is unknown ({looked}); the server offers {label} key {fp}"
        ));
    }
    append_known_host(file, &name, keytype, key64).map_err(|e| {
        err!(
            kind = Host,
            hint = "fix the permissions of that file or of ~/.ssh",
            "Failed to record the host key of {who} in {}: {}",
            file.display(),
            crate::error::io_cause(&e)
        )
    })?;
    eprintln!(
        "warning: {}: permanently added the {label} host key {fp} for {name} to {}",
        who.host,
        file.display()
    );
    Ok(())
}

fn keytype_file_stem(t: &str) -> &'static str {
    match t {
        "ssh-rsa" => "rsa",
        "ssh-dss" => "dsa",
        t if t.starts_with("ecdsa-") => "ecdsa",
        _ => "ed25519",
    }
}

/// What the user would type to connect with OpenSSH (for hints only).
fn ssh_command_for(target: &str, r: &Resolved) -> String {
    if !target.contains('@') && !target.contains(':') {
        return format!("ssh {target}");
    }
    if r.port == 22 {
        format!("ssh {}@{}", r.user, r.hostname)
    } else {
        format!("ssh -p {} {}@{}", r.port, r.user, r.hostname)
    }
}

/// Append one OpenSSH-format line, creating the file (and its directory, 0700).
fn append_known_host(file: &Path, name: &str, keytype: &str, key64: &str) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    let needs_newline = match std::fs::read(file) {
        Ok(b) => !b.is_empty() && !b.ends_with(b"\n"),
        Err(_) => false,
    };
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(file)?;
    let line = format!(
        "{}{name} {keytype} {key64}\n",
        if needs_newline { "\n" } else { "" }
    );
    f.write_all(line.as_bytes())?;
    f.sync_all()
}

// ---------------------------------------------------------------------------
// Authentication

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_known_hosts_patterns() {
        assert!(match_host_patterns("box,10.0.0.1", "box"));
        assert!(match_host_patterns("BOX", "box"));
        assert!(match_host_patterns("*.lan", "a.lan"));
        assert!(!match_host_patterns("*.lan", "a.lan.evil"));
        assert!(match_host_patterns("[10.0.0.?]:2222", "[10.0.0.5]:2222"));
        assert!(!match_host_patterns("[box]:2222", "box"));
        assert!(!match_host_patterns("*.lan,!bad.lan", "bad.lan"));
        assert!(match_host_patterns("*.lan,!bad.lan", "good.lan"));
        assert!(wildmatch("a*b*c", "aXbYbZc"));
        assert!(!wildmatch("a*b", "aXbY"));

        let text = "# comment\n\nbox ssh-ed25519 AAAA one\n@revoked * ssh-rsa BBBB\n@cert-authority *.lan ssh-ed25519 CCCC\nbroken-line\n";
        let e = parse_known_hosts(Path::new("kh"), text);
        assert_eq!(e.len(), 3);
        assert_eq!(
            (
                e[0].line,
                e[0].hosts.as_str(),
                e[0].keytype.as_str(),
                e[0].key.as_str()
            ),
            (3, "box", "ssh-ed25519", "AAAA")
        );
        assert_eq!(e[1].marker.as_deref(), Some("@revoked"));
        assert_eq!(e[2].marker.as_deref(), Some("@cert-authority"));
    }

    #[test]
    fn fingerprints_and_key_types() {
        // sha256 of nothing, as OpenSSH prints fingerprints: unpadded base64.
        assert_eq!(
            sha256_fingerprint(b""),
            "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU"
        );
        assert_eq!(
            BASE64_STANDARD
                .decode(PROBE_KEY)
                .ok()
                .map(|b| key_type_of_blob(&b)),
            Some(Some("ssh-ed25519".into()))
        );
        assert_eq!(OfferedKey::new(b"\0\0\0\x0bssh-ed25519").label, "ED25519");
        assert_eq!(BASE64_STANDARD.encode(b"f"), "Zg==");
    }
}
