//! The calls the model replays, one method per family (see `model.rs`).

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use super::{At, Builder, Fd, FromBytes, Kind, Op};
use crate::trace::{Call, fd_arg, field, iov_bytes, parse_int, ptr_int, str_arg};

const O_ACCMODE: i64 = 3;
const O_CREAT: i64 = 0o100;
const O_TRUNC: i64 = 0o1000;
const O_APPEND: i64 = 0o2000;
const O_TMPFILE: i64 = 0o20000000;
const CLONE_THREAD: i64 = 0x10000;
const FICLONE: i64 = 0x4004_9409;
const AT_REMOVEDIR: i64 = 0x200;
const AT_EMPTY_PATH: i64 = 0x1000;
const RENAME_EXCHANGE: i64 = 2;
const RENAME_WHITEOUT: i64 = 4;

/// A short text for an op's message: the call and the venv-relative paths.
pub fn describe(c: &Call, venv: &std::path::Path) -> String {
    let v = venv.as_os_str().as_encoded_bytes();
    let paths: Vec<String> = c
        .args
        .iter()
        .filter_map(|a| fd_arg(a).1.or_else(|| str_arg(a)).filter(|p| p.len() < 300))
        .map(|p| {
            let p = p
                .strip_prefix(v)
                .map(|r| r.strip_prefix(b"/").unwrap_or(r))
                .unwrap_or(&p);
            String::from_utf8_lossy(p).into_owned()
        })
        .collect();
    format!("{} {} (log line {})", c.name, paths.join(" "), c.line)
}

/// The task a clone, fork or vfork made, and whether it is a thread of
/// the caller's process.
pub fn thread_of(c: &Call) -> Option<(u32, bool)> {
    let flags = match c.name.as_str() {
        "clone" => c
            .args
            .iter()
            .find_map(|a| a.strip_prefix("flags=").and_then(parse_int)),
        "clone3" => field(&c.args[0], "flags"),
        "fork" | "vfork" => Some(0),
        _ => return None,
    }
    .unwrap_or(0);
    Some((c.ret_value()? as u32, flags & CLONE_THREAD != 0))
}

impl Builder {
    fn what(&self, c: &Call) -> String {
        describe(c, &self.venv)
    }

    pub(super) fn open(&mut self, c: &Call) {
        let (path, flags, mode) = match c.name.as_str() {
            "open" => (str_arg(&c.args[0]), parse_int(&c.args[1]), c.args.get(2)),
            "creat" => (
                str_arg(&c.args[0]),
                Some(O_CREAT | O_TRUNC | 1),
                c.args.get(1),
            ),
            "openat" => (
                str_arg(&c.args[1]).map(|n| self.join(&c.args[0], &n)),
                parse_int(&c.args[2]),
                c.args.get(3),
            ),
            _ => (
                str_arg(&c.args[1]).map(|n| self.join(&c.args[0], &n)),
                field(&c.args[2], "flags"),
                None,
            ),
        };
        let flags = flags.unwrap_or(0);
        let mode = mode
            .and_then(|m| parse_int(m))
            .or_else(|| {
                c.args
                    .get(2)
                    .filter(|_| c.name == "openat2")
                    .and_then(|a| field(a, "mode"))
            })
            .unwrap_or(0o644) as u32;
        let path = c.ret_path().or(path).expect("open's path");
        let writes = flags & O_ACCMODE != 0 || flags & (O_CREAT | O_TRUNC) != 0;
        let fd = parse_int(c.ret.split('<').next().unwrap()).unwrap();
        let key = (self.tgid(c.tid), fd);
        let comps = match self.at(&path) {
            At::Outside(p) => {
                if writes {
                    self.outside(&p, c);
                }
                let st = Fd {
                    node: None,
                    outside: Some(p),
                    pos: 0,
                    append: false,
                };
                self.fds.insert(key, st);
                return;
            }
            At::Venv(comps) => comps,
        };
        assert!(
            flags & O_TMPFILE != O_TMPFILE,
            "log line {}: O_TMPFILE in the venv",
            c.line
        );
        let node = match self.lookup(&comps) {
            Some(n) => {
                if flags & O_TRUNC != 0
                    && flags & O_ACCMODE != 0
                    && self.m.nodes[n].kind == Kind::File
                {
                    let w = self.what(c);
                    self.set_len(n, 0, w);
                }
                n
            }
            None => {
                assert!(
                    flags & O_CREAT != 0,
                    "log line {}: opened a path the model lacks",
                    c.line
                );
                let (parent, name) = self.parent(&comps, c);
                let n = self.add(Kind::File, None, mode & !self.umask & 0o7777);
                self.cur.get_mut(&parent).unwrap().insert(name.clone(), n);
                let w = self.what(c);
                self.push(Op::Entry(vec![(parent, name, Some(n))]), w);
                n
            }
        };
        let append = flags & O_APPEND != 0;
        self.fds.insert(
            key,
            Fd {
                node: Some(node),
                outside: None,
                pos: 0,
                append,
            },
        );
    }

