//! `overlay plan SRC DST`: scan and hash both live hosts, decide the plan,
//! print it and save it. Never writes to either venv.

use std::collections::BTreeSet;
use std::path::Path;

use overlay::client::Client;
use std::collections::HashSet;

use overlay::err;
use overlay::error::Result;
use overlay::manifest::{Host, Manifest};
use overlay::plan::{self, HostInfo, PLAN_FORMAT, Plan, Side};
use overlay::preflight::{cuda, requirements};
use overlay::protocol::{Request, Response};
use overlay::report;
use overlay::text;
use overlay::transport::ConnectOptions;

use crate::cli::{GlobalArgs, PlanArgs};
use crate::progress::{self, HashBars};
use overlay::error::{EXIT_CHANGES, EXIT_OK};
use overlay::model::{
    Action, Check, Dist, Endpoint, Entry, HashMode, Kind, PreflightRequest, Problem, Progress,
    ScanReport, Set, ShebangRewrite,
};

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
        direct_ssh: host.direct_ssh.clone(),
        site_packages: scan.site_packages.clone(),
        python: scan.python.clone(),
    }
}

/// One side of the plan's stat rounds.
struct StatSide<'a> {
    venv: &'a str,
    shebang: Option<ShebangRewrite>,
    pycache: bool,
    bar: &'a indicatif::ProgressBar,
}

impl StatSide<'_> {
    /// Stat the members of `sets` on this side's host, plus `extra` paths,
    /// with the hashes its cache still vouches for; the answer is for
    /// `order` ([`plan::stat_order`] of the same).
    fn stat_members(
        &self,
        client: &mut Client,
        sets: &[Set],
        globs: &[String],
        extra: &[&str],
        order: &[&str],
    ) -> Result<Vec<Entry>> {
        if order.is_empty() {
            return Ok(Vec::new());
        }
        client.stat_members(
            self.venv,
            sets,
            globs,
            extra.iter().map(|p| p.to_string()).collect(),
            order.iter().map(|p| p.to_string()).collect(),
            plan::order_check(order),
            HashMode::Cached,
            self.shebang.clone(),
            self.pycache,
            &mut |_| {},
        )
    }

    /// Stat `paths` on this side's host (hashing them with `HashMode::All`,
    /// with progress on the bar). An empty list costs no round trip.
    fn stat(&self, client: &mut Client, paths: Vec<String>, mode: HashMode) -> Result<Vec<Entry>> {
        if paths.is_empty() {
            return Ok(Vec::new());
        }
        let bar = self.bar;
        let mut progress = |p: Progress| {
            if mode == HashMode::All {
                bar.set_length(p.total_bytes);
                bar.set_position(p.bytes);
                bar.set_message(format!("{}/{} files", p.files, p.total_files));
            }
        };
        client.stat(
            self.venv,
            paths,
            mode,
            self.shebang.clone(),
            self.pycache,
            &mut progress,
        )
    }
}

/// The sets' members on one host and the order of their stat.
fn members_and_order<'a>(
    sets: &[Set],
    scan: &'a ScanReport,
    globs: &[String],
) -> (Vec<plan::Members<'a>>, Vec<&'a str>) {
    let members = plan::members_of(sets, scan, globs);
    let order = plan::stat_order(&members, &[]);
    (members, order)
}

