//! The `overlay` binary: parse arguments, dispatch to one function per
//! command, print errors with their hints, and map outcomes to exit codes.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc; // musl's malloc is slow under many threads

mod cli;
mod commands;
#[cfg(target_env = "musl")]
mod musl_memcmp;
mod progress;

use std::process::ExitCode;

use overlay::error::{EXIT_OK, ErrorKind};

unsafe extern "C" {
    /// mimalloc's option setter (the C library the `mimalloc` crate links).
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// The controller holds two hosts' listings at once and is measured by its
/// peak memory: give freed memory back to the OS at once and commit arena
/// memory only as it is used. (Agents keep mimalloc's faster defaults.)
fn lean_allocator() {
    const MI_OPTION_ARENA_EAGER_COMMIT: std::ffi::c_int = 4;
    const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;
    // SAFETY: plain option setters, called before the threads start.
    unsafe {
        mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0);
        mi_option_set(MI_OPTION_PURGE_DELAY, 0);
    }
}

/// No transparent huge pages for this process. mimalloc marks its arenas
/// `MADV_HUGEPAGE`, so on a host whose THP setting is `madvise` every fresh
/// 2 MiB of heap was faulted in (and zeroed, or compacted for) as a whole:
/// a quarter of a warm plan's CPU in one profile, erratic from run to run,
/// and 40% more peak memory, for processes that live a second and touch a
/// few dozen MB. The flag is inherited by children (ssh, the verify
/// command), where it only means ordinary pages.
fn no_huge_pages() {
    // SAFETY: a plain prctl with integer arguments; failure changes nothing.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

fn main() -> ExitCode {
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                ErrorKind::Usage.exit_code()
            } else {
                EXIT_OK
            });
        }
    };
    no_huge_pages();
    if !matches!(cli.command, cli::Command::Agent) {
        lean_allocator();
        // Ctrl-C and SIGTERM: an apply stops cleanly, the rest at once (exit 130).
        overlay::interrupt::install();
    }
    let result = match cli.command {
        cli::Command::Agent => overlay::agent::main().map(|()| EXIT_OK),
        cli::Command::Plan(args) => commands::plan::run(&cli.global, &args),
        cli::Command::Apply(args) => commands::apply::run(&cli.global, &args),
        cli::Command::Pack(args) => commands::pack::run(&cli.global, &args),
        cli::Command::Sign(args) => commands::sign::run(&cli.global, &args),
        cli::Command::Rollback(args) => commands::rollback::run(&cli.global, &args),
        cli::Command::History(args) => commands::history::run(&cli.global, &args),
        cli::Command::Prune(args) => commands::prune::run(&cli.global, &args),
        cli::Command::Verify(args) => commands::verify::run(&cli.global, &args),
        cli::Command::Doctor(args) => commands::doctor::run(&cli.global, &args),
        cli::Command::Completions(args) => commands::completions::run(&args),
        cli::Command::Man(args) => commands::man::run(&args),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let color = progress::color_stderr();
            let (red, yellow, reset) = if color {
                ("\x1b[1;31m", "\x1b[1;33m", "\x1b[0m")
            } else {
                ("", "", "")
            };
            // One line each: a file name or a remote message inside them
            // cannot add lines or move the cursor.
            if e.kind == ErrorKind::Interrupted {
                // "interrupted: nothing changed on dst (staging discarded)"
                eprintln!("{}", overlay::text::escape(&e.to_string()));
            } else {
                eprintln!(
                    "{red}error{reset}: {}",
                    overlay::text::escape(&e.to_string())
                );
            }
            if let Some(h) = &e.hint {
                eprintln!("{yellow}hint{reset}: {}", overlay::text::escape(h));
            }
            ExitCode::from(e.kind.exit_code())
        }
    }
}
