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

impl Running {
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty() && self.unknown.is_empty()
    }
}
