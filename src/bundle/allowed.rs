//! OpenSSH's allowed_signers file (ssh-keygen(1), "ALLOWED SIGNERS"), as
//! `ssh-keygen -Y verify` reads it: one key per line,
//! `PRINCIPALS [OPTIONS] KEYTYPE BASE64 [COMMENT]`, `#` comments and blank
//! lines ignored. PRINCIPALS is a comma-separated list of patterns
//! (quoted if it holds spaces); OPTIONS are `cert-authority`,
//! `namespaces="PATTERN,..."`, `valid-after="TIME"` and
//! `valid-before="TIME"` (TIME is `YYYYMMDD[HHMM[SS]]Z`: overlay takes only
//! UTC times, where ssh-keygen reads a time without `Z` as local time).
//! An unknown option or a line that does not parse is an error naming the
//! file and line, as it fails `ssh-keygen -Y verify`: a trust file is
//! never half read.

use std::path::Path;

use ssh_key::PublicKey;

use crate::err;
use crate::error::{Result, io_cause};

/// The largest allowed_signers file read (bytes).
const LIMIT: u64 = 16 << 20;

/// One line of an allowed_signers file.
#[derive(Debug, Clone)]
pub struct AllowedSigner {
    /// 1-based.
    pub line: usize,
    /// As written (without quotes): comma-separated patterns.
    pub principals: String,
    pub key: PublicKey,
    /// `cert-authority`: the key signs certificates, not messages.
    pub cert_authority: bool,
    /// `namespaces="..."`: `None` allows every namespace.
    pub namespaces: Option<String>,
    /// Seconds since the epoch (UTC).
    pub valid_after: Option<u64>,
    pub valid_before: Option<u64>,
}

impl AllowedSigner {
    /// Does this line allow signatures of `namespace` at `now`? `Err`
    /// says why not.
    pub fn allows(&self, namespace: &str, now: u64) -> std::result::Result<(), String> {
        if self.cert_authority {
            return Err("it is a cert-authority line (overlay reads no certificates)".into());
        }
        if let Some(ns) = &self.namespaces
            && !match_list(namespace, ns)
        {
            return Err(format!("its namespaces=\"{ns}\" leave out {namespace}"));
        }
        if self.valid_after.is_some_and(|t| now < t) {
            return Err("its valid-after time is still to come".into());
        }
        if self.valid_before.is_some_and(|t| now >= t) {
            return Err("its valid-before time has passed".into());
        }
        Ok(())
    }
}

/// Read and parse the allowed_signers file at `path`.
pub fn read(path: &Path) -> Result<Vec<AllowedSigner>> {
    use std::io::Read;
    let shown = path.display();
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(LIMIT).read_to_string(&mut text))
        .map_err(|e| {
            err!(
                kind = Usage,
                hint = "give an allowed_signers file (ssh-keygen(1), ALLOWED SIGNERS) with --trust, or fix its permissions",
                "Cannot read the allowed_signers file {shown}: {}",
                io_cause(&e)
            )
        })?;
    parse(&text).map_err(|(line, why)| {
        err!(
            kind = Usage,
            hint = "each line is `PRINCIPALS [OPTIONS] KEYTYPE BASE64 [COMMENT]`, e.g. `ops@example namespaces=\"overlay-bundle\" ssh-ed25519 AAAA...` (ssh-keygen(1), ALLOWED SIGNERS)",
            "The allowed_signers file {shown}:{line}: {why}"
        )
    })
}

/// Parse an allowed_signers file's text; `Err` has the 1-based line.
pub fn parse(text: &str) -> std::result::Result<Vec<AllowedSigner>, (usize, String)> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(parse_line(line).map_err(|why| (i + 1, why))?);
        if let Some(last) = out.last_mut() {
            last.line = i + 1;
        }
    }
    Ok(out)
}

