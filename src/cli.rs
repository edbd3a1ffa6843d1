//! Command-line definitions. The doc comments here are the `--help` text;
//! each subcommand's `after_help` ends it with real examples. [`command`]
//! is the command line as parsed, shown and documented (completions, man
//! page): the derived [`Cli`] with each subcommand's own `-v` wording.

use std::path::PathBuf;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use overlay::model::{Compression, Connections};
use overlay::ops::HostChoice;
use overlay::transport::ConnectOptions;

mod bundle_args;
pub use bundle_args::{SignArgs, TrustArgs};

/// Overlay package sets from a working Python venv on one host onto another
/// host's venv, over SSH: exact, predictable, reversible.
///
/// Exit codes: 0 success; 1 `plan --check` found changes, or `doctor` found
/// problems; 2 bad usage (arguments, manifest, plan file); 3 the `[verify]`
/// check failed; 4 to 10 one per kind of failure (connection, host key,
/// drift, conflict, refused, host, protocol): see docs/exit-codes.md; 130
/// interrupted (Ctrl-C).
#[derive(Debug, Parser)]
#[command(
    name = "overlay",
    version,
    propagate_version = true,
    after_help = OVERLAY_EXAMPLES
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// The manifest: hosts, package sets and the `[verify]` check.
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

    /// Seconds to wait for each host to answer before giving up.
    #[arg(long, global = true, default_value_t = 10, value_name = "SECS")]
    pub connect_timeout: u64,

    /// Show more (repeatable); each command's `--help` says what.
    #[arg(long, short = 'v', global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// Print only data and errors: no status lines, no progress bars.
    #[arg(long, short = 'q', global = true)]
    pub quiet: bool,
}

impl GlobalArgs {
    /// How to reach hosts, from `--connect-timeout` and `--accept-new-host-key`.
    pub fn connect_options(&self) -> ConnectOptions {
        ConnectOptions {
            timeout: std::time::Duration::from_secs(self.connect_timeout.max(1)),
            accept_new_host_key: self.accept_new_host_key,
        }
    }

    /// The hosts `names` stand for when they are several (hosts and
    /// `[groups.NAME]`s), or none named and `plan` is a plan of several
    /// targets (its targets); `None` for one host, which the command's
    /// one-host form handles as it always did.
    pub fn several_hosts(
        &self,
        names: &[String],
        plan: &std::path::Path,
    ) -> overlay::error::Result<Option<Vec<String>>> {
        use overlay::fleet::plan_many;
        if names.is_empty() {
            return Ok(overlay::plan::load_fleet(plan)
                .map(|(f, _)| f.targets.into_iter().map(|t| t.name).collect()));
        }
        // One name that is not a group: the one-host form, which also
        // works without a manifest (from the plan's target).
        if names.len() == 1 && !plan_many::is_group(&self.manifest, &names[0]) {
            return Ok(None);
        }
        plan_many::targets(&self.manifest, names).map(Some)
    }