    pub(super) fn fork(&mut self, c: &Call) {
        let Some((child, false)) = thread_of(c) else {
            return;
        };
        let parent = self.tgid(c.tid);
        let copies: Vec<_> = self
            .fds
            .iter()
            .filter(|((t, _), _)| *t == parent)
            .map(|((_, fd), f)| {
                (
                    *fd,
                    Fd {
                        node: f.node,
                        outside: f.outside.clone(),
                        pos: f.pos,
                        append: f.append,
                    },
                )
            })
            .collect();
        for (fd, f) in copies {
            self.fds.insert((child, fd), f);
        }
    }

    pub(super) fn dup(&mut self, c: &Call) {
        if c.name == "fcntl" {
            // Only F_DUPFD (0) and F_DUPFD_CLOEXEC (1030) make an fd.
            let cmd = parse_int(&c.args[1]).unwrap_or(-1);
            if cmd != 0 && cmd != 1030 {
                return;
            }
        }
        let t = self.tgid(c.tid);
        let new = parse_int(c.ret.split('<').next().unwrap()).unwrap();
        let old = fd_arg(&c.args[0]).0;
        if let Some(f) = self.fds.get(&(t, old)) {
            let copy = Fd {
                node: f.node,
                outside: f.outside.clone(),
                pos: f.pos,
                append: f.append,
            };
            self.fds.insert((t, new), copy);
        } else {
            self.fds.remove(&(t, new));
        }
    }

    pub(super) fn seek(&mut self, c: &Call) {
        let t = self.tgid(c.tid);
        let n = c.ret_value().unwrap() as u64;
        if let Some(f) = self.fds.get_mut(&(t, fd_arg(&c.args[0]).0)) {
            if c.name == "lseek" {
                f.pos = n;
            } else {
                f.pos += n;
            }
        }
    }

    pub(super) fn data_write(&mut self, c: &Call) {
        let n = c.ret_value().unwrap() as usize;
        let Some(node) = self.fd_node(c, 0) else {
            return;
        };
        let mut data = match c.name.as_str() {
            "write" | "pwrite64" => str_arg(&c.args[1]).unwrap_or_default(),
            _ => iov_bytes(&c.args[1]),
        };
        assert!(
            data.len() >= n,
            "log line {}: the payload is cut short (strace -s)",
            c.line
        );
        data.truncate(n);
        let t = self.tgid(c.tid);
        let size = self.content(node).len() as u64;
        let f = self.fds.get_mut(&(t, fd_arg(&c.args[0]).0)).unwrap();
        let off = match c.name.as_str() {
            "pwrite64" | "pwritev" | "pwritev2" => parse_int(&c.args[3]).unwrap() as u64,
            _ if f.append => size,
            _ => f.pos,
        };
        if !c.name.starts_with('p') {
            f.pos = off + n as u64;
        }
        let w = self.what(c);
        self.write(node, off, data, w);
    }

