//! Everything before the stream: load and check the plan (its manifest,
//! `--strict`), connect the target, read the `[verify]` check, and open the
//! generation ([`begin`]); `--resume` ([`resume`]).

use crate::client::Client;
use crate::err;
use crate::error::{Result, io_cause};
use crate::interrupt;
use crate::model::{Action, GenChange, PrepareRequest, ShebangRewrite, VerifyRequest};
use crate::ops::{Observer, Step, endpoint, load_plan};
use crate::plan::Plan;

use super::outcome::{Left, Phase, fate, interrupted};
use super::route::{ChosenRoute, choose_route};
use super::{ApplyOptions, ApplyReport, gen_changes};

/// What [`begin`] left: a target ready for its files, or the whole report.
pub enum Began {
    Ready(Box<Ready>),
    /// `--resume`, or a plan with nothing to change.
    Done(ApplyReport),
}

/// A target ready for its files: connected, checked, its generation open.
pub struct Ready {
    pub opts: ApplyOptions,
    pub plan: Plan,
    pub dst: Client,
    pub changes: Vec<GenChange>,
    pub generation: String,
    pub recovered: Option<String>,
    pub chosen: ChosenRoute,
    pub(super) check: Option<VerifyRequest>,
    /// Ctrl-C stops cleanly while this lives.
    pub(super) _cleanly: interrupt::Cleanly,
}

/// Everything before the stream: load and check the plan, connect the
/// target, choose the route, read the check, and open the generation.
pub fn begin(opts: &ApplyOptions, obs: &dyn Observer) -> Result<Began> {
    let mut plan = load_plan(&opts.plan)?;
    if !opts.compile {
        plan.without_carried_bytecode();
    }
    same_manifest(&plan, opts)?;
    if !opts.resume {
        check_bundle(&plan, &opts.plan)?;
    }
    let tname = plan.target.name.clone();
    if !opts.resume && plan.has_changes() {
        obs.status(&announcement(&plan, &opts.plan));
    }
    let connecting = obs.step(Step::Connect, &tname);
    let mut dst = Client::connect(
        &tname,
        &endpoint(&plan.target),
        plan.target.sudo.as_deref(),
        &opts.connect,
    )?;
    connecting.finish();
    if opts.resume {
        return resume(dst, &plan, opts.allow_running).map(Began::Done);
    }
    // From here on, Ctrl-C stops cleanly.
    let cleanly = interrupt::Cleanly::new(interrupt::Note {
        cleaning: format!("{tname} discards what this apply staged, or undoes its switch"),
        forced: format!("{tname} in an unknown state"),
        hint: format!(
            "run `overlay history {tname}` to see where it stands (that rolls back an unfinished switch), or `overlay apply --resume {}` to complete it",
            opts.plan.display()
        ),
    });
    strict_check(&plan, opts.force)?;
    let chosen = choose_route(&plan, opts, obs)?;
    // Read the check before touching anything, so a missing [verify] fails early.
    let check = opts
        .verify
        .then(|| check_request(&plan, opts, obs))
        .transpose()?;
    let changes = gen_changes(&plan);
    if changes.is_empty() {
        dst.close()?;
        return Ok(Began::Done(ApplyReport::NothingToApply { target: tname }));
    }
    if interrupt::requested() {
        let _ = dst.close();
        return Err(interrupted(Left::Untouched, &tname, &opts.plan));
    }
    let prepared = prepare(&mut dst, &plan, opts, changes.clone())?;
    if let Some(r) = &prepared.recovered {
        obs.status(&format!("{tname}: {r}"));
    }
    for w in &prepared.warnings {
        obs.warn(&format!("{tname}: {w}"));
    }
    if let Some(d) = &prepared.durability {
        obs.note(&format!(
            "{tname}: the venv is on {}: staged files and renames are made durable with {} (barrier: {})",
            d.fs,
            d.barrier.words(),
            d.barrier.name()
        ));
    }
    if !prepared.running.is_empty() {
        let n = prepared.running.len();
        obs.warn(&format!(
            "{n} process{} run{} from {tname}'s venv; going on (--allow-running): {}",
            if n == 1 { "" } else { "es" },
            if n == 1 { "s" } else { "" },
            crate::running::list(&prepared.running)
        ));
    }
    Ok(Began::Ready(Box::new(Ready {
        opts: opts.clone(),
        plan,
        dst,
        changes,
        generation: prepared.generation,
        recovered: prepared.recovered,
        chosen,
        check,
        _cleanly: cleanly,
    })))
}

