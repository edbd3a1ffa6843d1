//! How the binary shows an operation's progress ([`Console`], the
//! [`Observer`] of `overlay::ops`): status lines and `-vv` details on
//! stderr, progress bars (on stderr) only when stderr is a terminal and
//! `--quiet` is off, the `[verify]` check's output, and terminal styling
//! (colour only without `NO_COLOR`).

use std::io::IsTerminal;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use overlay::model::{Progress, VerifyReport};
use overlay::ops::{Meter, Observer};
use overlay::text::escape;

use crate::cli::GlobalArgs;

fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

pub fn color_stderr() -> bool {
    !no_color() && std::io::stderr().is_terminal()
}

pub fn color_stdout() -> bool {
    !no_color() && std::io::stdout().is_terminal()
}

/// Where the `[verify]` check's own output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckOutput {
    /// Its stdout to stdout, its stderr to stderr (`overlay verify`, `apply --verify`).
    Text,
    /// Both to stderr (`apply --verify --json`: stdout holds one JSON document).
    Stderr,
    /// The whole report as JSON on stdout (`overlay verify --json`).
    Json,
}

/// The terminal (or log) an operation reports to.
pub struct Console {
    quiet: bool,
    verbose: u8,
    check: CheckOutput,
    /// The bars, made when the first is asked for; `None` when they are off.
    bars: OnceLock<Option<MultiProgress>>,
}

impl Console {
    pub fn new(global: &GlobalArgs) -> Console {
        Console {
            quiet: global.quiet,
            verbose: global.verbose,
            check: CheckOutput::Text,
            bars: OnceLock::new(),
        }
    }

    /// Show the `[verify]` check's output as `check` says.
    pub fn check_output(mut self, check: CheckOutput) -> Console {
        self.check = check;
        self
    }
}

impl Observer for Console {
    /// A status line on stderr, unless `--quiet`; control characters in it
    /// (from a file name, a remote message) are escaped.
    fn status(&self, line: &str) {
        if !self.quiet {
            eprintln!("{}", escape(line));
        }
    }

    fn detail(&self, line: &str) {
        if self.verbose >= 2 {
            eprintln!("{line}");
        }
    }

    /// A bar for `name`; hidden when bars are off.
    fn meter(&self, name: &str) -> Box<dyn Meter> {
        let multi = self.bars.get_or_init(|| {
            let show = !self.quiet && std::io::stderr().is_terminal();
            show.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
        });
        let Some(m) = multi else {
            return Box::new(Bar(ProgressBar::hidden()));
        };
        let style = ProgressStyle::with_template(
            "{prefix:>12} [{bar:30}] {msg} {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}, {eta})",
        )
        .expect("static template")
        .progress_chars("=> ");
        let bar = m.add(
            ProgressBar::new(0)
                .with_style(style)
                .with_prefix(escape(name).into_owned()),
        );
        bar.enable_steady_tick(Duration::from_millis(250));
        Box::new(Bar(bar))
    }

    /// The check's whole output, then (failed) its final line on its own.
    fn checked(&self, host: &str, report: &VerifyReport, log: &Path) {
        match self.check {
            CheckOutput::Json => println!(
                "{}",
                serde_json::to_string_pretty(report).expect("serializes")
            ),
            CheckOutput::Stderr => {
                eprint!("{}", report.stdout);
                eprint!("{}", report.stderr);
            }
            CheckOutput::Text => {
                print!("{}", report.stdout);
                eprint!("{}", report.stderr);
            }
        }
        if report.ok {
            self.status(&format!(
                "verify passed on {host} in {:.1}s (log: {host}:{}, {})",
                report.millis as f64 / 1000.0,
                report.log,
                log.display()
            ));
        } else if self.check != CheckOutput::Json {
            eprintln!();
            eprintln!("verify failed on {host}: {}", escape(&report.summary()));
            eprintln!(
                "{}",
                escape(&format!(
                    "logs: {host}:{} and {}",
                    report.log,
                    log.display()
                ))
            );
        }
    }
}

/// One indicatif bar.
struct Bar(ProgressBar);

impl Meter for Bar {
    fn update(&self, p: &Progress) {
        self.0.set_length(p.total_bytes);
        self.0.set_position(p.bytes);
        self.0
            .set_message(format!("{}/{} files", p.files, p.total_files));
    }

    fn finish(&self) {
        self.0.finish_and_clear();
    }
}
