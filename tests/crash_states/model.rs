//! The recorded run as operations on a model of the venv's file system:
//! inodes ([`Node`]) and, for each directory, its entries; every call of
//! the trace that changes something under the venv becomes one [`Op`] (an
//! entry change, a data write, a truncation, a mode change) or a barrier
//! (an fsync or fdatasync of one inode, a `syncfs`). Paths outside the
//! venv are allowed only where the test says (the controller's home and
//! working folder, `/proc`, `/dev`, pipes); a change anywhere else, or a
//! call the model cannot replay (`RENAME_EXCHANGE`, `O_TMPFILE`, an ioctl
//! other than `FICLONE`, a punched hole, an xattr, `chdir`), fails the
//! test naming the call and its line in the log.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::trace::{Call, fd_arg, str_arg};

pub type NodeId = usize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Link(Vec<u8>),
}

#[derive(Debug, Clone)]
pub struct Node {
    pub kind: Kind,
    /// Its file in the farm (the hard-linked copy of the tree before the
    /// run) for the inodes that were there before; `None` for new ones.
    pub base: Option<PathBuf>,
    /// The mode it had before the run, or was created with.
    pub mode: u32,
}

/// One change or barrier, in the order the calls completed.
#[derive(Debug, Clone)]
pub enum Op {
    /// Directory entries set (`Some`) or removed (`None`), atomically: a
    /// create or mkdir is one, a rename two (new name, old name).
    Entry(Vec<(NodeId, Vec<u8>, Option<NodeId>)>),
    Write {
        node: NodeId,
        off: u64,
        data: Arc<Vec<u8>>,
    },
    /// The size set (`ftruncate`, `O_TRUNC`, `fallocate` growing it).
    SetLen {
        node: NodeId,
        len: u64,
    },
    Mode {
        node: NodeId,
        mode: u32,
    },
    /// fsync (`data_only` false) or fdatasync of one inode.
    Sync {
        node: NodeId,
        data_only: bool,
    },
    SyncFs,
}

/// The recorded run as the model sees it.
pub struct Model {
    pub nodes: Vec<Node>,
    pub root: NodeId,
    /// Each directory's entries before the run.
    pub base_children: HashMap<NodeId, BTreeMap<Vec<u8>, NodeId>>,
    pub ops: Vec<Op>,
    /// What each op was, for messages (`renameat2 staging/3 -> lib/x.py`).
    pub what: Vec<String>,
    /// The files the run made that it left in the tree: where, with what
    /// bytes and mode. A state where one of them is whole links it from
    /// the farm of the tree after the run (`after`), so that it keeps the
    /// inode and mtime the journal recorded, as after a real power cut.
    pub made: HashMap<NodeId, (String, Arc<Vec<u8>>, u32)>,
    /// The farm of the tree after the run, once made.
    pub after: Option<PathBuf>,
}

struct Fd {
    node: Option<NodeId>,
    outside: Option<PathBuf>,
    pos: u64,
    append: bool,
}

enum At {
    Venv(Vec<Vec<u8>>),
    Outside(PathBuf),
}

/// Builds a [`Model`] from the calls of a trace.
pub struct Builder {
    venv: PathBuf,
    /// Folders outside the venv where the run may write (ignored).
    allowed: Vec<PathBuf>,
    cwd: PathBuf,
    umask: u32,
    /// The venv's device, when a `syncfs` of it makes everything durable
    /// (`None` on FUSE, where it never reaches the daemon).
    dev: Option<u64>,
    m: Model,
    cur: HashMap<NodeId, BTreeMap<Vec<u8>, NodeId>>,
    content: HashMap<NodeId, Vec<u8>>,
    fds: HashMap<(u32, i64), Fd>,
    tgid: HashMap<u32, u32>,
}

fn umask() -> u32 {
    // SAFETY: plain syscalls; the mask is put back at once.
    unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m as u32
    }
}

