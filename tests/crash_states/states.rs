//! The crash states a recorded run may leave, under the persistence model
//! of docs/design.md ("Crash states"): an op is durable once a later
//! barrier covers it (an fsync or fdatasync of its inode for its data, an
//! fsync of its directory for an entry change, a `syncfs` for everything
//! before it); at a crash after the first `k` ops every durable op is
//! there; of the others, the entry changes (create, mkdir, rename, link,
//! unlink, rmdir, symlink) reach the disk in the order they were made, so
//! those past some point are lost, and independently of them each data
//! write (and size or mode change) may be lost, or torn at 4 KiB (each
//! piece kept or lost on its own), in any combination.
//!
//! [`choices`] enumerates, for every `k`, the state with every non-durable
//! op lost, the one with only the non-durable data lost (what LazyFS
//! leaves), and the one with none lost (what killing the process leaves),
//! then `random` states from a seed: a random `k`, a random cut of the
//! entry changes, each data op kept or lost, some writes torn. [`realise`]
//! turns one into the tree it leaves.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::model::{Kind, Model, NodeId, Op};

/// The page size writes may be torn at.
const PIECE: u64 = 4096;

/// For each op, the index of the first barrier that makes it durable
/// (`usize::MAX`: none does).
pub fn cover(m: &Model) -> Vec<usize> {
    let never = usize::MAX;
    let mut out = vec![never; m.ops.len()];
    let (mut fs, mut data, mut full): (usize, HashMap<NodeId, usize>, HashMap<NodeId, usize>) =
        (never, HashMap::new(), HashMap::new());
    for i in (0..m.ops.len()).rev() {
        let get = |h: &HashMap<NodeId, usize>, n: &NodeId| *h.get(n).unwrap_or(&never);
        out[i] = match &m.ops[i] {
            Op::Write { node, .. } | Op::SetLen { node, .. } => fs.min(get(&data, node)),
            Op::Mode { node, .. } => fs.min(get(&full, node)),
            Op::Entry(effects) => {
                let dirs = effects
                    .iter()
                    .map(|(d, _, _)| get(&data, d))
                    .max()
                    .unwrap_or(never);
                fs.min(dirs)
            }
            Op::Sync { .. } | Op::SyncFs => i,
        };
        match &m.ops[i] {
            Op::SyncFs => fs = i,
            Op::Sync { node, data_only } => {
                data.insert(*node, i);
                if !data_only {
                    full.insert(*node, i);
                }
            }
            _ => {}
        }
    }
    out
}

/// What happens to one non-durable op in a crash state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    Lost,
    Kept,
    /// A write torn at 4 KiB: piece `i` kept when bit `i % 64` is set.
    Torn(u64),
}

/// One crash state: the first `k` ops happened; `fates` of the
/// non-durable ones (absent: kept).
#[derive(Debug, Clone)]
pub struct Choice {
    pub label: String,
    pub k: usize,
    pub fates: HashMap<usize, Fate>,
}

/// splitmix64: small, seedable, the same everywhere.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn pieces(off: u64, len: u64) -> u64 {
    if len == 0 {
        1
    } else {
        (off + len - 1) / PIECE - off / PIECE + 1
    }
}

