//! Symbol and version-need analysis over a loaded [`Session`]: the version
//! needs of each newly loaded object against the definitions of the object
//! that provides them (glibc's `dl-version.c`), then every non-weak undefined
//! symbol against what the whole scope defines (glibc's `check_match`, as an
//! existence check: a binary search in each object's sorted definition
//! hashes, [`ElfInfo::defines`](super::ElfInfo::defines)). Also the wording of these problems: version summaries
//! and demangled C++ names.

use std::collections::{HashMap, HashSet};

use super::Symbol;
use super::check::{ElfProblem, Unmet};
use super::search::Session;

/// At most this many undefined symbols are listed per object; the rest are
/// counted in one more problem.
const MAX_UNDEFINED_PER_FILE: usize = 20;

/// Versions found missing, by object index: the undefined symbols of those
/// versions are not reported once more.
pub(super) type MissingVersions<'a> = HashMap<usize, HashSet<&'a str>>;

/// Version needs (`dl-version.c`) of each newly loaded object: a need of a
/// version its provider does not define is a problem.
pub(super) fn check_version_needs<'a>(
    s: &'a Session<'_>,
    problems: &mut Vec<ElfProblem>,
) -> MissingVersions<'a> {
    let mut missing_versions = MissingVersions::new();
    for (i, o) in s.objs.iter().enumerate().filter(|(_, o)| o.new) {
        for (file, version) in &o.info.version_needs {
            let provider = o
                .deps
                .iter()
                .find(|d| d.name == *file)
                .and_then(|d| d.object)
                .or_else(|| s.by_name.get(file).copied());
            let Some(p) = provider else { continue };
            let defs = &s.objs[p].info.version_defs;
            // A provider without any version definitions is accepted by glibc.
            if defs.is_empty() || defs.contains(version) {
                continue;
            }
            missing_versions.entry(i).or_default().insert(version);
            problems.push(ElfProblem {
                file: o.path.clone(),
                reason: format!(
                    "needs {version} from {file} ({} {})",
                    s.objs[p].path.display(),
                    defines_summary(version, defs)
                ),
                unmet: Unmet::Version,
            });
        }
    }
    missing_versions
}

/// Undefined symbols: what the new objects need, against what the scope
/// (global closure and the root's closure) defines. Objects with a
/// `DT_NEEDED` not found are skipped (the loader stops there), and so are
/// symbols of a version already reported missing.
pub(super) fn check_undefined_symbols(
    s: &Session<'_>,
    missing_versions: &MissingVersions<'_>,
    problems: &mut Vec<ElfProblem>,
) {
    let checked: Vec<usize> = s
        .objs
        .iter()
        .enumerate()
        .filter(|(_, o)| o.new && o.deps.iter().all(|d| d.object.is_some()))
        .map(|(i, _)| i)
        .collect();
    let defined = Definitions::of(s);
    for i in checked {
        let o = &s.objs[i];
        let reported_versions = missing_versions.get(&i);
        let mut missing = o.info.undefined.iter().filter(|u| {
            let version_reported = u
                .version
                .as_deref()
                .is_some_and(|v| reported_versions.is_some_and(|set| set.contains(v)));
            !u.weak && !version_reported && !defined.resolves(u)
        });
        for u in missing.by_ref().take(MAX_UNDEFINED_PER_FILE) {
            problems.push(ElfProblem {
                file: o.path.clone(),
                reason: format!("undefined symbol: {}", describe_symbol(u)),
                unmet: Unmet::Symbols(vec![u.clone()]),
            });
        }
        let more: Vec<Symbol> = missing.cloned().collect();
        if !more.is_empty() {
            problems.push(ElfProblem {
                file: o.path.clone(),
                reason: format!("… and {} more undefined symbols", more.len()),
                unmet: Unmet::Symbols(more),
            });
        }
    }
}

/// The definitions in scope: each object's sorted symbol keys
/// ([`ElfInfo::defined`](super::ElfInfo::defined)), searched by
/// [`ElfInfo::defines`](super::ElfInfo::defines).
struct Definitions<'a> {
    objects: Vec<&'a super::ElfInfo>,
}

impl<'a> Definitions<'a> {
    fn of(s: &'a Session<'_>) -> Self {
        Definitions {
            objects: s.objs.iter().map(|o| &*o.info).collect(),
        }
    }

    /// An unversioned reference takes any definition; a versioned one takes
    /// that version or an unversioned definition (glibc's check_match).
    fn resolves(&self, u: &Symbol) -> bool {
        let keys = crate::model::reference_keys(&u.name, u.version.as_deref());
        self.objects.iter().any(|o| o.defines_any(&keys))
    }
}

/// A version name split into its prefix and numbers: `GLIBC_2.36` is
/// `GLIBC_` and `[2, 36]`.
struct NumberedVersion<'a> {
    prefix: &'a str,
    numbers: Vec<u64>,
}

impl<'a> NumberedVersion<'a> {
    fn parse(v: &'a str) -> Option<Self> {
        let at = v.find(|c: char| c.is_ascii_digit())?;
        let numbers: Option<Vec<u64>> = v[at..].split('.').map(|n| n.parse().ok()).collect();
        Some(NumberedVersion {
            prefix: &v[..at],
            numbers: numbers?,
        })
    }
}

/// "up to GLIBC_2.36" for a need of GLIBC_2.99, else the list of versions.
fn defines_summary(needed: &str, defs: &[String]) -> String {
    if let Some(need) = NumberedVersion::parse(needed) {
        let best = defs
            .iter()
            .filter_map(|d| {
                NumberedVersion::parse(d)
                    .filter(|v| v.prefix == need.prefix)
                    .map(|v| (v.numbers, d))
            })
            .max();
        if let Some((_, d)) = best {
            return format!("defines up to {d}");
        }
    }
    match defs.len() {
        0 => "defines no versions".to_owned(),
        n if n <= 6 => format!("defines {}", defs.join(", ")),
        n => format!("defines {}, … ({n} versions)", defs[..6].join(", ")),
    }
}

