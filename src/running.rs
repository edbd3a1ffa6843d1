//! The processes that run from a venv, read from `/proc` on the host that
//! has it ([`find`]): what `plan` names and what `apply` and `rollback`
//! refuse on while they run (docs/design.md, "Processes running from the
//! venv").
//!
//! A process runs from the venv when it maps a file of the venv
//! (`/proc/PID/maps`), holds one open (`/proc/PID/fd`), has its executable
//! there (`/proc/PID/exe`), or runs the venv's interpreter or one of its
//! scripts (`argv[0]` or `argv[1]` of `/proc/PID/cmdline`, resolved in the
//! process's own root and working directory, the last component not
//! followed: a venv's `bin/python` is a symlink to the system's
//! interpreter, and a script's `#!/venv/bin/python` gives that path as
//! `argv[0]`). Files are matched by device and inode against a walk of the
//! venv ([`VenvFiles`]), never by path: a container or another mount
//! namespace sees the venv at another path. Where a maps line names a
//! device the venv has no file on (overlayfs shows the layer's file there,
//! not the one `stat` sees), the path it gives is looked up once in the
//! process's root and matched by device and inode again.
//!
//! Every `stat` of another process's file (its `exe`, fds, interpreter) is
//! a `statx` with `AT_STATX_DONT_SYNC` ([`quick_stat`]): a FUSE or NFS
//! mount whose server hangs, where some process holds a file open, must
//! not hang the scan (it did: a stopped LazyFS daemon elsewhere on this
//! machine stalled a plan in `newfstatat` of `/proc/PID/fd/N`).
//!
//! A process the agent may not inspect (another user's, the agent not
//! root: `EACCES` on its maps) is reported as unknown, never guessed. A
//! process that exits mid-scan is skipped. The agent itself and its
//! ancestors (the sshd and shell that started it) are not counted, nor
//! another overlay agent of this build (the same executable), which reads
//! the venv's files but does not run them. Kernel threads are skipped.
//!
//! Each process found gets its user (the host's `/etc/passwd`), command
//! line, start time (its `stat` start time after the host's boot time) and
//! the GPU memory `nvidia-smi --query-compute-apps` gives it (a few seconds
//! at most; no `nvidia-smi` is no GPU column, not an error).
//!
//! `/proc` is read by hand (a few small files per process, `openat` from
//! the process's `/proc/PID` fd) rather than through a crate: what is
//! needed is the maps' device and inode, the errors told apart (gone,
//! denied) and nothing else, at a few microseconds a process.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::err;
use crate::error::Result;
use crate::model::{How, Running, STATE_DIR, VenvProcess};
use parse::{
    ProcStat, parse_cmdline, parse_compute_apps, parse_maps_line, parse_passwd, parse_stat,
    parse_uid,
};

/// A file's identity: device and inode.
type Id = (u64, u64);

/// The device and inode of every file and symlink of a venv (directories
/// left out: a shell whose working directory is in the venv runs nothing
/// from it), and the devices they are on.
#[derive(Debug, Default)]
pub struct VenvFiles {
    ids: HashSet<Id>,
    devs: HashSet<u64>,
    /// What the venv's symlinks point to (`bin/python` to the system's
    /// interpreter): only a process whose executable is one of these can
    /// have been started through a bare `argv[0]` found in its PATH.
    targets: HashSet<Id>,
}

impl VenvFiles {
    /// Walk `root` without following symlinks. Of overlay's own state
    /// folder only the generations are taken (their backups hold the files
    /// an earlier apply replaced, which a process may still map); its lock
    /// and caches are overlay's, not the venv's.
    pub fn walk(root: &Path) -> Result<VenvFiles> {
        let mut out = VenvFiles::default();
        let state = root.join(STATE_DIR);
        let generations = state.join("generations");
        let mut it = walkdir::WalkDir::new(root).follow_links(false).into_iter();
        // The device of each directory on the way down, by depth: a file's
        // is its directory's (only a directory can be a mount point), and
        // its inode is the one `readdir` gives, so the walk costs no
        // `stat` a file.
        let mut devs: Vec<u64> = Vec::new();
        while let Some(e) = it.next() {
            let e = match e {
                Ok(e) => e,
                // A folder removed or unreadable mid-walk: what is there
                // to see was seen.
                Err(e) if e.depth() > 0 => continue,
                Err(e) => {
                    return Err(err!(
                        kind = Host,
                        hint = "check that the venv exists and is readable",
                        "cannot read {}: {e}",
                        root.display()
                    ));
                }
            };
            let path = e.path();
            if e.file_type().is_dir() {
                if path.starts_with(&state) && path != state && !path.starts_with(&generations) {
                    it.skip_current_dir();
                    continue;
                }
                // The root itself may be a symlink to the venv.
                let at = if e.depth() == 0 {
                    AtFlags::empty()
                } else {
                    AtFlags::SYMLINK_NOFOLLOW
                };
                let Ok(st) = rustix::fs::statat(rustix::fs::CWD, path, at) else {
                    it.skip_current_dir();
                    continue;
                };
                devs.truncate(e.depth());
                devs.push(st.st_dev);
                out.devs.insert(st.st_dev);
                continue;
            }
            if path.starts_with(&state) && !path.starts_with(&generations) {
                continue;
            }
            let Some(&dev) = e.depth().checked_sub(1).and_then(|d| devs.get(d)) else {
                continue;
            };
            out.ids.insert((dev, walkdir::DirEntryExt::ino(&e)));
            if e.file_type().is_symlink()
                && let Ok(st) = rustix::fs::stat(path)
            {
                out.targets.insert((st.st_dev, st.st_ino));
            }
        }
        Ok(out)
    }

