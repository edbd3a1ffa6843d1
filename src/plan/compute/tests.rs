//! Tests of [`compute`](super::compute): the set semantics, from the scans
//! and entries two hosts report to the changes and warnings of each set.

use super::*;
use crate::model::{Action, Dist, Entry, Kind, ScanReport, Set};
use crate::plan::{SetPlan, Totals, Transition, Warning, totals};

fn file(sha: &str, size: u64) -> Kind {
    Kind::File {
        size,
        mode: 0o644,
        blake3: Some(sha.into()),
        stamp: None,
    }
}

fn dist(name: &str, version: &str, files: &[&str]) -> Dist {
    Dist {
        files: files.iter().map(|s| s.to_string()).collect(),
        ..Dist::for_test(name, version)
    }
}

fn scan(dists: Vec<Dist>, globs: Vec<Vec<&str>>) -> ScanReport {
    ScanReport {
        venv: "/v".into(),
        site_packages: "lib/python3.11/site-packages".into(),
        python: "3.11".into(),
        machine: Default::default(),
        dists,
        globs: globs
            .into_iter()
            .map(|g| g.into_iter().map(String::from).collect())
            .collect(),
        facts: Default::default(),
    }
}

fn entries(list: &[(&str, Kind)]) -> Entries {
    list.iter()
        .map(|(p, k)| {
            (
                p.to_string(),
                Entry {
                    path: p.to_string(),
                    kind: k.clone(),
                    pyc: vec![],
                },
            )
        })
        .collect()
}

fn set(name: &str, dists: &[&str], files: &[&str]) -> Set {
    Set {
        name: name.into(),
        dists: dists.iter().map(|s| s.to_string()).collect(),
        files: files.iter().map(|s| s.to_string()).collect(),
    }
}

fn actions(p: &SetPlan) -> Vec<(String, Action)> {
    p.changes
        .iter()
        .map(|c| (c.path.clone(), c.action))
        .collect()
}

fn run(
    sets: &[Set],
    s: (&ScanReport, &Entries),
    d: (&ScanReport, &Entries),
    globs: &[String],
) -> Result<(Vec<SetPlan>, Vec<Warning>)> {
    let done = compute(
        sets,
        &Side {
            host: "src",
            scan: s.0,
            globs,
            entries: s.1,
        },
        &Side {
            host: "dst",
            scan: d.0,
            globs,
            entries: d.1,
        },
    )?;
    Ok((done.sets, done.warnings))
}

