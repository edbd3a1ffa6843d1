//! Command-line definitions. The doc comments here are the `--help` text.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use overlay::model::Compression;
use overlay::ops::HostChoice;
use overlay::transport::ConnectOptions;

/// Overlay package sets from a working Python venv on one host onto another
/// host's venv, over SSH: exact, predictable, reversible.
///
/// Exit codes: 0 success; 1 `--check` found changes, or `doctor` found
/// problems; 2 error; 3 the `[verify]` check failed; 130 interrupted (Ctrl-C).
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
    #[arg(
        long,
        short = 'm',
        global = true,
        default_value = "overlay.toml",
        env = "OVERLAY_MANIFEST"
    )]
    pub manifest: PathBuf,

    /// Whether `--manifest` (or OVERLAY_MANIFEST) was given rather than
    /// defaulted: `apply` then refuses a plan made from another manifest.
    #[arg(skip)]
    pub manifest_explicit: bool,

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

impl Cli {
    /// Parse the command line, noting whether `--manifest` was given (on
    /// the command line or in the environment) rather than defaulted.
    pub fn try_parse_marked() -> Result<Cli, clap::Error> {
        use clap::{CommandFactory, FromArgMatches, parser::ValueSource};
        let matches = Cli::command().try_get_matches()?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        let given = |m: &clap::ArgMatches| {
            matches!(
                m.value_source("manifest"),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        };
        cli.global.manifest_explicit =
            given(&matches) || matches.subcommand().is_some_and(|(_, m)| given(m));
        Ok(cli)
    }
}

impl GlobalArgs {
    /// How to reach hosts, from `--connect-timeout` and `--accept-new-host-key`.
    pub fn connect_options(&self) -> ConnectOptions {
        ConnectOptions {
            timeout: std::time::Duration::from_secs(self.connect_timeout.max(1)),
            accept_new_host_key: self.accept_new_host_key,
        }
    }

    /// The host a one-host command names, or else the target of `plan`.
    pub fn host_choice(&self, host: &Option<String>, plan: &std::path::Path) -> HostChoice {
        HostChoice {
            manifest: self.manifest.clone(),
            host: host.clone(),
            plan: plan.to_path_buf(),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Hash the package sets on both live hosts and show what would be added,
    /// replaced and deleted on the target. Changes nothing on either host; the
    /// plan is saved for `overlay apply`.
    Plan(PlanArgs),

    /// Carry out a saved plan on its target: stream only the changed files
    /// from the source, stage them, and switch them in through a journal.
    Apply(ApplyArgs),

    /// Restore the target to its state before a generation, byte for byte.
    /// Needs only the target host.
    Rollback(RollbackArgs),

    /// List the generations (applies) on a host.
    History(HistoryArgs),

    /// Remove old generations and their backups.
    Prune(PruneArgs),

    /// Run the manifest's `[verify]` smoke test in the host's venv and show
    /// its whole output. Exit 3 when the check fails.
    Verify(VerifyArgs),

    /// Check a host's venv as it stands, without a source: files against
    /// their RECORD, damaged shared objects, extra files, duplicate
    /// dist-infos, stale bytecode, broken scripts, and the preflight's
    /// requirement, CUDA and ELF checks. Exit 1 when it finds a problem.
    Doctor(DoctorArgs),

    /// Serve the controller on stdin/stdout (started by overlay itself on each host).
    #[command(hide = true)]
    Agent,
}

/// Where `plan` saves its plan, and where the other commands look for it.
pub const DEFAULT_PLAN: &str = ".overlay/plan.json";

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

    /// Treat predicted problems (requirements, CUDA builds, ELF loading) as
    /// errors: exit 2, and `overlay apply` refuses the plan without `--force`.
    #[arg(long)]
    pub strict: bool,

    /// Where to save the plan.
    #[arg(
        long,
        short = 'o',
        default_value = ".overlay/plan.json",
        value_name = "FILE"
    )]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The plan to carry out.
    #[arg(default_value = ".overlay/plan.json")]
    pub plan: PathBuf,