impl Builder {
    /// The model of `venv` as it stands now, its files' contents read from
    /// the same relative paths under `farm`.
    /// `syncfs_writes_back`: whether the venv's file system writes
    /// everything back on `syncfs` (not FUSE's).
    pub fn new(
        venv: &Path,
        farm: &Path,
        allowed: Vec<PathBuf>,
        cwd: &Path,
        syncfs_writes_back: bool,
    ) -> Builder {
        let mut b = Builder {
            venv: venv.to_path_buf(),
            allowed,
            cwd: cwd.to_path_buf(),
            umask: umask(),
            dev: syncfs_writes_back.then(|| std::fs::metadata(venv).unwrap().dev()),
            m: Model {
                nodes: Vec::new(),
                root: 0,
                base_children: HashMap::new(),
                ops: Vec::new(),
                what: Vec::new(),
                made: HashMap::new(),
                after: None,
            },
            cur: HashMap::new(),
            content: HashMap::new(),
            fds: HashMap::new(),
            tgid: HashMap::new(),
        };
        let mode = std::fs::metadata(venv).unwrap().permissions().mode() & 0o7777;
        b.m.root = b.add(Kind::Dir, None, mode);
        let mut ids: HashMap<PathBuf, NodeId> = HashMap::new();
        ids.insert(venv.to_path_buf(), b.m.root);
        for e in walkdir::WalkDir::new(venv).min_depth(1).sort_by_file_name() {
            let e = e.unwrap();
            let meta = e.path().symlink_metadata().unwrap();
            let rel = e.path().strip_prefix(venv).unwrap();
            let kind = if meta.is_dir() {
                Kind::Dir
            } else if meta.file_type().is_symlink() {
                Kind::Link(
                    std::fs::read_link(e.path())
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                )
            } else {
                Kind::File
            };
            let base = (kind == Kind::File).then(|| farm.join(rel));
            let id = b.add(kind, base, meta.permissions().mode() & 0o7777);
            let parent = ids[e.path().parent().unwrap()];
            let name = e.file_name().as_encoded_bytes().to_vec();
            b.cur.entry(parent).or_default().insert(name, id);
            ids.insert(e.path().to_path_buf(), id);
        }
        b.m.base_children = b.cur.clone();
        b
    }

    /// Note every file the run made that stands in the final tree.
    fn made_files(&mut self, dir: NodeId, prefix: String) {
        let kids: Vec<(Vec<u8>, NodeId)> = match self.cur.get(&dir) {
            Some(k) => k.iter().map(|(n, i)| (n.clone(), *i)).collect(),
            None => return,
        };
        for (name, n) in kids {
            let path = format!("{prefix}{}", String::from_utf8_lossy(&name));
            match self.m.nodes[n].kind {
                Kind::Dir => self.made_files(n, format!("{path}/")),
                Kind::File if self.m.nodes[n].base.is_none() && !self.m.made.contains_key(&n) => {
                    let mode = self.mode_now(n);
                    let bytes = Arc::new(self.content(n).clone());
                    self.m.made.insert(n, (path, bytes, mode));
                }
                _ => {}
            }
        }
    }

    /// A node's mode after every mode change of the run.
    fn mode_now(&self, n: NodeId) -> u32 {
        self.m
            .ops
            .iter()
            .rev()
            .find_map(|o| match o {
                Op::Mode { node, mode } if *node == n => Some(*mode),
                _ => None,
            })
            .unwrap_or(self.m.nodes[n].mode)
    }

    fn add(&mut self, kind: Kind, base: Option<PathBuf>, mode: u32) -> NodeId {
        if kind == Kind::Dir {
            self.cur.entry(self.m.nodes.len()).or_default();
        }
        self.m.nodes.push(Node { kind, base, mode });
        self.m.nodes.len() - 1
    }

    fn push(&mut self, op: Op, what: String) {
        self.m.ops.push(op);
        self.m.what.push(what);
    }

    /// Feed every call; then the model.
    pub fn build(mut self, calls: &[Call]) -> Model {
        // Threads first: a new thread's first calls may be logged before
        // the clone that made it returns.
        for c in calls.iter().filter(|c| c.ok()) {
            if let Some((child, true)) = calls::thread_of(c) {
                self.tgid.insert(child, c.tid);
            }
        }
        let tids: Vec<u32> = self.tgid.keys().copied().collect();
        for t in tids {
            let mut g = t;
            while let Some(&p) = self.tgid.get(&g).filter(|&&p| p != g) {
                g = p;
            }
            self.tgid.insert(t, g);
        }
        for c in calls {
            self.call(c);
        }
        self.made_files(self.m.root, String::new());
        self.m
    }