    /// Files in the walk.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn has(&self, id: &FileId) -> bool {
        self.ids.contains(&(id.dev, id.ino))
    }
}

/// A file's device, inode and type, from `statx` with
/// `AT_STATX_DONT_SYNC`: a FUSE or network file system answers from what
/// the kernel holds, without asking its server, so that a hung mount
/// elsewhere on the host (a stopped FUSE daemon, a dead NFS server, where
/// some process holds a file open) does not hang the scan. Device and
/// inode do not change, so nothing stale is matched.
#[derive(Debug, Clone, Copy)]
struct FileId {
    dev: u64,
    ino: u64,
    mode: u32,
}

/// [`FileId`] of `path` under `dir` (`""`: `dir` itself), following a last
/// symlink only with `follow`.
fn quick_stat<P: rustix::path::Arg>(
    dir: impl std::os::fd::AsFd,
    path: P,
    follow: bool,
) -> Option<FileId> {
    let mut flags = AtFlags::STATX_DONT_SYNC | AtFlags::EMPTY_PATH;
    if !follow {
        flags |= AtFlags::SYMLINK_NOFOLLOW;
    }
    let x = rustix::fs::statx(
        dir,
        path,
        flags,
        rustix::fs::StatxFlags::TYPE | rustix::fs::StatxFlags::INO,
    )
    .ok()?;
    Some(FileId {
        dev: rustix::fs::makedev(x.stx_dev_major, x.stx_dev_minor),
        ino: x.stx_ino,
        mode: u32::from(x.stx_mode),
    })
}

/// The processes of this host that run from the venv at `root` (see the
/// module's doc), by pid.
///
/// What the first scan found is looked at again against a second walk,
/// and only a process found both times is kept: a file of the venv
/// removed between the walk and the scan (an interrupted apply's agent
/// cleaning its staging) frees its inode, and a file another process
/// creates on the same file system at that moment can get it (a `cp`
/// elsewhere on the disk, seen once as running from the venv: issue 46's
/// CI). The second walk costs only where something was found.
pub fn find(root: &Path) -> Result<Running> {
    let files = VenvFiles::walk(root)?;
    let mut running = find_in(&files);
    if running.processes.is_empty() {
        return Ok(running);
    }
    let again = VenvFiles::walk(root)?;
    let host = Host::read();
    let mut scan = Scan::new(&again);
    running
        .processes
        .retain(|p| match scan.process(p.pid, &host) {
            Seen::Runs(q) => q.started == p.started,
            Seen::Unknown(_) | Seen::No => false,
        });
    Ok(running)
}

/// [`find`] against a walk already made.
pub fn find_in(files: &VenvFiles) -> Running {
    let mut running = Running::default();
    if files.is_empty() {
        return running;
    }
    let host = Host::read();
    let mut scan = Scan::new(files);
    let Ok(proc) = std::fs::read_dir("/proc") else {
        return running;
    };
    let mut pids: Vec<u32> = proc
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    for pid in pids {
        if scan.skip.contains(&pid) {
            continue;
        }
        match scan.process(pid, &host) {
            Seen::Runs(p) => running.processes.push(p),
            Seen::Unknown(p) => running.unknown.push(p),
            Seen::No => {}
        }
    }
    if !running.processes.is_empty()
        && let Some(gpu) = gpu_memory(Duration::from_secs(3))
    {
        for p in running
            .processes
            .iter_mut()
            .chain(running.unknown.iter_mut())
        {
            p.gpu_mib = gpu.get(&p.pid).copied();
        }
    }
    running
}