fn parse_line(line: &str) -> std::result::Result<AllowedSigner, String> {
    let mut tokens = Tokens(line);
    let principals = tokens.next()?.ok_or("no principals")?;
    let principals = unquote(principals);
    if principals.is_empty() {
        return Err("empty principals".into());
    }
    let mut next = tokens.next()?.ok_or("no key after the principals")?;
    let mut opts = Options::default();
    if !is_key_type(next) {
        options(next, &mut opts)?;
        next = tokens.next()?.ok_or("no key after the options")?;
    }
    let ktype = next;
    let b64 = tokens.next()?.ok_or("no key data after the key type")?;
    let key = PublicKey::from_openssh(&format!("{ktype} {b64}"))
        .map_err(|e| format!("the key {ktype} {b64:.12}... does not parse: {e}"))?;
    Ok(AllowedSigner {
        line: 0,
        principals: principals.to_string(),
        key,
        cert_authority: opts.cert_authority,
        namespaces: opts.namespaces,
        valid_after: opts.valid_after,
        valid_before: opts.valid_before,
    })
}

/// A line's options.
#[derive(Default)]
struct Options {
    cert_authority: bool,
    namespaces: Option<String>,
    valid_after: Option<u64>,
    valid_before: Option<u64>,
}

/// The key types an allowed_signers line may give.
fn is_key_type(s: &str) -> bool {
    s.starts_with("ssh-") || s.starts_with("ecdsa-sha2-") || s.starts_with("sk-")
}

/// Apply the comma-separated OPTIONS token to `signer`.
fn options(token: &str, signer: &mut Options) -> std::result::Result<(), String> {
    for opt in split_outside_quotes(token, ',') {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt, None),
        };
        let value = || -> std::result::Result<&str, String> {
            let v = value.ok_or_else(|| format!("option {name} needs a value"))?;
            v.strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .ok_or_else(|| format!("option {name}'s value is not in double quotes"))
        };
        match name.to_ascii_lowercase().as_str() {
            "cert-authority" => signer.cert_authority = true,
            "namespaces" => signer.namespaces = Some(value()?.to_string()),
            "valid-after" => signer.valid_after = Some(time(value()?)?),
            "valid-before" => signer.valid_before = Some(time(value()?)?),
            _ => return Err(format!("unknown option {opt:?}")),
        }
    }
    Ok(())
}

/// `YYYYMMDD[HHMM[SS]]Z` as seconds since the epoch.
fn time(s: &str) -> std::result::Result<u64, String> {
    let bad = || format!("time {s:?} is not YYYYMMDD[HHMM[SS]]Z");
    let digits = s
        .strip_suffix('Z')
        .or_else(|| s.strip_suffix('z'))
        .ok_or_else(|| {
            format!("time {s:?} has no Z: overlay reads only UTC times (ssh-keygen would read it as local time); add Z")
        })?;
    if !matches!(digits.len(), 8 | 12 | 14) || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return Err(bad());
    }
    let n = |a: usize, b: usize| {
        digits
            .get(a..b)
            .map_or(0, |d| d.parse::<i64>().unwrap_or(0))
    };
    let (y, m, d) = (n(0, 4), n(4, 6), n(6, 8));
    let (hh, mm, ss) = (n(8, 10), n(10, 12), n(12, 14));
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return Err(bad());
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).map_err(|_| bad())
}

/// Whitespace-separated tokens; double quotes hold spaces.
struct Tokens<'a>(&'a str);

impl<'a> Tokens<'a> {
    fn next(&mut self) -> std::result::Result<Option<&'a str>, String> {
        let s = self.0.trim_start();
        if s.is_empty() {
            return Ok(None);
        }
        let mut quoted = false;
        let mut end = s.len();
        for (i, c) in s.char_indices() {
            match c {
                '"' => quoted = !quoted,
                c if c.is_whitespace() && !quoted => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        if quoted {
            return Err("a double quote is not closed".into());
        }
        self.0 = &s[end..];
        Ok(Some(&s[..end]))
    }
}

fn unquote(s: &str) -> &str {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
}

fn split_outside_quotes(s: &str, sep: char) -> Vec<&str> {
    let (mut out, mut start, mut quoted) = (Vec::new(), 0, false);
    for (i, c) in s.char_indices() {
        if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            out.push(&s[start..i]);
            start = i + 1;
        }
    }
    out.push(&s[start..]);
    out
}