/// `--resume`: complete an interrupted generation on the target, and nothing else.
pub fn resume(mut dst: Client, plan: &Plan, allow_running: bool) -> Result<ApplyReport> {
    let outcome = dst.recover(&plan.target.venv, true, allow_running)?;
    dst.close()?;
    Ok(ApplyReport::Resumed {
        target: plan.target.name.clone(),
        outcome,
    })
}

/// A plan made with `--strict` (or a strict manifest) that predicts
/// problems is refused unless forced.
pub(super) fn strict_check(plan: &Plan, force: bool) -> Result<()> {
    if plan.strict && plan.new_problems() > 0 && !force {
        return Err(err!(
            kind = Refused,
            hint = "fix what `overlay plan` predicts, or pass --force to apply anyway",
            "The plan predicts {} problem{} after the overlay and was made with --strict; {} is unchanged",
            plan.new_problems(),
            if plan.new_problems() == 1 { "" } else { "s" },
            plan.target.name
        ));
    }
    Ok(())
}

/// The line `apply` starts with: which plan, from where to where, and
/// how many files it adds, replaces and deletes.
pub fn announcement(plan: &Plan, file: &std::path::Path) -> String {
    let count = |a: Action| -> usize {
        plan.sets
            .iter()
            .map(|s| s.changes.iter().filter(|c| c.action == a).count())
            .sum()
    };
    let adds = count(Action::Add);
    format!(
        "Applying {}: {} -> {} ({}), {adds} file{} to add, {} to replace, {} to delete",
        file.display(),
        plan.source.name,
        plan.target.name,
        plan.target.venv,
        if adds == 1 { "" } else { "s" },
        count(Action::Replace),
        count(Action::Delete)
    )
}

/// An explicit `--manifest` must be the manifest the plan was made from,
/// byte for byte (a copy elsewhere is the same manifest). Plans made
/// before overlay recorded the manifest's hash are not checked.
pub(super) fn same_manifest(plan: &Plan, opts: &ApplyOptions) -> Result<()> {
    let Some(recorded) = &plan.manifest_sha256 else {
        return Ok(());
    };
    if !opts.manifest_explicit {
        return Ok(());
    }
    let given = crate::ops::plan::manifest_stamp(&opts.manifest)?;
    if given.sha256 == *recorded {
        return Ok(());
    }
    let planfile = opts.plan.display();
    let what = if given.path == std::path::Path::new(&plan.manifest) {
        format!(
            "{} has changed since the plan {planfile} was made from it",
            plan.manifest
        )
    } else {
        format!(
            "The plan {planfile} was made from {}, not from {}",
            plan.manifest,
            given.path.display()
        )
    };
    Err(err!(
        kind = Usage,
        hint = format!(
            "re-run `overlay plan -m {} {} {}` to plan with it, or drop --manifest (and OVERLAY_MANIFEST) to apply {planfile} as it was planned",
            crate::text::shell_quote(&opts.manifest.to_string_lossy()),
            crate::text::shell_quote(&plan.source.name),
            crate::text::shell_quote(&plan.target.name)
        ),
        "{what}; nothing was applied to {}",
        plan.target.name
    ))
}

/// A plan whose source is a bundle: the file must still hold that bundle
/// (its trailer's hash; the source's agent checks the whole file before it
/// reads a byte of it), and the plan must not be one that an older overlay
/// made against the bundle unpacked.
fn check_bundle(plan: &Plan, planfile: &std::path::Path) -> Result<()> {
    let Some(b) = &plan.bundle else {
        return Ok(());
    };
    let Some(file) = crate::model::bundle_of(&plan.source.venv) else {
        return Ok(());
    };
    let hint = format!(
        "plan again: `overlay plan --bundle {} {}`",
        crate::text::shell_quote(&b.file),
        crate::text::shell_quote(&plan.target.name)
    );
    if b.cache.is_some() {
        return Err(err!(
            kind = Usage,
            hint = hint,
            "The plan {} was made by an older overlay against the bundle {} unpacked; {} is unchanged",
            planfile.display(),
            b.file,
            plan.target.name
        ));
    }
    let why = match crate::bundle::sealed_blake3(std::path::Path::new(file)) {
        Ok(h) if h == b.blake3 => return Ok(()),
        Ok(_) => "the file holds another bundle now".to_string(),
        Err(e) => format!("it cannot be read as one ({})", e.message),
    };
    Err(err!(
        kind = Drift,
        hint = hint,
        "The plan {} takes its files from the bundle {}, but {why}; {} is unchanged",
        planfile.display(),
        b.file,
        plan.target.name
    ))
}

