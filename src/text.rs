//! Text shown on a terminal: file names, distribution names, versions and
//! messages that quote them come from RECORD files, METADATA and remote
//! hosts, and may hold terminal control characters (ESC, CR, newline, DEL,
//! C1 controls). Printed raw they could recolour, move the cursor, rewrite
//! lines or forge a line of output. Human output shows them escaped, C
//! style, as git does with `core.quotePath`; `--json` carries them exactly.
//!
//! - [`quote`] is for one name or value: unchanged when it is plain, else
//!   in double quotes with `\"`, `\\`, `\n`, `\t`, `\r`, ... and `\ooo`
//!   octal escapes (git's form: `"a\033[31mb"`).
//! - [`escape`] is for free text (error messages, hints): control
//!   characters are escaped the same way, but nothing is quoted, so a
//!   message stays one line however hostile the names in it.
//!
//! It also holds the two plain formats the crate shares: [`hex`] and the
//! UTC timestamp of generation ids and logs ([`format_time`]).
//!
//! Printable non-ASCII characters (UTF-8 letters, the U+FFFD that a lossy
//! conversion put in place of invalid bytes) are left as they are.

use std::borrow::Cow;

/// Whether `c` must not reach a terminal raw: C0 controls, DEL, C1 controls.
fn is_control(c: char) -> bool {
    matches!(c, '\0'..='\x1f' | '\x7f' | '\u{80}'..='\u{9f}')
}

/// Append the escape for control character `c`.
fn push_escape(out: &mut String, c: char) {
    match c {
        '\x07' => out.push_str("\\a"),
        '\x08' => out.push_str("\\b"),
        '\t' => out.push_str("\\t"),
        '\n' => out.push_str("\\n"),
        '\x0b' => out.push_str("\\v"),
        '\x0c' => out.push_str("\\f"),
        '\r' => out.push_str("\\r"),
        _ => {
            // Octal of each UTF-8 byte, as git writes them (C1 is two bytes).
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("\\{b:03o}"));
            }
        }
    }
}

/// `s` for a terminal: control characters escaped, nothing else changed.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_control(c) {
            push_escape(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// One name or value for a terminal: as it is when it has no control
/// character, `"` or `\`; else in double quotes with those escaped.
pub fn quote(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| is_control(c) || c == '"' || c == '\\') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if is_control(c) => push_escape(&mut out, c),
            c => out.push(c),
        }
    }
    out.push('"');
    Cow::Owned(out)
}

/// One word for a POSIX shell: as it is when it holds only characters no
/// shell treats specially, else in single quotes (a `'` as `'\''`).
pub fn shell_quote(s: &str) -> Cow<'_, str> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./+=:,@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(format!("'{}'", s.replace('\'', "'\\''")))
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// `secs` since the epoch as `YYYYMMDDTHHMMSSZ` (UTC).
/// `YYYYMMDDTHHMMSSZ` from seconds since the epoch (UTC).
pub fn format_time(secs: u64) -> String {
    let days = secs / 86400;
    let rem = secs % 86400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn shell_quote_leaves_plain_words_and_quotes_the_rest() {
        use super::shell_quote;
        assert_eq!(shell_quote("c-plan.json"), "c-plan.json");
        assert_eq!(shell_quote("/tmp/a b.json"), "'/tmp/a b.json'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote("$x"), "'$x'");
        assert_eq!(shell_quote(""), "''");
    }

    use super::*;

    #[test]
    fn time_format() {
        assert_eq!(format_time(0), "19700101T000000Z");
        assert_eq!(format_time(1_796_043_722), "20261130T130202Z");
    }

    #[test]
    fn plain_text_is_borrowed() {
        for s in [
            "",
            "torch/lib/libc10.so",
            "a b,c'$`",
            "naïve/日本.py",
            "x\u{fffd}y",
        ] {
            assert!(matches!(escape(s), Cow::Borrowed(_)), "{s}");
            assert!(matches!(quote(s), Cow::Borrowed(_)), "{s}");
        }
    }

    #[test]
    fn escapes_controls_as_git_does() {
        assert_eq!(escape("a\x1b[31mb"), "a\\033[31mb");
        assert_eq!(
            escape("l1\nl2\r\tx\x07\x08\x0b\x0c"),
            "l1\\nl2\\r\\tx\\a\\b\\v\\f"
        );
        assert_eq!(escape("nul\0del\x7f"), "nul\\000del\\177");
        // C1 controls (CSI is U+009B), as their UTF-8 bytes.
        assert_eq!(escape("a\u{9b}31mb"), "a\\302\\23331mb");
        assert_eq!(escape("a\u{85}b"), "a\\302\\205b");
        // Backslashes and quotes are left alone in free text.
        assert_eq!(escape("C:\\x \"y\"\n"), "C:\\x \"y\"\\n");
        // Non-ASCII printable characters stay.
        assert_eq!(escape("é\x1b"), "é\\033");
    }

    #[test]
    fn quotes_names_that_need_it() {
        assert_eq!(quote("a\x1b[31m\nb.py"), "\"a\\033[31m\\nb.py\"");
        assert_eq!(quote("a\"b"), "\"a\\\"b\"");
        assert_eq!(quote("a\\nb"), "\"a\\\\nb\"");
        assert_eq!(quote("日本\r"), "\"日本\\r\"");
    }

    #[test]
    fn output_has_no_control_characters() {
        let all: String = (0u32..0x200).filter_map(char::from_u32).collect();
        for s in [escape(&all), quote(&all)] {
            assert!(!s.chars().any(is_control), "{s:?}");
        }
    }
}
