use super::*;

#[test]
fn maps_lines_with_spaces_and_deleted_files() {
    let l = parse_maps_line(
        b"7f12a000-7f12b000 r-xp 00001000 fd:01 1234567    /opt/my venv/lib/libx.so",
    )
    .unwrap();
    assert_eq!(l.dev, rustix::fs::makedev(0xfd, 1));
    assert_eq!(l.inode, 1234567);
    assert_eq!(l.path, Some(&b"/opt/my venv/lib/libx.so"[..]));
    assert!(!l.deleted);

    let l =
        parse_maps_line(b"7f12a000-7f12b000 r--p 00000000 103:02 99 /v/a (deleted) b.so (deleted)")
            .unwrap();
    assert_eq!(l.dev, rustix::fs::makedev(0x103, 2));
    assert_eq!(l.path, Some(&b"/v/a (deleted) b.so"[..]));
    assert!(l.deleted);

    let anon = parse_maps_line(b"7ffd1000-7ffd2000 rw-p 00000000 00:00 0 ").unwrap();
    assert_eq!((anon.inode, anon.path), (0, None));
    let stack = parse_maps_line(
        b"7ffd1000-7ffd2000 rw-p 00000000 00:00 0                          [stack]",
    )
    .unwrap();
    assert_eq!(stack.path, Some(&b"[stack]"[..]));
    assert_eq!(parse_maps_line(b""), None);
    assert_eq!(parse_maps_line(b"garbage line"), None);
    assert_eq!(parse_maps_line(b"a-b r-xp 0 zz:01 12 /x"), None);
}

#[test]
fn stat_with_parentheses_and_spaces_in_comm() {
    let line = b"4242 (py (x) thon) S 17 4242 4242 0 -1 4194560 100 0 0 0 5 6 0 0 20 0 3 0 98765 1000 50 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n";
    let s = parse_stat(line).unwrap();
    assert_eq!(s.comm, "py (x) thon");
    assert_eq!(s.state, b'S');
    assert_eq!(s.ppid, 17);
    assert_eq!(s.flags, 4194560);
    assert_eq!(s.starttime, 98765);
    let kthread = b"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 3 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 17 1 0 0 0 0 0";
    assert_ne!(parse_stat(kthread).unwrap().flags & PF_KTHREAD, 0);
    assert_eq!(parse_stat(b"12 (cut"), None);
    assert_eq!(parse_stat(b"12 (x) S 1"), None);
}

#[test]
fn cmdline_nuls() {
    assert_eq!(
        parse_cmdline(b"/v/bin/python\0-m\0sglang.launch_server\0--port\0\0"),
        ["/v/bin/python", "-m", "sglang.launch_server", "--port", ""]
            .iter()
            .take(4)
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    );
    assert_eq!(parse_cmdline(b"a\0\0b\0"), ["a", "", "b"]);
    // A rewritten title: one string with spaces, padded with NULs.
    assert_eq!(
        parse_cmdline(b"sglang::scheduler TP0\0\0\0\0"),
        ["sglang::scheduler TP0"]
    );
    assert!(parse_cmdline(b"").is_empty());
    assert!(parse_cmdline(b"\0").is_empty());
}

#[test]
fn status_passwd_and_nvidia_smi() {
    let status = b"Name:\tpython\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t1000\t1001\t1001\t1001\nGid:\t1000\t1000\t1000\t1000\n";
    assert_eq!(parse_uid(status), Some(1001));
    assert_eq!(parse_uid(b"Name: x\n"), None);
    let users = parse_passwd(b"root:x:0:0:root:/root:/bin/bash\nbob:x:1000:1000::/home/bob:/bin/sh\ntoor:x:0:0::/:/bin/sh\nbad line\n");
    assert_eq!(users[&0], "root");
    assert_eq!(users[&1000], "bob");
    let gpu = parse_compute_apps(
        b"1234, 8123\n1234, 100\n77, 5\nNo running processes found\n[N/A], [N/A]\n",
    );
    assert_eq!(gpu[&1234], 8223);
    assert_eq!(gpu[&77], 5);
    assert_eq!(gpu.len(), 2);
}

/// A child process killed when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Wait until `/proc/PID/exe` is no longer this test's (the child has
/// exec'ed).
fn wait_exec(pid: u32) {
    let own = std::fs::read_link("/proc/self/exe").unwrap();
    for _ in 0..200 {
        if std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e != own) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn sleep_bin() -> std::path::PathBuf {
    ["/bin/sleep", "/usr/bin/sleep"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists())
        .expect("sleep")
}

#[test]
fn finds_a_process_by_its_interpreter_exe_maps_and_fd() {
    let venv = tempfile::tempdir().unwrap();
    let bin = venv.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    // bin/python is a symlink to the system's executable, as venv makes it.
    std::os::unix::fs::symlink(sleep_bin(), bin.join("python")).unwrap();
    std::fs::copy(sleep_bin(), bin.join("copied")).unwrap();
    std::fs::write(venv.path().join("data.txt"), "x").unwrap();

    let linked = Child(
        std::process::Command::new(bin.join("python"))
            .arg("30")
            .spawn()
            .unwrap(),
    );
    let copied = Child(
        std::process::Command::new(bin.join("copied"))
            .arg("30")
            .spawn()
            .unwrap(),
    );
    let holder = Child(
        std::process::Command::new(sleep_bin())
            .arg("30")
            .stdin(std::fs::File::open(venv.path().join("data.txt")).unwrap())
            .spawn()
            .unwrap(),
    );
    let other = Child(
        std::process::Command::new(sleep_bin())
            .arg("30")
            .spawn()
            .unwrap(),
    );
    for c in [&linked, &copied, &holder, &other] {
        wait_exec(c.0.id());
    }
    let found = find(venv.path()).unwrap();
    let how = |pid: u32| {
        found
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| p.how.clone())
    };
    assert_eq!(how(linked.0.id()), Some(vec![How::Interpreter]));
    assert_eq!(
        how(copied.0.id()),
        Some(vec![How::Exe, How::Interpreter, How::Maps])
    );
    assert_eq!(how(holder.0.id()), Some(vec![How::Fd]));
    assert_eq!(how(other.0.id()), None);
    assert_eq!(how(std::process::id()), None, "the agent itself is skipped");
    let p = found
        .processes
        .iter()
        .find(|p| p.pid == linked.0.id())
        .unwrap();
    assert_eq!(p.command, format!("{} 30", bin.join("python").display()));
    assert_eq!(p.uid, rustix::process::geteuid().as_raw());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        p.started + 120 > now && p.started <= now + 2,
        "{} vs {now}",
        p.started
    );
    assert_eq!(still_running(&found.processes).len(), 3);
    drop(linked);
    let left = still_running(&found.processes);
    assert_eq!(left.len(), 2);
}

