//! The GPU code of a CUDA shared object: the targets of the entries of its
//! `.nv_fatbin` section (`__nv_relfatbin` in `-rdc` objects), read from
//! the container and entry headers alone ([`read_fatbin`]): a 1 GB
//! `libtorch_cuda.so` has some 450 containers, so a few thousand small
//! reads, never the kernels themselves.
//!
//! The layout (nvcc 13.0 output; the same as ZLUDA's `fatbin` module
//! reads): the section is containers one after another, 8-aligned, each
//! `u32 magic 0xBA55ED50, u16 version, u16 header size, u64 size of its
//! entries`; each entry starts with `u16 kind (1 PTX, 2 ELF), u16, u32
//! header size, u32 padded payload size` (the next entry follows the
//! header and the padded payload), has its PTX ISA `minor, major` as two
//! `u16` at 0x18, its SM number as `u32` at 0x1C and its flags as `u64` at
//! 0x28 (`0x100000`: an `a` target such as `sm_90a`; `0x200000`: an `f`
//! target such as `sm_100f`). Anything else ends the walk: a hostile or
//! odd section yields what was read before it, never a loop or a large
//! allocation.
//!
//! Where nvcc's wrappers (`.nvFatBinSegment`) say where every container
//! starts, the containers are read all at once ([`read_containers`]);
//! otherwise they are walked one after another ([`read_fatbin`]). The
//! caller opens the file with `POSIX_FADV_RANDOM`: each header is a small
//! read far from the last, and the kernel's read-ahead would otherwise
//! read the kernels around it (the whole 4 GB stack, measured).

use std::io;
use std::sync::RwLock;

use rayon::prelude::*;

use crate::model::{ArchVariant, GpuArch, GpuCode};

const CONTAINER_MAGIC: u32 = 0xBA55_ED50;
const CONTAINER_HEADER: u64 = 16;
const ENTRY_HEADER: u64 = 64;
const KIND_PTX: u16 = 1;
const KIND_ELF: u16 = 2;
const FLAG_ARCH: u64 = 0x10_0000;
const FLAG_FAMILY: u64 = 0x20_0000;
/// Bounds on a section's walk: no real fatbin comes near them.
const MAX_CONTAINERS: u32 = 1 << 16;
const MAX_ENTRIES: u32 = 1 << 20;
/// How far past a container's end the next magic is looked for (padding).
const RESYNC_WINDOW: u64 = 4096;

/// Containers read at once, in file order, by a reading for some GPUs
/// between its looks at whether what it read runs on them.
const BATCH: usize = 32;

/// Bytes read at once while walking the containers: the container's
/// header, and the entry headers that lie in the same window (a container
/// of small cubins, or several small containers, cost one read).
const WINDOW: u64 = 64 << 10;

/// The GPUs (compute capabilities) the readings of this process are for:
/// `None`, every container is read (a bundle's facts, a reading for no
/// particular host); `Some`, a reading stops once what it read runs on all
/// of them, and reads nothing for none. Set by the agent from the request
/// (the target's GPUs) or its own machine ([`read_for`]).
static WANTED: RwLock<Option<Vec<(u32, u32)>>> = RwLock::new(None);

/// The files whose GPU code is read (`None`: every file's). A plan's
/// target reads the GPU code of the shared objects its sets hold (those
/// the overlay may replace, whose findings it compares), not of every
/// object of site-packages: an object the overlay leaves has the same
/// findings before and after, none of them new (`doctor` reads them all).
static CODE_OF: RwLock<Option<std::collections::HashSet<std::path::PathBuf>>> = RwLock::new(None);

/// Read GPU code only of these files from now on (see [`CODE_OF`]).
pub fn read_code_of(paths: Option<std::collections::HashSet<std::path::PathBuf>>) {
    *CODE_OF.write().unwrap_or_else(|e| e.into_inner()) = paths;
}

/// Is the GPU code of `p` read (see [`CODE_OF`])?
pub fn reads_code_of(p: &std::path::Path) -> bool {
    CODE_OF
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_none_or(|set| set.contains(p))
}