    pub(super) fn copy(&mut self, c: &Call) {
        let n = c.ret_value().unwrap() as usize;
        let (fin, offin, fout, offout) = match c.name.as_str() {
            "copy_file_range" => (0, ptr_int(&c.args[1]), 2, ptr_int(&c.args[3])),
            _ => (1, ptr_int(&c.args[2]), 0, None),
        };
        let Some(node) = self.fd_node(c, fout) else {
            return;
        };
        let t = self.tgid(c.tid);
        let mut pos = |arg: usize, given: Option<i64>| -> u64 {
            match given {
                Some(o) => o as u64,
                None => {
                    let f = self
                        .fds
                        .get_mut(&(t, fd_arg(&c.args[arg]).0))
                        .expect("a known fd");
                    f.pos += n as u64;
                    f.pos - n as u64
                }
            }
        };
        let (src_off, dst_off) = (pos(fin, offin), pos(fout, offout));
        let data = self.read_from(c, fin, src_off, n);
        let w = self.what(c);
        self.write(node, dst_off, data, w);
    }

    pub(super) fn resize(&mut self, c: &Call) {
        let w = self.what(c);
        if c.name == "truncate" {
            if let Some(At::Venv(comps)) = str_arg(&c.args[0]).map(|p| self.at(&p)) {
                let n = self.lookup(&comps).expect("truncate of a known path");
                self.set_len(n, parse_int(&c.args[1]).unwrap() as u64, w);
            }
            return;
        }
        let Some(node) = self.fd_node(c, 0) else {
            return;
        };
        match c.name.as_str() {
            "ftruncate" => self.set_len(node, parse_int(&c.args[1]).unwrap() as u64, w),
            "ioctl" if parse_int(&c.args[1]) == Some(FICLONE) => {
                let size = self.read_from(c, 2, 0, usize::MAX >> 1);
                self.set_len(node, 0, w.clone());
                self.write(node, 0, size, w);
            }
            "fallocate" => {
                let (mode, off, len) = (
                    parse_int(&c.args[1]).unwrap(),
                    parse_int(&c.args[2]).unwrap() as u64,
                    parse_int(&c.args[3]).unwrap() as u64,
                );
                match mode {
                    0 if off + len > self.content(node).len() as u64 => {
                        self.set_len(node, off + len, w)
                    }
                    0 | 1 => {}
                    _ => panic!("log line {}: fallocate mode {mode:#x} in the venv", c.line),
                }
            }
            _ => panic!(
                "log line {}: {} {} in the venv cannot be replayed",
                c.line, c.name, c.args[1]
            ),
        }
    }

    /// Two paths of a rename or link: (dirfd, name) pairs or plain paths.
    fn two_paths(&self, c: &Call) -> (Vec<u8>, Vec<u8>, i64) {
        let s = |i: usize| str_arg(&c.args[i]).expect("a path");
        match c.name.as_str() {
            "rename" | "link" => (s(0), s(1), 0),
            _ => (
                self.join(&c.args[0], &s(1)),
                self.join(&c.args[2], &s(3)),
                c.args.get(4).and_then(|f| parse_int(f)).unwrap_or(0),
            ),
        }
    }

    pub(super) fn rename(&mut self, c: &Call) {
        let (from, to, flags) = self.two_paths(c);
        let link = c.name.starts_with("link");
        let (from, to) = match (self.at(&from), self.at(&to)) {
            (At::Venv(a), At::Venv(b)) => (a, b),
            (At::Outside(_), At::Outside(p)) => return self.outside(&p, c),
            _ => panic!("log line {}: {} across the venv's edge", c.line, c.name),
        };
        if link {
            assert!(
                flags & AT_EMPTY_PATH == 0,
                "log line {}: linkat AT_EMPTY_PATH",
                c.line
            );
        } else {
            assert!(
                flags & (RENAME_EXCHANGE | RENAME_WHITEOUT) == 0,
                "log line {}: rename flags {flags:#x}",
                c.line
            );
        }
        let node = self
            .lookup(&from)
            .unwrap_or_else(|| panic!("log line {}: no source in the model", c.line));
        let (fp, fname) = self.parent(&from, c);
        let (tp, tname) = self.parent(&to, c);
        let mut effects = vec![(tp, tname.clone(), Some(node))];
        self.cur.get_mut(&tp).unwrap().insert(tname, node);
        if !link && !(fp == tp && effects[0].1 == fname) {
            self.cur.get_mut(&fp).unwrap().remove(&fname);
            effects.push((fp, fname, None));
        }
        let w = self.what(c);
        self.push(Op::Entry(effects), w);
    }

