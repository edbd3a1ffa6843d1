//! End-to-end tests of a hostile source over real sshd test hosts (as
//! root): whatever the source venv holds, the target agent writes nothing
//! outside the target venv, and the target venv stays whole or rolls back.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use common::{Testbed, assert_same, ok, snapshot};

/// Append rows to the RECORD of the dist-info `dist` in `site`.
fn add_record_rows(site: &Path, dist: &str, rows: &[&str]) {
    let record = fs::read_dir(site)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with(&format!("{dist}-")) && n.ends_with(".dist-info")
        })
        .unwrap()
        .join("RECORD");
    let mut text = fs::read_to_string(&record).unwrap();
    for r in rows {
        text.push_str(r);
        text.push('\n');
    }
    fs::write(record, text).unwrap();
}

/// Issue 12, case 1: the target has `minitorch/sub/` as a directory; the
/// source has `minitorch/sub` as a symlink climbing out of the venv to a
/// `payload` directory (`/root/payload`, the host's home), and its RECORD lists `minitorch/sub/x` below it. The
/// target's `/root/payload/x` (outside the venv) must never be touched: the
/// agent refuses the change list at prepare, naming both paths, the venv is
/// unchanged, and `history` and `rollback` work afterwards.
#[test]
#[cfg_attr(
    not(overlay_test_root),
    ignore = "needs root: mount namespaces and sshd"
)]
fn a_directory_the_source_has_as_a_symlink_never_leads_a_write_outside_the_venv() {
    let tb = Testbed::new(2);
    tb.write_manifest("[sets.torch]\ndists = [\"minitorch\"]\n");
    // Source: minitorch/sub -> ../../../../../payload (= /root/payload), listed with sub/x.
    let src_site = tb.site_packages(0);
    let src_payload = tb.host_dir(0).join("root/payload");
    fs::create_dir_all(&src_payload).unwrap();
    fs::write(src_payload.join("x"), "planted by the source\n").unwrap();
    fs::write(src_payload.join("mod.py"), "planted by the source\n").unwrap();
    symlink("../../../../../payload", src_site.join("minitorch/sub")).unwrap();
    add_record_rows(
        &src_site,
        "minitorch",
        &[
            "minitorch/sub,,",
            "minitorch/sub/x,,",
            "minitorch/sub/mod.py,,",
        ],
    );
    // Target: minitorch/sub/ is a real directory; /root/payload/x sits outside the venv.
    let dst_site = tb.site_packages(1);
    fs::create_dir_all(dst_site.join("minitorch/sub/__pycache__")).unwrap();
    fs::write(dst_site.join("minitorch/sub/mod.py"), "the target's own\n").unwrap();
    fs::write(
        dst_site.join("minitorch/sub/__pycache__/mod.cpython-311.pyc"),
        "pyc",
    )
    .unwrap();
    add_record_rows(&dst_site, "minitorch", &["minitorch/sub/mod.py,,"]);
    let dst_payload = tb.host_dir(1).join("root/payload");
    fs::create_dir_all(&dst_payload).unwrap();
    fs::write(dst_payload.join("x"), "the target's, outside the venv\n").unwrap();
    fs::write(
        dst_payload.join("mod.py"),
        "the target's, outside the venv\n",
    )
    .unwrap();

    let before = snapshot(tb.host_venv_dir(1));
    let outside = snapshot(&dst_payload);
    ok(
        tb.overlay(&["plan", "src", "dst"]).output().unwrap(),
        "plan",
    );
    let out = tb.overlay(&["apply", "--backup"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("apply: {err}");
    assert_same(
        &outside,
        &snapshot(&dst_payload),
        "outside the venv, after apply",
    );
    if out.status.success() {
        // A plan that leaves such rows out may apply the rest: it rolls back exactly.
        assert!(
            fs::symlink_metadata(dst_site.join("minitorch/sub"))
                .unwrap()
                .is_dir(),
            "{err}"
        );
        ok(
            tb.overlay(&["rollback", "dst"]).output().unwrap(),
            "rollback",
        );
    } else {
        assert!(
            err.contains("minitorch/sub/")
                && err.contains("minitorch/sub,")
                && err.contains("symlink"),
            "{err}"
        );
    }
    assert_same(&before, &snapshot(tb.host_venv_dir(1)), "the target venv");
    assert_same(&outside, &snapshot(&dst_payload), "outside the venv");
    ok(tb.overlay(&["history", "dst"]).output().unwrap(), "history");
}
