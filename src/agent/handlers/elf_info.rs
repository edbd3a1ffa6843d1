//! `PrefetchElf` and `ElfInfo`: source side. The first starts reading the
//! ELF facts of the sets' shared objects in the background (on the
//! background pool, through the facts cache) and is answered at once; the `ElfInfo` that
//! follows the diff is answered from what it read, reading only the paths
//! it did not cover, with progress frames meanwhile.

use std::collections::HashMap;
use std::io::Write;

use crate::agent::session::{ElfPrefetch, Session, with_progress};
use crate::error::Result;
use crate::inventory::Counters;
use crate::model::ElfInfo;
use crate::preflight::facts;
use crate::protocol::Response;

pub fn prefetch_elf(session: &mut Session, venv: String, paths: Vec<String>) -> Result<Response> {
    if session.bundle_source(&venv)?.is_some() {
        // Answered from the index: nothing to read ahead.
        return Ok(Response::Prefetching);
    }
    let (root, wanted) = (venv.clone(), paths.clone());
    session.elf_prefetch = Some(ElfPrefetch {
        venv,
        paths,
        read: Some(crate::preflight::background::spawn(move || {
            facts::read_source(&root, &wanted, &Counters::default()).ok()
        })),
    });
    Ok(Response::Prefetching)
}

pub fn elf_info(
    session: &mut Session,
    output: &mut dyn Write,
    venv: &str,
    paths: &[String],
) -> Result<Response> {
    if let Some(b) = session.bundle_source(venv)? {
        return Ok(Response::ElfInfo {
            infos: b.elf_info(paths),
        });
    }
    let counters = Counters::default();
    let ahead = session.elf_prefetch.take().filter(|p| p.venv == venv);
    with_progress(output, &counters, || -> Result<Vec<Option<ElfInfo>>> {
        let mut known: HashMap<String, Option<ElfInfo>> = match ahead {
            Some(mut p) => match p.join() {
                Some(read) => std::mem::take(&mut p.paths)
                    .into_iter()
                    .zip(read.infos)
                    .collect(),
                None => HashMap::new(),
            },
            None => HashMap::new(),
        };
        let rest: Vec<String> = paths
            .iter()
            .filter(|p| !known.contains_key(*p))
            .cloned()
            .collect();
        if !rest.is_empty() {
            let read = facts::read_source(venv, &rest, &counters)?;
            known.extend(rest.into_iter().zip(read.infos));
        }
        Ok(paths.iter().map(|p| known.remove(p).flatten()).collect())
    })?
    .map(|infos| Response::ElfInfo { infos })
}

#[cfg(test)]
mod tests {
    use crate::agent::testing::exchange;
    use crate::preflight::elf::read_elf;
    use crate::preflight::elf::testutil::{BaseAndUser, base_and_user};
    use crate::protocol::{Request, Response};

    #[test]
    fn elf_info_after_a_prefetch_is_what_a_direct_read_gives() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("pyvenv.cfg"), "version = 3.11.2\n").unwrap();
        let site = t.path().join("lib/python3.11/site-packages");
        std::fs::create_dir_all(site.join("pkg")).unwrap();
        let BaseAndUser { base, user } = base_and_user(&site.join("pkg"));
        let venv = t.path().to_str().unwrap().to_string();
        let rel = |p: &std::path::Path| p.strip_prefix(&site).unwrap().to_str().unwrap().to_owned();
        let (base_rel, user_rel) = (rel(&base), rel(&user));
        // The prefetch covers one object; the request asks for it, one
        // more, and a path that is not there.
        let answers = exchange(&[
            Request::PrefetchElf {
                venv: venv.clone(),
                paths: vec![user_rel.clone()],
                gpus: None,
            },
            Request::ElfInfo {
                venv: venv.clone(),
                paths: vec![base_rel, user_rel, "pkg/gone.so".into()],
                gpus: None,
            },
        ]);
        assert!(matches!(answers[0], Response::Prefetching), "{answers:?}");
        let Response::ElfInfo { infos } = &answers[1] else {
            panic!("{answers:?}");
        };
        let direct = vec![read_elf(&base).unwrap(), read_elf(&user).unwrap(), None];
        assert_eq!(*infos, direct);
        assert!(!infos[1].as_ref().unwrap().defines("printf", None));
        assert!(infos[0].as_ref().unwrap().defines("base", None));
    }
}
