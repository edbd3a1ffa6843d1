//! `[verify]`: the smoke test run in the target venv, with the manifest's
//! environment. Output is captured whole (never truncated), stored in a log
//! on the target (`<venv>/.overlay/verify/<time>.log`, mode 0600 in 0700
//! folders, written beneath the venv root's fd; and in the generation's
//! folder when run by `apply --verify`), and returned to the controller.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::beneath::Beneath;
use crate::err;
use crate::error::{Result, io_cause};
use crate::inventory::Venv;
use crate::journal::valid_id;
use crate::model::{STATE_DIR, VerifyReport, VerifyRequest};
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

/// Run the check on this host.
pub fn run(req: &VerifyRequest) -> Result<VerifyReport> {
    let venv = Venv::open(&req.venv)?;
    let python = venv.root.join("bin/python");
    let env: BTreeMap<String, String> = req
        .env
        .iter()
        .map(|(k, v)| (k.clone(), expand(v, &venv)))
        .collect();
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
    let deadline = started + Duration::from_secs(req.timeout_secs.max(1));
    let Finished { status, timed_out } = wait(&mut child, deadline)?;
    let stdout = out.join().unwrap_or_default();
    let mut stderr = errs.join().unwrap_or_default();
    if timed_out {
        stderr.push_str(&format!(
            "\noverlay: the check did not finish within {} s and was killed\n",
            req.timeout_secs
        ));
    }
    let millis = started.elapsed().as_millis() as u64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let text = format!(
        "# overlay verify on {}\n# python: {}\n# env: {env:?}\n# exit: {:?}{}\n# millis: {millis}\n--- code ---\n{}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        format_time(now),
        python.display(),
        status.code(),
        if timed_out { " (timed out)" } else { "" },
        req.python,
    );
    let log = store_log(&venv, req.generation.as_deref(), now, &text)?;
    Ok(VerifyReport {
        ok: status.success() && !timed_out,
        exit_code: status.code(),
        timed_out,
        stdout,
        stderr,
        log: log.to_string_lossy().into_owned(),
        millis,
    })
}

/// Start `python -c code` in the venv, in its own process group, with
/// `env` and its output piped.
fn spawn(
    venv: &Venv,
    python: &std::path::Path,
    code: &str,
    env: &BTreeMap<String, String>,
) -> Result<Child> {
    Command::new(python)
        .arg("-c")
        .arg(code)
        .envs(env)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .current_dir(&venv.root)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            err!(
                hint =
                    "is the venv intact? `python -m venv --upgrade` repairs its interpreter links",
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

/// Wait for the check; past `deadline`, kill its whole process group.
fn wait(child: &mut Child, deadline: Instant) -> Result<Finished> {
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| err!("Failed to wait for the check: {e}"))?
        {
            return Ok(Finished {
                status,
                timed_out: false,
            });
        }
        if Instant::now() > deadline {
            // The whole process group: children that hold the pipes open die too.
            let _ = rustix::process::kill_process_group(
                rustix::process::Pid::from_raw(child.id() as i32).expect("a child has a pid"),
                rustix::process::Signal::KILL,
            );
            let _ = child.kill();
            let status = child
                .wait()
                .map_err(|e| err!("Failed to wait for the check: {e}"))?;
            return Ok(Finished {
                status,
                timed_out: true,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
