//! `overlay plan SRC DST`: scan and hash both live hosts, decide the plan,
//! print it and save it. Never writes to either venv.

use overlay::err;
use overlay::error::{EXIT_CHANGES, EXIT_OK, Result};
use overlay::ops::plan::{PlanOptions, plan, save};
use overlay::plan::Plan;
use overlay::report;
use overlay::text;

use crate::cli::{DEFAULT_PLAN, GlobalArgs, PlanArgs};
use crate::progress::{self, Console};

pub fn run(global: &GlobalArgs, args: &PlanArgs) -> Result<u8> {
    if let (Some(bundle), Some(venv)) = (&args.bundle, &args.venv) {
        return run_bundle(global, args, bundle, venv);
    }
    let opts = PlanOptions {
        manifest: global.manifest.clone(),
        source: args.source.clone().unwrap_or_default(),
        target: args.target.clone().unwrap_or_default(),
        sets: args.sets.clone(),
        strict: args.strict,
        connect: global.connect_options(),
    };
    let planned = plan(&opts, &Console::new(global))?;
    let plan = planned.plan;
    if args.json {
        print!("{}", report::plan_json(&plan));
    } else {
        print!(
            "{}",
            report::plan_text(&plan, global.verbose > 0, progress::color_stdout())
        );
    }
    print_findings(&plan, global.verbose > 0);
    save(&plan, &args.out)?;
    // The agents have answered everything; their goodbyes ran beside the
    // printing and saving.
    planned.closing.wait();
    if plan.strict && plan.new_problems() > 0 {
        return Err(err!(
            kind = Refused,
            hint = "fix the plan (add the missing sets or packages), or run `overlay apply --force` to apply it anyway",
            "The plan predicts {} problem{} after the overlay (strict); saved to {}, but `overlay apply` will refuse it",
            plan.new_problems(),
            if plan.new_problems() == 1 { "" } else { "s" },
            args.out.display()
        ));
    }
    if !global.quiet {
        if let Some(note) = overlay::ops::apply::route_note(&plan) {
            eprintln!("{}", text::escape(&note));
        }
        eprintln!(
            "Plan saved to {}; run `{}` to carry it out.",
            text::escape(&args.out.to_string_lossy()),
            text::escape(&apply_command(&args.out))
        );
    }
    Ok(if args.check && plan.has_changes() {
        EXIT_CHANGES
    } else {
        EXIT_OK
    })
}

/// `overlay plan --bundle FILE --venv PATH`: the bundle's plan against
/// the venv on this host, shown and not saved (it names a folder that is
/// gone when the command ends); `apply --bundle` plans again.
fn run_bundle(
    global: &GlobalArgs,
    args: &PlanArgs,
    bundle: &std::path::Path,
    venv: &str,
) -> Result<u8> {
    let plan = overlay::ops::pack::plan_bundle(bundle, venv, &Console::new(global))?;
    if args.json {
        print!("{}", report::plan_json(&plan));
    } else {
        print!(
            "{}",
            report::plan_text(&plan, global.verbose > 0, progress::color_stdout())
        );
    }
    print_findings(&plan, global.verbose > 0);
    if !global.quiet {
        eprintln!(
            "Run `overlay apply --bundle {} --venv {}` to carry it out.",
            text::escape(&text::shell_quote(&bundle.to_string_lossy())),
            text::escape(&text::shell_quote(venv))
        );
    }
    Ok(if args.check && plan.has_changes() {
        EXIT_CHANGES
    } else {
        EXIT_OK
    })
}

/// The command that applies the plan saved at `out`: `overlay apply`
/// for the default place, else `overlay apply FILE`, quoted for a shell.
fn apply_command(out: &std::path::Path) -> String {
    if out == std::path::Path::new(DEFAULT_PLAN) {
        return "overlay apply".into();
    }
    let file = out.to_string_lossy();
    // A file name that starts with `-` would read as an option.
    let file = if file.starts_with('-') {
        format!("./{file}")
    } else {
        file.into_owned()
    };
    format!("overlay apply {}", text::shell_quote(&file))
}

/// The plan's warnings and predicted problems, on stderr (see
/// [`report::problems_text`]).
fn print_findings(plan: &Plan, verbose: bool) {
    for w in &plan.warnings {
        let set = w
            .set
            .as_deref()
            .map(|s| format!("[{s}] "))
            .unwrap_or_default();
        eprintln!("warning: {}", text::escape(&format!("{set}{}", w.message)));
    }
    for line in report::problems_text(&plan.problems, plan.strict, verbose) {
        eprintln!("{}", text::escape(&line));
    }
}
