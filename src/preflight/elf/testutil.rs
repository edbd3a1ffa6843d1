//! Test fixtures shared by the ELF tests: real shared objects built by gcc
//! in a temporary directory, and problem lists rendered as strings.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::ElfProblem;

/// Build a shared object `out` in `dir` from C (or C++ if `cpp`) source.
pub fn cc(dir: &Path, out: &str, src: &str, cpp: bool, args: &[&str]) -> PathBuf {
    let ext = if cpp { "cc" } else { "c" };
    let src_path = dir.join(format!("{}.{ext}", out.replace('/', "_")));
    fs::write(&src_path, src).unwrap();
    let out_path = dir.join(out);
    fs::create_dir_all(out_path.parent().unwrap()).unwrap();
    let status = Command::new("gcc")
        .current_dir(dir)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out_path)
        .arg(&src_path)
        .args(args)
        .status()
        .expect("gcc");
    assert!(status.success(), "gcc failed for {out}");
    out_path
}

pub fn reasons(p: &[ElfProblem]) -> Vec<String> {
    p.iter()
        .map(|p| format!("{}: {}", p.file.display(), p.reason))
        .collect()
}

/// The two objects of [`base_and_user`].
pub struct BaseAndUser {
    /// deps/libbase.so.1, defining `base` and `other`.
    pub base: PathBuf,
    /// libuse.so (RPATH $ORIGIN/deps), using `base` and printf.
    pub user: PathBuf,
}

/// deps/libbase.so.1 and libuse.so (RPATH $ORIGIN/deps, uses printf).
pub fn base_and_user(dir: &Path) -> BaseAndUser {
    let base = cc(
        dir,
        "deps/libbase.so.1",
        "int base(int x) { return x + 1; }\nint other(int x) { return x; }\n",
        false,
        &["-Wl,-soname,libbase.so.1"],
    );
    let user = cc(
        dir,
        "libuse.so",
        "#include <stdio.h>\nextern int base(int);\nint use(int x) { printf(\"%d\", x); return base(x) * 2; }\n",
        false,
        &[
            "deps/libbase.so.1",
            "-Wl,--disable-new-dtags",
            "-Wl,-rpath,$ORIGIN/deps",
        ],
    );
    BaseAndUser { base, user }
}