/// The `[verify]` check of the manifest the plan was made from: `--manifest`
/// when it was given (it matches, see [`same_manifest`]), else the
/// plan's recorded path, which must still be there. Plans made before
/// overlay recorded the manifest's hash fall back to `--manifest`.
pub(super) fn check_request(
    plan: &Plan,
    opts: &ApplyOptions,
    obs: &dyn Observer,
) -> Result<VerifyRequest> {
    if let Some(b) = plan.bundle.as_ref().filter(|b| !b.manifest.is_empty()) {
        // A bundle carries the [verify] of the manifest it was packed from.
        let mut tmp = tempfile::NamedTempFile::new()
            .map_err(|e| err!("Cannot write the bundle's manifest: {}", io_cause(&e)))?;
        std::io::Write::write_all(&mut tmp, b.manifest.as_bytes())
            .map_err(|e| err!("Cannot write the bundle's manifest: {}", io_cause(&e)))?;
        return crate::ops::verify::request(tmp.path(), &plan.target.venv, None, None);
    }
    let recorded = std::path::Path::new(&plan.manifest);
    let manifest = if opts.manifest_explicit {
        opts.manifest.as_path()
    } else if recorded.exists() {
        let edited = match &plan.manifest_sha256 {
            Some(sha) => crate::ops::plan::manifest_stamp(recorded)?.sha256 != *sha,
            None => false,
        };
        obs.status(&format!(
            "The check is the [verify] of {}, the manifest the plan was made from{}",
            plan.manifest,
            if edited {
                " (edited since: its check as it is now)"
            } else {
                ""
            }
        ));
        recorded
    } else if plan.manifest_sha256.is_some() {
        return Err(err!(
            kind = Usage,
            hint =
                "pass --manifest with that manifest (or a copy of it), or apply without --verify",
            "The plan {} was made from {}, which is gone: its [verify] check cannot be read; nothing was applied to {}",
            opts.plan.display(),
            plan.manifest,
            plan.target.name
        ));
    } else {
        opts.manifest.as_path()
    };
    crate::ops::verify::request(manifest, &plan.target.venv, None, None)
}

/// Open the generation on the target.
pub(super) fn prepare(
    dst: &mut Client,
    plan: &Plan,
    opts: &ApplyOptions,
    changes: Vec<GenChange>,
) -> Result<crate::client::Prepared> {
    let tname = &plan.target.name;
    let req = PrepareRequest {
        venv: plan.target.venv.clone(),
        source: plan.source.name.clone(),
        target: tname.clone(),
        plan_created: plan.created,
        changes,
        backup: opts.backup,
        resume: false,
        same_owner: opts.same_owner,
        versions: versions(plan),
        // The target rewrites the RECORD rows of the scripts whose shebang
        // the source rewrote, as pip records the script it wrote; they
        // describe them as the source venv had them: a bundle's, as the
        // venv it was packed from.
        shebang: Some(ShebangRewrite {
            from: plan
                .bundle
                .as_ref()
                .and_then(|b| b.source_venv.clone())
                .unwrap_or_else(|| plan.source.venv.clone()),
            to: plan.target.venv.clone(),
        }),
        provenance: Some(provenance(plan)),
        machine: plan.target.machine.clone(),
        allow_running: opts.allow_running,
    };
    let prepared = dst.prepare(req);
    prepared.map_err(|e| fate(e, dst.lost(), Phase::Prepare, tname, ""))
}

/// Where the plan's files come from: what it records (a bundle), else its
/// live source and the folders of its sets with `from`.
pub(super) fn provenance(plan: &Plan) -> crate::model::Provenance {
    plan.provenance
        .clone()
        .unwrap_or_else(|| crate::model::Provenance {
            host: plan.source.name.clone(),
            venv: plan.source.venv.clone(),
            folders: plan
                .sets
                .iter()
                .filter_map(|s| s.from.as_ref())
                .map(|f| {
                    let dir = crate::model::folder_of(&f.venv).unwrap_or(&f.venv);
                    match &f.ssh {
                        Some(_) => format!("{}:{dir}", f.name),
                        None => dir.to_string(),
                    }
                })
                .collect(),
            bundle: None,
        })
}

/// The plan's distribution versions, each name once (the first set that
/// names it), for the generation to record.
pub(super) fn versions(plan: &Plan) -> Vec<crate::model::Transition> {
    let mut seen = std::collections::HashSet::new();
    plan.sets
        .iter()
        .flat_map(|s| &s.versions)
        .filter(|t| seen.insert(t.name.clone()))
        .cloned()
        .collect()
}
