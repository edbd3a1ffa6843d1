//! The cached agent's check of its own file before it serves.
//!
//! Over SSH the agent is kept in `~/.cache/overlay/overlay-<hash>` and, on
//! the fast path, started by name without any look at that file first (see
//! docs/design.md). Whoever can write to that folder, or to a folder above
//! it up to the home directory, can replace the file, and the next run
//! would execute theirs as the login user. So an agent started from that
//! folder first makes the check OpenSSH's `StrictModes` makes for
//! `authorized_keys`: its executable and every directory from it up to the
//! home directory (up to `/` when the real path leaves the home) must belong
//! to this user or root and must not be writable by group or others; and
//! the path it was started by must be that very file, not a symlink. If not,
//! it refuses to serve ([`EXIT_UNSAFE`], a message and a hint on stderr);
//! the controller then checks the folder over SFTP and replaces the file
//! or refuses with the same advice.
//!
//! Under sudo (the manifest's `sudo`, docs/sudo.md) the agent runs from the
//! *login* user's cache folder as another user (root): the home checked is
//! then the login user's (from `SUDO_UID`, which sudo sets), and files and
//! folders owned by the login user pass too. A file the login user may
//! write, run as root, gives that user nothing new: the sudoers rule that
//! lets them run it already lets them run whatever they put there
//! (docs/threat-model.md). Another user's file or folder still fails.
//!
//! This is a check by the file that may have been replaced, so it cannot
//! catch a replacement that already happened; what it does is stop the
//! cache from being used, quietly and every run, while it is replaceable.
//! An agent started from anywhere else (the local transport,
//! `OVERLAY_AGENT_BINARY`, a hand-run build) is not checked.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Exit status of an agent that refuses to run from an unsafe place
/// (`EX_CONFIG` of sysexits.h).
pub use crate::transport::EXIT_UNSAFE;

/// Why the cache folder or file is unsafe, and what to do about it.
#[derive(Debug, PartialEq, Eq)]
pub struct Unsafe {
    pub message: String,
    pub hint: String,
}

/// Check the running executable when it was started from
/// `~/.cache/overlay/`; `Ok` when it is safe or not the cached agent.
pub fn check() -> Result<(), Unsafe> {
    let euid = rustix::process::geteuid().as_raw();
    let login = crate::hashcache::sudo_login_uid().filter(|u| *u != euid);
    let home = match login.and_then(crate::hashcache::user_home) {
        Some(h) => h.into_os_string(),
        None => match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
            Some(h) => h,
            None => return Ok(()),
        },
    };
    let uids: Vec<u32> = std::iter::once(euid).chain(login).collect();
    let started = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .filter(|p| p.components().count() > 1)
        .map(|p| match std::env::current_dir() {
            Ok(cwd) if p.is_relative() => cwd.join(p),
            _ => p,
        });
    check_file(
        Path::new("/proc/self/exe"),
        started.as_deref(),
        Path::new(&home),
        &uids,
    )
}

/// `exe` is the running executable (`/proc/self/exe`), `started` the path
/// it was started by, `home` the home directory, `uids` the users whose
/// files pass besides root: the effective uid (and under sudo the login
/// user's) — the first is named in messages.
pub fn check_file(
    exe: &Path,
    started: Option<&Path>,
    home: &Path,
    uids: &[u32],
) -> Result<(), Unsafe> {
    let (Ok(home), Ok(real)) = (std::fs::canonicalize(home), std::fs::canonicalize(exe)) else {
        return Ok(());
    };
    let Ok(cache) = std::fs::canonicalize(home.join(crate::transport::ssh::AGENT_DIR)) else {
        return Ok(());
    };
    let in_cache = |p: &Path| {
        p.parent()
            .and_then(|d| std::fs::canonicalize(d).ok())
            .is_some_and(|d| d == cache)
    };
    if !in_cache(&real) && !started.is_some_and(in_cache) {
        return Ok(());
    }
    let refuse = |message: String, hint: String| Err(Unsafe { message, hint });
    let Ok(running) = std::fs::metadata(exe) else {
        return Ok(());
    };
    if let Some(p) = started {
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                return refuse(
                    format!("{} is a symbolic link, not the agent itself", show(p)),
                    format!(
                        "remove it on that host (rm {}); overlay uploads the agent again",
                        show(p)
                    ),
                );
            }
            Ok(m) if (m.dev(), m.ino()) == (running.dev(), running.ino()) => {}
            _ => {
                return refuse(
                    format!("{} was replaced while the agent started", show(p)),
                    "run again; if it repeats, someone else writes to that folder".into(),
                );
            }
        }
    }
    let path = started.map_or(real.clone(), Path::to_path_buf);
    if !owner_ok(&running, uids) || running.mode() & 0o022 != 0 {
        return refuse(
            format!(
                "{} {} (mode {:04o}, owner uid {}), so another user may have replaced it",
                show(&path),
                if owner_ok(&running, uids) {
                    "is writable by its group or others"
                } else {
                    "belongs to another user"
                },
                running.mode() & 0o7777,
                running.uid()
            ),
            format!(
                "remove it on that host (rm {}); overlay uploads the agent again",
                show(&path)
            ),
        );
    }
    check_folders(&real, &home, &cache, uids)
}

