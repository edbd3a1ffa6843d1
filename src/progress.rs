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
//! rate and the time left ([`Speed`]) are an exponentially weighted rate
//! over about [`TAU`], sampled at every tick (10 a second) from the moment
//! the line starts counting, so a pause slows them down gradually instead
//! of making them jump, and the wait before the first byte does not count
//! against the rate. A finished step
//! leaves one summary line (`✓ streamed a -> b: 4 files, 64.01 MiB in
//! 1.3s (48.9 MiB/s)`); a step cut short by an error is cleared. Status
//! lines and details are printed above the live lines. Off a terminal
//! none of this is drawn and stderr holds the status lines only.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use indicatif::style::ProgressTracker;
use indicatif::{
    HumanBytes, MultiProgress, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle,
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
/// (A new style brings a new [`Speed`]: the rate starts when counting does.)
fn counting_style(total: bool) -> ProgressStyle {
    let template = if total {
        "{spinner} {prefix:<10} {msg} [{wide_bar}] {binary_bytes}/{binary_total_bytes} {speed}"
    } else {
        "{spinner} {prefix:<10} {msg} {binary_bytes} {speed}"
    };
    ProgressStyle::with_template(template)
        .expect("static template")
        .progress_chars("=> ")
        .with_key("speed", Speed::default())
}

/// How long the rate remembers: a sample `TAU` old weighs 1/e of a new one.
const TAU: f64 = 5.0;
/// No rate is shown before the line has counted this long.
const WARMUP: Duration = Duration::from_millis(500);

/// Bytes per second, exponentially weighted over time: each sample's rate
/// since the one before weighs by the time it covers, so many reports in a
/// burst weigh no more than the time they took, and a pause (samples of
/// nothing) pulls the rate down gradually.
#[derive(Debug, Clone, Copy, Default)]
struct Rate {
    /// The first sample's time: the weights are normalized from there.
    start: Option<Instant>,
    /// The last sample: when, and the position then.
    last: Option<(Instant, u64)>,
    /// The weighted rate, not yet normalized.
    ewma: f64,
}

impl Rate {
    /// The position is `pos` at `now`.
    fn record(&mut self, now: Instant, pos: u64) {
        let Some((then, before)) = self.last else {
            *self = Rate {
                start: Some(now),
                last: Some((now, pos)),
                ewma: 0.0,
            };
            return;
        };
        if pos < before {
            // Counting started over.
            *self = Rate::default();
            return self.record(now, pos);
        }
        let dt = now.saturating_duration_since(then).as_secs_f64();
        if dt <= 0.0 {
            return;
        }
        let w = (-dt / TAU).exp();
        self.ewma = self.ewma * w + (pos - before) as f64 / dt * (1.0 - w);
        self.last = Some((now, pos));
    }

    /// The rate at the last sample, once it covers [`WARMUP`].
    fn per_sec(&self) -> Option<f64> {
        let (start, (last, _)) = (self.start?, self.last?);
        let span = last.saturating_duration_since(start);
        if span < WARMUP {
            return None;
        }
        // The samples' weights add up to this much, not 1, since nothing
        // was sampled before `start`.
        let weights = 1.0 - (-span.as_secs_f64() / TAU).exp();
        let r = self.ewma / weights;
        (r.is_finite() && r > 0.0).then_some(r)
    }

    /// Time to reach `total` at the current rate.
    fn left(&self, total: u64) -> Option<Duration> {
        let (_, pos) = self.last?;
        let secs = total.saturating_sub(pos) as f64 / self.per_sec()?;
        Duration::try_from_secs_f64(secs).ok()
    }
}

/// `5s`, `3m07s`, `2h05m`.
fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// The `{speed}` of a counting line: `12.40 MiB/s, 5s left`, sampled at
/// every tick.
#[derive(Debug, Clone, Default)]
struct Speed(Rate);

impl ProgressTracker for Speed {
    fn clone_box(&self) -> Box<dyn ProgressTracker> {
        Box::new(self.clone())
    }

    fn tick(&mut self, state: &ProgressState, now: Instant) {
        self.0.record(now, state.pos());
    }

    fn reset(&mut self, _: &ProgressState, _: Instant) {
        self.0 = Rate::default();
    }

    fn write(&self, state: &ProgressState, w: &mut dyn std::fmt::Write) {
        let Some(r) = self.0.per_sec() else { return };
        let _ = write!(w, "{}/s", HumanBytes(r as u64));
        if let Some(left) = state.len().and_then(|len| self.0.left(len)) {
            let _ = write!(w, ", {} left", short_duration(left));
        }
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

    fn note(&self, line: &str) {
        if self.verbose >= 1 {
            self.above(|| eprintln!("{}", escape(line)));
        }
    }

    /// Even with `--quiet`, which keeps errors and warnings.
    fn warn(&self, line: &str) {
        self.above(|| eprintln!("warning: {}", escape(line)));
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
        self.bar
            .set_message(format!("{}: {}/{} files", self.on, p.files, p.total_files));
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

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// `rate` fed every 100 ms from `from` for `secs` seconds at `per_sec`
    /// bytes a second, in 1 MiB steps; returns the time after the last sample.
    fn feed(rate: &mut Rate, from: (Instant, u64), secs: u64, per_sec: u64) -> (Instant, u64) {
        let (t0, p0) = from;
        for tick in 1..=secs * 10 {
            let exact = p0 + per_sec * tick / 10;
            rate.record(t0 + Duration::from_millis(100 * tick), exact / MIB * MIB);
        }
        (
            t0 + Duration::from_secs(secs),
            p0 + per_sec * secs / MIB * MIB,
        )
    }

    #[test]
    fn the_rate_follows_a_steady_stream_and_the_time_left_with_it() {
        let mut rate = Rate::default();
        let t0 = Instant::now();
        rate.record(t0, 0);
        assert_eq!(rate.per_sec(), None, "nothing before the warm-up");
        let (_, pos) = feed(&mut rate, (t0, 0), 10, 20 * MIB);
        let r = rate.per_sec().unwrap() / MIB as f64;
        assert!((19.0..21.0).contains(&r), "{r} MiB/s");
        let left = rate.left(pos + 100 * MIB).unwrap().as_secs_f64();
        assert!((4.7..5.3).contains(&left), "{left}s left");
    }

    #[test]
    fn a_pause_lowers_the_rate_gradually_and_a_burst_does_not_spike_it() {
        let mut rate = Rate::default();
        let t0 = Instant::now();
        rate.record(t0, 0);
        let (t, pos) = feed(&mut rate, (t0, 0), 10, 20 * MIB);
        let before = rate.per_sec().unwrap();
        // One second of nothing: lower, not collapsed.
        let (t, pos) = feed(&mut rate, (t, pos), 1, 0);
        let paused = rate.per_sec().unwrap();
        assert!(
            paused < before && paused > before * 0.7,
            "{before} -> {paused}"
        );
        // Then 8 MiB at once (reports queued behind the pause): no spike.
        rate.record(t + Duration::from_millis(100), pos + 8 * MIB);
        let burst = rate.per_sec().unwrap();
        assert!(burst < before * 1.2, "{before} -> {burst}");
    }

    #[test]
    fn durations_are_short() {
        assert_eq!(short_duration(Duration::from_secs(5)), "5s");
        assert_eq!(short_duration(Duration::from_secs(187)), "3m07s");
        assert_eq!(short_duration(Duration::from_secs(7500)), "2h05m");
    }
}