/// Those of `procs` that still run: the same pid started at the same
/// time (a pid reused by a newer process is not the one found before).
pub fn still_running(procs: &[VenvProcess]) -> Vec<VenvProcess> {
    let Some(btime) = boot_time() else {
        return Vec::new();
    };
    let ticks = clock_ticks();
    procs
        .iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{}/stat", p.pid))
                .ok()
                .and_then(|b| parse_stat(&b))
                .is_some_and(|s| btime + s.starttime / ticks == p.started && s.state != b'Z')
        })
        .cloned()
        .collect()
}

/// The refusal of an operation while `running` processes run from `venv`
/// (kind `Refused`): their pids and commands, and how to go on.
pub fn refusal(host_venv: &str, what: &str, running: &[VenvProcess]) -> crate::error::Error {
    let n = running.len();
    err!(
        kind = Refused,
        hint = "stop them first (they would go on with the old files loaded and load new ones later: a mixed process), or pass --allow-running to go on anyway and restart them after",
        "{n} process{} run{} from {host_venv}, so {what} was refused and nothing was changed: {}",
        if n == 1 { "" } else { "es" },
        if n == 1 { "s" } else { "" },
        list(running)
    )
}

/// `pid 1234 (root) python -m x`, comma-separated (see
/// [`VenvProcess::brief`]).
pub fn list(procs: &[VenvProcess]) -> String {
    crate::model::brief_list(procs)
}

/// What the host says once per scan: boot time, clock ticks, user names.
struct Host {
    btime: u64,
    ticks: u64,
    users: HashMap<u32, String>,
}

impl Host {
    fn read() -> Host {
        Host {
            btime: boot_time().unwrap_or(0),
            ticks: clock_ticks(),
            users: std::fs::read("/etc/passwd")
                .map(|b| parse_passwd(&b))
                .unwrap_or_default(),
        }
    }

    fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }
}

/// One scan's state: the venv, who is skipped, and maps paths already
/// looked up (by the device and inode maps gave).
struct Scan<'a> {
    files: &'a VenvFiles,
    skip: HashSet<u32>,
    own_exe: Option<Id>,
    by_path: HashMap<Id, bool>,
    /// The buffer maps are read into, kept from one process to the next.
    buf: Vec<u8>,
}

/// What one process turned out to be.
enum Seen {
    Runs(VenvProcess),
    Unknown(VenvProcess),
    /// Not from the venv, gone, skipped, or a kernel thread.
    No,
}

