//! Progress bars and terminal styling. Bars are drawn (on stderr) only when
//! stderr is a terminal and `--quiet` is off; colour only without `NO_COLOR`.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

pub fn color_stderr() -> bool {
    !no_color() && std::io::stderr().is_terminal()
}

pub fn color_stdout() -> bool {
    !no_color() && std::io::stdout().is_terminal()
}

/// One bar per host while hashing.
pub struct HashBars {
    multi: Option<MultiProgress>,
}

impl HashBars {
    pub fn new(quiet: bool) -> HashBars {
        let show = !quiet && std::io::stderr().is_terminal();
        HashBars {
            multi: show.then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
        }
    }

    /// A bar for `host`; hidden when bars are off.
    pub fn bar(&self, host: &str) -> ProgressBar {
        let Some(m) = &self.multi else {
            return ProgressBar::hidden();
        };
        let style = ProgressStyle::with_template(
            "{prefix:>12} [{bar:30}] {msg} {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}, {eta})",
        )
        .expect("static template")
        .progress_chars("=> ");
        let bar = m.add(
            ProgressBar::new(0)
                .with_style(style)
                .with_prefix(overlay::text::escape(host).into_owned()),
        );
        bar.enable_steady_tick(Duration::from_millis(250));
        bar
    }
}

/// A status line on stderr, unless `--quiet`; control characters in it
/// (from a file name, a remote message) are escaped.
pub fn status(global: &crate::cli::GlobalArgs, line: &str) {
    if !global.quiet {
        eprintln!("{}", overlay::text::escape(line));
    }
}
