//! The agent on the host: this build's digest names it
//! (`~/.cache/overlay/overlay-<hash>`), and [`upload_agent`] makes sure the
//! file there is this build and safe to run: its folders pass OpenSSH's
//! `StrictModes` check over SFTP ([`safe_agent_dir`]), and a missing or
//! unsafe file is uploaded again ([`write_remote`] to a temporary name,
//! then renamed into place by [`put_in_place`]).
//!
//! Hosts that share a home directory (an NFS `/home` or `/root`) share the
//! file, and their agents may start at once, from several controllers or
//! from one fanning out. So a file that is already this build is used and
//! never removed, and a rename never leaves the path naming nothing: an
//! upload goes in only where the path is free (SFTP v3's rename refuses to
//! replace a file), and an unusable file is replaced in one step with
//! OpenSSH's `posix-rename@openssh.com` ([`posix_rename`]).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use ssh2::{ErrorCode, FileType, OpenFlags, OpenType, RenameFlags, Sftp};

use super::config::LocalEnv;
use super::connect::Connected;
use super::libssh2_sys_codes as codes;
use super::{AGENT_DIR, ConnectOptions, Who, duration_ms};
use crate::err;
use crate::error::{Error, Result};
use crate::text::hex;

/// Size of the SFTP writes when uploading the agent.
const UPLOAD_CHUNK: usize = 256 * 1024;
/// Bound on one SFTP operation during the upload.
const UPLOAD_OP_TIMEOUT: Duration = Duration::from_secs(60);

/// The file name of this build of the agent: named by its digest.
pub(super) fn agent_name(digest: &AgentDigest) -> String {
    format!("overlay-{}", &digest.hex[..16])
}

#[derive(Debug, Clone)]
pub(super) struct AgentDigest {
    pub(super) hex: String,
    size: u64,
}

/// sha256 of the agent binary, computed once per process (per path).
pub(super) fn agent_digest(path: &Path) -> Result<AgentDigest> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, AgentDigest>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = map.get(path) {
        return Ok(d.clone());
    }
    let fail = |e: io::Error| {
        err!(
            hint = "set OVERLAY_AGENT_BINARY to the path of a static overlay binary",
            "Failed to read the agent binary {}: {}",
            path.display(),
            crate::error::io_cause(&e)
        )
    };
    let mut f = std::fs::File::open(path).map_err(fail)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; UPLOAD_CHUNK];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(fail)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    let d = AgentDigest {
        hex: hex(h.finalize().as_slice()),
        size,
    };
    map.insert(path.to_path_buf(), d.clone());
    Ok(d)
}

/// Make sure `~/.cache/overlay/overlay-<hash>` on the host is this agent;
/// returns its absolute path there.
pub(super) fn upload_agent(
    who: Who<'_>,
    conn: &Connected,
    opts: &ConnectOptions,
    env: &LocalEnv,
) -> Result<String> {
    let digest = agent_digest(&env.agent_binary).map_err(|e| Error {
        message: format!("{} (to start the agent on {who})", e.message),
        ..e
    })?;
    conn.session
        .set_timeout(duration_ms(opts.timeout.max(UPLOAD_OP_TIMEOUT)));
    let fail = |what: String, e: ssh2::Error| upload_failed(who, &what, &e);
    let sftp = conn
        .session
        .sftp()
        .map_err(|e| fail("cannot start SFTP".into(), e))?;
    let home = sftp
        .realpath(Path::new("."))
        .map_err(|e| fail("cannot find the home directory".into(), e))?;
    let dir = home.join(AGENT_DIR);
    let name = agent_name(&digest);
    let final_path = dir.join(&name);
    let final_str = final_path
        .to_str()
        .ok_or_else(|| {
            err!(
                hint = "give that account a home directory with a UTF-8 path",
                "Failed to upload the agent to {who}: the home directory {} is not UTF-8",
                home.display()
            )
        })?
        .to_string();

    make_agent_dir(who, &sftp, &home, &dir)?;
    // Nothing is run from a folder another user could write to; a file
    // that is not safe itself is replaced below.
    let owners = safe_agent_dir(who, &sftp, &home, &dir)?;
    let dest = AgentFile {
        path: &final_path,
        size: digest.size,
        owners,
    };
    if is_usable_agent(&sftp, &dest) {
        return Ok(final_str);
    }

    // Unique among the uploads of every controller to this home: the
    // process, a counter for the threads of one process (a fan-out uploads
    // to several hosts at once) and the clock for the other hosts' pids.
    static UPLOADS: AtomicU64 = AtomicU64::new(0);
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(
        ".{name}.tmp-{}-{}-{nonce:08x}",
        std::process::id(),
        UPLOADS.fetch_add(1, Ordering::Relaxed)
    ));
    let result = write_remote(who, &sftp, &env.agent_binary, &tmp)
        .and_then(|()| put_in_place(who, &conn.session, &sftp, &tmp, &dest));
    // Gone after a successful rename; left over otherwise.
    let _ = sftp.unlink(&tmp);
    result?;
    if !is_usable_agent(&sftp, &dest) {
        return Err(err!(
            hint = "check free space on that host and run again",
            "Failed to upload the agent to {who}: {} has the wrong size or mode after the upload",
            final_path.display()
        ));
    }
    Ok(final_str)
}