#[test]
fn the_state_folder_counts_only_for_its_generations() {
    let venv = tempfile::tempdir().unwrap();
    let state = venv.path().join(STATE_DIR);
    std::fs::create_dir_all(state.join("generations/g1/backup")).unwrap();
    std::fs::write(state.join("lock"), "").unwrap();
    std::fs::write(state.join("generations/g1/backup/old.so"), "x").unwrap();
    std::fs::write(venv.path().join("a.py"), "").unwrap();
    let files = VenvFiles::walk(venv.path()).unwrap();
    assert_eq!(files.len(), 2);
    let lock = quick_stat(rustix::fs::CWD, state.join("lock"), true).unwrap();
    assert!(!files.has(&lock));
    // The quick stat (no sync with a FUSE or NFS server) sees what stat does.
    let st = rustix::fs::stat(state.join("lock")).unwrap();
    assert_eq!((lock.dev, lock.ino), (st.st_dev, st.st_ino));
}

/// What the scan costs on this host: printed, for docs/design.md
/// (`cargo test --lib running::tests::cost -- --ignored --nocapture`).
#[test]
#[ignore]
fn cost() {
    let venv = std::env::var("OVERLAY_COST_VENV").unwrap_or_else(|_| "/usr/lib/python3".into());
    let t = std::time::Instant::now();
    let files = VenvFiles::walk(Path::new(&venv)).unwrap();
    let walk = t.elapsed();
    let cpu = || {
        // SAFETY: getrusage fills the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
        Duration::from_micros(
            (u.ru_utime.tv_sec + u.ru_stime.tv_sec) as u64 * 1_000_000
                + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) as u64,
        )
    };
    let (t, c) = (std::time::Instant::now(), cpu());
    let found = find_in(&files);
    let (scan, scan_cpu) = (t.elapsed(), cpu() - c);
    let n = std::fs::read_dir("/proc")
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        })
        .count();
    println!(
        "walk of {venv}: {} files in {walk:?}; /proc scan of {n} processes in {scan:?}, CPU {scan_cpu:?} ({:?} a process); {} found, {} unknown",
        files.len(),
        scan_cpu / n.max(1) as u32,
        found.processes.len(),
        found.unknown.len()
    );
}

fn proc_for_test(pid: u32, user: &str, command: &str) -> VenvProcess {
    VenvProcess {
        pid,
        uid: 0,
        user: user.into(),
        command: command.into(),
        started: 0,
        gpu_mib: None,
        how: vec![How::Maps],
    }
}

#[test]
fn the_refusal_names_pids_and_commands_escaped_and_cut() {
    let long = format!("python -m sglang.launch_server {}", "x".repeat(100));
    let e = refusal(
        "/root/venv",
        "the apply",
        &[
            proc_for_test(7, "root", "python\x1b[31m -c pass"),
            proc_for_test(8, "bob", &long),
        ],
    );
    assert_eq!(e.kind, crate::error::ErrorKind::Refused);
    assert!(
        e.message.starts_with(
            "2 processes run from /root/venv, so the apply was refused and nothing was changed: pid 7 (root) python\\033[31m -c pass, pid 8 (bob) python -m sglang"
        ),
        "{}",
        e.message
    );
    assert!(e.message.ends_with("xxx..."), "{}", e.message);
    assert!(e.hint.unwrap().contains("--allow-running"));
}

#[test]
fn the_plans_warnings_count_and_name() {
    let r = Running {
        processes: vec![proc_for_test(7, "root", "python -c pass")],
        unknown: vec![
            proc_for_test(1, "root", "init"),
            proc_for_test(2, "bob", "x"),
            proc_for_test(3, "root", "y"),
        ],
    };
    let w = r.warnings("ct200");
    assert_eq!(w.len(), 2);
    assert_eq!(
        w[0],
        "1 process runs from ct200's venv: pid 7 (root) python -c pass; `overlay apply` and `overlay rollback` refuse while it runs (stop it, or pass --allow-running)"
    );
    assert!(
        w[1].starts_with("3 processes on ct200 could not be inspected (users bob, root; the agent is not root): whether they run from its venv is unknown"),
        "{}",
        w[1]
    );
    assert!(Running::default().warnings("h").is_empty());
}
