//! The ELF facts the preflight needs, read on the agents: on all cores
//! (rayon), ahead of the request that needs them, and through the facts
//! cache ([`FactsCache`], keyed by each file's stamp) so that a warm plan
//! parses no ELF file at all.
//!
//! * Source side: [`read_source`] reads the facts of shared objects named
//!   relative to site-packages. The agent starts it on `PrefetchElf`, right
//!   after the stat phase (for every shared object of the sets), and answers
//!   the `ElfInfo` request that follows the diff from what it read.
//! * Target side: [`prefetch_target`] lists site-packages' shared objects
//!   ([`shared_objects`]) and reads the facts of each, on `PrefetchPreflight`
//!   while the controller decides the plan; the `Preflight` that follows
//!   starts from that ([`Prefetched`]) instead of reading one object at a time.
//!
//! Each read returns how many files were parsed rather than answered by the
//! cache ([`Read::parsed`]), which tests use to see that a warm run reads none.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use super::elf::OverlayView;
use super::{ELF_CACHE, looks_shared};
use crate::error::Result;
use crate::hashcache::StampCache;
use crate::inventory::{Counters, Venv};
use crate::model::ElfInfo;

/// The ELF facts cache of one venv: `None` for a file that is not ELF.
pub type FactsCache = StampCache<Option<ElfInfo>>;

/// Every shared object of a site-packages, as (path relative to
/// site-packages, path), in path order.
pub type SharedObjects = Vec<(String, PathBuf)>;

/// The facts cache of the venv at `root` (kind [`ELF_CACHE`]).
pub fn open_cache(root: &Path) -> Arc<FactsCache> {
    Arc::new(StampCache::open_kind(root, ELF_CACHE))
}

/// Facts of some files, in their order, and how many of them had to be parsed.
#[derive(Debug, Default)]
pub struct Read {
    pub infos: Vec<Option<ElfInfo>>,
    /// Files parsed (not answered by the cache).
    pub parsed: usize,
}

/// The facts of the files at `paths` (absolute; symlinks followed as the
/// loader would), in parallel, through `cache`; a file that cannot be read
/// or is not ELF has `None`. `counters.files` counts the files done.
pub fn read_paths(paths: &[PathBuf], cache: &FactsCache, counters: &Counters) -> Read {
    let parsed = AtomicUsize::new(0);
    let infos = paths
        .par_iter()
        .map(|p| {
            let info = read_one(p, cache, &parsed);
            counters.files.fetch_add(1, Ordering::Relaxed);
            info
        })
        .collect();
    Read {
        infos,
        parsed: parsed.into_inner(),
    }
}

fn read_one(p: &Path, cache: &FactsCache, parsed: &AtomicUsize) -> Option<ElfInfo> {
    let m = std::fs::metadata(p).ok()?;
    if !m.is_file() {
        return None;
    }
    if let Some(info) = cache.get(p, &m)
        && super::elf::fatbin::serves(p, &info)
    {
        return info;
    }
    parsed.fetch_add(1, Ordering::Relaxed);
    let info = super::elf::read_elf(p).ok().flatten();
    cache.put(p, &m, &info);
    info
}

/// Source side: the facts of `paths` (site-packages relative) of the venv
/// at `venv_root`, through its cache (saved after).
pub fn read_source(venv_root: &str, paths: &[String], counters: &Counters) -> Result<Read> {
    let venv = Venv::open_source(venv_root)?;
    let abs = paths
        .iter()
        .map(|p| Ok(venv.resolve(p)?.0))
        .collect::<Result<Vec<PathBuf>>>()?;
    counters
        .total_files
        .store(abs.len() as u64, Ordering::Relaxed);
    let cache = open_cache(&venv.root);
    let read = read_paths(&abs, &cache, counters);
    cache.save();
    Ok(read)
}

/// ELF facts of files in a venv (source side), `None` for non-ELF files.
pub fn elf_infos(venv_root: &str, paths: &[String]) -> Result<Vec<Option<ElfInfo>>> {
    Ok(read_source(venv_root, paths, &Counters::default())?.infos)
}

/// What the target's agent read ahead of a `Preflight`: the venv's shared
/// objects, the facts of each (in the same order), and the cache they came
/// through (for what the loader check reads beyond them).
pub struct Prefetched {
    pub objects: SharedObjects,
    pub facts: Vec<Option<Arc<ElfInfo>>>,
    pub cache: Arc<FactsCache>,
    /// Files parsed (not answered by the cache).
    pub parsed: usize,
}

/// Target side: list the shared objects of the venv at `venv_root` and
/// read the facts of each, in parallel, through its cache.
pub fn prefetch_target(venv_root: &str) -> Result<Prefetched> {
    let venv = Venv::open(venv_root)?;
    let objects = walk_shared_objects(&venv.site());
    let cache = open_cache(&venv.root);
    Ok(prefetch_with(objects, cache))
}