/// An SFTP step of the upload failed.
fn upload_failed(who: Who<'_>, what: &str, e: &ssh2::Error) -> Error {
    err!(
        hint = "check that the home directory on that host is writable and not full, and that sshd allows SFTP (Subsystem sftp)",
        "Failed to upload the agent to {who}: {what}: {}",
        sftp_cause(e)
    )
}

/// Create AGENT_DIR's parent (`~/.cache`), then AGENT_DIR, where missing.
fn make_agent_dir(who: Who<'_>, sftp: &Sftp, home: &Path, dir: &Path) -> Result<()> {
    for d in [
        dir.parent().unwrap_or(home).to_path_buf(),
        dir.to_path_buf(),
    ] {
        if matches!(sftp.stat(&d), Ok(st) if st.is_dir()) {
            continue;
        }
        if let Err(e) = sftp.mkdir(&d, 0o700) {
            match sftp.stat(&d) {
                Ok(st) if st.is_dir() => {}
                _ => {
                    return Err(upload_failed(
                        who,
                        &format!("cannot create {}", d.display()),
                        &e,
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Make the uploaded `tmp` executable and put it at `dest.path` without
/// ever leaving that path naming nothing, nor removing a usable agent:
/// another controller, or a host that shares this home directory, may be
/// starting the file there at this very moment.
///
/// 1. A plain rename: SFTP v3 (OpenSSH) renames only to a free name, so it
///    replaces nothing.
/// 2. The path is taken: by a usable agent, which is this build (its name
///    is the digest), put there by another upload meanwhile; it is used
///    and `tmp` left for the caller to remove.
/// 3. By an unusable file (damaged, unsafe): replaced in one step by
///    `posix-rename@openssh.com` (rename(2) on the host), or by an SFTP v5+
///    rename with OVERWRITE|ATOMIC.
/// 4. Only a server with neither is sent remove-then-rename, as before:
///    there an agent starting from this path in between would not find it.
fn put_in_place(
    who: Who<'_>,
    session: &ssh2::Session,
    sftp: &Sftp,
    tmp: &Path,
    dest: &AgentFile<'_>,
) -> Result<()> {
    let chmod = ssh2::FileStat {
        size: None,
        uid: None,
        gid: None,
        perm: Some(0o755),
        atime: None,
        mtime: None,
    };
    sftp.setstat(tmp, chmod).map_err(|e| {
        upload_failed(
            who,
            &format!("cannot make {} executable", tmp.display()),
            &e,
        )
    })?;
    let no_overwrite = RenameFlags::ATOMIC | RenameFlags::NATIVE;
    if sftp.rename(tmp, dest.path, Some(no_overwrite)).is_ok() || is_usable_agent(sftp, dest) {
        return Ok(());
    }
    let failed = |e: &ssh2::Error| {
        // Another upload may have put this build there meanwhile.
        if is_usable_agent(sftp, dest) {
            return Ok(());
        }
        Err(upload_failed(
            who,
            &format!("cannot rename it to {}", dest.path.display()),
            e,
        ))
    };
    match posix_rename(session, tmp, dest.path) {
        Ok(Renamed::Done) => return Ok(()),
        Ok(Renamed::Unsupported) => {}
        Err(e) => return failed(&e),
    }
    let overwrite = RenameFlags::OVERWRITE | RenameFlags::ATOMIC | RenameFlags::NATIVE;
    if sftp.rename(tmp, dest.path, Some(overwrite)).is_ok() {
        return Ok(());
    }
    let _ = sftp.unlink(dest.path);
    match sftp.rename(tmp, dest.path, Some(no_overwrite)) {
        Ok(()) => Ok(()),
        Err(e) => failed(&e),
    }
}

/// What [`posix_rename`] did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Renamed {
    Done,
    /// The server does not offer `posix-rename@openssh.com`, or refused a
    /// second SFTP channel (sshd's `MaxSessions 1`): try the other ways.
    Unsupported,
}

// libssh2 has had it since 1.11.1 (the vendored one is 1.11.2); the
// libssh2-sys crate does not declare it.
unsafe extern "C" {
    fn libssh2_sftp_posix_rename_ex(
        sftp: *mut libssh2_sys::LIBSSH2_SFTP,
        source_filename: *const libc::c_char,
        source_filename_len: libc::size_t,
        dest_filename: *const libc::c_char,
        dest_filename_len: libc::size_t,
    ) -> libc::c_int;
}

/// Rename `from` to `to` on the host, replacing `to` in one step, with
/// OpenSSH's `posix-rename@openssh.com` SFTP extension: the server calls
/// rename(2), so `to` names the old file or the new one, never nothing.
/// The `ssh2` crate does not wrap libssh2's call for it, nor hand out its
/// `Sftp`'s libssh2 handle, so this opens an SFTP channel of its own on
/// `session` (a round trip or two, on the rare path of a replacement).
pub(super) fn posix_rename(
    session: &ssh2::Session,
    from: &Path,
    to: &Path,
) -> std::result::Result<Renamed, ssh2::Error> {
    let (from, to) = (from.as_os_str().as_bytes(), to.as_os_str().as_bytes());
    let mut guard = session.raw();
    let raw: *mut libssh2_sys::LIBSSH2_SESSION = &mut *guard;
    // SAFETY: `raw` is the live session, locked by `guard` (held to the end,
    // so no other thread uses it meanwhile, as ssh2's own calls lock it);
    // the SFTP handle is made, used and shut down here, and the two names
    // are passed with their lengths (libssh2 copies them into the packet).
    unsafe {
        let sftp = libssh2_sys::libssh2_sftp_init(raw);
        if sftp.is_null() {
            return Ok(Renamed::Unsupported);
        }
        let rc = libssh2_sftp_posix_rename_ex(
            sftp,
            from.as_ptr().cast(),
            from.len(),
            to.as_ptr().cast(),
            to.len(),
        );
        let status = libssh2_sys::libssh2_sftp_last_error(sftp);
        let result = match rc {
            0 => Ok(Renamed::Done),
            libssh2_sys::LIBSSH2_ERROR_SFTP_PROTOCOL
                if status == libssh2_sys::LIBSSH2_FX_OP_UNSUPPORTED as libc::c_ulong =>
            {
                Ok(Renamed::Unsupported)
            }
            libssh2_sys::LIBSSH2_ERROR_SFTP_PROTOCOL => Err(ssh2::Error::from_errno(
                ssh2::ErrorCode::SFTP(status as libc::c_int),
            )),
            rc => Err(ssh2::Error::from_session_error_raw(raw, rc)),
        };
        libssh2_sys::libssh2_sftp_shutdown(sftp);
        result
    }
}

/// The owners a file on the agent's path may have: root and the owner of
/// the home directory (SFTP does not tell the login user's uid; the
/// agent's own check, `agent::selfcheck`, compares with it exactly).
#[derive(Debug, Clone, Copy)]
struct Owners {
    home: u32,
}

impl Owners {
    fn allow(self, uid: Option<u32>) -> bool {
        uid.is_some_and(|u| u == 0 || u == self.home)
    }
}

/// The check OpenSSH's `StrictModes` makes, over SFTP: `dir` and every
/// folder of its real path up to the home directory (or `/`) belong to the
/// home's owner or root and are not writable by group or others.
fn safe_agent_dir(who: Who<'_>, sftp: &Sftp, home: &Path, dir: &Path) -> Result<Owners> {
    let lost = |p: &Path, e: ssh2::Error| {
        err!(
            hint = "check that sshd allows SFTP (Subsystem sftp) and run again",
            "Failed to check {} on {who}: {}",
            p.display(),
            sftp_cause(&e)
        )
    };
    let home_st = sftp.stat(home).map_err(|e| lost(home, e))?;
    let owners = Owners {
        home: home_st.uid.unwrap_or(0),
    };
    let real = sftp.realpath(dir).map_err(|e| lost(dir, e))?;
    let home_real = sftp.realpath(home).unwrap_or_else(|_| home.to_path_buf());
    let show = |p: &Path| crate::text::quote(&p.to_string_lossy()).into_owned();
    for d in real.ancestors() {
        let st = sftp.stat(d).map_err(|e| lost(d, e))?;
        let mode = st.perm.unwrap_or(0);
        if !owners.allow(st.uid) {
            return Err(err!(
                hint = format!(
                    "on that host, remove {} (or give {} to the login user), then run again",
                    show(dir),
                    show(d)
                ),
                "Refusing to run the agent on {who} from {}: {} belongs to uid {}, neither the owner of {} nor root, so another user could replace the agent",
                show(dir),
                show(d),
                st.uid.unwrap_or(0),
                show(home)
            ));
        }
        if mode & 0o022 != 0 {
            return Err(err!(
                hint = format!(
                    "on that host, run `chmod go-w {}` (OpenSSH's StrictModes wants the same for ~/.ssh), then run again",
                    show(d)
                ),
                "Refusing to run the agent on {who} from {}: {} is writable by its group or others (mode {:04o}), so another user could replace the agent",
                show(dir),
                show(d),
                mode & 0o7777
            ));
        }
        if d == home_real {
            break;
        }
    }
    Ok(owners)
}

/// The agent file on the host and what this build looks like there.
struct AgentFile<'a> {
    path: &'a Path,
    size: u64,
    owners: Owners,
}

/// Whether `f.path` is this build, safe to run: a regular file (not a
/// symlink) of the right size, executable, owned by the user or root and
/// writable only by its owner.
fn is_usable_agent(sftp: &Sftp, f: &AgentFile<'_>) -> bool {
    match sftp.lstat(f.path) {
        Ok(st) => {
            st.file_type() == FileType::RegularFile
                && st.size == Some(f.size)
                && st.perm.is_some_and(|p| p & 0o100 != 0 && p & 0o022 == 0)
                && f.owners.allow(st.uid)
        }
        Err(_) => false,
    }
}

/// Copy the local file `local` to the new file `remote` on the host.
fn write_remote(who: Who<'_>, sftp: &Sftp, local: &Path, remote: &Path) -> Result<()> {
    let unreadable = |e: std::io::Error| {
        err!(
            hint = "set OVERLAY_AGENT_BINARY to the path of a static overlay binary",
            "Failed to read the agent binary {} to upload it to {who}: {}",
            local.display(),
            crate::error::io_cause(&e)
        )
    };
    let mut src = std::fs::File::open(local).map_err(unreadable)?;
    let fail = |what: &str, cause: String| {
        err!(
            hint = "check that the home directory on that host is writable and not full",
            "Failed to upload the agent to {who}: {what} {}: {cause}",
            remote.display()
        )
    };
    let mut dst = sftp
        .open_mode(
            remote,
            OpenFlags::WRITE | OpenFlags::TRUNCATE | OpenFlags::EXCLUSIVE,
            0o700,
            OpenType::File,
        )
        .map_err(|e| fail("cannot create", sftp_cause(&e)))?;
    let mut buf = vec![0u8; UPLOAD_CHUNK];
    loop {
        let n = src.read(&mut buf).map_err(unreadable)?;
        if n == 0 {
            break;
        }
        dst.write_all(&buf[..n])
            .map_err(|e| fail("cannot write", e.to_string()))?;
    }
    dst.close()
        .map_err(|e| fail("cannot close", sftp_cause(&e)))?;
    Ok(())
}

/// An SFTP failure in a few words.
fn sftp_cause(e: &ssh2::Error) -> String {
    match e.code() {
        ErrorCode::SFTP(2) => "no such file or directory".into(),
        ErrorCode::SFTP(3) => "permission denied".into(),
        ErrorCode::SFTP(14) => "no space left".into(),
        ErrorCode::Session(codes::TIMEOUT) => "timed out".into(),
        _ => e.message().to_string(),
    }
}
