//! `PrefetchPreflight` and `Preflight`: target side. The first starts
//! listing site-packages' shared objects and reading their ELF facts (in
//! parallel, through the facts cache) in the background, and is answered
//! at once; the `Preflight` that follows (for the same venv) starts from
//! what it read to predict what fails to load after the overlay.

use std::io::Write;

use crate::agent::session::{Session, with_progress};
use crate::error::Result;
use crate::inventory::Counters;
use crate::model::PreflightRequest;
use crate::protocol::Response;

pub fn prefetch_preflight(
    session: &mut Session,
    venv: String,
    gpu_paths: Option<&[String]>,
) -> Result<Response> {
    // The GPU code of the objects named only, for this walk and the
    // `Preflight` that follows (see `fatbin::read_code_of`).
    let only = gpu_paths.and_then(|rels| {
        let site = crate::inventory::Venv::open(&venv).ok()?.site();
        Some(rels.iter().map(|r| site.join(r)).collect())
    });
    crate::preflight::elf::fatbin::read_code_of(only);
    let walk = venv.clone();
    session.prefetch = Some((
        venv,
        crate::preflight::background::spawn(move || {
            crate::preflight::facts::prefetch_target(&walk).ok()
        }),
    ));
    Ok(Response::Prefetching)
}

pub fn preflight(
    session: &mut Session,
    output: &mut dyn Write,
    req: &PreflightRequest,
) -> Result<Response> {
    let counters = Counters::default();
    if let Some(m) = &req.machine {
        crate::preflight::elf::fatbin::read_for(Some(m.capabilities()));
    }
    let listed = match session.prefetch.take() {
        Some((venv, walk)) if venv == req.venv => walk.join().ok().flatten(),
        _ => {
            // No walk ahead for this venv: its filter does not apply.
            crate::preflight::elf::fatbin::read_code_of(None);
            None
        }
    };
    with_progress(output, &counters, || {
        crate::preflight::run_on_target(req, listed)
    })?
    .map(Response::Preflight)
}

#[cfg(test)]
mod tests {
    use crate::agent::testing::exchange;
    use crate::model::{ElfInfo, PreflightRequest};
    use crate::preflight::elf::testutil::{BaseAndUser, base_and_user};
    use crate::protocol::{Request, Response};

    #[test]
    fn a_prefetched_preflight_predicts_what_a_cold_one_does() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
        let site = t.path().join("lib/python3.11/site-packages");
        std::fs::create_dir_all(site.join("pkg")).unwrap();
        let BaseAndUser { .. } = base_and_user(&site.join("pkg"));
        let venv = t.path().to_str().unwrap().to_string();
        // libbase.so.1 replaced by an object that defines nothing: the
        // staying libuse.so loses `base`.
        let req = PreflightRequest {
            venv: venv.clone(),
            placed: vec![(
                "pkg/deps/libbase.so.1".into(),
                Some(ElfInfo {
                    soname: Some("libbase.so.1".into()),
                    ..Default::default()
                }),
            )],
            deleted: vec![],
            ld_library_path: vec![],
            torch_users: vec![],
            imported_first: Default::default(),
            whole: false,
            machine: None,
        };
        let ahead = exchange(&[
            Request::PrefetchPreflight {
                venv: venv.clone(),
                gpus: None,
                gpu_paths: None,
            },
            Request::Preflight(Box::new(req.clone())),
        ]);
        let cold = exchange(&[Request::Preflight(Box::new(req))]);
        assert!(matches!(ahead[0], Response::Prefetching), "{ahead:?}");
        let (Response::Preflight(a), Response::Preflight(c)) = (&ahead[1], &cold[0]) else {
            panic!("{ahead:?} {cold:?}");
        };
        assert_eq!(a.problems, c.problems);
        assert!(
            a.problems
                .iter()
                .any(|f| f.file == "pkg/libuse.so" && f.reason.contains("undefined symbol: base")),
            "{:?}",
            a.problems
        );
    }
}
