//! The local transport: the agent is this binary, started as a child process
//! with piped stdin/stdout. Used for hosts without `ssh` in the manifest and by
//! unit tests. With the manifest's `sudo` it is started as
//! `sudo -n -u USER -- <this binary> agent` (the user name checked as for
//! the ssh transport).

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use crate::err;
use crate::error::Result;

pub fn start_agent(host: &str, sudo: Option<&str>) -> Result<super::AgentPipe> {
    let exe = super::agent_binary_path()?;
    let Some(user) = sudo else {
        let mut cmd = Command::new(&exe);
        cmd.arg("agent");
        return spawn(host, cmd);
    };
    if !crate::model::valid_user_name(user) {
        return Err(err!(
            kind = Usage,
            hint = "set `sudo = true` or `sudo = \"USER\"` with a plain user name in the host's [hosts] table",
            "Refusing to run the agent for {host} through sudo as {user:?}: not a user name"
        ));
    }
    let mut cmd = Command::new("sudo");
    cmd.args(["-n", "-u", user, "--"]).arg(&exe).arg("agent");
    let exe_shown = exe.display().to_string();
    let user = user.to_string();
    let sudoers = move |login: &str| format!("{login} ALL=({user}) NOPASSWD: {exe_shown}");
    let mut pipe = spawn(host, cmd).map_err(|e| {
        e.hint(format!(
            "install sudo, or remove `sudo` from [hosts.{host}] in the manifest (then add to sudoers: {})",
            sudoers("USER")
        ))
    })?;
    let finish = pipe.finish;
    let login = std::env::var("USER").unwrap_or_else(|_| "USER".into());
    let user = sudo.unwrap_or("root").to_string();
    let host = host.to_string();
    pipe.finish = Box::new(move || {
        finish().map_err(|e| {
            if e.message.contains("sudo:")
                && (e.message.contains("password is required")
                    || e.message.contains("not allowed"))
            {
                err!(
                    kind = Connection,
                    hint = format!(
                        "add to sudoers (visudo -f /etc/sudoers.d/overlay): {}",
                        sudoers(&login)
                    ),
                    "Failed to start the agent on {host} as {user} through sudo: sudo needs a password for user {login}"
                )
            } else {
                e
            }
        })
    });
    Ok(pipe)
}

/// Run `cmd` with piped stdin/stdout as the agent pipe (stderr is collected
/// and returned by `finish`), in a process group of its own: a Ctrl-C on
/// the terminal reaches only the controller, which stops the agent cleanly
/// (`crate::interrupt`), never the agent in the middle of a switch.
pub fn spawn(host: &str, mut cmd: Command) -> Result<super::AgentPipe> {
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            err!(
                "Failed to start the agent for {host} ({}): {e}",
                cmd.get_program().to_string_lossy()
            )
        })?;
    let writer = child.stdin.take().expect("piped stdin");
    let reader = child.stdout.take().expect("piped stdout");
    // A stream moves in 1 MiB frames (see `PIPE_SIZE`).
    let _ = rustix::pipe::fcntl_setpipe_size(&writer, super::PIPE_SIZE);
    let _ = rustix::pipe::fcntl_setpipe_size(&reader, super::PIPE_SIZE);
    let mut stderr = child.stderr.take().expect("piped stderr");
    // Drain stderr on its own thread so a chatty agent can never block.
    let drain = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let host = host.to_string();
    let pid = child.id();
    let child = Arc::new(Mutex::new(child));
    let (probe, cut) = (child.clone(), child.clone());
    Ok(super::AgentPipe {
        reader: Box::new(reader),
        writer: Box::new(writer),
        finish: Box::new(move || {
            let status = child
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .wait()
                .map_err(|e| err!("Failed to wait for the agent on {host}: {e}"))?;
            let text = drain.join().unwrap_or_default();
            if !status.success() {
                let text = text.trim();
                return Err(err!(
                    "The agent on {host} {}{}{text}",
                    ended(status),
                    if text.is_empty() { "" } else { ": " }
                ));
            }
            Ok(text)
        }),
        watch: super::Watch::new(
            move || {
                // `finish` holds the child while it waits: then nobody needs to know.
                let mut c = probe.try_lock().ok()?;
                match c.try_wait() {
                    Ok(Some(status)) => Some(ended(status)),
                    Ok(None) => None,
                    Err(e) => Some(format!("cannot be waited for: {e}")),
                }
            },
            move || match cut.try_lock() {
                Ok(mut c) => {
                    let _ = c.kill();
                }
                // `finish` is waiting for it, so it is not reaped yet.
                Err(_) => {
                    // SAFETY: plain kill(2) of our own child.
                    unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
                }
            },
        ),
    })
}

/// How a child ended, as the end of "The agent on HOST ...".
fn ended(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (_, Some(sig)) => format!("was killed by signal {}", super::signal_number(sig)),
        (Some(0), _) => "exited".into(),
        (Some(code), _) => format!("exited with status {code}"),
        (None, None) => format!("exited with {status}"),
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    #[test]
    fn a_watch_sees_a_killed_child_and_finish_names_the_signal() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let pipe = super::spawn("h", cmd).unwrap();
        assert_eq!(pipe.watch.gone(), None);
        pipe.watch.cut();
        let mut gone = None;
        while gone.is_none() {
            gone = pipe.watch.gone();
            std::thread::yield_now();
        }
        assert_eq!(gone.as_deref(), Some("was killed by signal 9 (KILL)"));
        let e = (pipe.finish)().unwrap_err();
        assert_eq!(e.message, "The agent on h was killed by signal 9 (KILL)");
    }
}