    fn rel(&self, comps: &[Vec<u8>]) -> String {
        comps
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect::<Vec<_>>()
            .join("/")
    }

    fn at(&self, p: &[u8]) -> At {
        let p = Path::new(std::ffi::OsStr::from_encoded_bytes_unchecked_safe(p));
        let p = if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.cwd.join(p)
        };
        match p.strip_prefix(&self.venv) {
            Ok(rel) => {
                let mut comps = Vec::new();
                for c in rel.components() {
                    match c {
                        std::path::Component::Normal(n) => {
                            comps.push(n.as_encoded_bytes().to_vec())
                        }
                        std::path::Component::CurDir => {}
                        other => panic!("a path with {other:?} in it: {}", p.display()),
                    }
                }
                At::Venv(comps)
            }
            Err(_) => At::Outside(p),
        }
    }

    /// The full path of `name` relative to the directory fd argument `dirfd`
    /// (or the working directory for `AT_FDCWD`).
    fn join(&self, dirfd: &str, name: &[u8]) -> Vec<u8> {
        if name.first() == Some(&b'/') {
            return name.to_vec();
        }
        let mut base = match fd_arg(dirfd).1 {
            Some(p) => p,
            None => self.cwd.as_os_str().as_encoded_bytes().to_vec(),
        };
        if !name.is_empty() {
            base.push(b'/');
            base.extend_from_slice(name);
        }
        base
    }

    fn lookup(&self, comps: &[Vec<u8>]) -> Option<NodeId> {
        let mut n = self.m.root;
        for c in comps {
            n = *self.cur.get(&n)?.get(c)?;
        }
        Some(n)
    }

    fn parent(&self, comps: &[Vec<u8>], c: &Call) -> (NodeId, Vec<u8>) {
        let (name, dir) = comps
            .split_last()
            .unwrap_or_else(|| panic!("log line {}: {} of the venv root itself", c.line, c.name));
        let p = self.lookup(dir).unwrap_or_else(|| {
            panic!(
                "log line {}: {}: no {} in the model",
                c.line,
                c.name,
                self.rel(dir)
            )
        });
        (p, name.clone())
    }

    /// A change outside the venv: allowed only under the allowed folders.
    fn outside(&self, p: &Path, c: &Call) {
        let s = p.to_string_lossy();
        let special = ["/proc/", "/dev/", "pipe:", "socket:", "anon_inode:"];
        if special.iter().any(|x| s.starts_with(x)) || self.allowed.iter().any(|a| p.starts_with(a))
        {
            return;
        }
        panic!(
            "log line {}: {} changed {} outside the target venv",
            c.line,
            c.name,
            p.display()
        );
    }

    fn tgid(&self, tid: u32) -> u32 {
        *self.tgid.get(&tid).unwrap_or(&tid)
    }

    fn fd(&self, c: &Call, arg: usize) -> Option<&Fd> {
        let n = fd_arg(&c.args[arg]).0;
        self.fds.get(&(self.tgid(c.tid), n))
    }

    /// The venv node an fd argument names: from the open that made it,
    /// else from the path `-y` shows (a change through an fd the trace
    /// did not see opened fails the test).
    fn fd_node(&self, c: &Call, arg: usize) -> Option<NodeId> {
        if let Some(f) = self.fd(c, arg) {
            return f.node;
        }
        match fd_arg(&c.args[arg]).1.map(|p| self.at(&p)) {
            Some(At::Venv(comps)) => panic!(
                "log line {}: {} on {} through an fd opened before the trace",
                c.line,
                c.name,
                self.rel(&comps)
            ),
            _ => None,
        }
    }

    fn content(&mut self, node: NodeId) -> &mut Vec<u8> {
        if !self.content.contains_key(&node) {
            let v = match &self.m.nodes[node].base {
                Some(p) => std::fs::read(p).unwrap(),
                None => Vec::new(),
            };
            self.content.insert(node, v);
        }
        self.content.get_mut(&node).unwrap()
    }

    fn write(&mut self, node: NodeId, off: u64, data: Vec<u8>, what: String) {
        let v = self.content(node);
        let end = off as usize + data.len();
        if v.len() < end {
            v.resize(end, 0);
        }
        v[off as usize..end].copy_from_slice(&data);
        self.push(
            Op::Write {
                node,
                off,
                data: Arc::new(data),
            },
            what,
        );
    }

    fn set_len(&mut self, node: NodeId, len: u64, what: String) {
        self.content(node).resize(len as usize, 0);
        self.push(Op::SetLen { node, len }, what);
    }

    /// `n` bytes at `off` of the file an fd argument names (in the venv: as
    /// the model has it; outside: as it is on disk, the source venv, which
    /// the run does not change).
    fn read_from(&mut self, c: &Call, arg: usize, off: u64, n: usize) -> Vec<u8> {
        if let Some(node) = self.fd_node(c, arg) {
            let v = self.content(node);
            return v[off as usize..(off as usize + n).min(v.len())].to_vec();
        }
        let path = fd_arg(&c.args[arg]).1.expect("an fd with a path");
        let path = PathBuf::from(std::ffi::OsStr::from_encoded_bytes_unchecked_safe(&path));
        let all = std::fs::read(&path).unwrap();
        let from = (off as usize).min(all.len());
        all[from..(from + n).min(all.len())].to_vec()
    }

    fn call(&mut self, c: &Call) {
        if !c.ok() {
            return;
        }
        match c.name.as_str() {
            "open" | "openat" | "openat2" | "creat" => self.open(c),
            "close" => {
                let k = (self.tgid(c.tid), fd_arg(&c.args[0]).0);
                self.fds.remove(&k);
            }
            "clone" | "clone3" | "fork" | "vfork" => self.fork(c),
            "dup" | "dup2" | "dup3" | "fcntl" => self.dup(c),
            "read" | "readv" | "lseek" => self.seek(c),
            "write" | "writev" | "pwrite64" | "pwritev" | "pwritev2" => self.data_write(c),
            "copy_file_range" | "sendfile" => self.copy(c),
            "ioctl" | "fallocate" | "ftruncate" | "truncate" => self.resize(c),
            "rename" | "renameat" | "renameat2" | "link" | "linkat" => self.rename(c),
            "unlink" | "unlinkat" | "rmdir" | "mkdir" | "mkdirat" | "symlink" | "symlinkat"
            | "mknod" | "mknodat" => self.entry(c),
            "chmod" | "fchmod" | "fchmodat" | "fchmodat2" => self.chmod(c),
            "fsync" | "fdatasync" | "syncfs" | "sync" => self.sync(c),
            // Owner and times: the checker compares neither (the tests run
            // as root, and a materialised state has fresh times anyway);
            // sync_file_range only starts writeback, it makes nothing
            // durable; pread64 moves no file position.
            "chown" | "fchown" | "lchown" | "fchownat" | "utimensat" | "futimesat" | "utimes"
            | "utime" | "sync_file_range" | "pread64" => {}
            n if super::trace::READ_ONLY.contains(&n) => {}
            _ => self.unsupported(c),
        }
    }

    /// Calls the model cannot replay: fine outside the venv, fatal in it.
    fn unsupported(&self, c: &Call) {
        let on_venv = c.args.iter().chain([&c.ret]).any(|a| {
            let p = fd_arg(a).1.or_else(|| str_arg(a));
            p.is_some_and(|p| matches!(self.at(&p), At::Venv(_)))
        });
        if on_venv || c.name == "chdir" || c.name == "fchdir" {
            panic!(
                "log line {}: {} cannot be replayed by the crash-state model",
                c.line, c.name
            );
        }
    }
}

/// `OsStr::from_encoded_bytes_unchecked` for bytes that came from the
/// kernel as a path on this Unix system, where every byte string is one.
trait FromBytes {
    fn from_encoded_bytes_unchecked_safe(b: &[u8]) -> &std::ffi::OsStr;
}

impl FromBytes for std::ffi::OsStr {
    fn from_encoded_bytes_unchecked_safe(b: &[u8]) -> &std::ffi::OsStr {
        std::os::unix::ffi::OsStrExt::from_bytes(b)
    }
}

#[path = "model_calls.rs"]
mod calls;
