//! The recorder: Debian's `strace` over the real `overlay` binary, every
//! process and thread of it (`-f`: the controller, the local agent, its
//! copy lanes and undo threads), file descriptors decoded to the path they
//! name at the moment of the call (`-y`), every string and path in hex
//! (`-xx`, so that no quote, comma or bracket in a name can confuse the
//! parser), flags as numbers (`-X raw`) and whole write payloads (`-s`).
//! [`record`] runs a command under it; [`parse`] turns the log into
//! [`Call`]s in the order they completed, a call that another thread
//! interrupted (`<unfinished ...>`, `<... resumed>`) joined back into one.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// The calls that only read, which the model passes over; any other call
/// that names a path or fd in the venv and that the model does not replay
/// fails the test (`model.rs`). Every call is recorded (no `-e trace=`
/// filter), so a call that changes the tree cannot go unseen.
pub const READ_ONLY: &[&str] = &[
    "access",
    "faccessat",
    "faccessat2",
    "stat",
    "lstat",
    "fstat",
    "newfstatat",
    "statx",
    "statfs",
    "fstatfs",
    "getdents64",
    "readlink",
    "readlinkat",
    "flock",
    "fadvise64",
    "readahead",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "preadv",
    "preadv2",
    "mmap",
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "execve",
    "wait4",
];

/// Run `cmd` under strace, the log to `log`. Returns the command's exit
/// status and its stderr (strace's own output goes to the log).
pub fn record(cmd: &Command, log: &Path) -> (std::process::ExitStatus, String) {
    let mut s = Command::new("strace");
    s.args([
        "-f",
        "-qq",
        "-y",
        "-xx",
        "-X",
        "raw",
        "-s",
        "1000000000",
        "-e",
        "signal=none",
    ])
    .arg("-o")
    .arg(log)
    .arg(cmd.get_program())
    .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => s.env(k, v),
            None => s.env_remove(k),
        };
    }
    if let Some(d) = cmd.get_current_dir() {
        s.current_dir(d);
    }
    let out = s
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run strace (run scripts/setup): {e}"));
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One completed system call.
#[derive(Debug, Clone)]
pub struct Call {
    pub tid: u32,
    pub name: String,
    /// The arguments, split at the top-level commas, still escaped.
    pub args: Vec<String>,
    /// The return value as printed (`0`, `5<\x2f...>`, `-1 ENOENT (...)`).
    pub ret: String,
    /// The line number in the log where it completed, for messages.
    pub line: usize,
}

impl Call {
    /// The numeric return value (`-1` on an error, `None` for `?`).
    pub fn ret_value(&self) -> Option<i64> {
        let t = self.ret.split(['<', ' ']).next()?;
        parse_int(t)
    }

    pub fn ok(&self) -> bool {
        self.ret_value().is_some_and(|v| v >= 0)
    }

    /// The path an fd returned by the call names (`= 5</a/b>`).
    pub fn ret_path(&self) -> Option<Vec<u8>> {
        fd_arg(&self.ret).1
    }
}