/// Read GPU code for these GPUs from now on (see [`WANTED`]).
pub fn read_for(gpus: Option<Vec<(u32, u32)>>) {
    *WANTED.write().unwrap_or_else(|e| e.into_inner()) = gpus;
}

pub fn wanted() -> Option<Vec<(u32, u32)>> {
    WANTED.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Does a reading (cached, say) of `p` tell what the readings are wanted
/// for now? Every reading without GPU code does, and any of a file whose
/// code is not wanted ([`reads_code_of`]); one that stopped early does
/// when what it read runs on every GPU wanted.
pub fn serves(p: &std::path::Path, info: &Option<crate::model::ElfInfo>) -> bool {
    let Some(code) = info.as_ref().and_then(|i| i.gpu.as_ref()) else {
        return true;
    };
    if !reads_code_of(p) {
        return true;
    }
    code.complete || wanted().is_some_and(|w| w.iter().all(|&cc| code.sass_runs_on(cc)))
}

/// What the walk of one container left to read: its entries from `next`
/// on (their headers lay past the window), up to `end`.
struct Rest {
    next: u64,
    end: u64,
}

/// The targets of the entries read so far.
#[derive(Default)]
struct Found {
    cubins: Vec<GpuArch>,
    ptx: Vec<GpuArch>,
    ptx_isa: Option<(u16, u16)>,
    entries: u32,
}

impl Found {
    fn entry(&mut self, h: &[u8]) {
        self.entries += 1;
        let flags = u64_at(h, 0x28);
        let variant = if flags & FLAG_ARCH != 0 {
            ArchVariant::Arch
        } else if flags & FLAG_FAMILY != 0 {
            ArchVariant::Family
        } else {
            ArchVariant::Plain
        };
        let arch = GpuArch {
            sm: u32_at(h, 0x1C),
            variant,
        };
        match u16_at(h, 0) {
            KIND_ELF => self.cubins.push(arch),
            KIND_PTX => {
                self.ptx.push(arch);
                let isa = (u16_at(h, 0x1A), u16_at(h, 0x18));
                self.ptx_isa = self.ptx_isa.max(Some(isa));
            }
            _ => {}
        }
    }

    /// Does SASS found so far run on all of `gpus` (compute capabilities)?
    /// PTX does not settle it: whether it runs depends on the driver.
    fn runs_on_all(&self, gpus: &[(u32, u32)]) -> bool {
        gpus.iter()
            .all(|&(a, b)| self.cubins.iter().any(|x| x.sass_runs(a * 10 + b)))
    }

    fn into_code(self, containers: u32, complete: bool) -> GpuCode {
        let mut code = GpuCode {
            cubins: self.cubins,
            ptx: self.ptx,
            ptx_isa: self.ptx_isa,
            containers,
            complete,
        };
        code.cubins.sort();
        code.cubins.dedup();
        code.ptx.sort();
        code.ptx.dedup();
        code
    }

    fn merge(&mut self, other: Found) {
        self.cubins.extend(other.cubins);
        self.ptx.extend(other.ptx);
        self.ptx_isa = self.ptx_isa.max(other.ptx_isa);
        self.entries += other.entries;
    }
}

/// The entry after the one whose header `h` starts at `at`, if the header
/// is sane.
fn next_entry(at: u64, h: &[u8]) -> Option<u64> {
    let header = u64::from(u32_at(h, 4));
    let padded = u64::from(u32_at(h, 8));
    (header >= ENTRY_HEADER).then(|| at + header + padded)
}

/// Read the GPU code of the fatbin section at `offset`, `size` bytes long,
/// through `read_at(offset, buf)` (a `pread` of the file), for the GPUs
/// `want` ([`WANTED`]). `Ok(None)` when the section holds no container at
/// all.
///
/// The containers are found one after another (each header says where the
/// next starts), in windows of [`WINDOW`] bytes; the entries whose headers
/// lie past a window are then read container by container, on all cores:
/// a cold `libtorch_cuda.so` (444 containers, 2,789 entries) costs a chain
/// of a few hundred small reads and the rest at once, never the kernels.
pub fn read_fatbin(
    offset: u64,
    size: u64,
    read_at: &(dyn Fn(u64, &mut [u8]) -> io::Result<()> + Sync),
    want: Option<&[(u32, u32)]>,
) -> io::Result<Option<GpuCode>> {
    let end = offset.saturating_add(size);
    if want.as_ref().is_some_and(|w| w.is_empty()) {
        return Ok(Some(Found::default().into_code(0, false)));
    }
    let mut found = Found::default();
    let mut rest: Vec<Rest> = Vec::new();
    let mut containers = 0u32;
    let mut pos = offset;
    let mut window: Vec<u8> = Vec::new();
    let mut window_at = 0u64;
    while pos.saturating_add(CONTAINER_HEADER) <= end && containers < MAX_CONTAINERS {
        // The bytes at `pos`, from the window when it holds them.
        let in_window = |at: u64, len: u64, window: &[u8], window_at: u64| {
            (at >= window_at && at + len <= window_at + window.len() as u64)
                .then(|| (at - window_at) as usize)
        };
        if in_window(pos, CONTAINER_HEADER + ENTRY_HEADER, &window, window_at).is_none() {
            let len = WINDOW.min(end - pos) as usize;
            window = vec![0u8; len];
            read_at(pos, &mut window)?;
            window_at = pos;
        }
        let at = (pos - window_at) as usize;
        let head = &window[at..at + CONTAINER_HEADER as usize];
        if u32_at(head, 0) != CONTAINER_MAGIC {
            match resync(pos, end, read_at)? {
                Some(next) => {
                    pos = next;
                    continue;
                }
                None => break,
            }
        }
        let header_size = u64::from(u16_at(head, 6));
        let fat_size = u64_at(head, 8);
        containers += 1;
        let Some(container_end) = pos
            .checked_add(header_size)
            .and_then(|p| p.checked_add(fat_size))
            .filter(|&e| e <= end && header_size >= CONTAINER_HEADER)
        else {
            break;
        };
        // The entries whose headers the window holds.
        let mut e = pos + header_size;
        while e + ENTRY_HEADER <= container_end && found.entries < MAX_ENTRIES {
            let Some(i) = in_window(e, ENTRY_HEADER, &window, window_at) else {
                rest.push(Rest {
                    next: e,
                    end: container_end,
                });
                break;
            };
            let h = &window[i..i + ENTRY_HEADER as usize];
            found.entry(h);
            match next_entry(e, h) {
                Some(n) => e = n,
                None => break,
            }
        }
        // The next container starts 8-aligned after this one.
        pos = container_end.div_ceil(8) * 8;
        // Reading for some GPUs: this container's entries now, and stop
        // once they run on all of them.
        if let Some(w) = want {
            for r in rest.drain(..) {
                let f = rest_of(&r, MAX_ENTRIES.saturating_sub(found.entries), read_at)?;
                found.merge(f);
            }
            if found.runs_on_all(w) {
                let complete = pos.saturating_add(CONTAINER_HEADER) > end;
                return Ok(Some(found.into_code(containers, complete)));
            }
        }
    }
    if containers == 0 {
        return Ok(None);
    }
    let budget = MAX_ENTRIES.saturating_sub(found.entries);
    let more = rest
        .par_iter()
        .map(|r| rest_of(r, budget, read_at))
        .collect::<io::Result<Vec<Found>>>()?;
    for f in more {
        found.merge(f);
    }
    Ok(Some(found.into_code(containers, true)))
}

/// The container at `at` (a section ending at `end`) and all its entries:
/// its header and what follows it read at once (`first` bytes), each entry
/// past that one read each. `None` when no container starts there.
fn container_at(
    at: u64,
    end: u64,
    first: u64,
    budget: u32,
    read_at: &(dyn Fn(u64, &mut [u8]) -> io::Result<()> + Sync),
) -> io::Result<Option<(Found, u64)>> {
    if at.saturating_add(CONTAINER_HEADER) > end {
        return Ok(None);
    }
    let mut held = vec![0u8; first.max(CONTAINER_HEADER).min(end - at) as usize];
    read_at(at, &mut held)?;
    if u32_at(&held, 0) != CONTAINER_MAGIC {
        return Ok(None);
    }
    let header_size = u64::from(u16_at(&held, 6));
    let Some(container_end) = at
        .checked_add(header_size)
        .and_then(|p| p.checked_add(u64_at(&held, 8)))
        .filter(|&e| e <= end && header_size >= CONTAINER_HEADER)
    else {
        return Ok(None);
    };
    let mut f = Found::default();
    let mut e = at + header_size;
    while e + ENTRY_HEADER <= container_end && f.entries < budget {
        let mut h = [0u8; ENTRY_HEADER as usize];
        let i = (e - at) as usize;
        match held.get(i..i + ENTRY_HEADER as usize) {
            Some(bytes) => h.copy_from_slice(bytes),
            None => read_at(e, &mut h)?,
        }
        f.entry(&h);
        match next_entry(e, &h) {
            Some(n) => e = n,
            None => break,
        }
    }
    Ok(Some((f, container_end)))
}

/// The first container of the section at `offset` alone, when its SASS
/// runs on every GPU of `want` (a healthy server: torch's first container
/// has sm_90); `None` otherwise, and the whole section is to be read. Costs
/// a window and the first container's other entries, and nothing of the
/// relocations the wrappers need.
pub fn read_first(
    offset: u64,
    size: u64,
    read_at: &(dyn Fn(u64, &mut [u8]) -> io::Result<()> + Sync),
    want: &[(u32, u32)],
) -> io::Result<Option<GpuCode>> {
    let end = offset.saturating_add(size);
    let Some((found, container_end)) = container_at(offset, end, WINDOW, MAX_ENTRIES, read_at)?
    else {
        return Ok(None);
    };
    if !found.runs_on_all(want) {
        return Ok(None);
    }
    let last = container_end.div_ceil(8) * 8 + CONTAINER_HEADER > end;
    Ok(Some(found.into_code(1, last)))
}

/// The entries of one container from where its window ended, one read each.
fn rest_of(
    r: &Rest,
    budget: u32,
    read_at: &(dyn Fn(u64, &mut [u8]) -> io::Result<()> + Sync),
) -> io::Result<Found> {
    let mut f = Found::default();
    let mut e = r.next;
    while e + ENTRY_HEADER <= r.end && f.entries < budget {
        let mut h = [0u8; ENTRY_HEADER as usize];
        read_at(e, &mut h)?;
        f.entry(&h);
        match next_entry(e, &h) {
            Some(n) => e = n,
            None => break,
        }
    }
    Ok(f)
}

/// Read the GPU code of the containers that start at `offsets` (file
/// offsets inside a fatbin section ending at `end`, as the wrappers beside
/// it say), all at once on all cores: each container's header and first
/// entry in one read, its other entries one read each. `Ok(None)` when no
/// offset holds a container.
pub fn read_containers(
    offsets: &[u64],
    end: u64,
    read_at: &(dyn Fn(u64, &mut [u8]) -> io::Result<()> + Sync),
    want: Option<&[(u32, u32)]>,
) -> io::Result<Option<GpuCode>> {
    if want.as_ref().is_some_and(|w| w.is_empty()) {
        return Ok(Some(Found::default().into_code(0, false)));
    }
    let offsets = &offsets[..offsets.len().min(MAX_CONTAINERS as usize)];
    let per_container = MAX_ENTRIES / (offsets.len() as u32).max(1);
    let one = |&at: &u64| -> io::Result<Option<Found>> {
        let first = CONTAINER_HEADER + ENTRY_HEADER;
        Ok(container_at(at, end, first, per_container, read_at)?.map(|(f, _)| f))
    };
    // Reading for some GPUs: batches of containers in file order, each
    // read at once, until what was read runs on all of them; else all.
    let batch = if want.is_some() {
        BATCH
    } else {
        offsets.len().max(1)
    };
    let mut all = Found::default();
    let mut containers = 0u32;
    for (n, chunk) in offsets.chunks(batch).enumerate() {
        let found = chunk
            .par_iter()
            .map(one)
            .collect::<io::Result<Vec<Option<Found>>>>()?;
        for f in found.into_iter().flatten() {
            containers += 1;
            all.merge(f);
        }
        let read_all = (n + 1) * batch >= offsets.len();
        if let Some(w) = want
            && !read_all
            && all.runs_on_all(w)
        {
            return Ok(Some(all.into_code(containers, false)));
        }
    }
    if containers == 0 {
        return Ok(None);
    }
    Ok(Some(all.into_code(containers, true)))
}

/// The next 8-aligned container magic within [`RESYNC_WINDOW`] after
/// `pos` (zero padding between containers), if any.
fn resync(
    pos: u64,
    end: u64,
    read_at: &(dyn Fn(u64, &mut [u8]) -> io::Result<()> + Sync),
) -> io::Result<Option<u64>> {
    let len = RESYNC_WINDOW.min(end - pos) as usize;
    let mut buf = vec![0u8; len];
    read_at(pos, &mut buf)?;
    Ok((8..len.saturating_sub(3))
        .step_by(8)
        .find(|&i| u32_at(&buf, i) == CONTAINER_MAGIC)
        .map(|i| pos + i as u64))
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Builders of fatbin sections for tests (here and in the preflight's).
#[cfg(test)]
pub(crate) mod build {
    /// One entry: kind (1 PTX, 2 ELF), SM, flags, PTX ISA (major, minor),
    /// payload bytes.
    pub struct Entry {
        pub kind: u16,
        pub sm: u32,
        pub flags: u64,
        pub isa: (u16, u16),
        pub payload: usize,
    }

    pub fn cubin(sm: u32) -> Entry {
        Entry {
            kind: 2,
            sm,
            flags: 0x11,
            isa: (0, 0),
            payload: 100,
        }
    }

    pub fn cubin_a(sm: u32) -> Entry {
        Entry {
            flags: 0x11 | 0x10_0000,
            ..cubin(sm)
        }
    }

    pub fn cubin_f(sm: u32) -> Entry {
        Entry {
            flags: 0x11 | 0x20_0000,
            ..cubin(sm)
        }
    }

    pub fn ptx(sm: u32, isa: (u16, u16)) -> Entry {
        Entry {
            kind: 1,
            sm,
            flags: 0x11,
            isa,
            payload: 300,
        }
    }

    /// A fatbin section: one container per slice of entries.
    pub fn section(containers: &[Vec<Entry>]) -> Vec<u8> {
        let mut out = Vec::new();
        for entries in containers {
            let mut body = Vec::new();
            for e in entries {
                let padded = e.payload.div_ceil(8) * 8;
                let mut h = vec![0u8; 64];
                h[0..2].copy_from_slice(&e.kind.to_le_bytes());
                h[2..4].copy_from_slice(&0x101u16.to_le_bytes());
                h[4..8].copy_from_slice(&64u32.to_le_bytes());
                h[8..12].copy_from_slice(&(padded as u32).to_le_bytes());
                h[0x10..0x14].copy_from_slice(&(e.payload as u32).to_le_bytes());
                h[0x18..0x1A].copy_from_slice(&e.isa.1.to_le_bytes());
                h[0x1A..0x1C].copy_from_slice(&e.isa.0.to_le_bytes());
                h[0x1C..0x20].copy_from_slice(&e.sm.to_le_bytes());
                h[0x28..0x30].copy_from_slice(&e.flags.to_le_bytes());
                body.extend(h);
                body.extend(std::iter::repeat_n(0xAB, padded));
            }
            out.extend(0xBA55_ED50u32.to_le_bytes());
            out.extend(1u16.to_le_bytes());
            out.extend(16u16.to_le_bytes());
            out.extend((body.len() as u64).to_le_bytes());
            out.extend(body);
            while out.len() % 8 != 0 {
                out.push(0);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    fn read(bytes: &[u8]) -> Option<GpuCode> {
        let reader = |off: u64, buf: &mut [u8]| -> io::Result<()> {
            let off = off as usize;
            let src = bytes
                .get(off..off + buf.len())
                .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            buf.copy_from_slice(src);
            Ok(())
        };
        read_fatbin(0, bytes.len() as u64, &reader, None).unwrap()
    }

    fn names(v: &[GpuArch]) -> Vec<String> {
        v.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn lists_cubins_and_ptx_of_every_container() {
        let s = section(&[
            vec![cubin(75), cubin(80), cubin_a(90), ptx(90, (8, 7))],
            vec![cubin(80), cubin_f(100), ptx(120, (9, 0))],
        ]);
        let code = read(&s).unwrap();
        assert_eq!(code.containers, 2);
        assert_eq!(names(&code.cubins), ["sm_75", "sm_80", "sm_90a", "sm_100f"]);
        assert_eq!(names(&code.ptx), ["sm_90", "sm_120"]);
        assert_eq!(code.ptx_isa, Some((9, 0)));
    }

    #[test]
    fn entries_past_the_first_window_are_read_too() {
        // Cubins of 100 KB: every entry header after the first lies past
        // the container's window.
        let big = |e: Entry| Entry {
            payload: 100 << 10,
            ..e
        };
        let s = section(&[
            vec![
                big(cubin(75)),
                big(cubin(80)),
                big(cubin_a(90)),
                ptx(90, (8, 7)),
            ],
            vec![big(cubin(86)), big(cubin_f(100))],
            vec![cubin(120)],
        ]);
        let code = read(&s).unwrap();
        assert_eq!(code.containers, 3);
        assert_eq!(
            names(&code.cubins),
            ["sm_75", "sm_80", "sm_86", "sm_90a", "sm_100f", "sm_120"]
        );
        assert_eq!(names(&code.ptx), ["sm_90"]);
    }

    #[test]
    fn containers_named_by_their_wrappers_are_read_at_once() {
        let big = |e: Entry| Entry {
            payload: 100 << 10,
            ..e
        };
        let one = section(&[vec![big(cubin(75)), big(cubin(80)), ptx(90, (8, 7))]]);
        let two = section(&[vec![big(cubin_a(90)), cubin(120)]]);
        let mut s = one.clone();
        s.extend(&two);
        let reader = |off: u64, buf: &mut [u8]| -> io::Result<()> {
            let off = off as usize;
            let src = s
                .get(off..off + buf.len())
                .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            buf.copy_from_slice(src);
            Ok(())
        };
        let end = s.len() as u64;
        let code = read_containers(&[0, one.len() as u64], end, &reader, None)
            .unwrap()
            .unwrap();
        assert_eq!(code.containers, 2);
        assert_eq!(names(&code.cubins), ["sm_75", "sm_80", "sm_90a", "sm_120"]);
        assert_eq!(names(&code.ptx), ["sm_90"]);
        assert_eq!(code, read(&s).unwrap(), "the same as the walk");
        // An offset that holds no container is skipped; none at all: None.
        let code = read_containers(&[8, one.len() as u64], end, &reader, None)
            .unwrap()
            .unwrap();
        assert_eq!(code.containers, 1);
        assert_eq!(read_containers(&[8], end, &reader, None).unwrap(), None);
        // Read for an A100 or an H100: one batch holds both containers. For
        // nothing, nothing is read.
        let a100 = read_containers(&[0, one.len() as u64], end, &reader, Some(&[(8, 0)]))
            .unwrap()
            .unwrap();
        // (both lie in one batch: read whole)
        assert_eq!((a100.containers, a100.complete), (2, true));
        assert!(a100.tells_about((8, 0)));
        let h100 = read_containers(&[0, one.len() as u64], end, &reader, Some(&[(9, 0)]))
            .unwrap()
            .unwrap();
        assert_eq!((h100.containers, h100.complete), (2, true));
        let none = read_containers(&[0], end, &reader, Some(&[]))
            .unwrap()
            .unwrap();
        assert_eq!((none.containers, none.complete), (0, false));
        // For a V100 nothing runs: every container is read.
        let v100 = read_containers(&[0, one.len() as u64], end, &reader, Some(&[(7, 0)]))
            .unwrap()
            .unwrap();
        assert_eq!((v100.containers, v100.complete), (2, true));
        // The walk stops the same way.
        let walk = read_fatbin(0, end, &reader, Some(&[(8, 6)]))
            .unwrap()
            .unwrap();
        assert_eq!((walk.containers, walk.complete), (1, false));
    }

    #[test]
    fn the_first_container_alone_tells_when_it_runs_on_every_gpu_wanted() {
        let s = section(&[vec![cubin(80), cubin(90)], vec![cubin(70)]]);
        let reader = |off: u64, buf: &mut [u8]| -> io::Result<()> {
            let off = off as usize;
            buf.copy_from_slice(&s[off..off + buf.len()]);
            Ok(())
        };
        let end = s.len() as u64;
        let h100 = read_first(0, end, &reader, &[(9, 0), (8, 6)])
            .unwrap()
            .unwrap();
        assert_eq!((h100.containers, h100.complete), (1, false));
        assert_eq!(
            read_first(0, end, &reader, &[(9, 0), (7, 0)]).unwrap(),
            None
        );
    }

    #[test]
    fn a_reading_for_some_gpus_stops_after_the_batch_that_runs_on_them() {
        // 40 containers: the first for sm_70 only, the sixth with sm_90.
        let mut containers: Vec<Vec<Entry>> = (0..40).map(|_| vec![cubin(75), cubin(80)]).collect();
        containers[0] = vec![cubin(70)];
        containers[5] = vec![cubin(80), cubin(90)];
        let mut s = Vec::new();
        let mut offsets = Vec::new();
        for c in containers {
            offsets.push(s.len() as u64);
            s.extend(section(&[c]));
        }
        let reader = |off: u64, buf: &mut [u8]| -> io::Result<()> {
            let off = off as usize;
            buf.copy_from_slice(&s[off..off + buf.len()]);
            Ok(())
        };
        let end = s.len() as u64;
        let h100 = read_containers(&offsets, end, &reader, Some(&[(9, 0)]))
            .unwrap()
            .unwrap();
        assert_eq!((h100.containers, h100.complete), (BATCH as u32, false));
        assert!(h100.tells_about((9, 0)));
        let v100 = read_containers(&offsets, end, &reader, Some(&[(7, 5)]))
            .unwrap()
            .unwrap();
        assert_eq!((v100.containers, v100.complete), (BATCH as u32, false));
        // A GPU nothing runs on: all 40 read, complete.
        let old = read_containers(&offsets, end, &reader, Some(&[(6, 0)]))
            .unwrap()
            .unwrap();
        assert_eq!((old.containers, old.complete), (40, true));
    }

    #[test]
    fn padding_between_containers_is_skipped() {
        let mut s = section(&[vec![cubin(80)]]);
        s.extend([0u8; 24]);
        s.extend(section(&[vec![cubin(90)]]));
        assert_eq!(names(&read(&s).unwrap().cubins), ["sm_80", "sm_90"]);
    }

    #[test]
    fn odd_sections_end_the_walk_without_failing() {
        assert_eq!(read(&[0u8; 64]), None);
        assert_eq!(read(&[]), None);
        // A container that claims more than the section holds.
        let mut s = section(&[vec![cubin(80)]]);
        s[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(read(&s).unwrap().cubins, vec![]);
        // An entry whose header size is 0 stops at that entry.
        let mut s = section(&[vec![cubin(80), cubin(90)]]);
        s[16 + 4..16 + 8].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(names(&read(&s).unwrap().cubins), ["sm_80"]);
        // A section cut short inside an entry header.
        let s = section(&[vec![cubin(80)]]);
        assert!(read(&s[..40]).unwrap().cubins.is_empty());
    }
}