impl<'a> Scan<'a> {
    fn new(files: &'a VenvFiles) -> Scan<'a> {
        Scan {
            files,
            skip: skipped(),
            own_exe: rustix::fs::stat("/proc/self/exe")
                .ok()
                .map(|st| (st.st_dev, st.st_ino)),
            by_path: HashMap::new(),
            buf: Vec::new(),
        }
    }

    fn process(&mut self, pid: u32, host: &Host) -> Seen {
        let Ok(dir) = rustix::fs::open(
            format!("/proc/{pid}"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return Seen::No;
        };
        let Ok(Some(stat)) = read_at(&dir, "stat", 4096).map(|b| parse_stat(&b)) else {
            return Seen::No;
        };
        if stat.flags & PF_KTHREAD != 0 || stat.state == b'Z' {
            return Seen::No;
        }
        let Ok(cmdline) = read_at(&dir, "cmdline", 1 << 16) else {
            return Seen::No;
        };
        let argv = parse_cmdline(&cmdline);
        let mut how = Vec::new();
        let denied = match self.maps(&dir) {
            Ok(true) => {
                how.push(How::Maps);
                false
            }
            Ok(false) => false,
            Err(Errno::NOENT | Errno::SRCH) => return Seen::No,
            Err(_) => true,
        };
        if denied {
            let uid = read_at(&dir, "status", 1 << 14)
                .ok()
                .and_then(|b| parse_uid(&b));
            return match uid {
                Some(uid) => Seen::Unknown(describe(pid, uid, &argv, &stat, host, how)),
                None => Seen::No,
            };
        }
        let exe = quick_stat(&dir, "exe", true);
        if let (Some(exe), Some(own)) = (&exe, self.own_exe)
            && (exe.dev, exe.ino) == own
        {
            return Seen::No;
        }
        if exe.as_ref().is_some_and(|st| self.files.has(st)) {
            how.push(How::Exe);
        }
        let exe_linked = exe
            .as_ref()
            .is_some_and(|st| self.files.targets.contains(&(st.dev, st.ino)));
        if self.interpreter(&dir, &argv, exe_linked) {
            how.push(How::Interpreter);
        }
        if self.fds(&dir) {
            how.push(How::Fd);
        }
        if how.is_empty() {
            return Seen::No;
        }
        how.sort();
        let Some(uid) = read_at(&dir, "status", 1 << 14)
            .ok()
            .and_then(|b| parse_uid(&b))
        else {
            return Seen::No;
        };
        Seen::Runs(describe(pid, uid, &argv, &stat, host, how))
    }

    /// Whether the process maps a file of the venv. `Err`: maps could not
    /// be read (denied, or the process is gone).
    fn maps(&mut self, dir: &OwnedFd) -> std::result::Result<bool, Errno> {
        let mut text = std::mem::take(&mut self.buf);
        let read = read_into(dir, "maps", 64 << 20, &mut text);
        let found = read.map(|()| self.maps_text(dir, &text));
        self.buf = text;
        found
    }

    /// Whether the maps `text` names a file of the venv.
    fn maps_text(&mut self, dir: &OwnedFd, text: &[u8]) -> bool {
        let mut root: Option<Option<OwnedFd>> = None;
        for line in text.split(|&b| b == b'\n') {
            let Some(m) = parse_maps_line(line) else {
                continue;
            };
            if m.inode == 0 {
                continue;
            }
            let id = (m.dev, m.inode);
            if self.files.ids.contains(&id) {
                return true;
            }
            // On a device the venv has files on, the inode decides.
            if self.files.devs.contains(&m.dev) || m.deleted {
                continue;
            }
            let Some(path) = m.path.filter(|p| p.starts_with(b"/")) else {
                continue;
            };
            if let Some(&hit) = self.by_path.get(&id) {
                if hit {
                    return true;
                }
                continue;
            }
            let root = root.get_or_insert_with(|| open_root(dir));
            let Some(root) = root else {
                continue;
            };
            let hit = resolve_in_root(root, OsStr::from_bytes(path), true)
                .is_some_and(|st| self.files.has(&st));
            self.by_path.insert(id, hit);
            if hit {
                return true;
            }
        }
        false
    }

    /// Whether `argv[0]` or `argv[1]` is a file of the venv, the last
    /// component not followed. A bare `argv[0]` is searched in the
    /// process's PATH when its executable (`exe_linked`) is what a symlink
    /// of the venv points to.
    fn interpreter(&self, dir: &OwnedFd, argv: &[String], exe_linked: bool) -> bool {
        let mut root = None;
        for (i, arg) in argv.iter().take(2).enumerate() {
            if arg.is_empty() || (!arg.contains('/') && (i == 1 || !exe_linked)) {
                continue;
            }
            let st = if arg.starts_with('/') {
                let root = root.get_or_insert_with(|| open_root(dir));
                root.as_ref()
                    .and_then(|r| resolve_in_root(r, OsStr::new(arg), false))
            } else if arg.contains('/') {
                rustix::fs::openat(dir, "cwd", OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
                    .ok()
                    .and_then(|cwd| quick_stat(&cwd, arg.as_str(), false))
            } else {
                let root = root.get_or_insert_with(|| open_root(dir));
                root.as_ref().and_then(|r| in_path(dir, r, arg))
            };
            if st.is_some_and(|st| self.files.has(&st)) {
                return true;
            }
        }
        false
    }

    /// Whether the process holds a file of the venv open.
    fn fds(&self, dir: &OwnedFd) -> bool {
        let Ok(fd_dir) = rustix::fs::openat(
            dir,
            "fd",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return false;
        };
        let Ok(entries) = rustix::fs::Dir::read_from(&fd_dir) else {
            return false;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            if name.to_bytes().first().is_none_or(|b| !b.is_ascii_digit()) {
                continue;
            }
            if let Some(st) = quick_stat(&fd_dir, name, true)
                && rustix::fs::FileType::from_raw_mode(st.mode).is_file()
                && self.files.has(&st)
            {
                return true;
            }
        }
        false
    }
}

/// The process's root directory (`/proc/PID/root`), opened.
fn open_root(dir: &OwnedFd) -> Option<OwnedFd> {
    rustix::fs::openat(
        dir,
        "root",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// `stat` of an absolute `path` as the process whose root is `root` sees
/// it (symlinks in it resolve inside that root); the last component
/// followed only with `follow`.
fn resolve_in_root(root: &OwnedFd, path: &OsStr, follow: bool) -> Option<FileId> {
    let mut flags = OFlags::PATH | OFlags::CLOEXEC;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    match rustix::fs::openat2(
        root,
        path,
        flags,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => quick_stat(&fd, "", false),
        // Before Linux 5.6: the path from the root's fd, absolute symlinks
        // on the way resolving in this agent's root.
        Err(Errno::NOSYS) => {
            let rel = path.as_bytes().trim_ascii_start();
            let rel = OsStr::from_bytes(rel.strip_prefix(b"/").unwrap_or(rel));
            quick_stat(root, rel, follow)
        }
        Err(_) => None,
    }
}

/// A bare command name found in the process's own PATH (its environment),
/// inside its root: the first entry that is not a directory, not followed.
fn in_path(dir: &OwnedFd, root: &OwnedFd, name: &str) -> Option<FileId> {
    let env = read_at(dir, "environ", 1 << 20).ok()?;
    let path = env
        .split(|&b| b == 0)
        .find_map(|v| v.strip_prefix(b"PATH="))?;
    for d in path.split(|&b| b == b':') {
        if !d.starts_with(b"/") {
            continue;
        }
        let mut full = d.to_vec();
        full.push(b'/');
        full.extend_from_slice(name.as_bytes());
        if let Some(st) = resolve_in_root(root, OsStr::from_bytes(&full), false)
            && !rustix::fs::FileType::from_raw_mode(st.mode).is_dir()
        {
            return Some(st);
        }
    }
    None
}

/// A file of `/proc/PID`, at most `max` bytes.
fn read_at(dir: &OwnedFd, name: &str, max: usize) -> std::result::Result<Vec<u8>, Errno> {
    let mut out = Vec::new();
    read_into(dir, name, max, &mut out)?;
    Ok(out)
}

/// [`read_at`] into `out` (cleared first), with reads of at least 16 KiB:
/// each read of a `/proc` file makes the kernel print it again.
fn read_into(
    dir: &OwnedFd,
    name: &str,
    max: usize,
    out: &mut Vec<u8>,
) -> std::result::Result<(), Errno> {
    out.clear();
    let fd = rustix::fs::openat(dir, name, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    while out.len() < max {
        if out.capacity() - out.len() < 4096 {
            out.reserve(out.capacity().max(16 << 10).min(max - out.len()));
        }
        let (read, _) = rustix::io::read(&fd, out.spare_capacity_mut())?;
        let n = read.len();
        if n == 0 {
            break;
        }
        // SAFETY: `read` initialized the first `n` bytes of the spare capacity.
        unsafe { out.set_len(out.len() + n) };
    }
    out.truncate(max);
    Ok(())
}

fn describe(
    pid: u32,
    uid: u32,
    argv: &[String],
    stat: &ProcStat,
    host: &Host,
    how: Vec<How>,
) -> VenvProcess {
    VenvProcess {
        pid,
        uid,
        user: host.user(uid),
        command: if argv.is_empty() {
            format!("[{}]", stat.comm)
        } else {
            argv.join(" ")
        },
        started: host.btime + stat.starttime / host.ticks,
        gpu_mib: None,
        how,
    }
}

/// This process and its ancestors.
fn skipped() -> HashSet<u32> {
    let mut out = HashSet::new();
    let mut pid = std::process::id();
    while pid > 0 && out.insert(pid) {
        pid = std::fs::read(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|b| parse_stat(&b))
            .map_or(0, |s| s.ppid);
    }
    out
}

/// `PF_KTHREAD` in a process's flags.
const PF_KTHREAD: u64 = 0x0020_0000;

/// The host's boot time, seconds since the epoch (`btime` of `/proc/stat`).
fn boot_time() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// Clock ticks a second (`sysconf(_SC_CLK_TCK)`).
fn clock_ticks() -> u64 {
    // SAFETY: sysconf reads a constant of the C library.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// GPU memory by pid, MiB, from `nvidia-smi --query-compute-apps`; `None`
/// without `nvidia-smi`, or when it fails or takes longer than `limit`.
fn gpu_memory(limit: Duration) -> Option<HashMap<u32, u64>> {
    let mut child = std::process::Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let mut stdout = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = (&mut stdout).take(1 << 20).read_to_end(&mut out);
        out
    });
    let start = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() < limit => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    };
    let out = reader.join().ok()?;
    status.success().then(|| parse_compute_apps(&out))
}

mod parse;
#[cfg(test)]
mod tests;