    /// Keep the old files so that `overlay rollback` can restore them (the
    /// default; accepted for scripts that pass it).
    #[arg(long)]
    pub backup: bool,

    /// Keep no backup: less space on the target, but `overlay rollback`
    /// cannot undo this generation.
    #[arg(long, conflicts_with = "backup")]
    pub no_backup: bool,

    /// After a successful apply, keep only the newest N generations.
    #[arg(long, value_name = "N")]
    pub keep: Option<usize>,

    /// Complete an interrupted apply instead of rolling it back.
    #[arg(long)]
    pub resume: bool,

    /// As root on the target: give new files the source's uid/gid (as
    /// `tar --same-owner` and `rsync -a` do). Without it they take the
    /// owner of the file they replace, or of the directory they land in.
    #[arg(long)]
    pub same_owner: bool,

    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,

    /// How the stream is compressed: `auto` picks the zstd level for the
    /// link as it goes (none on a fast link, more on a slow one), `none`
    /// sends files as they are, a number is a fixed zstd level (-7 to 19).
    #[arg(
        long,
        default_value = "auto",
        value_name = "auto|none|LEVEL",
        allow_negative_numbers = true
    )]
    pub compress: Compression,

    /// Stream straight from the source host to the target with the source's
    /// own `ssh` client (to the target's `direct_ssh`, or its `ssh` value),
    /// instead of relaying through this machine. Needs the source to reach
    /// the target without a prompt: see docs/apply.md.
    #[arg(long)]
    pub direct: bool,

    /// Apply a plan that predicts problems even though it was made with `--strict`.
    #[arg(long)]
    pub force: bool,

    /// After the switch, run the manifest's `[verify]` check on the target.
    #[arg(long)]
    pub verify: bool,

    /// When the `--verify` check fails, roll the generation back (not with `--no-backup`).
    #[arg(long, requires = "verify", conflicts_with = "no_backup")]
    pub rollback_on_failure: bool,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The host whose venv to check (default: the target of the last plan).
    pub host: Option<String>,

    /// Give up on the check after this many seconds (default: the
    /// manifest's `[verify] timeout`, else 600).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: Option<u64>,

    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,

    /// The plan that names the default host.
    #[arg(long, default_value = ".overlay/plan.json", value_name = "FILE")]
    pub plan: PathBuf,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The host whose venv to check (default: the target of the last plan).
    pub host: Option<String>,

    /// Print the findings as JSON on stdout.
    #[arg(long)]
    pub json: bool,

    /// The plan that names the default host.
    #[arg(long, default_value = ".overlay/plan.json", value_name = "FILE")]
    pub plan: PathBuf,
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// The target host (default: the target of the last plan).
    pub host: Option<String>,

    /// Roll back every generation down to and including this one (default: the newest).
    #[arg(long, value_name = "ID")]
    pub to: Option<String>,

    /// Roll back even if the generations' files or distributions changed since the apply (pip ran); what stands in the way is kept in the state folder.
    #[arg(long)]
    pub force: bool,

    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,

    /// The plan that names the default host.
    #[arg(long, default_value = ".overlay/plan.json", value_name = "FILE")]
    pub plan: PathBuf,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The host (default: the target of the last plan).
    pub host: Option<String>,

    /// Print the generations as JSON on stdout.
    #[arg(long)]
    pub json: bool,

    /// The plan that names the default host.
    #[arg(long, default_value = ".overlay/plan.json", value_name = "FILE")]
    pub plan: PathBuf,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// The host (default: the target of the last plan).
    pub host: Option<String>,

    /// How many of the newest generations to keep.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub keep: usize,

    /// The plan that names the default host.
    #[arg(long, default_value = ".overlay/plan.json", value_name = "FILE")]
    pub plan: PathBuf,
}