/// Every prefix with its non-durable ops all lost, with only its
/// non-durable data lost (the entries kept), and with nothing lost; then
/// `random` seeded states (a state's seed is in its label).
pub fn choices(m: &Model, cover: &[usize], random: usize, seed: u64) -> Vec<Choice> {
    let n = m.ops.len();
    let pending = |k: usize| (0..k).filter(move |&i| cover[i] >= k && !is_barrier(&m.ops[i]));
    let mut out = Vec::new();
    for k in 0..=n {
        let all = pending(k).map(|i| (i, Fate::Lost)).collect();
        out.push(Choice {
            label: format!("prefix {k}/{n}, every non-durable op lost"),
            k,
            fates: all,
        });
        let data = pending(k)
            .filter(|&i| !is_entry(&m.ops[i]))
            .map(|i| (i, Fate::Lost))
            .collect();
        out.push(Choice {
            label: format!("prefix {k}/{n}, non-durable data lost"),
            k,
            fates: data,
        });
        out.push(Choice {
            label: format!("prefix {k}/{n}, nothing lost"),
            k,
            fates: HashMap::new(),
        });
    }
    for r in 0..random {
        let s = seed ^ (r as u64).wrapping_mul(0x2545_F491_4F6C_DD1D);
        let mut rng = Rng(s);
        let k = (rng.next() % (n as u64 + 1)) as usize;
        let entries = pending(k).filter(|&i| is_entry(&m.ops[i])).count() as u64;
        // Entry changes reach the disk in order: those past a cut are lost.
        let cut = rng.next() % (entries + 1);
        let (mut fates, mut seen) = (HashMap::new(), 0);
        for i in pending(k) {
            let fate = match &m.ops[i] {
                Op::Entry(_) => {
                    seen += 1;
                    if seen > cut { Fate::Lost } else { Fate::Kept }
                }
                Op::Write { off, data, .. }
                    if pieces(*off, data.len() as u64) > 1 && rng.next() % 3 == 0 =>
                {
                    Fate::Torn(rng.next())
                }
                _ if rng.next() % 2 == 0 => Fate::Lost,
                _ => Fate::Kept,
            };
            fates.insert(i, fate);
        }
        out.push(Choice {
            label: format!("random state {r} (seed {s:#x}), prefix {k}/{n}"),
            k,
            fates,
        });
    }
    out
}

fn is_entry(op: &Op) -> bool {
    matches!(op, Op::Entry(_))
}

fn is_barrier(op: &Op) -> bool {
    matches!(op, Op::Sync { .. } | Op::SyncFs)
}

/// One entry of a realised tree.
#[derive(Debug, Clone)]
pub enum Entry {
    Dir(u32),
    /// A file unchanged since before the run: its file in the farm.
    Farm(std::path::PathBuf, u32),
    File(Arc<Vec<u8>>, u32),
    /// A second name of a file made during the run (`link(2)`): a hard
    /// link to the entry at this path, as the run left it.
    Hard(String),
    Link(Vec<u8>),
}

/// The tree a crash state leaves, parents before children, and its hash.
pub struct Tree {
    pub entries: Vec<(String, Entry)>,
    pub hash: u64,
}

/// Apply `choice`'s ops to the tree from before the run.
pub fn realise(m: &Model, choice: &Choice) -> Tree {
    let mut children = m.base_children.clone();
    let mut data_ops: HashMap<NodeId, Vec<(usize, Fate)>> = HashMap::new();
    let mut modes: HashMap<NodeId, u32> = HashMap::new();
    for i in 0..choice.k {
        let fate = *choice.fates.get(&i).unwrap_or(&Fate::Kept);
        if fate == Fate::Lost {
            continue;
        }
        match &m.ops[i] {
            Op::Entry(effects) => {
                for (d, name, v) in effects {
                    let dir = children.entry(*d).or_default();
                    match v {
                        Some(n) => dir.insert(name.clone(), *n),
                        None => dir.remove(name),
                    };
                }
            }
            Op::Write { node, .. } | Op::SetLen { node, .. } => {
                data_ops.entry(*node).or_default().push((i, fate))
            }
            Op::Mode { node, mode } => {
                modes.insert(*node, *mode);
            }
            Op::Sync { .. } | Op::SyncFs => {}
        }
    }
    let mut entries = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut names = HashMap::new();
    let mut w = Walk {
        m,
        children: &children,
        data_ops: &data_ops,
        modes: &modes,
        out: &mut entries,
        seen: &mut seen,
        names: &mut names,
    };
    w.walk(m.root, String::new());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (p, e) in &entries {
        p.hash(&mut h);
        match e {
            Entry::Dir(mode) => (0u8, mode).hash(&mut h),
            Entry::Farm(f, mode) => (1u8, f, mode).hash(&mut h),
            Entry::File(d, mode) => (2u8, d.as_slice(), mode).hash(&mut h),
            Entry::Link(t) => (3u8, t).hash(&mut h),
            Entry::Hard(first) => (4u8, first).hash(&mut h),
        }
    }
    Tree {
        entries,
        hash: h.finish(),
    }
}