/// Parse a log written by [`record`].
pub fn parse(log: &Path) -> Vec<Call> {
    let text = std::fs::read(log).unwrap();
    let text = String::from_utf8_lossy(&text);
    let mut pending: HashMap<u32, (String, String)> = HashMap::new();
    let mut calls = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some((tid, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(tid) = tid.parse::<u32>() else {
            continue;
        };
        let rest = rest.trim_start();
        if rest.starts_with("+++") || rest.starts_with("---") {
            continue;
        }
        let (name, body) = if let Some(r) = rest.strip_prefix("<... ") {
            let (name, tail) = r
                .split_once(" resumed>")
                .unwrap_or_else(|| panic!("line {}: {line}", n + 1));
            let (_, head) = pending
                .remove(&tid)
                .unwrap_or_else(|| panic!("line {}: resumed without a start", n + 1));
            (name.to_string(), format!("{head}{tail}"))
        } else {
            let open = rest
                .find('(')
                .unwrap_or_else(|| panic!("line {}: {line}", n + 1));
            (rest[..open].to_string(), rest[open + 1..].to_string())
        };
        if let Some(head) = body.strip_suffix(" <unfinished ...>") {
            if name == "close" {
                // The fd is free from the call's start: another thread's
                // open may return it before this close is logged done.
                let args = split_args(head);
                calls.push(Call {
                    tid,
                    name: name.clone(),
                    args,
                    ret: "0".into(),
                    line: n + 1,
                });
            }
            pending.insert(tid, (name, head.to_string()));
            continue;
        }
        if name == "close" && rest.starts_with("<... ") {
            continue;
        }
        // `...) = 0`, or `...)      = 0` after a resumed call.
        let Some(at) = body
            .match_indices(" = ")
            .map(|(i, _)| i)
            .filter(|&i| body[..i].trim_end().ends_with(')'))
            .last()
        else {
            continue;
        };
        let args = body[..at].trim_end();
        calls.push(Call {
            tid,
            name,
            args: split_args(&args[..args.len() - 1]),
            ret: body[at + 3..].trim().to_string(),
            line: n + 1,
        });
    }
    calls
}

/// Split an argument list at its top-level commas.
fn split_args(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth, mut quoted) = (Vec::new(), String::new(), 0i32, false);
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                cur.push(c);
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
                continue;
            }
            '"' => quoted = !quoted,
            '(' | '[' | '{' | '<' if !quoted => depth += 1,
            ')' | ']' | '}' | '>' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// Decode strace's `\xHH` escapes (and any plain characters) into bytes.
pub fn unhex(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len() / 4);
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b.get(i + 1) == Some(&b'x') {
            let h = std::str::from_utf8(&b[i + 2..i + 4]).unwrap();
            out.push(u8::from_str_radix(h, 16).unwrap());
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// A quoted string argument (`"\x61\x62"`), decoded; `None` for `NULL`.
pub fn str_arg(a: &str) -> Option<Vec<u8>> {
    let a = a.trim();
    let a = a.strip_suffix("...").unwrap_or(a);
    let inner = a.strip_prefix('"')?.strip_suffix('"')?;
    Some(unhex(inner))
}

/// An fd argument: its number and, with `-y`, the path it names.
pub fn fd_arg(a: &str) -> (i64, Option<Vec<u8>>) {
    let a = a.trim();
    match a.find('<') {
        Some(i) => {
            let n = parse_int(&a[..i]).unwrap_or(-1);
            let p = a[i + 1..].strip_suffix('>').unwrap_or(&a[i + 1..]);
            (n, Some(unhex(p)))
        }
        None => (parse_int(a).unwrap_or(-1), None),
    }
}

/// An integer as strace prints it: decimal, `0x` hex, `0` octal, and
/// `A|B` sums of raw flags.
pub fn parse_int(a: &str) -> Option<i64> {
    let a = a.trim();
    if a.contains('|') {
        return a.split('|').map(parse_int).sum();
    }
    let (neg, a) = match a.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, a),
    };
    let v = if let Some(h) = a.strip_prefix("0x") {
        i64::from_str_radix(h, 16).ok()?
    } else if a.len() > 1 && a.starts_with('0') {
        i64::from_str_radix(&a[1..], 8).ok()?
    } else {
        a.parse().ok()?
    };
    Some(if neg { -v } else { v })
}

/// The value of `[N]` (an in-out offset argument), `None` for `NULL`.
pub fn ptr_int(a: &str) -> Option<i64> {
    let inner = a.trim().strip_prefix('[')?.strip_suffix(']')?;
    parse_int(inner.split(" => ").next()?)
}

/// A field of a struct argument (`{flags=0x2a0000, resolve=0x12}`).
pub fn field(a: &str, name: &str) -> Option<i64> {
    let inner = a.trim().strip_prefix('{')?.strip_suffix('}')?;
    split_args(inner)
        .iter()
        .find_map(|f| f.strip_prefix(&format!("{name}=")).and_then(parse_int))
}

/// The decoded payloads of an iovec array (`[{iov_base="..", iov_len=N}, ..]`).
pub fn iov_bytes(a: &str) -> Vec<u8> {
    let inner = a.trim().trim_start_matches('[').trim_end_matches(']');
    let mut out = Vec::new();
    for item in split_args(inner) {
        let inner = item.trim_start_matches('{').trim_end_matches('}');
        for f in split_args(inner) {
            if let Some(s) = f.strip_prefix("iov_base=") {
                out.extend(str_arg(s).unwrap_or_default());
            }
        }
    }
    out
}