    pub(super) fn entry(&mut self, c: &Call) {
        let s = |i: usize| str_arg(&c.args[i]).expect("a path");
        let (path, target) = match c.name.as_str() {
            "unlink" | "rmdir" | "mkdir" | "mknod" => (s(0), None),
            "symlink" => (s(1), Some(s(0))),
            "symlinkat" => (self.join(&c.args[1], &s(2)), Some(s(0))),
            _ => (self.join(&c.args[0], &s(1)), None),
        };
        let comps = match self.at(&path) {
            At::Outside(p) => return self.outside(&p, c),
            At::Venv(comps) => comps,
        };
        let (parent, name) = self.parent(&comps, c);
        let w = self.what(c);
        let node = match c.name.as_str() {
            "mknod" | "mknodat" => panic!("log line {}: mknod in the venv", c.line),
            "mkdir" | "mkdirat" => {
                let mode = parse_int(c.args.last().unwrap()).unwrap() as u32;
                Some(self.add(Kind::Dir, None, mode & !self.umask & 0o7777))
            }
            "symlink" | "symlinkat" => Some(self.add(Kind::Link(target.unwrap()), None, 0o777)),
            "unlinkat" => {
                let _dir = parse_int(&c.args[2]).unwrap_or(0) & AT_REMOVEDIR != 0;
                None
            }
            _ => None,
        };
        match node {
            Some(n) => self.cur.get_mut(&parent).unwrap().insert(name.clone(), n),
            None => self.cur.get_mut(&parent).unwrap().remove(&name),
        };
        self.push(Op::Entry(vec![(parent, name, node)]), w);
    }

    pub(super) fn chmod(&mut self, c: &Call) {
        let s = |i: usize| str_arg(&c.args[i]).expect("a path");
        let (node, mode) = match c.name.as_str() {
            "fchmod" => (self.fd_node(c, 0), &c.args[1]),
            "chmod" => (self.path_node(&s(0), c), &c.args[1]),
            _ => (self.path_node(&self.join(&c.args[0], &s(1)), c), &c.args[2]),
        };
        if let Some(node) = node {
            let w = self.what(c);
            let mode = parse_int(mode).unwrap() as u32 & 0o7777;
            self.push(Op::Mode { node, mode }, w);
        }
    }

    fn path_node(&self, p: &[u8], c: &Call) -> Option<super::NodeId> {
        match self.at(p) {
            At::Outside(p) => {
                self.outside(&p, c);
                None
            }
            At::Venv(comps) => Some(self.lookup(&comps).expect("a known path")),
        }
    }

    pub(super) fn sync(&mut self, c: &Call) {
        let w = self.what(c);
        match c.name.as_str() {
            "sync" => self.push(Op::SyncFs, w),
            "syncfs" => {
                let p = fd_arg(&c.args[0]).1.unwrap_or_default();
                let p = PathBuf::from(std::ffi::OsStr::from_encoded_bytes_unchecked_safe(&p));
                // The fd's folder may be gone by now (the apply's `syncfs`
                // of `staging/`, which its commit removed): its nearest
                // folder still there is on the same file system. (Stat of
                // the gone path alone dropped that barrier, and every
                // staged file counted as never durable: a resumed switch
                // then placed torn files, an artefact of the model.)
                let same = p
                    .ancestors()
                    .find_map(|a| std::fs::metadata(a).ok())
                    .is_some_and(|m| Some(m.dev()) == self.dev);
                if same {
                    self.push(Op::SyncFs, w);
                }
            }
            name => {
                if let Some(node) = self.fd_node(c, 0) {
                    self.push(
                        Op::Sync {
                            node,
                            data_only: name == "fdatasync",
                        },
                        w,
                    );
                }
            }
        }
    }
}
