//! `overlay plan SRC DST`: scan and hash both live hosts, decide the plan,
//! print it and save it. Never writes to either venv. With several
//! targets (or a `[groups.NAME]`), one plan per target against one scan of
//! the source (`overlay::fleet::plan_many`), shown grouped. With `--bundle
//! FILE` instead of SOURCE, the bundle is the source
//! (`overlay::fleet::bundle_plan`); with `--bundle FILE --venv PATH`, the
//! plan of a venv on this host, shown and not saved.

use overlay::err;
use overlay::error::{EXIT_CHANGES, EXIT_OK, Result};
use overlay::fleet::bundle_plan::{BundlePlanOptions, BundlePlanned, plan_from_bundle};
use overlay::fleet::plan_many::{self, PlanManyOptions, PlannedMany};
use overlay::ops::plan::{PlanOptions, Planned, plan, save};
use overlay::plan::Plan;
use overlay::report;
use overlay::text;

use crate::cli::{DEFAULT_PLAN, GlobalArgs, PlanArgs};
use crate::progress::{self, Console};

pub fn run(global: &GlobalArgs, args: &PlanArgs) -> Result<u8> {
    if let Some(bundle) = &args.bundle {
        // Without --venv the positional names are all targets.
        let targets: Vec<String> = args.source.iter().chain(&args.targets).cloned().collect();
        return match (&args.venv, targets.is_empty()) {
            (Some(venv), true) => run_bundle(global, args, bundle, venv),
            (Some(_), false) => Err(err!(
                kind = Usage,
                hint = "drop --venv to plan those hosts from this machine (`overlay plan --bundle FILE TARGET...`), or name no hosts to plan the venv on this host",
                "--bundle with --venv plans a venv on this host: it takes no hosts ({})",
                targets.join(" ")
            )),
            (None, true) => Err(err!(
                kind = Usage,
                hint = "name the targets: `overlay plan --bundle FILE TARGET...`, or give --venv PATH on the host itself",
                "--bundle needs the targets to plan, or --venv"
            )),
            (None, false) => run_from_bundle(global, args, bundle, targets),
        };
    }
    let source = args.source.clone().unwrap_or_default();
    if !plan_many::is_single_host(&global.manifest, &args.targets) {
        return run_many(global, args, source);
    }
    let opts = PlanOptions {
        manifest: global.manifest.clone(),
        source,
        target: args.targets[0].clone(),
        sets: args.sets.clone(),
        strict: args.strict,
        connect: global.connect_options(),
    };
    let planned = plan(&opts, &Console::new(global))?;
    show_one(global, args, planned)
}

/// `overlay plan --bundle FILE TARGET...`: the bundle as the source of
/// the plans, shown and saved as those of a live source.
fn run_from_bundle(
    global: &GlobalArgs,
    args: &PlanArgs,
    bundle: &std::path::Path,
    targets: Vec<String>,
) -> Result<u8> {
    let opts = BundlePlanOptions {
        manifest: global.manifest.clone(),
        bundle: bundle.to_path_buf(),
        targets,
        sets: args.sets.clone(),
        strict: args.strict,
        connect: global.connect_options(),
        trust: args.trust.choice(),
    };
    match plan_from_bundle(&opts, &Console::new(global))? {
        BundlePlanned::One(planned) => show_one(global, args, *planned),
        BundlePlanned::Many(planned) => show_many(global, args, planned),
    }
}

/// The plan on stdout (text or `--json`), its warnings and problems on
/// stderr.
fn print_plan(global: &GlobalArgs, args: &PlanArgs, plan: &Plan) {
    if args.json {
        print!("{}", report::plan_json(plan));
    } else {
        print!(
            "{}",
            report::plan_text(plan, global.verbose > 0, progress::color_stdout())
        );
    }
    print_findings(plan, global.verbose > 0);
}

/// Show and save the plan of one target.
fn show_one(global: &GlobalArgs, args: &PlanArgs, planned: Planned) -> Result<u8> {
    let plan = planned.plan;
    print_plan(global, args, &plan);
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
    let trust = args.trust.choice().resolve(None);
    let plan = overlay::ops::pack::plan_bundle(bundle, venv, &trust, &Console::new(global))?;
    print_plan(global, args, &plan);
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

/// `overlay plan SRC T1 T2 ...`: the plans of several targets, shown with
/// identical ones grouped, saved one file per target.
fn run_many(global: &GlobalArgs, args: &PlanArgs, source: String) -> Result<u8> {
    let opts = PlanManyOptions {
        manifest: global.manifest.clone(),
        source,
        targets: args.targets.clone(),
        sets: args.sets.clone(),
        strict: args.strict,
        connect: global.connect_options(),
    };
    let planned = plan_many::plan_many(&opts, &Console::new(global))?;
    show_many(global, args, planned)
}

/// Show the plans of several targets, grouped, and save them.
fn show_many(global: &GlobalArgs, args: &PlanArgs, planned: PlannedMany) -> Result<u8> {
    let plans = planned.plans;
    if args.json {
        print!("{}", report::fleet_json(&plans));
    } else {
        print!(
            "{}",
            report::fleet_text(&plans, global.verbose > 0, progress::color_stdout())
        );
    }
    for p in &plans {
        if !p.warnings.is_empty() || !p.problems.is_empty() {
            eprintln!("{}:", text::escape(&p.target.name));
            print_findings(p, global.verbose > 0);
        }
    }
    let files = plan_many::save_many(&plans, &args.out)?;
    planned.closing.wait();
    let refused: Vec<&str> = plans
        .iter()
        .filter(|p| p.strict && p.new_problems() > 0)
        .map(|p| p.target.name.as_str())
        .collect();
    if !refused.is_empty() {
        return Err(err!(
            kind = Refused,
            hint = "fix the plans (add the missing sets or packages), or run `overlay apply --force` to apply them anyway",
            "The plans for {} predict problems after the overlay (strict); saved to {}, but `overlay apply` will refuse them",
            refused.join(", "),
            args.out.display()
        ));
    }
    if !global.quiet {
        let first = files
            .first()
            .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
        eprintln!(
            "{} plans saved to {} (listed in {}); run `{}` to carry out one.",
            plans.len(),
            text::escape(&plan_many::plans_dir(&args.out).to_string_lossy()),
            text::escape(&args.out.to_string_lossy()),
            text::escape(&format!("overlay apply {}", text::shell_quote(&first)))
        );
    }
    Ok(if args.check && plans.iter().any(|p| p.has_changes()) {
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
