//! Command-line definitions. The doc comments here are the `--help` text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Overlay package sets from a working Python venv on one host onto another
/// host's venv, over SSH: exact, predictable, reversible.
///
/// Exit codes: 0 success; 1 `--check` found changes; 2 error.
#[derive(Debug, Parser)]
#[command(name = "overlay", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// The manifest that names hosts and package sets.
    #[arg(long, short = 'm', global = true, default_value = "overlay.toml", env = "OVERLAY_MANIFEST")]
    pub manifest: PathBuf,

    /// Trust and record a host key seen for the first time (never a changed one).
    #[arg(long, global = true)]
    pub accept_new_host_key: bool,

    /// Seconds to wait for a host to answer before giving up.
    #[arg(long, global = true, default_value_t = 10, value_name = "SECS")]
    pub connect_timeout: u64,

    /// Show more: with `plan`, every changed path.
    #[arg(long, short = 'v', global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Print only data and errors, no status or progress.
    #[arg(long, short = 'q', global = true)]
    pub quiet: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Hash the package sets on both live hosts and show what would be added,
    /// replaced and deleted on the target. Changes nothing on either host; the
    /// plan is saved for `overlay apply`.
    Plan(PlanArgs),

    /// Serve the controller on stdin/stdout (started by overlay itself on each host).
    #[command(hide = true)]
    Agent,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The host with the working venv (a name from the manifest's [hosts]).
    pub source: String,
    /// The host whose venv is to be changed.
    pub target: String,

    /// Only these sets (repeatable); default: every set in the manifest.
    #[arg(long = "set", value_name = "NAME")]
    pub sets: Vec<String>,

    /// Print the plan as one JSON document on stdout.
    #[arg(long)]
    pub json: bool,

    /// Exit with 1 if there is anything to change (like `git diff --exit-code`).
    #[arg(long)]
    pub check: bool,

    /// Where to save the plan.
    #[arg(long, short = 'o', default_value = ".overlay/plan.json", value_name = "FILE")]
    pub out: PathBuf,
}