    /// The host a one-host command names, or else the target of `plan`.
    pub fn host_choice(&self, host: &Option<String>, plan: &std::path::Path) -> HostChoice {
        HostChoice {
            manifest: self.manifest.clone(),
            host: host.clone(),
            plan: plan.to_path_buf(),
            venv: None,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Hash the package sets on both live hosts and show what would be added,
    /// replaced and deleted on the target, with the problems predicted after
    /// the overlay. Changes nothing on either host; the plan is saved for
    /// `overlay apply`.
    #[command(after_help = PLAN_EXAMPLES)]
    Plan(PlanArgs),

    /// Carry out a saved plan on its target: stream only the changed files
    /// from the source, stage them, and switch them in through a journal.
    #[command(after_help = APPLY_EXAMPLES)]
    Apply(ApplyArgs),

    /// Write the sets of a live source into one bundle file, for
    /// `overlay apply --bundle FILE --venv PATH` on hosts the controller
    /// does not reach live (docs/pack.md).
    #[command(after_help = PACK_EXAMPLES)]
    Pack(PackArgs),

    /// Sign a bundle with an SSH key (BUNDLE.sig, OpenSSH's SSHSIG format),
    /// or print the message its signature signs.
    #[command(after_help = bundle_args::SIGN_EXAMPLES)]
    Sign(SignArgs),

    /// Restore the target to its state before a generation, byte for byte.
    /// Needs only the target host, and the generations' backups.
    #[command(after_help = ROLLBACK_EXAMPLES)]
    Rollback(RollbackArgs),

    /// List the generations (applies) on a host, newest last.
    #[command(after_help = HISTORY_EXAMPLES)]
    History(HistoryArgs),

    /// Remove old generations and their backups from a host.
    #[command(after_help = PRUNE_EXAMPLES)]
    Prune(PruneArgs),

    /// Run the manifest's `[verify]` smoke test in the host's venv and show
    /// its whole output. Exit 3 when the check fails.
    #[command(after_help = VERIFY_EXAMPLES)]
    Verify(VerifyArgs),

    /// Check a host's venv as it stands, without a source: files against
    /// their RECORD, damaged shared objects, extra files, duplicate
    /// dist-infos, stale bytecode, broken scripts, and the preflight's
    /// requirement, CUDA and ELF checks. What a healthy venv shows too
    /// (regenerable bytecode, edited data files, modules imported after
    /// another package, optional backends without their system library)
    /// is a note. Exit 1 when it finds a problem.
    #[command(after_help = DOCTOR_EXAMPLES)]
    Doctor(DoctorArgs),

    /// Print a shell completion script on stdout (see docs/completions.md).
    #[command(after_help = COMPLETIONS_EXAMPLES)]
    Completions(CompletionsArgs),

    /// Print the man page (roff) on stdout: overlay's, or one command's.
    #[command(after_help = MAN_EXAMPLES)]
    Man(ManArgs),

    /// Serve the controller on stdin/stdout (started by overlay itself on each host).
    #[command(hide = true)]
    Agent,
}

/// Where `plan` saves its plan, and where the other commands look for it.
pub const DEFAULT_PLAN: &str = ".overlay/plan.json";

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The host with the working venv (a name from the manifest's [hosts]).
    #[arg(required_unless_present = "bundle")]
    pub source: Option<String>,
    /// The hosts whose venvs are to be changed (names from [hosts], or
    /// [groups]): one plan each, against one scan of the source.
    #[arg(required_unless_present = "bundle", value_name = "TARGET")]
    pub targets: Vec<String>,

    /// Plan from a bundle written by `overlay pack` instead of a live
    /// source: name only the TARGETs (the bundle is read in place, never
    /// unpacked, and `overlay apply` streams from it);
    /// or, with --venv, on this host against that venv (no manifest, no
    /// SSH; read-only).
    #[arg(long, value_name = "FILE")]
    pub bundle: Option<PathBuf>,

    /// With --bundle: the venv on this host (then name no hosts).
    #[arg(long, value_name = "PATH", requires = "bundle")]
    pub venv: Option<String>,

    #[command(flatten)]
    pub trust: TrustArgs,

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

    /// Where to save the plan; `overlay apply FILE` carries it out.
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
    /// The plan to carry out, as saved by `overlay plan` (its `-o`).
    #[arg(default_value = ".overlay/plan.json")]
    pub plan: PathBuf,

    /// With --bundle (and no --venv): more targets; the first one takes
    /// PLAN's place (`overlay apply --bundle FILE T1 T2 ...`).
    #[arg(value_name = "TARGET", requires = "bundle")]
    pub targets: Vec<String>,

    /// Apply a bundle written by `overlay pack`: to the TARGETs named
    /// (hosts or groups of the manifest; planned from the bundle into
    /// .overlay/plan.json, then applied as `overlay apply` does), or with
    /// --venv to that venv on this host (no manifest, no SSH; `--json`
    /// prints one line).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["direct", "relay", "resume", "same_owner"])]
    pub bundle: Option<PathBuf>,

    /// With --bundle: the venv on this host (then name no targets).
    #[arg(long, value_name = "PATH", requires = "bundle")]
    pub venv: Option<String>,

    #[command(flatten)]
    pub trust: TrustArgs,

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
    /// link as it goes (none on a fast link, more on a slow one, none at all
    /// when both hosts are local), `none` sends files as they are, a number
    /// is a fixed zstd level (-7 to 19).
    #[arg(
        long,
        default_value = "auto",
        value_name = "auto|none|LEVEL",
        allow_negative_numbers = true
    )]
    pub compress: Compression,