/// The walk of a realised tree: parents before children, each directory
/// once, a file's second name as a hard link to its first.
struct Walk<'a> {
    m: &'a Model,
    children: &'a HashMap<NodeId, BTreeMap<Vec<u8>, NodeId>>,
    data_ops: &'a HashMap<NodeId, Vec<(usize, Fate)>>,
    modes: &'a HashMap<NodeId, u32>,
    out: &'a mut Vec<(String, Entry)>,
    seen: &'a mut std::collections::HashSet<NodeId>,
    names: &'a mut HashMap<NodeId, String>,
}

impl Walk<'_> {
    fn walk(&mut self, dir: NodeId, prefix: String) {
        assert!(
            self.seen.insert(dir),
            "a directory reached twice at {prefix}: the model lost a rename's atomicity"
        );
        let Some(kids) = self.children.get(&dir) else {
            return;
        };
        for (name, &n) in kids {
            let path = format!("{prefix}{}", String::from_utf8_lossy(name));
            let node = &self.m.nodes[n];
            let mode = *self.modes.get(&n).unwrap_or(&node.mode);
            match &node.kind {
                Kind::Dir => {
                    self.out.push((path.clone(), Entry::Dir(mode)));
                    self.walk(n, format!("{path}/"));
                }
                Kind::Link(t) => self.out.push((path, Entry::Link(t.clone()))),
                Kind::File => {
                    let e = match (self.names.get(&n), self.data_ops.get(&n), &node.base) {
                        (Some(first), _, _) => Entry::Hard(first.clone()),
                        (None, None, Some(f)) if mode == node.mode => Entry::Farm(f.clone(), mode),
                        (None, ops, base) => {
                            let bytes = content(self.m, base.as_deref(), ops);
                            match (self.m.made.get(&n), &self.m.after) {
                                // Whole, as the run left it: the very inode.
                                (Some((rel, want, m)), Some(after))
                                    if *want.as_ref() == bytes && *m == mode =>
                                {
                                    Entry::Farm(after.join(rel), mode)
                                }
                                _ => Entry::File(Arc::new(bytes), mode),
                            }
                        }
                    };
                    self.names.insert(n, path.clone());
                    self.out.push((path, e));
                }
            }
        }
    }
}

/// A file's bytes: its content before the run, then its kept data ops.
fn content(m: &Model, base: Option<&std::path::Path>, ops: Option<&Vec<(usize, Fate)>>) -> Vec<u8> {
    let mut v = base.map(|p| std::fs::read(p).unwrap()).unwrap_or_default();
    for (i, fate) in ops.into_iter().flatten() {
        match &m.ops[*i] {
            Op::SetLen { len, .. } => v.resize(*len as usize, 0),
            Op::Write { off, data, .. } => {
                let (off, end) = (*off, *off + data.len() as u64);
                let mut at = off;
                let mut piece = 0u64;
                while at < end {
                    let next = ((at / PIECE + 1) * PIECE).min(end);
                    let keep = match fate {
                        Fate::Torn(mask) => mask >> (piece % 64) & 1 == 1,
                        _ => true,
                    };
                    if keep {
                        if v.len() < next as usize {
                            v.resize(next as usize, 0);
                        }
                        v[at as usize..next as usize]
                            .copy_from_slice(&data[(at - off) as usize..(next - off) as usize]);
                    }
                    at = next;
                    piece += 1;
                }
            }
            _ => {}
        }
    }
    v
}

/// The ops of `choice` that were lost or torn, for a violation's message.
pub fn lost(m: &Model, choice: &Choice, max: usize) -> Vec<String> {
    let mut v: Vec<(usize, String)> = choice
        .fates
        .iter()
        .filter(|(_, f)| **f != Fate::Kept)
        .map(|(i, f)| {
            (
                *i,
                format!(
                    "#{i} {} {}",
                    if *f == Fate::Lost { "lost:" } else { "torn:" },
                    m.what[*i]
                ),
            )
        })
        .collect();
    v.sort();
    let n = v.len();
    let mut out: Vec<String> = v.into_iter().take(max).map(|(_, s)| s).collect();
    if n > max {
        out.push(format!("... and {} more", n - max));
    }
    out
}