/// Every folder from the real executable's up to `home` (up to `/` when
/// it is not under `home`) belongs to one of `uids` or root and is not
/// writable by group or others.
fn check_folders(real: &Path, home: &Path, cache: &Path, uids: &[u32]) -> Result<(), Unsafe> {
    let uid = uids.first().copied().unwrap_or(0);
    let refuse = |message: String, hint: String| Err(Unsafe { message, hint });
    for dir in real.ancestors().skip(1) {
        let Ok(m) = std::fs::metadata(dir) else {
            return Ok(());
        };
        if !owner_ok(&m, uids) {
            return refuse(
                format!(
                    "{} belongs to uid {}, neither this user (uid {uid}) nor root, so another user may replace the agent in {}",
                    show(dir),
                    m.uid(),
                    show(cache)
                ),
                format!(
                    "on that host, give {} to this user (chown) or remove {}",
                    show(dir),
                    show(cache)
                ),
            );
        }
        if m.mode() & 0o022 != 0 {
            return refuse(
                format!(
                    "{} is writable by its group or others (mode {:04o}), so another user may replace the agent in {}",
                    show(dir),
                    m.mode() & 0o7777,
                    show(cache)
                ),
                format!(
                    "on that host, run `chmod go-w {}` (as OpenSSH's StrictModes wants for ~/.ssh)",
                    show(dir)
                ),
            );
        }
        if dir == home {
            break;
        }
    }
    Ok(())
}

/// A path for a message, terminal-safe.
fn show(p: &Path) -> String {
    crate::text::escape(&p.to_string_lossy()).into_owned()
}

/// Whether `m` belongs to one of `uids` or root.
fn owner_ok(m: &std::fs::Metadata, uids: &[u32]) -> bool {
    uids.contains(&m.uid()) || m.uid() == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn checks_only_the_cached_agent_and_its_folders() {
        let t = tempfile::tempdir().unwrap();
        chmod(t.path(), 0o700);
        let home = t.path().join("home");
        let dir = home.join(".cache/overlay");
        std::fs::create_dir_all(&dir).unwrap();
        for d in [&home, &home.join(".cache"), &dir] {
            chmod(d, 0o700);
        }
        let exe = dir.join("overlay-0123456789abcdef");
        std::fs::write(&exe, b"#!").unwrap();
        chmod(&exe, 0o755);
        let uid = rustix::process::geteuid().as_raw();
        let rel = Path::new(".cache/overlay/overlay-0123456789abcdef");
        let started = home.join(rel);
        assert_eq!(check_file(&exe, Some(&started), &home, &[uid]), Ok(()));

        chmod(&exe, 0o775);
        let e = check_file(&exe, Some(&started), &home, &[uid]).unwrap_err();
        assert!(e.message.contains("writable by its group"), "{e:?}");
        assert!(e.hint.contains("rm "), "{e:?}");
        chmod(&exe, 0o755);

        chmod(&home.join(".cache"), 0o770);
        let e = check_file(&exe, Some(&started), &home, &[uid]).unwrap_err();
        assert!(e.message.contains("mode 0770"), "{e:?}");
        assert!(
            e.hint
                .contains(&format!("chmod go-w {}", home.join(".cache").display())),
            "{e:?}"
        );
        // Elsewhere (a local agent, a hand-run build) nothing is checked.
        let other = t.path().join("overlay");
        std::fs::write(&other, b"#!").unwrap();
        chmod(&other, 0o777);
        assert_eq!(check_file(&other, Some(&other), &home, &[uid]), Ok(()));
        chmod(&home.join(".cache"), 0o700);

        // Another owner (as seen by a different uid) is refused.
        if uid == 0 {
            // Root-owned files are accepted for any user, as OpenSSH does.
            assert_eq!(check_file(&exe, Some(&started), &home, &[4242]), Ok(()));
        } else {
            assert!(check_file(&exe, Some(&started), &home, &[uid + 1]).is_err());
        }
        if uid == 0 {
            // Under sudo: the login user's (4242) file and folders pass too,
            // another user's do not.
            for p in [&home, &home.join(".cache"), &dir, &exe] {
                std::os::unix::fs::chown(p, Some(4242), None).unwrap();
            }
            assert!(check_file(&exe, Some(&started), &home, &[0]).is_err());
            assert_eq!(check_file(&exe, Some(&started), &home, &[0, 4242]), Ok(()));
            assert!(check_file(&exe, Some(&started), &home, &[0, 4343]).is_err());
            for p in [&home, &home.join(".cache"), &dir, &exe] {
                std::os::unix::fs::chown(p, Some(0), None).unwrap();
            }
        }

        // Started through a symlink in the cache folder.
        let link = dir.join("overlay-link");
        std::os::unix::fs::symlink(&other, &link).unwrap();
        let e = check_file(&other, Some(&link), &home, &[uid]).unwrap_err();
        assert!(e.message.contains("symbolic link"), "{e:?}");
    }
}
