//! `[verify]`: the smoke test run in the target venv, with the manifest's
//! environment and Python's faulthandler on (a fatal signal prints the
//! Python stack). A check past its timeout gets SIGABRT (its stack), then
//! its whole process group is killed. Output is captured whole (never
//! truncated), stored in a log
//! on the target (`<venv>/.overlay/verify/<time>.log`, mode 0600 in 0700
//! folders, written beneath the venv root's fd; and in the generation's
//! folder when run by `apply --verify`), and returned to the controller.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::beneath::Beneath;
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::Venv;
use crate::journal::valid_id;
use crate::model::{STATE_DIR, VerifyReport, VerifyRequest, crash_location, signal_name};
use crate::text::format_time;

/// Create `dir` (and missing parents) with mode 0700; an existing `dir`
/// with a wider mode is narrowed to 0700.
pub fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other("not a directory"));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Write `text` to the new file `dir_rel/name` beneath `root` (0600), the
/// folders on the way created 0700 and `dir_rel` narrowed to 0700.
fn write_log(root: &Beneath, dir_rel: &str, name: &str, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    root.create_dir_all(dir_rel, 0o700)?;
    let dir = root.dir(dir_rel)?;
    if rustix::fs::fstat(&dir)?.st_mode & 0o077 != 0 {
        rustix::fs::fchmod(&dir, rustix::fs::Mode::from_raw_mode(0o700))?;
    }
    dir.create_new(name, 0o600)?.write_all(text.as_bytes())
}

/// Expand `{site_packages}` and `{venv}` in a manifest value.
pub fn expand(value: &str, venv: &Venv) -> String {
    value
        .replace("{site_packages}", &venv.site().to_string_lossy())
        .replace("{venv}", &venv.root.to_string_lossy())
}

/// How long a check past its timeout has, after SIGABRT, to print its
/// Python stack (faulthandler) and die, before its process group is killed.
const ABORT_GRACE: Duration = Duration::from_secs(5);

/// Run the check on this host.
pub fn run(req: &VerifyRequest) -> Result<VerifyReport> {
    let venv = Venv::open(&req.venv)?;
    let python = venv.root.join("bin/python");
    let env: BTreeMap<String, String> = req
        .env
        .iter()
        .map(|(k, v)| (k.clone(), expand(v, &venv)))
        .collect();
    let timeout = req.timeout_secs.max(1);
    let started = Instant::now();
    let mut child = spawn(&venv, &python, &req.python, &env)?;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped")));
    let errs = drain(Box::new(child.stderr.take().expect("piped")));
    let deadline = started + Duration::from_secs(timeout);
    let Finished { status, timed_out } = wait(&mut child, deadline)?;
    let stdout = out.join().unwrap_or_default();
    let mut stderr = errs.join().unwrap_or_default();
    let signal = status.signal();
    let location = (signal.is_some() || timed_out)
        .then(|| crash_location(&stderr, &venv.site().to_string_lossy()))
        .flatten();
    if timed_out {
        stderr.push_str(&format!(
            "\noverlay: the check did not finish within {timeout} s: sent SIGABRT (Python's stack above), then killed its process group\n",
        ));
    }
    let millis = started.elapsed().as_millis() as u64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut ending = String::new();
    if timed_out {
        ending.push_str(&format!("# timed out: after {timeout} s\n"));
    }
    match (status.code(), signal) {
        (Some(code), _) => ending.push_str(&format!("# exit: {code}\n")),
        (None, Some(sig)) => ending.push_str(&format!(
            "# signal: {} ({sig})\n",
            signal_name(sig).unwrap_or("unknown")
        )),
        (None, None) => ending.push_str(&format!("# status: {status}\n")),
    }
    if let Some(at) = &location {
        ending.push_str(&format!("# location: {at}\n"));
    }
    let text = format!(
        "# overlay verify on {}\n# python: {}\n# env: {env:?}\n{ending}# millis: {millis}\n--- code ---\n{}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        format_time(now),
        python.display(),
        req.python,
    );
    let log = store_log(&venv, req.generation.as_deref(), now, &text)?;
    Ok(VerifyReport {
        ok: status.success() && !timed_out,
        exit_code: status.code(),
        signal,
        timed_out,
        timeout_secs: timeout,
        location,
        stdout,
        stderr,
        log: log.to_string_lossy().into_owned(),
        millis,
    })
}