#[test]
fn add_replace_delete_unchanged() {
    let s = scan(
        vec![dist(
            "torch",
            "2.11.0",
            &[
                "torch/a.py",
                "torch/b.py",
                "torch/new.so",
                "t-2.11.dist-info/RECORD",
            ],
        )],
        vec![],
    );
    let d = scan(
        vec![dist(
            "torch",
            "2.9.1",
            &[
                "torch/a.py",
                "torch/b.py",
                "torch/old.so",
                "t-2.9.1.dist-info/RECORD",
            ],
        )],
        vec![],
    );
    let se = entries(&[
        ("torch/a.py", file("aa", 1)),
        ("torch/b.py", file("b2", 2)),
        ("torch/new.so", file("n", 30)),
        ("t-2.11.dist-info/RECORD", file("r", 4)),
    ]);
    let de = entries(&[
        ("torch/a.py", file("aa", 1)),
        ("torch/b.py", file("b1", 5)),
        ("torch/old.so", file("o", 7)),
        ("t-2.9.1.dist-info/RECORD", file("r", 4)),
    ]);
    let (plans, warnings) =
        run(&[set("torch", &["torch"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let p = &plans[0];
    assert_eq!(
        actions(p),
        vec![
            ("t-2.11.dist-info/RECORD".into(), Action::Add),
            ("t-2.9.1.dist-info/RECORD".into(), Action::Delete),
            ("torch/b.py".into(), Action::Replace),
            ("torch/new.so".into(), Action::Add),
            ("torch/old.so".into(), Action::Delete),
        ]
    );
    assert_eq!(p.unchanged, 1);
    let sizes: Vec<u64> = p.changes.iter().map(|c| c.size).collect();
    assert_eq!(
        sizes,
        [4, 4, 2, 30, 7],
        "source size for add/replace, target size for delete"
    );
    assert_eq!(
        p.versions,
        vec![Transition {
            name: "torch".into(),
            from: Some("2.9.1".into()),
            to: Some("2.11.0".into())
        }]
    );
    let t = totals(p);
    assert_eq!(
        t[&Action::Add],
        Totals {
            files: 2,
            bytes: 34
        }
    );
}

#[test]
fn mode_type_and_link_target_count_as_replace() {
    let s = scan(vec![dist("x", "1", &["x/a", "x/b", "x/c", "x/d"])], vec![]);
    let d = scan(vec![dist("x", "1", &["x/a", "x/b", "x/c", "x/d"])], vec![]);
    let se = entries(&[
        (
            "x/a",
            Kind::File {
                size: 1,
                mode: 0o755,
                blake3: Some("h".into()),
                stamp: None,
            },
        ),
        ("x/b", Kind::Symlink { target: "a".into() }),
        ("x/c", Kind::Symlink { target: "a".into() }),
        ("x/d", Kind::Symlink { target: "a".into() }),
    ]);
    let de = entries(&[
        ("x/a", file("h", 1)),
        ("x/b", file("h", 1)),
        ("x/c", Kind::Symlink { target: "b".into() }),
        ("x/d", Kind::Symlink { target: "a".into() }),
    ]);
    let (plans, _) = run(&[set("x", &["x"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
    assert_eq!(
        actions(&plans[0]),
        vec![
            ("x/a".into(), Action::Replace),
            ("x/b".into(), Action::Replace),
            ("x/c".into(), Action::Replace)
        ]
    );
    assert_eq!(plans[0].unchanged, 1);
}

#[test]
fn a_file_owned_outside_the_set_is_kept_with_a_warning() {
    // cu12 and cu13 wheels write some of the same paths; a dist outside the set keeps its files.
    let s = scan(
        vec![dist(
            "nvidia-cublas",
            "13.0",
            &["nvidia/cu13/lib/libcublas.so.13"],
        )],
        vec![],
    );
    let d = scan(
        vec![
            dist(
                "nvidia-cublas-cu12",
                "12.8",
                &["nvidia/cublas/lib/libcublas.so.12", "nvidia/__init__.py"],
            ),
            dist("other", "1", &["nvidia/__init__.py"]),
        ],
        vec![],
    );
    let se = entries(&[("nvidia/cu13/lib/libcublas.so.13", file("c13", 10))]);
    let de = entries(&[
        ("nvidia/cublas/lib/libcublas.so.12", file("c12", 9)),
        ("nvidia/__init__.py", file("i", 0)),
    ]);
    let (plans, warnings) =
        run(&[set("nv", &["nvidia-*"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
    assert_eq!(
        actions(&plans[0]),
        vec![
            ("nvidia/cu13/lib/libcublas.so.13".into(), Action::Add),
            ("nvidia/cublas/lib/libcublas.so.12".into(), Action::Delete)
        ]
    );
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].path.as_deref(), Some("nvidia/__init__.py"));
    assert!(warnings[0].message.contains("other 1"), "{warnings:?}");
}

#[test]
fn overwriting_a_file_of_another_distribution_warns() {
    let s = scan(vec![dist("a", "2", &["shared/x.so"])], vec![]);
    let d = scan(vec![dist("b", "1", &["shared/x.so"])], vec![]);
    let se = entries(&[("shared/x.so", file("new", 1))]);
    let de = entries(&[("shared/x.so", file("old", 1))]);
    let (plans, warnings) = run(&[set("a", &["a"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
    assert_eq!(
        actions(&plans[0]),
        vec![("shared/x.so".into(), Action::Replace)]
    );
    assert!(warnings[0].message.contains("b 1") && warnings[0].message.contains("overwritten"));
}

#[test]
fn file_globs_and_bytecode() {
    let globs = vec!["sg/spec/*.py".to_string()];
    let s = scan(
        vec![dist("sg", "0.5", &["sg/spec/a.py", "sg/spec/b.py"])],
        vec![vec!["sg/spec/a.py", "sg/spec/b.py", "sg/spec/new.py"]],
    );
    let d = scan(
        vec![dist("sg", "0.5", &["sg/spec/a.py", "sg/spec/b.py"])],
        vec![vec!["sg/spec/a.py", "sg/spec/b.py", "sg/spec/local.py"]],
    );
    let se = entries(&[
        ("sg/spec/a.py", file("a2", 3)),
        ("sg/spec/b.py", file("b", 3)),
        ("sg/spec/new.py", file("n", 1)),
    ]);
    let mut de = entries(&[
        ("sg/spec/a.py", file("a1", 3)),
        ("sg/spec/b.py", file("b", 3)),
        ("sg/spec/local.py", file("l", 1)),
    ]);
    de.get_mut("sg/spec/a.py").unwrap().pyc = vec!["sg/spec/__pycache__/a.cpython-311.pyc".into()];
    de.get_mut("sg/spec/b.py").unwrap().pyc = vec!["sg/spec/__pycache__/b.cpython-311.pyc".into()];
    let (plans, warnings) = run(
        &[set("patches", &[], &["sg/spec/*.py"])],
        (&s, &se),
        (&d, &de),
        &globs,
    )
    .unwrap();
    // local.py matches the glob only on the target and no distribution owns it: the mirror deletes it.
    assert_eq!(
        actions(&plans[0]),
        vec![
            ("sg/spec/a.py".into(), Action::Replace),
            ("sg/spec/local.py".into(), Action::Delete),
            ("sg/spec/new.py".into(), Action::Add)
        ]
    );
    assert!(
        warnings.is_empty(),
        "patching files of a distribution is the point of a file set: {warnings:?}"
    );
    assert_eq!(
        plans[0].stale_bytecode,
        ["sg/spec/__pycache__/a.cpython-311.pyc"]
    );
}

#[test]
fn target_only_glob_match_is_deleted_unless_a_dist_owns_it() {
    let globs = vec!["p/*.py".to_string()];
    let s = scan(vec![], vec![vec!["p/a.py"]]);
    let d = scan(
        vec![dist("p", "1", &["p/owned.py"])],
        vec![vec!["p/a.py", "p/owned.py", "p/stray.py"]],
    );
    let se = entries(&[("p/a.py", file("a", 1))]);
    let de = entries(&[
        ("p/a.py", file("a", 1)),
        ("p/owned.py", file("o", 1)),
        ("p/stray.py", file("s", 2)),
    ]);
    let (plans, warnings) =
        run(&[set("f", &[], &["p/*.py"])], (&s, &se), (&d, &de), &globs).unwrap();
    assert_eq!(
        actions(&plans[0]),
        vec![("p/stray.py".into(), Action::Delete)]
    );
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].message.contains("p 1"));
}

#[test]
fn a_path_another_set_carries_is_not_deleted() {
    let s = scan(
        vec![dist("b", "2", &["shared.so"]), dist("a", "2", &["a.py"])],
        vec![],
    );
    let d = scan(vec![dist("a", "1", &["a.py", "shared.so"])], vec![]);
    let se = entries(&[("shared.so", file("n", 1)), ("a.py", file("a", 1))]);
    let de = entries(&[("shared.so", file("o", 1)), ("a.py", file("a", 1))]);
    let (plans, _) = run(
        &[set("a", &["a"], &[]), set("b", &["b"], &[])],
        (&s, &se),
        (&d, &de),
        &[],
    )
    .unwrap();
    assert!(plans[0].changes.is_empty(), "{:?}", plans[0].changes);
    assert_eq!(
        actions(&plans[1]),
        vec![("shared.so".into(), Action::Replace)]
    );
}

#[test]
fn a_path_in_two_sets_goes_with_the_first() {
    let s = scan(
        vec![dist("a", "1", &["x.py"]), dist("b", "1", &["x.py"])],
        vec![],
    );
    let d = scan(vec![], vec![]);
    let se = entries(&[("x.py", file("x", 1))]);
    let de = entries(&[]);
    let (plans, warnings) = run(
        &[set("a", &["a"], &[]), set("b", &["b"], &[])],
        (&s, &se),
        (&d, &de),
        &[],
    )
    .unwrap();
    assert_eq!(actions(&plans[0]), vec![("x.py".into(), Action::Add)]);
    assert!(plans[1].changes.is_empty());
    assert!(warnings[0].message.contains("sets a and b"));
}

#[test]
fn empty_set_and_damaged_dist_are_errors() {
    let s = scan(vec![dist("torch", "1", &["t.py"])], vec![]);
    let d = scan(vec![], vec![]);
    let se = entries(&[("t.py", file("t", 1))]);
    let de = entries(&[]);
    let e = run(
        &[set("tv", &["torchvision"], &[])],
        (&s, &se),
        (&d, &de),
        &[],
    )
    .unwrap_err();
    assert!(
        e.message
            .contains("Set tv matches nothing on the source host src"),
        "{}",
        e.message
    );
    let mut bad = dist("torch", "1", &["t.py"]);
    bad.problem = Some("RECORD line 3: path \"../../../../etc/passwd\" escapes the venv".into());
    let d = scan(vec![bad], vec![]);
    let e = run(&[set("t", &["torch"], &[])], (&s, &se), (&d, &de), &[]).unwrap_err();
    assert!(
        e.message.contains("on dst is damaged") && e.message.contains("escapes"),
        "{}",
        e.message
    );
}

#[test]
fn missing_source_file_is_left_out_with_a_warning() {
    let s = scan(vec![dist("x", "1", &["x/a.py", "x/gone.py"])], vec![]);
    let d = scan(vec![], vec![]);
    let se = entries(&[("x/a.py", file("a", 1)), ("x/gone.py", Kind::Missing)]);
    let de = entries(&[]);
    let (plans, warnings) = run(&[set("x", &["x"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
    assert_eq!(actions(&plans[0]), vec![("x/a.py".into(), Action::Add)]);
    assert!(warnings[0].message.contains("missing there"));
}

#[test]
fn state_folder_paths_directories_and_symlinked_parents_are_left_out() {
    let fake = "../../../.overlay/generations/20000101T000000Z-0000/journal";
    let s = scan(
        vec![dist(
            "x",
            "2",
            &[fake, "x/a.py", "srcdir", "evil/secret", "evil", "x//b.py"],
        )],
        vec![],
    );
    let d = scan(
        vec![
            dist(
                "x",
                "1",
                &["../../../.overlay/mine", "shared/", "tdata/y", "x/a.py"],
            ),
            dist("other", "1", &["shared/other_module.py"]),
        ],
        vec![],
    );
    let se = entries(&[
        (fake, file("j", 1)),
        ("x/a.py", file("a", 1)),
        ("srcdir", Kind::Dir { mode: 0o755 }),
        (
            "evil/secret",
            Kind::ThroughSymlink {
                link: "evil".into(),
            },
        ),
        (
            "evil",
            Kind::Symlink {
                target: "/etc".into(),
            },
        ),
        ("x//b.py", file("b", 1)),
    ]);
    let de = entries(&[
        ("../../../.overlay/mine", file("m", 1)),
        ("shared/", Kind::Dir { mode: 0o755 }),
        (
            "tdata/y",
            Kind::ThroughSymlink {
                link: "tdata".into(),
            },
        ),
        ("x/a.py", Kind::Dir { mode: 0o755 }),
    ]);
    let (plans, warnings) = run(&[set("x", &["x"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
    assert_eq!(actions(&plans[0]), vec![("evil".into(), Action::Add)]);
    let said = |path: &str, part: &str| {
        assert!(
            warnings
                .iter()
                .any(|w| w.path.as_deref() == Some(path) && w.message.contains(part)),
            "{path}: {part}: {warnings:#?}"
        )
    };
    said(fake, "points into overlay's state folder; it is left out");
    said(
        "../../../.overlay/mine",
        "points into overlay's state folder; it is kept",
    );
    said("srcdir", "is a directory on src");
    said("shared/", "never deletes a directory");
    said("x/a.py", "never replaces a directory");
    said(
        "evil/secret",
        "evil/secret: its parent evil is a symlink on src; overlay never reads through one",
    );
    said("tdata/y", "its parent tdata is a symlink on dst");
    said("x//b.py", "not spelled as a plain path");
}

#[test]
fn setuid_setgid_and_sticky_bits_are_dropped_with_one_warning() {
    let paths: Vec<String> = (0..7).map(|i| format!("x/f{i}")).collect();
    let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
    let s = scan(vec![dist("x", "1", &refs)], vec![]);
    let d = scan(vec![], vec![]);
    let special = |m: u32| Kind::File {
        size: 1,
        mode: m,
        blake3: Some("h".into()),
        stamp: None,
    };
    let list: Vec<(&str, Kind)> = refs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (
                *p,
                special(if i == 0 {
                    0o755
                } else {
                    0o4755 | (i as u32 * 0o1000 % 0o10000)
                }),
            )
        })
        .collect();
    let se = entries(&list);
    let mut de = entries(&[]);
    // Unchanged once the bits are dropped: not carried, not warned about.
    de.insert(
        "x/f6".into(),
        Entry {
            path: "x/f6".into(),
            kind: special(0o755),
            pyc: vec![],
        },
    );
    let (plans, warnings) = run(&[set("x", &["x"], &[])], (&s, &se), (&d, &de), &[]).unwrap();
    assert_eq!(plans[0].changes.len(), 6);
    assert_eq!(plans[0].unchanged, 1);
    for c in &plans[0].changes {
        let Some(Kind::File { mode, .. }) = &c.source else {
            panic!("{c:?}")
        };
        assert_eq!(*mode, 0o755, "{}", c.path);
    }
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    let m = &warnings[0].message;
    assert!(
        m.contains("of 5 files on src") && m.contains("x/f1, x/f2") && !m.contains("x/f0"),
        "{m}"
    );
}

/// A script the plan places, listed by a RECORD both sides have alike:
/// where the venvs' paths differ (the shebang is rewritten), the RECORD is
/// replaced too, in the set that holds it, so that the target can rewrite
/// the script's row; where they are the same, it stays unchanged.
#[test]
fn an_unchanged_record_of_a_placed_script_is_replaced_where_shebangs_are_rewritten() {
    let files = [
        "tool/__init__.py",
        "../../../bin/tool",
        "../../../bin/tool2",
        "tool-1.dist-info/RECORD",
    ];
    let other = ["other/x.py", "other-1.dist-info/RECORD"];
    let src_scan = |venv: &str| ScanReport {
        venv: venv.into(),
        ..scan(
            vec![dist("tool", "1", &files), dist("other", "1", &other)],
            vec![],
        )
    };
    let d = scan(
        vec![dist("tool", "1", &files), dist("other", "1", &other)],
        vec![],
    );
    let se = entries(&[
        ("tool/__init__.py", file("i", 1)),
        ("../../../bin/tool", file("t-rewritten", 50)),
        ("../../../bin/tool2", file("t2", 51)),
        ("tool-1.dist-info/RECORD", file("r", 40)),
        ("other/x.py", file("x", 2)),
        ("other-1.dist-info/RECORD", file("o", 30)),
    ]);
    // The target lacks bin/tool; bin/tool2 and both RECORDs are alike.
    let de = entries(&[
        ("tool/__init__.py", file("i", 1)),
        ("../../../bin/tool2", file("t2", 51)),
        ("tool-1.dist-info/RECORD", file("r", 40)),
        ("other/x.py", file("x", 2)),
        ("other-1.dist-info/RECORD", file("o", 30)),
    ]);
    let sets = [set("tool", &["tool", "other"], &[])];
    let s = src_scan("/src/venv");
    let (plans, warnings) = run(&sets, (&s, &se), (&d, &de), &[]).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        actions(&plans[0]),
        vec![
            ("../../../bin/tool".into(), Action::Add),
            ("tool-1.dist-info/RECORD".into(), Action::Replace),
        ]
    );
    let record = &plans[0].changes[1];
    assert_eq!(record.size, 40);
    assert_eq!(record.source, Some(file("r", 40)));
    assert_eq!(record.target, Some(file("r", 40)));
    // tool/__init__.py, bin/tool2, other/x.py and other's RECORD.
    assert_eq!(plans[0].unchanged, 4);
    assert_eq!(plans[0].unchanged_bytes, 1 + 51 + 2 + 30);

    // The same venv path: the script is placed as the source has it, and
    // the RECORD's row describes it already.
    let s = src_scan("/v");
    let (plans, _) = run(&sets, (&s, &se), (&d, &de), &[]).unwrap();
    assert_eq!(
        actions(&plans[0]),
        vec![("../../../bin/tool".into(), Action::Add)]
    );
    assert_eq!(plans[0].unchanged, 5);

    // The RECORD in another set than the script: that set replaces it.
    let sets = [
        set("scripts", &[], &["../../../bin/*"]),
        set("tool", &["tool"], &[]),
    ];
    let s = ScanReport {
        globs: vec![vec![
            "../../../bin/tool".into(),
            "../../../bin/tool2".into(),
        ]],
        ..src_scan("/src/venv")
    };
    let d = ScanReport {
        globs: vec![vec!["../../../bin/tool2".into()]],
        ..d
    };
    let globs = ["../../../bin/*".to_string()];
    let (plans, _) = run(&sets, (&s, &se), (&d, &de), &globs).unwrap();
    assert_eq!(
        actions(&plans[0]),
        vec![("../../../bin/tool".into(), Action::Add)]
    );
    assert_eq!(
        actions(&plans[1]),
        vec![("tool-1.dist-info/RECORD".into(), Action::Replace)]
    );
}