    /// How many SSH connections the stream takes (relay and --direct):
    /// `auto` opens several on a fast link between hosts with cores to
    /// spare, one on a slow link; a number opens that many (1 to 32).
    #[arg(long, default_value = "auto", value_name = "auto|N")]
    pub connections: Connections,

    /// Stream straight from the source host to the target with the source's
    /// own `ssh` client (to the target's `direct_ssh`, or its `ssh` value),
    /// instead of relaying through this machine; an error if the source
    /// cannot reach the target without a prompt. Without --direct or
    /// --relay, the manifest's `route` decides (the relay unless it says
    /// "direct"): see docs/apply.md.
    #[arg(long)]
    pub direct: bool,

    /// Stream through this machine, even when the manifest's `route` is
    /// "direct".
    #[arg(long, conflicts_with = "direct")]
    pub relay: bool,

    /// Apply a plan that predicts problems even though it was made with `--strict`.
    #[arg(long)]
    pub force: bool,

    /// Apply even while processes run from the target's venv (without it
    /// the target refuses, exit 8, before anything is written, and names
    /// them); those still running the old files after are named: restart
    /// them.
    #[arg(long)]
    pub allow_running: bool,

    /// After the switch, run the manifest's `[verify]` check on the target.
    #[arg(long)]
    pub verify: bool,

    /// When the `--verify` check fails, roll the generation back (not with `--no-backup`).
    #[arg(long, requires = "verify", conflicts_with = "no_backup")]
    pub rollback_on_failure: bool,

    /// Place no bytecode (as `pip install --no-compile`): the source's
    /// `__pycache__` files of the `.py` files the plan carries stay behind,
    /// and the target's old ones of those files are deleted as stale.
    #[arg(long)]
    pub no_compile: bool,

    /// A plan of several targets: how many to apply at once, the next
    /// starting as one finishes; those that can share one read of the
    /// source do (Ansible's default of 5 forks).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub parallel: u64,

    /// A plan of several targets: apply (and with --verify check) the first
    /// K targets first; the others start only if all K succeed.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub canary: usize,

    /// A plan of several targets: start no new target once K have failed
    /// (default: go on through every target). Those not started are untouched.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_fail: Option<u64>,
}

#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// The hosts whose venvs to check, or groups (default: the target, or
    /// the targets, of the last plan).
    #[arg(value_name = "HOST")]
    pub hosts: Vec<String>,

    /// Give up on the check after this many seconds (default: the
    /// manifest's `[verify] timeout`, else 600).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: Option<u64>,

    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,

    /// The saved plan whose target is the default host.
    #[arg(long, default_value = ".overlay/plan.json", value_name = "FILE")]
    pub plan: PathBuf,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The host whose venv to check (default: the target of the last plan).
    pub host: Option<String>,

    /// Print the findings (problems and notes) as JSON on stdout.
    #[arg(long)]
    pub json: bool,

    /// The saved plan whose target is the default host.
    #[arg(long, default_value = ".overlay/plan.json", value_name = "FILE")]
    pub plan: PathBuf,

    /// A venv on this machine instead of a manifest's host (no manifest,
    /// no SSH), e.g. one that `overlay apply --bundle FILE --venv PATH`
    /// changed.
    #[arg(long, value_name = "PATH", conflicts_with = "host")]
    pub venv: Option<String>,
}

#[derive(Debug, Args)]
pub struct PackArgs {
    /// The host with the working venv (a name from the manifest's [hosts]).
    pub source: String,

