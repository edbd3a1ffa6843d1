//! Processes that run from a venv ([`Running`]), as the target's agent
//! finds them (`crate::running`): what the plan names, what `apply` and
//! `rollback` refuse on, and what they name as still running old files.

use serde::{Deserialize, Serialize};

/// How a process was found to run from the venv.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum How {
    /// Its executable is a file of the venv.
    Exe,
    /// Its command runs the venv's interpreter or one of its scripts
    /// (`argv[0]` or `argv[1]`).
    Interpreter,
    /// It maps a file of the venv (a shared object: `/proc/PID/maps`).
    Maps,
    /// It holds a file of the venv open (`/proc/PID/fd`).
    Fd,
}

impl How {
    pub fn name(self) -> &'static str {
        match self {
            How::Exe => "exe",
            How::Interpreter => "interpreter",
            How::Maps => "maps",
            How::Fd => "fd",
        }
    }
}

/// One process on the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VenvProcess {
    pub pid: u32,
    /// Its effective uid.
    pub uid: u32,
    /// The user's name (from the host's /etc/passwd), else the uid.
    pub user: String,
    /// Its command line, arguments joined by spaces (raw: escape it to show it).
    pub command: String,
    /// When it started, seconds since the epoch (UTC).
    pub started: u64,
    /// GPU memory it holds, MiB, where `nvidia-smi` tells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_mib: Option<u64>,
    /// How it was found to run from the venv (empty for a process that
    /// could not be inspected).
    #[serde(default)]
    pub how: Vec<How>,
}

/// The processes of a host that run from a venv.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Running {
    /// Those that run from the venv, by pid.
    pub processes: Vec<VenvProcess>,
    /// Those the agent may not inspect (another user's, the agent not
    /// root): whether they run from the venv is unknown.
    #[serde(default)]
    pub unknown: Vec<VenvProcess>,
}

impl VenvProcess {
    /// `pid 1234 (root) python -m x`: the command escaped for the
    /// terminal and cut at 80 characters.
    pub fn brief(&self) -> String {
        let cmd = crate::text::escape(&self.command);
        let cmd = if cmd.chars().count() > 80 {
            format!("{}...", cmd.chars().take(77).collect::<String>())
        } else {
            cmd.into_owned()
        };
        format!(
            "pid {} ({}) {cmd}",
            self.pid,
            crate::text::escape(&self.user)
        )
    }
}

/// [`VenvProcess::brief`] of each, comma-separated.
pub fn brief_list(procs: &[VenvProcess]) -> String {
    procs
        .iter()
        .map(VenvProcess::brief)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Running {
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty() && self.unknown.is_empty()
    }

    /// The plan's warnings about them, on `host`: those that run from
    /// the venv (apply refuses), and a count of those not inspected.
    pub fn warnings(&self, host: &str) -> Vec<String> {
        let mut out = Vec::new();
        let n = self.processes.len();
        if n > 0 {
            out.push(format!(
                "{n} process{} run{} from {host}'s venv: {}; `overlay apply` and `overlay rollback` refuse while {} run{} (stop {}, or pass --allow-running)",
                plural(n, "", "es"),
                plural(n, "s", ""),
                brief_list(&self.processes),
                plural(n, "it", "they"),
                plural(n, "s", ""),
                plural(n, "it", "them"),
            ));
        }
        let u = self.unknown.len();
        if u > 0 {
            let mut users: Vec<&str> = self.unknown.iter().map(|p| p.user.as_str()).collect();
            users.sort_unstable();
            users.dedup();
            out.push(format!(
                "{u} process{} on {host} could not be inspected (user{} {}; the agent is not root): whether {} from its venv is unknown; with `sudo` for {host} in the manifest the agent sees them",
                plural(u, "", "es"),
                plural(users.len(), "", "s"),
                crate::text::escape(&users.join(", ")),
                plural(u, "it runs", "they run"),
            ));
        }
        out
    }
}

fn plural<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}