/// Stat entries by path. (The path moves into the key; the entry's own
/// `path` is left empty.)
fn index(v: Vec<Entry>) -> plan::Entries {
    let mut map = plan::Entries::with_capacity_and_hasher(v.len(), Default::default());
    for mut e in v {
        map.insert(std::mem::take(&mut e.path), e);
    }
    map
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
    let (mut plan, closing) = make_plan(global, &manifest, &sets, src_host, dst_host)?;
    plan.strict |= args.strict;

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
        eprintln!("warning: {}", text::escape(&format!("{set}{}", w.message)));
    }
    for p in &plan.problems {
        let level = if plan.strict && !p.preexisting {
            "error"
        } else {
            "warning"
        };
        let check = serde_json::to_value(p.check)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let dist = p
            .dist
            .as_deref()
            .map(|d| format!("{d}: "))
            .unwrap_or_default();
        // Name the file unless the reason already starts with it.
        let file = match &p.file {
            Some(f) if !p.reason.starts_with(f.as_str()) => format!("{f}: "),
            _ => String::new(),
        };
        eprintln!(
            "{level}: {}",
            text::escape(&format!("[{check}] {dist}{file}{}", p.reason))
        );
    }
    save_plan(&plan, &args.out)?;
    // The agents have answered everything; their goodbyes ran beside the
    // printing and saving.
    let _ = closing.join();
    if plan.strict && plan.new_problems() > 0 {
        return Err(err!(
            hint = "fix the plan (add the missing sets or packages), or run `overlay apply --force` to apply it anyway",
            "The plan predicts {} problem{} after the overlay (strict); saved to {}, but `overlay apply` will refuse it",
            plan.new_problems(),
            if plan.new_problems() == 1 { "" } else { "s" },
            args.out.display()
        ));
    }
    if !global.quiet {
        eprintln!(
            "Plan saved to {}; run `overlay apply` to carry it out.",
            text::escape(&args.out.to_string_lossy())
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
) -> Result<(Plan, std::thread::JoinHandle<()>)> {
    let opts = connect_options(global);
    let started = std::time::Instant::now();
    let timing = |what: &str| {
        if global.verbose >= 2 {
            eprintln!(
                "timing: {what} done at {:.2}s",
                started.elapsed().as_secs_f64()
            );
        }
    };
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
    timing("connect and scan");
    plan::check_python(&source, &target)?;

    // Which paths each side must describe: the source its members, the
    // target its own and the source's. Each agent works its members out
    // from the scan it sent, as this side does, so only the paths the
    // target lacks travel (a torch stack's 35,000 paths do not).
    let ((src_members, src_order), (dst_members, dst_own)) = both(
        || members_and_order(sets, &src_scan, &globs),
        || members_and_order(sets, &dst_scan, &globs),
    );
    let extra = plan::sorted_difference(&src_order, &dst_own);
    // The order the target's agent states them in.
    let dst_order = plan::stat_order(&dst_members, &extra);

    let shebang = ShebangRewrite {
        from: src_host.venv.clone(),
        to: dst_host.venv.clone(),
    };
    let bars = HashBars::new(global.quiet);
    let (sbar, dbar) = (bars.bar(&src_host.name), bars.bar(&dst_host.name));
    // What differs between the sides' requests: the source's `bin/` scripts
    // are hashed as they would read on the target, and only the target's
    // bytecode matters.
    let src_side = StatSide {
        venv: &src_host.venv,
        shebang: Some(shebang),
        pycache: false,
        bar: &sbar,
    };
    let dst_side = StatSide {
        venv: &dst_host.venv,
        shebang: None,
        pycache: true,
        bar: &dbar,
    };
    // Phase 1: stat both sides; no content is read, but hashes the hosts'
    // caches still vouch for come along.
    let (s, d) = both(
        || {
            src_side
                .stat_members(&mut src, sets, &globs, &[], &src_order)
                .map(index)
        },
        || {
            dst_side
                .stat_members(&mut dst, sets, &globs, &extra, &dst_order)
                .map(index)
        },
    );
    let mut src_entries = s?;
    let mut dst_entries = d?;
    timing("stat");
    // The target's preflight walks all of site-packages; it can start now,
    // while this side hashes and decides.
    match dst.call(
        &Request::PrefetchPreflight {
            venv: dst_host.venv.clone(),
        },
        &mut |_| {},
    )? {
        Response::Prefetching => {}
        other => return Err(err!("unexpected answer from {}: {other:?}", dst.host)),
    }
    // Phase 2: hash only what decides something, as rsync --checksum does:
    // files on both sides with the same size (a size difference already
    // means "replace"), and scripts whose shebang is rewritten; and of
    // those only the sides the cache did not answer.
    let unhashed =
        |e: Option<&Entry>| matches!(e.map(|e| &e.kind), Some(Kind::File { blake3: None, .. }));
    let (mut to_hash, mut src_hash, mut dst_hash) = (0usize, Vec::new(), Vec::new());
    for (p, s, d) in plan::needs_hash(&src_entries, &dst_entries) {
        to_hash += 1;
        if unhashed(Some(s)) {
            src_hash.push(p.to_string());
        }
        if unhashed(d) {
            dst_hash.push(p.to_string());
        }
    }
    let (n_src, n_dst) = (src_hash.len(), dst_hash.len());
    let (s, d) = both(
        || src_side.stat(&mut src, src_hash, HashMode::All),
        || dst_side.stat(&mut dst, dst_hash, HashMode::All),
    );
    sbar.finish_and_clear();
    dbar.finish_and_clear();
    src_entries.extend(index(s?));
    dst_entries.extend(index(d?));
    timing(&format!(
        "hash ({} same-size pairs and scripts; read {} + {} files, the rest cached)",
        to_hash, n_src, n_dst
    ));
    let plan::Computed {
        sets: set_plans,
        warnings,
    } = plan::compute_with(
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
        src_members,
        dst_members,
    )?;
    timing("decide");
    let problems = preflight(
        manifest,
        sets,
        (&mut src, &src_scan, &src_host.venv),
        (&mut dst, &dst_scan, &dst_host.venv),
        &set_plans,
        &timing,
    )?;
    timing("preflight");
    let closing = std::thread::spawn(move || {
        let _ = both(|| src.close(), || dst.close());
    });
    // Both hosts' listings (two maps of 35,000 entries for a torch stack)
    // are not freed one allocation at a time just before the process exits.
    std::mem::forget((src_entries, dst_entries, src_scan, dst_scan));
    let plan = Plan {
        format: PLAN_FORMAT,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        manifest: manifest.path.display().to_string(),
        source,
        target,
        sets: set_plans,
        warnings,
        problems,
        strict: manifest.preflight.strict,
    };
    Ok((plan, closing))
}

/// Predict what would fail after the overlay: requirements, CUDA majors, ELF loading.
fn preflight(
    manifest: &Manifest,
    sets: &[Set],
    (src, src_scan, src_venv): (&mut Client, &ScanReport, &str),
    (dst, dst_scan, dst_venv): (&mut Client, &ScanReport, &str),
    set_plans: &[overlay::plan::SetPlan],
    timing: &dyn Fn(&str),
) -> Result<Vec<Problem>> {
    let mut deleted: HashSet<&str> = HashSet::new();
    let mut placed: Vec<&str> = Vec::new();
    for s in set_plans {
        for c in &s.changes {
            match c.action {
                Action::Delete => {
                    deleted.insert(c.path.as_str());
                }
                _ => placed.push(c.path.as_str()),
            }
        }
    }
    let after = overlay::preflight::dists_after(&dst_scan.dists, &src_scan.dists, sets, &deleted);
    let mut problems = Vec::new();

    // 1. Requirements, for the target's interpreter and platform. Problems
    //    the target already has are marked as such.
    if let Some(env) = requirements::environment(&dst_scan.facts, &dst_scan.python) {
        let before: Vec<&Dist> = dst_scan.dists.iter().collect();
        let already: HashSet<String> = requirements::check(&before, &env)
            .into_iter()
            .map(|p| p.reason)
            .collect();
        for mut p in requirements::check(&after, &env) {
            if already.contains(&p.reason) {
                p.reason.push_str(" (already so before the overlay)");
                p.preexisting = true;
            }
            problems.push(p);
        }
    }

    // 2. ELF: facts of the shared objects the overlay brings, then the target simulates its loader.
    let shared: Vec<String> = placed
        .iter()
        .filter(|p| overlay::preflight::looks_shared(p))
        .map(|p| p.to_string())
        .collect();
    let infos = if shared.is_empty() {
        Vec::new()
    } else {
        match src.call(
            &Request::ElfInfo {
                venv: src_venv.to_string(),
                paths: shared.clone(),
            },
            &mut |_| {},
        )? {
            Response::ElfInfo { infos } => infos,
            other => return Err(err!("unexpected answer from {}: {other:?}", src.host)),
        }
    };
    timing(&format!(
        "preflight: requirements, and ELF facts of {} shared objects",
        shared.len()
    ));
    let ld_library_path: Vec<String> = manifest
        .verify
        .as_ref()
        .and_then(|v| v.env.get("LD_LIBRARY_PATH"))
        .map(|v| {
            let site = format!(
                "{}/{}",
                dst_venv.trim_end_matches('/'),
                dst_scan.site_packages
            );
            v.replace("{site_packages}", &site)
                .replace("{venv}", dst_venv)
                .split(':')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let req = PreflightRequest {
        venv: dst_venv.to_string(),
        placed: placed
            .iter()
            .map(|p| p.to_string())
            .map(|p| {
                let info = shared
                    .iter()
                    .position(|s| *s == p)
                    .and_then(|i| infos.get(i).cloned().flatten());
                (p, info)
            })
            .collect(),
        deleted: deleted.iter().map(|p| p.to_string()).collect(),
        ld_library_path,
        torch_users: overlay::preflight::torch_users(&after),
    };
    let report = match dst.call(&Request::Preflight(Box::new(req)), &mut |_| {})? {
        Response::Preflight(r) => r,
        other => return Err(err!("unexpected answer from {}: {other:?}", dst.host)),
    };
    for (file, reason) in report.problems {
        problems.push(Problem {
            check: Check::Elf,
            dist: overlay::preflight::owner(&after, &file).map(|d| d.name.clone()),
            file: Some(file),
            reason,
            preexisting: false,
        });
    }

    // 3. CUDA majors of the packages that link together.
    problems.extend(cuda::check(
        &after,
        &manifest.preflight.cuda_family,
        &report.cudart,
    ));
    problems.sort();
    problems.dedup();
    Ok(problems)
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
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(dir)
        .map_err(fail)?;
    // Created 0600 (NamedTempFile's mode), whatever the umask.
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(fail)?;
    // One buffered write: a plan of 35,000 paths is ~10 MB of JSON.
    let mut w = std::io::BufWriter::with_capacity(1 << 20, &mut tmp);
    serde_json::to_writer_pretty(&mut w, plan).map_err(|e| fail(std::io::Error::other(e)))?;
    std::io::Write::flush(&mut w).map_err(fail)?;
    drop(w);
    tmp.persist(out).map_err(|e| fail(e.error))?;
    Ok(())
}