    /// Only these sets (repeatable); default: every set in the manifest.
    #[arg(long = "set", value_name = "NAME")]
    pub sets: Vec<String>,

    /// The bundle to write (replaced atomically).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub out: PathBuf,

    /// Sign the bundle with this key (FILE.sig): as `overlay sign --key`.
    #[arg(long, value_name = "KEY")]
    pub sign: Option<String>,

    /// Print the result as one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RollbackArgs {
    /// The target hosts, or groups (default: the target, or the targets,
    /// of the last plan).
    #[arg(value_name = "HOST")]
    pub hosts: Vec<String>,

    /// Roll back every generation from the newest down to and including
    /// this one, an ID from `overlay history` (default: only the newest).
    #[arg(long, value_name = "ID")]
    pub to: Option<String>,

    /// Roll back even if the generations' files or distributions changed since the apply (pip ran); what stands in the way is kept in the state folder.
    #[arg(long)]
    pub force: bool,

    /// Roll back even while processes run from the venv (without it the
    /// target refuses, exit 8, and names them); those still running after
    /// are named: restart them.
    #[arg(long)]
    pub allow_running: bool,

    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,

    /// The saved plan whose target is the default host.
    #[arg(long, default_value = ".overlay/plan.json", value_name = "FILE")]
    pub plan: PathBuf,

