//! The smoke test: what to run on the target ([`VerifyRequest`]) and how it
//! went ([`VerifyReport`]): its exit status or the signal that killed it,
//! whether it ran past its timeout, and where in the Python code it was
//! when it died (from faulthandler's dump, [`crash_location`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Seconds a check may run when neither `--timeout` nor the manifest's
/// `[verify] timeout` says.
pub const DEFAULT_VERIFY_TIMEOUT: u64 = 600;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerifyRequest {
    pub venv: String,
    /// Environment for the check; `{site_packages}` and `{venv}` are expanded.
    pub env: BTreeMap<String, String>,
    /// Python source run with the venv's interpreter.
    pub python: String,
    pub timeout_secs: u64,
    /// Also log into this generation's folder.
    pub generation: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VerifyReport {
    pub ok: bool,
    /// The interpreter's exit status; `None` when a signal killed it.
    pub exit_code: Option<i32>,
    /// The signal that killed the interpreter (7 for SIGBUS, ...).
    #[serde(default)]
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// The timeout it ran with, in seconds.
    #[serde(default)]
    pub timeout_secs: u64,
    /// Where the Python code was when it was killed (a signal or the
    /// timeout): `path:line` of a frame of faulthandler's dump, the path
    /// relative to site-packages when it lies below it.
    #[serde(default)]
    pub location: Option<String>,
    pub stdout: String,
    pub stderr: String,
    /// The log on the target.
    pub log: String,
    pub millis: u64,
}

impl VerifyReport {
    /// The final line of the error (the exception), if it failed.
    pub fn final_line(&self) -> Option<&str> {
        self.stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(str::trim)
    }

    /// Why the check failed, in one line: `timed out after 3 s in
    /// <string>:5`, `killed by SIGBUS (signal 7) in torch/__init__.py:258`,
    /// or the final line of its error output.
    pub fn summary(&self) -> String {
        let at = self
            .location
            .as_deref()
            .map(|l| format!(" in {l}"))
            .unwrap_or_default();
        if self.timed_out {
            return format!("timed out after {} s{at}", self.timeout_secs);
        }
        if let Some(sig) = self.signal {
            return format!("killed by {}{at}", signal_label(sig));
        }
        match (self.final_line(), self.exit_code) {
            (Some(line), _) => line.to_string(),
            (None, Some(code)) => format!("exited with status {code} (no error output)"),
            (None, None) => "(no error output)".to_string(),
        }
    }
}

/// `SIGBUS (signal 7)`, or `signal 70` for a number without a name.
pub fn signal_label(sig: i32) -> String {
    match signal_name(sig) {
        Some(name) => format!("{name} (signal {sig})"),
        None => format!("signal {sig}"),
    }
}

/// The name of signal `sig` (Linux numbering): `SIGBUS` for 7.
pub fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTKFLT => "SIGSTKFLT",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

/// Where faulthandler's dump in `stderr` says the Python code was: of the
/// crashed thread (`Current thread ...`, else the first thread listed),
/// the innermost frame that is the venv's or the check's own code (not
/// `<frozen importlib...>`, not the standard library), else the innermost
/// frame; as `path:line`, the path relative to `site` (site-packages) when
/// it lies below it. `None` when stderr holds no dump.
///
/// The dump's lines (most recent call first):
/// ```text
/// Fatal Python error: Bus error
///
/// Current thread 0x00007f9c111d4b80 (most recent call first):
///   File "/usr/lib/python3.11/ctypes/__init__.py", line 376 in __init__
///   File "/v/lib/python3.11/site-packages/torch/__init__.py", line 258 in <module>
///   File "<string>", line 1 in <module>
/// ```
pub fn crash_location(stderr: &str, site: &str) -> Option<String> {
    // Each thread's frames, innermost first; the crashed thread's block
    // is marked.
    let mut blocks: Vec<(bool, Vec<(String, String)>)> = Vec::new();
    let mut in_block = false;
    for line in stderr.lines() {
        let t = line.trim();
        if t.ends_with("(most recent call first):") {
            blocks.push((t.starts_with("Current thread"), Vec::new()));
            in_block = true;
        } else if in_block && let Some(frame) = dump_frame(t) {
            if let Some(b) = blocks.last_mut() {
                b.1.push(frame);
            }
        } else {
            in_block = false;
        }
    }
    let frames = blocks
        .iter()
        .find(|b| b.0)
        .or_else(|| blocks.first())
        .map(|b| &b.1)?;
    let (file, line) = frames
        .iter()
        .find(|(f, _)| !is_stdlib(f, site))
        .or_else(|| frames.first())?;
    let site = site.trim_end_matches('/');
    let shown = file
        .strip_prefix(site)
        .and_then(|r| r.strip_prefix('/'))
        .unwrap_or(file);
    Some(format!("{shown}:{line}"))
}

/// `File "x.py", line 5 in f` (faulthandler's frame line) as (file, line).
fn dump_frame(t: &str) -> Option<(String, String)> {
    let rest = t.strip_prefix("File \"")?;
    let (file, rest) = rest.rsplit_once("\", line ")?;
    let line: String = rest.chars().take_while(char::is_ascii_digit).collect();
    (!line.is_empty()).then(|| (file.to_string(), line))
}

/// A frame of Python's own machinery: importlib's frozen modules and the
/// standard library (`.../lib/python3.X/...` outside site-packages).
fn is_stdlib(file: &str, site: &str) -> bool {
    if file.starts_with("<frozen ") {
        return true;
    }
    if file.starts_with(site)
        || file.contains("/site-packages/")
        || file.contains("/dist-packages/")
    {
        return false;
    }
    file.split('/')
        .any(|c| c == "python3" || (c.starts_with("python3.") && !c.ends_with(".py")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = "/v/lib/python3.11/site-packages";

    #[test]
    fn names_the_venv_frame_below_the_stdlib() {
        let err = "Fatal Python error: Bus error\n\nCurrent thread 0x00007f9c (most recent call first):\n  File \"/usr/lib/python3.11/ctypes/__init__.py\", line 376 in __init__\n  File \"/v/lib/python3.11/site-packages/torch/__init__.py\", line 258 in <module>\n  File \"<frozen importlib._bootstrap>\", line 241 in _call_with_frames_removed\n  File \"<string>\", line 1 in <module>\n\nExtension modules: x (total: 1)\n";
        assert_eq!(
            crash_location(err, SITE).as_deref(),
            Some("torch/__init__.py:258")
        );
    }

    #[test]
    fn the_check_itself_and_the_crashed_thread() {
        let err = "Fatal Python error: Aborted\n\nThread 0x1 (most recent call first):\n  File \"/v/lib/python3.11/site-packages/a.py\", line 3 in run\n\nCurrent thread 0x2 (most recent call first):\n  File \"/usr/lib/python3.11/ctypes/__init__.py\", line 376 in __init__\n  File \"<string>\", line 5 in hang\n  File \"<string>\", line 7 in <module>\n";
        assert_eq!(crash_location(err, SITE).as_deref(), Some("<string>:5"));
    }

    #[test]
    fn only_the_stdlib_gives_the_innermost_frame_and_no_dump_nothing() {
        let err = "Stack (most recent call first):\n  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n  File \"<frozen runpy>\", line 88 in _run_code\n";
        assert_eq!(
            crash_location(err, SITE).as_deref(),
            Some("/usr/lib/python3.11/threading.py:320")
        );
        assert_eq!(
            crash_location(
                "Traceback (most recent call last):\n  File \"<string>\", line 1, in <module>\n",
                SITE
            ),
            None
        );
    }

    #[test]
    fn summaries() {
        let mut r = VerifyReport {
            ok: false,
            exit_code: None,
            signal: Some(7),
            timed_out: false,
            timeout_secs: 600,
            location: Some("torch/__init__.py:258".into()),
            stdout: String::new(),
            stderr: String::new(),
            log: String::new(),
            millis: 0,
        };
        assert_eq!(
            r.summary(),
            "killed by SIGBUS (signal 7) in torch/__init__.py:258"
        );
        r.timed_out = true;
        r.timeout_secs = 3;
        r.signal = Some(6);
        r.location = Some("<string>:5".into());
        assert_eq!(r.summary(), "timed out after 3 s in <string>:5");
        r.timed_out = false;
        r.signal = None;
        r.location = None;
        r.exit_code = Some(1);
        assert_eq!(r.summary(), "exited with status 1 (no error output)");
        r.stderr = "Traceback ...\nAssertionError: 12.8\n".into();
        assert_eq!(r.summary(), "AssertionError: 12.8");
        assert_eq!(signal_label(70), "signal 70");
        assert_eq!(signal_name(libc::SIGSEGV), Some("SIGSEGV"));
    }
}