/// Start `python -X faulthandler -c code` in the venv, in its own process
/// group, with `env` (and `PYTHONFAULTHANDLER=1`, so Pythons it starts dump
/// their stacks too), no core dumps, and its output piped.
fn spawn(
    venv: &Venv,
    python: &std::path::Path,
    code: &str,
    env: &BTreeMap<String, String>,
) -> Result<Child> {
    let mut cmd = Command::new(python);
    cmd.arg("-X")
        .arg("faulthandler")
        .arg("-c")
        .arg(code)
        .envs(env)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONFAULTHANDLER", "1")
        .current_dir(&venv.root)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A crash (or the SIGABRT at the timeout) leaves no core file in the
    // venv: faulthandler's dump on stderr says where it was.
    // SAFETY: setrlimit is async-signal-safe; the closure allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            Ok(())
        });
    }
    cmd.spawn().map_err(|e| {
        err!(
            hint = "is the venv intact? `python -m venv --upgrade` repairs its interpreter links",
            "Failed to run {}: {}",
            python.display(),
            io_cause(&e)
        )
    })
}

/// How the check ended.
struct Finished {
    status: ExitStatus,
    /// It ran past its deadline and was killed.
    timed_out: bool,
}

/// Wait for the check. Past `deadline`, send the interpreter SIGABRT (its
/// faulthandler prints the Python stack) and give it [`ABORT_GRACE`] to
/// die. Whichever way it ended, its whole process group is then killed
/// (SIGKILL) before it is reaped: processes it left behind go with it and
/// release the output pipes, and the group's id cannot have been reused.
fn wait(child: &mut Child, deadline: Instant) -> Result<Finished> {
    use rustix::process::{Pid, Signal, WaitId, WaitIdOptions, waitid};
    let pid = Pid::from_raw(child.id() as i32).expect("a child has a pid");
    let mut aborted: Option<Instant> = None;
    loop {
        // Exited (not reaped: WNOWAIT keeps the group's id ours).
        let exited = waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
        )
        .map_err(|e| err!("Failed to wait for the check: {e}"))?
        .is_some();
        let now = Instant::now();
        if exited || aborted.is_some_and(|t| now > t + ABORT_GRACE) {
            break;
        }
        if aborted.is_none() && now > deadline {
            let _ = rustix::process::kill_process(pid, Signal::ABORT);
            aborted = Some(now);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The whole process group: children that hold the pipes open die too.
    let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    let status = child
        .wait()
        .map_err(|e| err!("Failed to wait for the check: {e}"))?;
    Ok(Finished {
        status,
        timed_out: aborted.is_some(),
    })
}

/// Store the log `text` of a check run at `now` in the venv's state folder,
/// and in the folder of `generation` if that names one; returns its path.
fn store_log(venv: &Venv, generation: Option<&str>, now: u64, text: &str) -> Result<PathBuf> {
    // The log holds the manifest's env values: the state directory's
    // folders are 0700 and its files 0600, whatever the umask. Written
    // beneath the venv root's fd: a symlink on the way is refused.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let name = format!("{}-{:09}.log", format_time(now), nanos);
    let vrel = format!("{STATE_DIR}/verify");
    let log = venv.root.join(&vrel).join(&name);
    let root = venv.beneath()?;
    write_log(&root, &vrel, &name, text)
        .map_err(|e| err!("Failed to write {}: {}", log.display(), io_cause(&e)))?;
    // A generation id from the request names one folder, nothing else.
    if let Some(g) = generation
        && valid_id(g)
    {
        let grel = format!("{STATE_DIR}/generations/{g}");
        if root.kind(&grel).ok().flatten() == Some(rustix::fs::FileType::Directory) {
            let _ = root.write_atomic(&format!("{grel}/verify.log"), text.as_bytes(), 0o600);
        }
    }
    Ok(log)
}