/// `foo::bar(int) (_ZN3foo3barEi@V2)` for C++, `foo@V2` for C.
fn describe_symbol(s: &Symbol) -> String {
    let raw = match &s.version {
        Some(v) => format!("{}@{v}", s.name),
        None => s.name.clone(),
    };
    if s.name.starts_with("_Z")
        && let Ok(sym) = cpp_demangle::Symbol::new(s.name.as_bytes())
        && let Ok(d) = sym.demangle()
    {
        return format!("{d} ({raw})");
    }
    raw
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::elf::testutil::{BaseAndUser, base_and_user, cc, reasons};
    use crate::preflight::elf::{LoaderConfig, OverlayView, check_object, read_elf};
    use std::fs;

    #[test]
    fn symbol_removed_by_replacement_is_undefined() {
        let t = tempfile::tempdir().unwrap();
        let BaseAndUser { base, user } = base_and_user(t.path());
        let new = cc(
            t.path(),
            "new/libbase.so.1",
            "int other(int x) { return x; }\n",
            false,
            &["-Wl,-soname,libbase.so.1"],
        );
        let mut view = OverlayView::new();
        view.set(base, read_elf(&new).unwrap());
        let problems = check_object(&user, &mut view, &LoaderConfig::system());
        assert_eq!(
            reasons(&problems),
            vec![format!("{}: undefined symbol: base", user.display())]
        );
    }

    #[test]
    fn missing_cpp_symbol_is_demangled() {
        let t = tempfile::tempdir().unwrap();
        let lib = cc(
            t.path(),
            "libfoo.so.1",
            "namespace foo { int bar(int x) { return x; } }\n",
            true,
            &["-Wl,-soname,libfoo.so.1"],
        );
        let user = cc(
            t.path(),
            "libcxxuse.so",
            "namespace foo { int bar(int); }\nint use() { return foo::bar(1); }\n",
            true,
            &["libfoo.so.1", "-Wl,-rpath,$ORIGIN"],
        );
        let changed = cc(
            t.path(),
            "new/libfoo.so.1",
            "namespace foo { int bar(long x) { return x; } }\n",
            true,
            &["-Wl,-soname,libfoo.so.1"],
        );
        let cfg = LoaderConfig::system();
        assert!(check_object(&user, &mut OverlayView::new(), &cfg).is_empty());
        let mut view = OverlayView::new();
        view.set(lib, read_elf(&changed).unwrap());
        let problems = check_object(&user, &mut view, &cfg);
        assert_eq!(problems.len(), 1, "{:#?}", reasons(&problems));
        assert_eq!(
            problems[0].reason,
            "undefined symbol: foo::bar(int) (_ZN3foo3barEi)"
        );
    }

    #[test]
    fn version_need_nothing_provides() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        fs::write(dir.join("v1.map"), "V1 { global: f1; local: *; };\n").unwrap();
        fs::write(
            dir.join("v2.map"),
            "V1 { global: f1; local: *; };\nV2 { global: f2; } V1;\n",
        )
        .unwrap();
        let src = "int f1(void) { return 1; }\nint f2(void) { return 2; }\n";
        let v2 = cc(
            dir,
            "v2/libv.so.1",
            src,
            false,
            &["-Wl,-soname,libv.so.1", "-Wl,--version-script=v2.map"],
        );
        let v1 = cc(
            dir,
            "libv.so.1",
            src,
            false,
            &["-Wl,-soname,libv.so.1", "-Wl,--version-script=v1.map"],
        );
        let user = cc(
            dir,
            "libvuse.so",
            "extern int f1(void); extern int f2(void);\nint use(void) { return f1() + f2(); }\n",
            false,
            &["v2/libv.so.1", "-Wl,-rpath,$ORIGIN"],
        );
        let info = read_elf(&user).unwrap().unwrap();
        assert!(
            info.version_needs
                .contains(&("libv.so.1".to_owned(), "V2".to_owned()))
        );
        assert!(
            info.undefined
                .iter()
                .any(|s| s.name == "f2" && s.version.as_deref() == Some("V2"))
        );
        assert_eq!(
            read_elf(&v1).unwrap().unwrap().version_defs,
            vec!["V1".to_owned()]
        );

        let cfg = LoaderConfig::system();
        let problems = check_object(&user, &mut OverlayView::new(), &cfg);
        assert_eq!(problems.len(), 1, "{:#?}", reasons(&problems));
        assert_eq!(problems[0].file, user);
        assert_eq!(
            problems[0].reason,
            format!(
                "needs V2 from libv.so.1 ({} defines up to V1)",
                v1.display()
            )
        );

        // The V2 build in its place: fine.
        let mut view = OverlayView::new();
        view.set(v1.clone(), read_elf(&v2).unwrap());
        let problems = check_object(&user, &mut view, &cfg);
        assert!(problems.is_empty(), "{:#?}", reasons(&problems));
    }

    #[test]
    fn defines_summary_names_the_best_version() {
        let defs: Vec<String> = ["GLIBC_2.2.5", "GLIBC_2.36", "GLIBC_2.4", "GLIBC_PRIVATE"]
            .map(String::from)
            .into();
        assert_eq!(
            defines_summary("GLIBC_2.99", &defs),
            "defines up to GLIBC_2.36"
        );
        assert_eq!(
            defines_summary("V2", &["V1".to_owned()]),
            "defines up to V1"
        );
        assert_eq!(defines_summary("FOO", &["V1".to_owned()]), "defines V1");
    }
}