/// [`prefetch_target`] of listed `objects` through `cache`.
pub fn prefetch_with(objects: SharedObjects, cache: Arc<FactsCache>) -> Prefetched {
    let paths: Vec<PathBuf> = objects.iter().map(|(_, p)| p.clone()).collect();
    let read = read_paths(&paths, &cache, &Counters::default());
    Prefetched {
        objects,
        facts: read.infos.into_iter().map(|i| i.map(Arc::new)).collect(),
        cache,
        parsed: read.parsed,
    }
}

/// The loader's view of `venv` for a `Preflight`, its shared objects and
/// the cache the view reads through (to save after): from what
/// [`prefetch_target`] read ahead, or (without it) listed now, the view
/// reading each object as the check reaches it.
pub fn target_view(
    venv: &Venv,
    prefetched: Option<Prefetched>,
) -> (OverlayView, SharedObjects, Arc<FactsCache>) {
    match prefetched {
        Some(p) => {
            let mut view = OverlayView::with_cache(p.cache.clone());
            for ((_, path), info) in p.objects.iter().zip(p.facts) {
                view.known(path, info);
            }
            (view, p.objects, p.cache)
        }
        None => {
            let cache = open_cache(&venv.root);
            let view = OverlayView::with_cache(cache.clone());
            (view, walk_shared_objects(&venv.site()), cache)
        }
    }
}

/// List the shared objects of the venv at `venv_root` (see [`SharedObjects`]).
pub fn shared_objects(venv_root: &str) -> Result<SharedObjects> {
    let site = Venv::open(venv_root)?.site();
    Ok(walk_shared_objects(&site))
}

/// The shared objects under `site`. The top-level entries are walked in
/// parallel: this walk reads every directory of the venv.
pub fn walk_shared_objects(site: &Path) -> SharedObjects {
    let tops: Vec<PathBuf> = std::fs::read_dir(site)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let mut out: SharedObjects = tops
        .par_iter()
        .flat_map_iter(|top| {
            walkdir::WalkDir::new(top)
                .follow_links(false)
                .follow_root_links(false)
                .into_iter()
                .filter_entry(|e| e.file_name() != "__pycache__")
                .flatten()
                .filter(|e| {
                    e.file_type().is_file() && e.file_name().to_str().is_some_and(looks_shared)
                })
                .filter_map(|e| {
                    let rel = e.path().strip_prefix(site).ok()?.to_str()?.to_string();
                    Some((rel, e.into_path()))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::elf::read_elf;
    use crate::preflight::elf::testutil::{BaseAndUser, base_and_user};

    /// A site-packages with two shared objects and a non-ELF `.so`.
    fn site(dir: &Path) -> (PathBuf, SharedObjects) {
        let site = dir.join("site");
        std::fs::create_dir_all(site.join("pkg")).unwrap();
        let BaseAndUser { .. } = base_and_user(&site.join("pkg"));
        std::fs::write(site.join("pkg/fake.so"), vec![b'x'; 100]).unwrap();
        let objects = walk_shared_objects(&site);
        (site, objects)
    }

    #[test]
    fn prefetch_gives_what_a_direct_read_gives() {
        let t = tempfile::tempdir().unwrap();
        let (_, objects) = site(t.path());
        let rels: Vec<&str> = objects.iter().map(|(r, _)| r.as_str()).collect();
        assert!(rels.contains(&"pkg/fake.so"), "{rels:?}");
        assert!(objects.len() >= 3, "{rels:?}");
        let got = prefetch_with(objects.clone(), Arc::new(StampCache::disabled()));
        assert_eq!(got.objects, objects);
        assert_eq!(got.parsed, objects.len());
        for ((_, p), info) in objects.iter().zip(&got.facts) {
            assert_eq!(
                info.as_deref(),
                read_elf(p).unwrap().as_ref(),
                "{}",
                p.display()
            );
        }
    }

    #[test]
    fn a_warm_read_parses_nothing() {
        let t = tempfile::tempdir().unwrap();
        let (_, objects) = site(t.path());
        let store = t.path().join("cache.bin");
        let cold = prefetch_with(objects.clone(), Arc::new(FactsCache::for_test(&store)));
        assert!(cold.parsed >= 2);
        cold.cache.save();
        // A new process: the cache is read back from its file.
        let warm = prefetch_with(objects.clone(), Arc::new(FactsCache::for_test(&store)));
        assert_eq!(warm.parsed, 0);
        let direct: Vec<_> = objects.iter().map(|(_, p)| read_elf(p).unwrap()).collect();
        let warm: Vec<_> = warm.facts.iter().map(|f| f.as_deref().cloned()).collect();
        assert_eq!(warm, direct);
    }
}
