//! `overlay plan SRC DST`: scan and hash both live hosts, decide the plan,
//! print it and save it. Never writes to either venv.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use overlay::agent::client::Client;
use overlay::agent::protocol::{Entry, ScanReport, ShebangRewrite};
use overlay::err;
use overlay::error::Result;
use overlay::manifest::{Host, Manifest, Set};
use overlay::plan::{self, HostInfo, PLAN_FORMAT, Plan, Side};
use overlay::report;
use overlay::transport::{ConnectOptions, Endpoint};

use crate::cli::{GlobalArgs, PlanArgs};
use crate::progress::{self, HashBars};
use crate::{EXIT_CHANGES, EXIT_OK};

pub fn connect_options(global: &GlobalArgs) -> ConnectOptions {
    ConnectOptions {
        timeout: std::time::Duration::from_secs(global.connect_timeout.max(1)),
        accept_new_host_key: global.accept_new_host_key,
    }
}

pub fn host_info(host: &Host, scan: &ScanReport) -> HostInfo {
    HostInfo {
        name: host.name.clone(),
        ssh: match &host.endpoint {
            Endpoint::Ssh(s) => Some(s.clone()),
            Endpoint::Local => None,
        },
        venv: host.venv.clone(),
        site_packages: scan.site_packages.clone(),
        python: scan.python.clone(),
    }
}

/// Run `f` for the source and the target at the same time.
fn both<A: Send, B: Send>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
    std::thread::scope(|s| {
        let ha = s.spawn(a);
        let rb = b();
        (ha.join().expect("worker thread panicked"), rb)
    })
}

/// The sets to plan: all, or those named with `--set`.
pub fn select_sets(manifest: &Manifest, names: &[String]) -> Result<Vec<Set>> {
    if names.is_empty() {
        if manifest.sets.is_empty() {
            return Err(err!(
                hint = "add a [sets.NAME] table with `dists` or `files` (docs/manifest.md)",
                "{} defines no sets",
                manifest.path.display()
            ));
        }
        return Ok(manifest.sets.clone());
    }
    if let Some(n) = names
        .iter()
        .find(|n| !manifest.sets.iter().any(|s| &s.name == *n))
    {
        let known: Vec<&str> = manifest.sets.iter().map(|s| s.name.as_str()).collect();
        return Err(err!(
            hint = format!("sets in {}: {}", manifest.path.display(), known.join(", ")),
            "Unknown set {n:?}"
        ));
    }
    // Manifest order, each set once: the order decides which set carries a shared path.
    Ok(manifest
        .sets
        .iter()
        .filter(|s| names.contains(&s.name))
        .cloned()
        .collect())
}

pub fn run(global: &GlobalArgs, args: &PlanArgs) -> Result<u8> {
    let manifest = Manifest::load(&global.manifest)?;
    let src_host = manifest.host(&args.source)?;
    let dst_host = manifest.host(&args.target)?;
    if src_host.name == dst_host.name {
        return Err(err!(
            hint = "name two different hosts",
            "Source and target are the same host ({})",
            src_host.name
        ));
    }
    let sets = select_sets(&manifest, &args.sets)?;
    let plan = make_plan(global, &manifest, &sets, src_host, dst_host)?;

    if args.json {
        print!("{}", report::plan_json(&plan));
    } else {
        print!(
            "{}",
            report::plan_text(&plan, global.verbose > 0, progress::color_stdout())
        );
    }
    for w in &plan.warnings {
        let set = w
            .set
            .as_deref()
            .map(|s| format!("[{s}] "))
            .unwrap_or_default();
        eprintln!("warning: {set}{}", w.message);
    }
    save_plan(&plan, &args.out)?;
    if !global.quiet {
        eprintln!(
            "Plan saved to {}; run `overlay apply` to carry it out.",
            args.out.display()
        );
    }
    Ok(if args.check && plan.has_changes() {
        EXIT_CHANGES
    } else {
        EXIT_OK
    })
}

