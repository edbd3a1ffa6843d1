//! How the binary shows an operation's progress ([`Console`], the
//! [`Observer`] of `overlay::ops`): status lines and `-vv` details on
//! stderr, live step lines (on stderr) only when stderr is a terminal and
//! `--quiet` is off, the `[verify]` check's output, and terminal styling
//! (colour only without `NO_COLOR`).
//!
//! On a terminal every [`Step`] of an operation on each host has a line
//! while it runs, in one indicatif `MultiProgress` (the two hosts' lines
//! side by side): a spinner with the time so far, which becomes a bar of
//! files and bytes once the step reports them (hashing, streaming). The
//! rate and the time left are indicatif's estimate, exponentially weighted
//! over about 15 s and fed at every report and every tick, so a pause
//! slows them down gradually instead of making them jump. A finished step
//! leaves one summary line (`✓ streamed a -> b: 4 files, 64.01 MiB in
//! 1.3s (48.9 MiB/s)`); a step cut short by an error is cleared. Status
//! lines and details are printed above the live lines. Off a terminal
//! none of this is drawn and stderr holds the status lines only.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use indicatif::{
    HumanBytes, HumanDuration, MultiProgress, ProgressBar, ProgressDrawTarget, ProgressState,
    ProgressStyle,
};
use overlay::model::{Progress, VerifyReport};
use overlay::ops::{Meter, Observer, Step};
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

    /// The live lines, made on first use; `None` off a terminal or with `--quiet`.
    fn multi(&self) -> Option<&MultiProgress> {
        self.bars
            .get_or_init(|| {
                let show = !self.quiet && std::io::stderr().is_terminal();
                show.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
            })
            .as_ref()
    }

    /// Run `print` with the live lines (if any) lifted out of its way.
    fn above(&self, print: impl FnOnce()) {
        match self.bars.get().and_then(Option::as_ref) {
            Some(m) => m.suspend(print),
            None => print(),
        }
    }
}

/// The step's words while it runs and once it is done.
fn words(step: Step) -> (&'static str, &'static str) {
    match step {
        Step::Connect => ("connecting", "connected"),
        Step::Scan => ("scanning", "scanned"),
        Step::Hash => ("hashing", "hashed"),
        Step::Stream => ("streaming", "streamed"),
        Step::Switch => ("switching", "switched"),
        Step::Verify => ("verifying", "checked"),
    }
}

/// A step under way, nothing counted yet: `⠙ connecting gpu-a 2s`.
fn spinner_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {prefix:<10} {msg} {elapsed}").expect("static template")
}

/// A step that counts files and bytes; with a total, a bar and the time left.
fn counting_style(total: bool) -> ProgressStyle {
    let template = if total {
        "{spinner} {prefix:<10} {msg} [{wide_bar}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}{left}"
    } else {
        "{spinner} {prefix:<10} {msg} {binary_bytes} {binary_bytes_per_sec}"
    };
    ProgressStyle::with_template(template)
        .expect("static template")
        .progress_chars("=> ")
        .with_key("left", time_left)
}

/// `, 12s left` from indicatif's smoothed rate; nothing until bytes moved.
fn time_left(state: &ProgressState, w: &mut dyn std::fmt::Write) {
    if state.pos() > 0 && state.per_sec() > 0.0 {
        let _ = write!(w, ", {} left", HumanDuration(state.eta()));
    }
}

impl Observer for Console {
    /// A status line on stderr, unless `--quiet`; control characters in it
    /// (from a file name, a remote message) are escaped.
    fn status(&self, line: &str) {
        if !self.quiet {
            self.above(|| eprintln!("{}", escape(line)));
        }
    }

    fn detail(&self, line: &str) {
        if self.verbose >= 2 {
            self.above(|| eprintln!("{line}"));
        }
    }

    /// A live line for `step` on `on`; nothing off a terminal.
    fn step(&self, step: Step, on: &str) -> Box<dyn Meter> {
        let Some(multi) = self.multi() else {
            return Box::new(overlay::ops::Silent);
        };
        let (doing, done) = words(step);
        let on = escape(on).into_owned();
        let bar = multi.add(
            ProgressBar::new_spinner()
                .with_style(spinner_style())
                .with_prefix(doing)
                .with_message(on.clone()),
        );
        bar.enable_steady_tick(Duration::from_millis(100));
        Box::new(StepLine {
            bar,
            multi: multi.clone(),
            done,
            on,
            started: Instant::now(),
            last: Mutex::new(None),
        })
    }

    /// The check's whole output, then (failed) its final line on its own.
    fn checked(&self, host: &str, report: &VerifyReport, log: &Path) {
        self.above(|| self.print_check(host, report, log));
    }
}

impl Console {
    fn print_check(&self, host: &str, report: &VerifyReport, log: &Path) {
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

/// One step's live line.
struct StepLine {
    bar: ProgressBar,
    multi: MultiProgress,
    /// The step's word once done ("streamed").
    done: &'static str,
    /// The host, or `source -> target`, escaped.
    on: String,
    started: Instant,
    /// The last report, if the step counts.
    last: Mutex<Option<Progress>>,
}

impl Meter for StepLine {
    fn update(&self, p: &Progress) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let had_total = last.map(|l| l.total_bytes > 0);
        if had_total != Some(p.total_bytes > 0) {
            self.bar.set_style(counting_style(p.total_bytes > 0));
        }
        *last = Some(*p);
        if p.total_bytes > 0 {
            self.bar.set_length(p.total_bytes);
        }
        self.bar.set_position(p.bytes);
        self.bar.set_message(format!(
            "{}: {}/{} files",
            self.on, p.files, p.total_files
        ));
    }

    /// Replace the live line with the step's summary.
    fn finish(&self) {
        let last = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        let line = summary(self.done, &self.on, self.started.elapsed(), last);
        self.bar.finish_and_clear();
        self.multi.remove(&self.bar);
        self.multi.suspend(|| eprintln!("{line}"));
    }
}

impl Drop for StepLine {
    /// A step cut short (an error on the way out) leaves nothing half-drawn.
    fn drop(&mut self) {
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
            self.multi.remove(&self.bar);
        }
    }
}

/// A finished step's line: `✓ hashed     gpu-a: 3 files, 1.20 MiB in 0.4s (3.00 MiB/s)`.
fn summary(done: &str, on: &str, took: Duration, last: Option<Progress>) -> String {
    let secs = took.as_secs_f64();
    match last {
        Some(p) => {
            let rate = if secs > 0.0 {
                format!(" ({}/s)", HumanBytes((p.total_bytes as f64 / secs) as u64))
            } else {
                String::new()
            };
            format!(
                "✓ {done:<10} {on}: {} file{}, {} in {secs:.1}s{rate}",
                p.total_files,
                if p.total_files == 1 { "" } else { "s" },
                HumanBytes(p.total_bytes),
            )
        }
        None => format!("✓ {done:<10} {on} ({secs:.1}s)"),
    }
}
