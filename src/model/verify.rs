//! The smoke test: what to run on the target ([`VerifyRequest`]) and how it
//! went ([`VerifyReport`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerifyRequest {
    pub venv: String,
    /// Environment for the check; `{site_packages}` and `{venv}` are expanded.
    pub env: BTreeMap<String, String>,
    /// Python source run with the venv's interpreter.
    pub python: String,
    pub timeout_secs: u64,
    /// Also log into this generation's folder.
    pub generation: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VerifyReport {
    pub ok: bool,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    /// The log on the target.
    pub log: String,
    pub millis: u64,
}

impl VerifyReport {
    /// The final line of the error (the exception), if it failed.
    pub fn final_line(&self) -> Option<&str> {
        self.stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(str::trim)
    }
}