    /// A venv on this machine instead of a manifest's host, e.g. one that
    /// `overlay apply --bundle FILE --venv PATH` changed.
    #[arg(long, value_name = "PATH", conflicts_with = "hosts")]
    pub venv: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct HistoryArgs {
    /// The hosts whose generations to list, or groups (default: the
    /// target, or the targets, of the last plan).
    #[arg(value_name = "HOST")]
    pub hosts: Vec<String>,

    /// Print the generations as JSON on stdout.
    #[arg(long)]
    pub json: bool,

    /// The saved plan whose target is the default host.
    #[arg(long, default_value = ".overlay/plan.json", value_name = "FILE")]
    pub plan: PathBuf,

    /// A venv on this machine instead of a manifest's host, e.g. one that
    /// `overlay apply --bundle FILE --venv PATH` changed.
    #[arg(long, value_name = "PATH", conflicts_with = "hosts")]
    pub venv: Option<String>,
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// The host to prune (default: the target of the last plan).
    pub host: Option<String>,

    /// How many of the newest generations to keep.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub keep: usize,

    /// The saved plan whose target is the default host.
    #[arg(long, default_value = ".overlay/plan.json", value_name = "FILE")]
    pub plan: PathBuf,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// One command's page (`overlay-apply(1)`, ...) instead of overlay's.
    #[arg(value_name = "COMMAND")]
    pub command: Option<String>,
}

const OVERLAY_EXAMPLES: &str = "\
Examples:
  See what would change on ct200, carry it out, and undo it:
    overlay plan ct129 ct200
    overlay apply
    overlay rollback ct200
  Every command's own examples:
    overlay plan --help";

const PLAN_EXAMPLES: &str = "\
Examples:
  Compare every set of the manifest; save the plan to .overlay/plan.json:
    overlay plan ct129 ct200
  Only the torch set, listing every changed path:
    overlay plan ct129 ct200 --set torch -v
  One plan per target for several targets (or name a [groups.NAME]), saved
  to .overlay/plan.d/TARGET.json and listed in .overlay/plan.json:
    overlay plan ct129 ct200 ct201 ct202
  From a bundle of `overlay pack` instead of the source (which may be down);
  on a host itself, `--bundle FILE --venv PATH` shows what it would change:
    overlay plan --bundle stack.ovl ct200 ct201";

const APPLY_EXAMPLES: &str = "\
Examples:
  Carry out the last plan (.overlay/plan.json), then run the [verify] check:
    overlay apply --verify
  Carry out a plan saved with `overlay plan -o`:
    overlay apply ct201.json
  Stream straight from the source host to the target, at zstd level 3:
    overlay apply --direct --compress 3
  After `overlay plan ct129 ct200 ct201 ct202 ct203`: ct200 first as a canary,
  then the rest two at a time, stopping after a failure, each rolled back if
  its check fails:
    overlay apply --canary 1 --parallel 2 --max-fail 1 --verify --rollback-on-failure";

const PACK_EXAMPLES: &str = "\
Examples:
  Pack every set of the manifest from ct129 into one file:
    overlay pack ct129 -o stack.ovl
  Only torch and its CUDA wheels; the result as one JSON line:
    overlay pack ct129 --set torch --set nvidia-cu13 -o torch.ovl --json
  Signed with your SSH key (stack.ovl.sig; hosts check it with --trust):
    overlay pack ct129 -o stack.ovl --sign ~/.ssh/id_ed25519
(Then on each host: overlay apply --bundle FILE --venv PATH; or from here,
with the source down: overlay apply --bundle FILE TARGET...; docs/fleet.md)";

const ROLLBACK_EXAMPLES: &str = "\
Examples:
  Undo the newest generation on ct200:
    overlay rollback ct200
  On every host of the manifest's [groups.gpu] (each its own newest):
    overlay rollback gpu
  Undo every generation down to and including one that `overlay history` lists:
    overlay rollback ct200 --to 20261130T142018Z-158f
  Undo the newest generation on the last plan's target; the result as JSON:
    overlay rollback --json";

const HISTORY_EXAMPLES: &str = "\
Examples:
  The generations on ct200:
    overlay history ct200
  On ct200 and ct201, one table each:
    overlay history ct200 ct201
  The same as JSON, for a script:
    overlay history ct200 --json";

const PRUNE_EXAMPLES: &str = "\
Examples:
  Keep the three newest generations on ct200 (the default), remove the rest:
    overlay prune ct200
  Keep only the newest (older ones can no longer be rolled back):
    overlay prune ct200 --keep 1";

const VERIFY_EXAMPLES: &str = "\
Examples:
  Run the manifest's [verify] check on ct200:
    overlay verify ct200
  On every target of the last plan of several targets:
    overlay verify
  On the source, giving up after two minutes; the result as JSON:
    overlay verify ct129 --timeout 120 --json";

const DOCTOR_EXAMPLES: &str = "\
Examples:
  Check ct200's venv as it stands:
    overlay doctor ct200
  The same for the source, as JSON:
    overlay doctor ct129 --json
  A venv on this machine, no manifest:
    overlay doctor --venv /root/venv";

const COMPLETIONS_EXAMPLES: &str = "\
Examples:
  bash (for your user; bash-completion loads it from there):
    overlay completions bash > ~/.local/share/bash-completion/completions/overlay
  zsh (with `fpath+=~/.zfunc; autoload -U compinit; compinit` in ~/.zshrc):
    overlay completions zsh > ~/.zfunc/_overlay
  fish:
    overlay completions fish > ~/.config/fish/completions/overlay.fish";

const MAN_EXAMPLES: &str = "\
Examples:
  Read overlay's page, or apply's:
    overlay man | man -l -
    overlay man apply | man -l -
  Install the page for every user:
    overlay man > /usr/local/share/man/man1/overlay.1";

/// What `-v` shows on each command, where it shows anything (`None`: the
/// flag is accepted but does nothing there, so it is not listed).
const VERBOSE_HELP: &[(&str, Option<&str>)] = &[
    (
        "plan",
        Some(
            "Show more: `-v` every changed path and every predicted problem, \
             `-vv` also the time each step took",
        ),
    ),
    (
        "apply",
        Some(
            "Show more: `-vv` the time each step took and the compression \
             levels `--compress auto` measured",
        ),
    ),
    (
        "rollback",
        Some("Show more: every file and dist-info changed since the apply, not the first few"),
    ),
    (
        "history",
        Some("Show more: one line per changed distribution, not the first three"),
    ),
    ("prune", None),
    ("verify", None),
    (
        "doctor",
        Some("Show more: every note in full, not one line per kind of note"),
    ),
    ("completions", None),
    ("man", None),
];

/// Global flags that mean nothing to a command: accepted there, not listed.
const UNUSED_GLOBALS: &[(&str, &[&str])] = &[
    (
        "completions",
        &[
            "manifest",
            "accept_new_host_key",
            "connect_timeout",
            "quiet",
        ],
    ),
    (
        "man",
        &[
            "manifest",
            "accept_new_host_key",
            "connect_timeout",
            "quiet",
        ],
    ),
];

/// One of [`GlobalArgs`]' flags as derived, to give a subcommand its own
/// copy (which then takes the place of the global one there).
fn global_arg(id: &str) -> clap::Arg {
    GlobalArgs::augment_args(clap::Command::new("overlay"))
        .get_arguments()
        .find(|a| a.get_id() == id)
        .cloned()
        .unwrap_or_else(|| panic!("no global argument {id}"))
}

/// The command line as parsed, shown in `--help` and documented by
/// `overlay completions` and `overlay man`: [`Cli`], with each subcommand's
/// own wording of `-v` and without the global flags it does not use.
pub fn command() -> clap::Command {
    Cli::command().mut_subcommands(|mut sc| {
        let name = sc.get_name().to_string();
        if let Some((_, help)) = VERBOSE_HELP.iter().find(|(n, _)| *n == name) {
            let arg = global_arg("verbose");
            sc = sc.arg(match help {
                Some(h) => arg.help(*h),
                None => arg.hide(true),
            });
        }
        if let Some((_, ids)) = UNUSED_GLOBALS.iter().find(|(n, _)| *n == name) {
            for id in *ids {
                sc = sc.arg(global_arg(id).hide(true));
            }
        }
        sc
    })
}

/// Parse the process's arguments with [`command`].
///
/// Also notes whether `--manifest` was given (on the command line or in the
/// environment) rather than defaulted: `apply` then checks it against the
/// manifest the plan recorded.
pub fn parse() -> Result<Cli, clap::Error> {
    use clap::parser::ValueSource;
    let mut cmd = command();
    let matches = cmd.try_get_matches_from_mut(std::env::args_os())?;
    let mut cli = Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))?;
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