/// OpenSSH's `match_pattern_list`: `name` matches the comma-separated
/// `patterns` if one matches and no negated one (`!PATTERN`) does.
pub fn match_list(name: &str, patterns: &str) -> bool {
    let mut matched = false;
    for p in patterns.split(',').map(str::trim) {
        if let Some(neg) = p.strip_prefix('!') {
            if glob(neg.as_bytes(), name.as_bytes()) {
                return false;
            }
        } else if glob(p.as_bytes(), name.as_bytes()) {
            matched = true;
        }
    }
    matched
}

/// `*` and `?` wildcards, as OpenSSH's `match_pattern`.
fn glob(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob(&p[1..], s) || (!s.is_empty() && glob(p, &s[1..])),
        (Some(b'?'), Some(_)) => glob(&p[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => glob(&p[1..], &s[1..]),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";

    #[test]
    fn lines_with_options_quotes_and_comments_parse() {
        let text = format!(
            "# ops\n\n{KEY} \n ops@example,\"a b\" {KEY} laptop\n\"ci bot\" namespaces=\"overlay-bundle,git\",valid-after=\"20260101Z\",valid-before=\"203001011200Z\" {KEY}\n* cert-authority {KEY}\n"
        );
        // The first line has a key where the principals go: its "key" is the base64.
        let e = parse(&text).unwrap_err();
        assert_eq!(e.0, 3, "{e:?}");
        let text = text.replacen(&format!("{KEY} \n"), "", 1);
        let s = parse(&text).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].principals, "ops@example,\"a b\"");
        assert_eq!(s[1].principals, "ci bot");
        assert_eq!(s[1].namespaces.as_deref(), Some("overlay-bundle,git"));
        assert_eq!(s[1].valid_after, Some(1_767_225_600));
        assert_eq!(s[1].valid_before, Some(1_893_499_200));
        assert!(s[1].allows("overlay-bundle", 1_800_000_000).is_ok());
        assert!(s[1].allows("file", 1_800_000_000).is_err());
        assert!(s[1].allows("overlay-bundle", 1_700_000_000).is_err());
        assert!(s[1].allows("overlay-bundle", 1_900_000_000).is_err());
        assert!(s[2].cert_authority && s[2].allows("overlay-bundle", 0).is_err());
        assert_eq!(s[2].line, 5);
    }

    #[test]
    fn bad_lines_name_themselves() {
        for (text, want) in [
            (format!("a frobnicate {KEY}"), "unknown option"),
            (format!("a valid-after=\"20260101\" {KEY}"), "has no Z"),
            (format!("a valid-after=\"2026Z\" {KEY}"), "not YYYYMMDD"),
            ("a ssh-ed25519 AAAAnotbase64".to_string(), "does not parse"),
            (format!("\"a {KEY}"), "not closed"),
            ("a".to_string(), "no key"),
        ] {
            let e = parse(&format!("# x\n{text}\n")).unwrap_err();
            assert_eq!(e.0, 2, "{text}");
            assert!(e.1.contains(want), "{text}: {}", e.1);
        }
    }

    #[test]
    fn patterns_match_as_openssh_does() {
        assert!(match_list("overlay-bundle", "overlay-*"));
        assert!(match_list("overlay-bundle", "git,overlay-bundle"));
        assert!(!match_list("overlay-bundle", "overlay-*,!overlay-bundle"));
        assert!(!match_list("overlay-bundle", "file"));
        assert!(match_list("overlay-bundle", "overlay-bundl?"));
    }
}
