//! What earlier imports have loaded before an extension module, for the
//! load model ([`Preloads`], from the request's `imported_first`), and the
//! model's last rule: a root whose every problem is a symbol another
//! package defines is imported after that package ([`imported_first_note`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use super::elf::{self, LoaderConfig, LoaderView, OverlayView};
use super::object::{Found, Object, lexical};
use crate::model::{ElfFinding, PreflightRequest};

/// How many symbol names a "needs X imported first" reason shows.
const SYMBOLS_SHOWN: usize = 3;

/// The load model's last rule: a root whose every problem is an undefined
/// symbol, each defined (exported in the dynamic symbol table) by a shared
/// object under another top-level package directory of the venv after the
/// overlay, is a module that is imported only after that package (it
/// loads those libraries, `RTLD_GLOBAL` or through its own modules):
/// "needs torch imported first". Its one finding (`file` left empty), or
/// `None` when any problem is of another kind or any symbol is defined
/// nowhere else (a real missing symbol). The root's own package directory
/// does not count (its own library that nothing loads is a real problem);
/// a wheel's vendored `<pkg>.libs` counts as `<pkg>`.
pub(super) fn imported_first_note(
    rel: &str,
    found: &[Found],
    after: &[Object],
) -> Option<ElfFinding> {
    let package = |r: &str| {
        let top = r.split('/').next().unwrap_or(r);
        top.strip_suffix(".libs").unwrap_or(top).to_owned()
    };
    let own = package(rel);
    let mut symbols: Vec<&crate::model::Symbol> = Vec::new();
    for f in found {
        match &f.unmet {
            elf::Unmet::Symbols(s) => symbols.extend(s),
            _ => return None,
        }
    }
    if symbols.is_empty() {
        return None;
    }
    let mut packages: BTreeSet<String> = BTreeSet::new();
    let mut definers: BTreeSet<&str> = BTreeSet::new();
    for u in &symbols {
        let keys = crate::model::reference_keys(&u.name, u.version.as_deref());
        let by = after.iter().find(|o| {
            !o.rel.starts_with("..")
                && !o.rel.starts_with('/')
                && package(&o.rel) != own
                && o.info.defines_any(&keys)
        })?;
        packages.insert(package(&by.rel));
        definers.insert(&by.rel);
    }
    let packages: Vec<String> = packages.into_iter().collect();
    let mut names: Vec<&str> = symbols.iter().map(|u| u.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let shown = names
        .iter()
        .take(SYMBOLS_SHOWN)
        .copied()
        .collect::<Vec<_>>();
    let more = if names.len() > SYMBOLS_SHOWN {
        ", …"
    } else {
        ""
    };
    let cause = format!("needs {} imported first", packages.join(", "));
    let definers: Vec<&str> = definers.into_iter().collect();
    Some(ElfFinding {
        file: String::new(),
        reason: format!(
            "{cause}: its {} undefined symbol{} ({}{more}) {} defined by {}",
            names.len(),
            if names.len() == 1 { "" } else { "s" },
            shown.join(", "),
            if names.len() == 1 { "is" } else { "are" },
            definers.join(", ")
        ),
        cause,
        optional: false,
        preexisting: false,
        imported_first: packages,
        missing_library: None,
    })
}

/// The request's `imported_first`, or from `torch_users` when a controller
/// did not send it: torch is imported before each of them.
pub(super) fn imported_first_of(req: &PreflightRequest) -> BTreeMap<String, Vec<String>> {
    if !req.imported_first.is_empty() {
        return req.imported_first.clone();
    }
    req.torch_users
        .iter()
        .map(|t| (t.clone(), vec!["torch".to_owned()]))
        .collect()
}

/// What earlier imports have loaded, per top-level package directory: the
/// global deps (`<top>/lib/lib<top>_global_deps.so`, which torch loads
/// `RTLD_GLOBAL`) and the top-level `_C` extension modules (loaded
/// `RTLD_LOCAL`: their closure's names satisfy later `DT_NEEDED`s, their
/// symbols are in scope only for objects that reach them) of the
/// distributions imported first.
pub(super) struct Preloads {
    /// The venv's interpreter (its real path), global for every object.
    interpreter: Option<PathBuf>,
    /// Top-level directory -> what is loaded before its extension modules.
    by_top: HashMap<String, Preload>,
}

#[derive(Default, Clone)]
struct Preload {
    /// Loaded `RTLD_GLOBAL`.
    global: Vec<PathBuf>,
    /// `_C` extension modules loaded `RTLD_LOCAL`, each with the names its
    /// closure answers to.
    modules: Vec<(PathBuf, Vec<(String, PathBuf)>)>,
}

impl Preloads {
    /// Preloads over `objects` (the venv's shared objects as `view` sees
    /// them, placed ones included): the preloaded objects are taken from the
    /// venv as the view shows it, never from a listing of the old disk.
    pub(super) fn of(
        site: &Path,
        objects: &[Object],
        imported_first: &BTreeMap<String, Vec<String>>,
        interpreter: Option<PathBuf>,
        cfg: &LoaderConfig,
        view: &mut OverlayView,
    ) -> Self {
        let providers: BTreeSet<&String> = imported_first.values().flatten().collect();
        let mut of_provider: HashMap<&str, Preload> = HashMap::new();
        for top in providers {
            let mut pre = Preload::default();
            let deps = site.join(format!("{top}/lib/lib{top}_global_deps.so"));
            if view.elf(&deps).is_some() {
                pre.global.push(deps);
            }
            let c = LoaderConfig {
                global: interpreter.iter().chain(&pre.global).cloned().collect(),
                loaded: HashMap::new(),
                ..cfg.clone()
            };
            let prefix = format!("{top}/");
            for o in objects.iter().filter(|o| {
                o.extension
                    && o.rel
                        .strip_prefix(&prefix)
                        .is_some_and(|n| n.starts_with("_C.") && !n.contains('/'))
            }) {
                let closure = elf::closure_of(&o.path, view, &c);
                pre.modules.push((o.path.clone(), closure.names));
            }
            of_provider.insert(top.as_str(), pre);
        }
        let by_top = imported_first
            .iter()
            .map(|(user, provs)| {
                let mut pre = Preload::default();
                for p in provs {
                    if let Some(pp) = of_provider.get(p.as_str()) {
                        pre.global.extend(pp.global.iter().cloned());
                        pre.modules.extend(pp.modules.iter().cloned());
                    }
                }
                (user.clone(), pre)
            })
            .collect();
        Preloads {
            interpreter,
            by_top,
        }
    }

    /// Every object some import preloads (their closures included).
    pub(super) fn all_objects(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for pre in self.by_top.values() {
            out.extend(pre.global.iter().map(|p| lexical(p)));
            for (m, names) in &pre.modules {
                out.push(lexical(m));
                out.extend(names.iter().map(|(_, p)| lexical(p)));
            }
        }
        out
    }

    /// `cfg` with what is loaded before the object at `rel` (`path`): the
    /// interpreter, and the preloads of its top-level directory except the
    /// object itself.
    pub(super) fn config_for(&self, cfg: &LoaderConfig, rel: &str, path: &Path) -> LoaderConfig {
        let mut c = LoaderConfig {
            global: self.interpreter.iter().cloned().collect(),
            loaded: HashMap::new(),
            ..cfg.clone()
        };
        let top = rel.split('/').next().unwrap_or(rel);
        if let Some(pre) = self.by_top.get(top) {
            c.global.extend(pre.global.iter().cloned());
            for (m, names) in pre.modules.iter().filter(|(m, _)| m != path) {
                let _ = m;
                for (n, p) in names {
                    c.loaded.entry(n.clone()).or_insert_with(|| p.clone());
                }
            }
        }
        c
    }
}
