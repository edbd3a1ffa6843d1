//! The `/proc` and `/etc/passwd` text the process scan reads, parsed
//! (`stat`, `cmdline`, `maps` lines, `status`'s uid, passwd, and
//! `nvidia-smi --query-compute-apps`): pure functions, tested apart.

use std::collections::HashMap;

/// The fields of `/proc/PID/stat` this module reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub comm: String,
    pub state: u8,
    pub ppid: u32,
    pub flags: u64,
    /// Clock ticks after boot.
    pub starttime: u64,
}

/// Parse `/proc/PID/stat`: `pid (comm) state ppid ...`, where comm may
/// hold spaces and parentheses (it ends at the last `)`).
pub(crate) fn parse_stat(b: &[u8]) -> Option<ProcStat> {
    let open = b.iter().position(|&c| c == b'(')?;
    let close = b.iter().rposition(|&c| c == b')')?;
    if close < open {
        return None;
    }
    let comm = String::from_utf8_lossy(&b[open + 1..close]).into_owned();
    let rest = std::str::from_utf8(b.get(close + 1..)?).ok()?;
    // Fields after comm, from field 3 (state).
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    Some(ProcStat {
        comm,
        state: *f.first()?.as_bytes().first()?,
        ppid: f.get(1)?.parse().ok()?,
        flags: f.get(6)?.parse().ok()?,
        starttime: f.get(19)?.parse().ok()?,
    })
}

/// The arguments of `/proc/PID/cmdline`: NUL-separated, the last one
/// NUL-terminated (a process that rewrote its title may leave one string
/// with spaces, or trailing NULs).
pub(crate) fn parse_cmdline(b: &[u8]) -> Vec<String> {
    let b = b.strip_suffix(b"\0").unwrap_or(b);
    if b.is_empty() {
        return Vec::new();
    }
    let mut args: Vec<String> = b
        .split(|&c| c == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    while args.last().is_some_and(|a| a.is_empty()) {
        args.pop();
    }
    args
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MapsLine<'a> {
    pub dev: u64,
    pub inode: u64,
    /// The path as the process sees it (may hold spaces), without a
    /// ` (deleted)` mark; `None` for an anonymous mapping.
    pub path: Option<&'a [u8]>,
    /// The file was deleted (or replaced) since it was mapped.
    pub deleted: bool,
}

/// Parse `start-end perms offset major:minor inode [path]`.
pub(crate) fn parse_maps_line(line: &[u8]) -> Option<MapsLine<'_>> {
    let mut rest = line;
    let mut field = || -> Option<&[u8]> {
        let start = rest.iter().position(|&c| c != b' ')?;
        rest = &rest[start..];
        let end = rest.iter().position(|&c| c == b' ').unwrap_or(rest.len());
        let (f, r) = rest.split_at(end);
        rest = r;
        Some(f)
    };
    let _range = field()?;
    let _perms = field()?;
    let _offset = field()?;
    let dev = std::str::from_utf8(field()?).ok()?;
    let inode: u64 = std::str::from_utf8(field()?).ok()?.parse().ok()?;
    let (maj, min) = dev.split_once(':')?;
    let dev = rustix::fs::makedev(
        u32::from_str_radix(maj, 16).ok()?,
        u32::from_str_radix(min, 16).ok()?,
    );
    let path = rest.trim_ascii_start();
    let (path, deleted) = match path.strip_suffix(b" (deleted)") {
        Some(p) => (p, true),
        None => (path, false),
    };
    Some(MapsLine {
        dev,
        inode,
        path: (!path.is_empty()).then_some(path),
        deleted,
    })
}

/// The effective uid from `/proc/PID/status` (`Uid: real effective ...`).
pub(crate) fn parse_uid(b: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(b).ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// uid to user name from `/etc/passwd` (the first name of a uid wins).
pub(crate) fn parse_passwd(b: &[u8]) -> HashMap<u32, String> {
    let mut out = HashMap::new();
    for line in String::from_utf8_lossy(b).lines() {
        let mut f = line.split(':');
        let (Some(name), Some(_), Some(uid)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if let Ok(uid) = uid.parse() {
            out.entry(uid).or_insert_with(|| name.to_string());
        }
    }
    out
}

/// `pid, used_memory` lines (MiB); a pid listed twice (one per GPU) adds up.
pub(crate) fn parse_compute_apps(b: &[u8]) -> HashMap<u32, u64> {
    let mut out = HashMap::new();
    for line in String::from_utf8_lossy(b).lines() {
        let mut f = line.split(',').map(str::trim);
        let (Some(pid), Some(mib)) = (f.next(), f.next()) else {
            continue;
        };
        if let (Ok(pid), Ok(mib)) = (pid.parse::<u32>(), mib.parse::<u64>()) {
            *out.entry(pid).or_insert(0) += mib;
        }
    }
    out
}