/// Connect to both hosts, scan, hash, and decide.
pub fn make_plan(
    global: &GlobalArgs,
    manifest: &Manifest,
    sets: &[Set],
    src_host: &Host,
    dst_host: &Host,
) -> Result<Plan> {
    let opts = connect_options(global);
    let globs: Vec<String> = {
        let mut seen = BTreeSet::new();
        sets.iter()
            .flat_map(|s| s.files.iter())
            .filter(|g| seen.insert(g.as_str()))
            .cloned()
            .collect()
    };

    let connect_scan = |host: &Host| -> Result<(Client, ScanReport)> {
        let mut c = Client::connect(&host.name, &host.endpoint, &opts)?;
        let scan = c.scan(&host.venv, &globs)?;
        Ok((c, scan))
    };
    let (s, d) = both(|| connect_scan(src_host), || connect_scan(dst_host));
    let (mut src, src_scan) = s?;
    let (mut dst, dst_scan) = d?;
    let source = host_info(src_host, &src_scan);
    let target = host_info(dst_host, &dst_scan);
    plan::check_python(&source, &target)?;

    // Which paths each side must describe.
    let mut src_paths = BTreeSet::new();
    let mut dst_paths = BTreeSet::new();
    for set in sets {
        src_paths.extend(plan::members(set, &src_scan, &globs).paths);
        dst_paths.extend(plan::members(set, &dst_scan, &globs).paths);
    }
    dst_paths.extend(src_paths.iter().cloned());

    let shebang = ShebangRewrite {
        from: src_host.venv.clone(),
        to: dst_host.venv.clone(),
    };
    let bars = HashBars::new(global.quiet);
    let (sbar, dbar) = (bars.bar(&src_host.name), bars.bar(&dst_host.name));
    let progress = |bar: &indicatif::ProgressBar| {
        let bar = bar.clone();
        move |p: overlay::agent::protocol::Progress| {
            bar.set_length(p.total_bytes);
            bar.set_position(p.bytes);
            bar.set_message(format!("{}/{} files", p.files, p.total_files));
        }
    };
    let (s, d) = both(
        || {
            src.stat(
                &src_host.venv,
                src_paths.into_iter().collect(),
                true,
                Some(shebang),
                false,
                &mut progress(&sbar),
            )
        },
        || {
            dst.stat(
                &dst_host.venv,
                dst_paths.into_iter().collect(),
                true,
                None,
                true,
                &mut progress(&dbar),
            )
        },
    );
    sbar.finish_and_clear();
    dbar.finish_and_clear();
    let index = |v: Vec<Entry>| -> HashMap<String, Entry> {
        v.into_iter().map(|e| (e.path.clone(), e)).collect()
    };
    let src_entries = index(s?);
    let dst_entries = index(d?);
    let (set_plans, warnings) = plan::compute(
        sets,
        &Side {
            host: &src_host.name,
            scan: &src_scan,
            globs: &globs,
            entries: &src_entries,
        },
        &Side {
            host: &dst_host.name,
            scan: &dst_scan,
            globs: &globs,
            entries: &dst_entries,
        },
    )?;
    let _ = both(|| src.close(), || dst.close());
    Ok(Plan {
        format: PLAN_FORMAT,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        manifest: manifest.path.display().to_string(),
        source,
        target,
        sets: set_plans,
        warnings,
    })
}

/// Write the plan atomically (temp file, then rename).
pub fn save_plan(plan: &Plan, out: &Path) -> Result<()> {
    let fail = |e: std::io::Error| {
        err!(
            hint = "choose another place with --out",
            "Failed to save the plan to {}: {}",
            out.display(),
            overlay::error::io_cause(&e)
        )
    };
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(fail)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(fail)?;
    serde_json::to_writer_pretty(&mut tmp, plan).map_err(|e| fail(std::io::Error::other(e)))?;
    tmp.persist(out).map_err(|e| fail(e.error))?;
    Ok(())
}