/// Run `one` on each of `hosts` in turn: with `headers` (and not `json`),
/// a `== HOST ==` line on stdout before each host's own output; with
/// `json`, each host's document as its one-host command prints it, in the
/// order of `hosts`. A host that
/// fails has its error printed and the others still run; then exit 0 if
/// all succeeded, else an error of kind `TargetsFailed` naming the others.
pub fn on_each_host(
    hosts: &[String],
    json: bool,
    headers: bool,
    mut one: impl FnMut(&str) -> overlay::error::Result<u8>,
) -> overlay::error::Result<u8> {
    use overlay::text::escape;
    let mut failed: Vec<String> = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        if headers && !json {
            if i > 0 {
                println!();
            }
            println!("== {} ==", escape(h));
        }
        match one(h) {
            Ok(0) => {}
            Ok(code) => failed.push(format!("{h} (exit {code})")),
            Err(e) => {
                eprintln!("error: {}", escape(&e.to_string()));
                if let Some(hint) = &e.hint {
                    eprintln!("hint: {}", escape(hint));
                }
                failed.push(format!("{h} (exit {})", e.kind.exit_code()));
            }
        }
    }
    if failed.is_empty() {
        return Ok(overlay::error::EXIT_OK);
    }
    Err(overlay::err!(
        kind = TargetsFailed,
        hint = "see each host's error above",
        "{} of {} hosts did not succeed: {}",
        failed.len(),
        hosts.len(),
        failed.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn a_subcommand_s_own_verbose_still_counts() {
        let parse = |args: &[&str]| {
            let m = command().try_get_matches_from(args).unwrap();
            Cli::from_arg_matches(&m).unwrap().global.verbose
        };
        assert_eq!(parse(&["overlay", "plan", "a", "b", "-vv"]), 2);
        assert_eq!(parse(&["overlay", "-v", "plan", "a", "b"]), 1);
        assert_eq!(parse(&["overlay", "rollback", "-v"]), 1);
        assert_eq!(parse(&["overlay", "history"]), 0);
    }
}
