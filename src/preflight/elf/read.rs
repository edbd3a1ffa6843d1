//! Reading the dynamic facts ([`ElfInfo`]) of one 64-bit little-endian ELF
//! file with the `object` crate. Only the ELF header, the section headers and
//! the dynamic sections (`.dynamic`, `.dynsym`, the GNU version sections and
//! the string tables they link to) are read from disk, through [`Sparse`], so
//! a 1 GB `libtorch_cuda.so` costs a few megabytes; of its GPU code, only
//! the section names and the fatbin's headers (`fatbin`).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use object::LittleEndian;
use object::elf as oelf;
use object::read::elf::{FileHeader, SectionHeader as _, SectionTable, Sym as _};
use object::read::{ReadRef, StringTable, SymbolIndex};

use super::{ElfInfo, Symbol};
use crate::model::defined_keys;

type Header = oelf::FileHeader64<LittleEndian>;
type Sections<'a> = SectionTable<'a, Header, &'a Sparse>;
const ENDIAN: LittleEndian = LittleEndian;

/// Parse `path`; `Ok(None)` if it is not a 64-bit little-endian ELF (or not
/// ELF at all, or not a regular file). A malformed ELF is an
/// `io::ErrorKind::InvalidData` error.
pub fn read_elf(path: &Path) -> io::Result<Option<ElfInfo>> {
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.len() < 64 {
        return Ok(None);
    }
    let mut header = vec![0u8; 64];
    file.read_exact_at(&mut header, 0)?;
    if header[..4] != oelf::ELFMAG
        || header[4] != oelf::ELFCLASS64.0
        || header[5] != oelf::ELFDATA2LSB.0
    {
        return Ok(None);
    }
    let data = Sparse {
        len: meta.len(),
        regions: vec![Region {
            offset: 0,
            bytes: header,
        }],
    };
    let code = super::fatbin::reads_code_of(path);
    parse_elf(&file, data, code).map(Some).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

/// Bytes read from a file at an offset.
struct Region {
    offset: u64,
    bytes: Vec<u8>,
}

/// A range of a file still to be read.
struct Extent {
    offset: u64,
    size: u64,
}

/// The parts of a file that were read, at their offsets. Implements
/// `object`'s `ReadRef` so that its ELF parsers work on a file of which only
/// the headers and the dynamic sections are in memory.
struct Sparse {
    len: u64,
    regions: Vec<Region>,
}

impl Sparse {
    /// Read `size` bytes at `offset` from `file` unless already present.
    fn add(&mut self, file: &File, offset: u64, size: u64) -> Result<(), String> {
        if size == 0 || (&*self).read_bytes_at(offset, size).is_ok() {
            return Ok(());
        }
        match offset.checked_add(size) {
            Some(end) if end <= self.len => {}
            _ => return Err(format!("range {offset:#x}+{size:#x} beyond end of file")),
        }
        let mut buf = vec![0u8; size as usize];
        file.read_exact_at(&mut buf, offset)
            .map_err(|e| e.to_string())?;
        self.regions.push(Region { offset, bytes: buf });
        Ok(())
    }
}

impl<'a> ReadRef<'a> for &'a Sparse {
    fn len(self) -> Result<u64, ()> {
        Ok(self.len)
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        if size == 0 {
            return Ok(&[]);
        }
        let end = offset.checked_add(size).ok_or(())?;
        self.regions
            .iter()
            .find_map(|r| {
                let rel = offset.checked_sub(r.offset)? as usize;
                let rel_end = (end - r.offset) as usize;
                r.bytes.get(rel..rel_end)
            })
            .ok_or(())
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        let r = self
            .regions
            .iter()
            .find(|r| range.start >= r.offset && range.start - r.offset < r.bytes.len() as u64)
            .ok_or(())?;
        let rel = (range.start - r.offset) as usize;
        let stop = (range.end.saturating_sub(r.offset) as usize).min(r.bytes.len());
        let hay = r.bytes.get(rel..stop).ok_or(())?;
        let n = hay.iter().position(|&b| b == delimiter).ok_or(())?;
        Ok(&hay[..n])
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn err(e: object::read::Error) -> String {
    e.to_string()
}

/// `code`: read the GPU code of a `.nv_fatbin` section; without it, a
/// section is noted as not read (no container, not complete: it tells
/// about no GPU, see [`super::fatbin::reads_code_of`]).
fn parse_elf(file: &File, mut data: Sparse, code: bool) -> Result<ElfInfo, String> {
    if !read_section_headers(file, &mut data)? {
        return Ok(ElfInfo::default());
    }
    for extent in dynamic_extents(&data)? {
        data.add(file, extent.offset, extent.size)?;
    }

    let fatbin = fatbin_section(file, &mut data)?;
    let h = Header::parse(&data).map_err(err)?;
    let headers = h.section_headers(ENDIAN, &data).map_err(err)?;
    let sections: Sections<'_> = SectionTable::new(headers, StringTable::default());
    let mut info = ElfInfo::default();
    if fatbin.is_some() && !code {
        info.gpu = Some(crate::model::GpuCode::default());
    } else if let Some(fat) = fatbin {
        // Small reads far apart: no read-ahead of the kernels between them.
        let _ = rustix::fs::fadvise(
            file,
            fat.offset,
            std::num::NonZeroU64::new(fat.size),
            rustix::fs::Advice::Random,
        );
        let read_at = |at: u64, buf: &mut [u8]| file.read_exact_at(buf, at);
        let end = fat.offset + fat.size;
        let want = super::fatbin::wanted();
        let want = want.as_deref();
        let first = match want {
            // For some GPUs: the first container may tell already.
            Some(w) if !w.is_empty() => {
                super::fatbin::read_first(fat.offset, fat.size, &read_at, w)
            }
            _ => Ok(None),
        };
        info.gpu = match first {
            Ok(Some(code)) => Ok(Some(code)),
            Err(e) => Err(e),
            Ok(None) => match container_offsets(file, &fat) {
                Some(offsets) => super::fatbin::read_containers(&offsets, end, &read_at, want),
                None => super::fatbin::read_fatbin(fat.offset, fat.size, &read_at, want),
            },
        }
        .map_err(|e| format!("the .nv_fatbin section cannot be read: {e}"))?;
    }
    read_dynamic(&sections, &data, &mut info)?;
    read_version_needs(&sections, &data, &mut info)?;
    read_version_defs(&sections, &data, &mut info)?;
    read_symbols(&sections, &data, &mut info)?;
    Ok(info)
}

/// Read the section headers into `data` (the first one may carry an
/// extended `e_shnum`); `false` if the file has none.
fn read_section_headers(file: &File, data: &mut Sparse) -> Result<bool, String> {
    let (shoff, shentsize) = {
        let h = Header::parse(&*data).map_err(err)?;
        (h.e_shoff(ENDIAN), h.e_shentsize(ENDIAN))
    };
    if shoff == 0 {
        return Ok(false);
    }
    if shentsize as usize != std::mem::size_of::<oelf::SectionHeader64<LittleEndian>>() {
        return Err("unexpected section header size".into());
    }
    data.add(file, shoff, shentsize.into())?;
    let shnum = Header::parse(&*data)
        .map_err(err)?
        .shnum(ENDIAN, &*data)
        .map_err(err)?;
    data.add(file, shoff, u64::from(shnum) * u64::from(shentsize))?;
    Ok(true)
}

/// Where an object's GPU code lies: its fatbin section, and what says
/// where each container starts.
struct FatbinSections {
    /// `.nv_fatbin` (`__nv_relfatbin` in an object built with `-rdc`).
    offset: u64,
    size: u64,
    addr: u64,
    /// `.nvFatBinSegment`: one 24-byte wrapper per container (magic
    /// `0x466243B1`, version, the container's address, a pointer), as
    /// nvcc writes one per translation unit: (offset, size, address).
    wrappers: Option<(u64, u64, u64)>,
    /// The `SHT_RELA` sections (offset, size): in a shared object the
    /// wrappers' addresses are relocations (`R_X86_64_RELATIVE`), their
    /// addends the addresses.
    rela: Vec<(u64, u64)>,
}

/// The fatbin's sections, if the object has GPU code. Reads the section
/// names.
fn fatbin_section(file: &File, data: &mut Sparse) -> Result<Option<FatbinSections>, String> {
    let names = {
        let h = Header::parse(&*data).map_err(err)?;
        let index = h.shstrndx(ENDIAN, &*data).map_err(err)?;
        let headers = h.section_headers(ENDIAN, &*data).map_err(err)?;
        match headers.get(index as usize) {
            Some(s) if index != 0 && s.sh_type(ENDIAN) != oelf::SHT_NOBITS => {
                (s.sh_offset(ENDIAN), s.sh_size(ENDIAN))
            }
            _ => return Ok(None),
        }
    };
    data.add(file, names.0, names.1)?;
    let h = Header::parse(&*data).map_err(err)?;
    let headers = h.section_headers(ENDIAN, &*data).map_err(err)?;
    let strings = StringTable::new(&*data, names.0, names.0 + names.1);
    let mut fat: Option<FatbinSections> = None;
    let mut wrappers = None;
    let mut rela = Vec::new();
    for s in headers {
        let Ok(name) = s.name(ENDIAN, strings) else {
            continue;
        };
        let (t, offset, size, addr) = (
            s.sh_type(ENDIAN),
            s.sh_offset(ENDIAN),
            s.sh_size(ENDIAN),
            s.sh_addr(ENDIAN),
        );
        if t == oelf::SHT_NOBITS || size == 0 {
            continue;
        }
        if (name == b".nv_fatbin" || name == b"__nv_relfatbin") && fat.is_none() {
            fat = Some(FatbinSections {
                offset,
                size,
                addr,
                wrappers: None,
                rela: Vec::new(),
            });
        } else if name == b".nvFatBinSegment" {
            wrappers = Some((offset, size, addr));
        } else if t == oelf::SHT_RELA {
            rela.push((offset, size));
        }
    }
    Ok(fat.map(|f| FatbinSections {
        wrappers,
        rela,
        ..f
    }))
}

/// The wrappers' section and the relocations read at most: bounds on
/// what a hostile object can make the reader allocate.
const MAX_WRAPPERS_BYTES: u64 = 1 << 20;
const MAX_RELA_BYTES: u64 = 64 << 20;
const WRAPPER_MAGIC: u32 = 0x4662_43B1;
const R_X86_64_RELATIVE: u32 = 8;

/// Where each fatbin container starts (file offsets), from the wrappers
/// nvcc writes beside them: so all containers can be read at once instead
/// of one after another. `None` when the object has no wrappers, or one
/// cannot be resolved to a place in the fatbin section (the containers are
/// then walked one after another).
fn container_offsets(file: &File, fat: &FatbinSections) -> Option<Vec<u64>> {
    let (w_off, w_size, w_addr) = fat.wrappers?;
    if w_size > MAX_WRAPPERS_BYTES || w_size % 24 != 0 {
        return None;
    }
    let mut raw = vec![0u8; w_size as usize];
    file.read_exact_at(&mut raw, w_off).ok()?;
    let mut addrs: Vec<u64> = Vec::new();
    // Wrapper fields whose address is a relocation: field address -> slot.
    let mut pending: std::collections::HashSet<u64> = std::collections::HashSet::new();
    for (i, w) in raw.chunks_exact(24).enumerate() {
        if u32::from_le_bytes(w[0..4].try_into().ok()?) != WRAPPER_MAGIC {
            return None;
        }
        match u64::from_le_bytes(w[8..16].try_into().ok()?) {
            0 => {
                pending.insert(w_addr + 24 * i as u64 + 8);
            }
            a => addrs.push(a),
        }
    }
    if !pending.is_empty() {
        let total: u64 = fat.rela.iter().map(|r| r.1).sum();
        if total > MAX_RELA_BYTES {
            return None;
        }
        for &(off, size) in &fat.rela {
            let mut buf = vec![0u8; size as usize];
            file.read_exact_at(&mut buf, off).ok()?;
            for r in buf.chunks_exact(24) {
                let r_offset = u64::from_le_bytes(r[0..8].try_into().ok()?);
                let r_type = u64::from_le_bytes(r[8..16].try_into().ok()?) as u32;
                if r_type == R_X86_64_RELATIVE && pending.remove(&r_offset) {
                    addrs.push(u64::from_le_bytes(r[16..24].try_into().ok()?));
                }
            }
        }
        if !pending.is_empty() {
            return None;
        }
    }
    let mut offsets: Vec<u64> = addrs
        .into_iter()
        .map(|a| {
            a.checked_sub(fat.addr)
                .filter(|rel| *rel < fat.size)
                .map(|rel| fat.offset + rel)
        })
        .collect::<Option<Vec<u64>>>()?;
    offsets.sort_unstable();
    offsets.dedup();
    (!offsets.is_empty()).then_some(offsets)
}

/// Where the dynamic sections and the string tables they link to lie.
fn dynamic_extents(data: &Sparse) -> Result<Vec<Extent>, String> {
    let h = Header::parse(data).map_err(err)?;
    let headers = h.section_headers(ENDIAN, data).map_err(err)?;
    let extent = |s: &oelf::SectionHeader64<LittleEndian>| Extent {
        offset: s.sh_offset(ENDIAN),
        size: s.sh_size(ENDIAN),
    };
    let mut wanted = Vec::new();
    for s in headers {
        let t = s.sh_type(ENDIAN);
        if [
            oelf::SHT_DYNAMIC,
            oelf::SHT_DYNSYM,
            oelf::SHT_GNU_VERSYM,
            oelf::SHT_GNU_VERDEF,
            oelf::SHT_GNU_VERNEED,
        ]
        .contains(&t)
        {
            wanted.push(extent(s));
            if let Some(linked) = headers.get(s.sh_link(ENDIAN) as usize)
                && linked.sh_type(ENDIAN) != oelf::SHT_NOBITS
            {
                wanted.push(extent(linked));
            }
        }
    }
    Ok(wanted)
}

/// `DT_NEEDED`, `DT_SONAME`, `DT_RPATH` and `DT_RUNPATH`.
fn read_dynamic<'a>(
    sections: &Sections<'a>,
    data: &'a Sparse,
    info: &mut ElfInfo,
) -> Result<(), String> {
    let dynamic = sections.dynamic_table(ENDIAN, data).map_err(err)?;
    for d in dynamic.iter() {
        let split = |v: &[u8]| -> Vec<String> {
            text(v)
                .split(':')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        match d.tag {
            oelf::DT_NEEDED => info.needed.push(text(dynamic.string(d).map_err(err)?)),
            oelf::DT_SONAME => info.soname = Some(text(dynamic.string(d).map_err(err)?)),
            oelf::DT_RPATH => info.rpath.extend(split(dynamic.string(d).map_err(err)?)),
            oelf::DT_RUNPATH => info.runpath.extend(split(dynamic.string(d).map_err(err)?)),
            _ => {}
        }
    }
    Ok(())
}

/// `.gnu.version_r`: the (file, version) needs, weak ones excluded.
fn read_version_needs<'a>(
    sections: &Sections<'a>,
    data: &'a Sparse,
    info: &mut ElfInfo,
) -> Result<(), String> {
    let Some((mut needs, link)) = sections.gnu_verneed(ENDIAN, data).map_err(err)? else {
        return Ok(());
    };
    let strings = sections.strings(ENDIAN, data, link).map_err(err)?;
    while let Some((need, mut auxs)) = needs.next().map_err(err)? {
        let file = text(need.file(ENDIAN, strings).map_err(err)?);
        while let Some(aux) = auxs.next().map_err(err)? {
            if aux.vna_flags.get(ENDIAN).contains(oelf::VER_FLG_WEAK) {
                continue;
            }
            info.version_needs
                .push((file.clone(), text(aux.name(ENDIAN, strings).map_err(err)?)));
        }
    }
    Ok(())
}

/// `.gnu.version_d`: the versions defined, the base (file name) excluded.
fn read_version_defs<'a>(
    sections: &Sections<'a>,
    data: &'a Sparse,
    info: &mut ElfInfo,
) -> Result<(), String> {
    let Some((mut defs, link)) = sections.gnu_verdef(ENDIAN, data).map_err(err)? else {
        return Ok(());
    };
    let strings = sections.strings(ENDIAN, data, link).map_err(err)?;
    while let Some((def, mut auxs)) = defs.next().map_err(err)? {
        if def.vd_flags.get(ENDIAN).contains(oelf::VER_FLG_BASE) {
            continue;
        }
        if let Some(aux) = auxs.next().map_err(err)? {
            info.version_defs
                .push(text(aux.name(ENDIAN, strings).map_err(err)?));
        }
    }
    Ok(())
}

/// `.dynsym`: the global and weak symbols, defined or undefined, with their
/// versions.
fn read_symbols<'a>(
    sections: &Sections<'a>,
    data: &'a Sparse,
    info: &mut ElfInfo,
) -> Result<(), String> {
    let symbols = sections
        .symbols(ENDIAN, data, oelf::SHT_DYNSYM)
        .map_err(err)?;
    let versions = sections.versions(ENDIAN, data).map_err(err)?;
    let mut defined = Vec::new();
    for (i, sym) in symbols.symbols().iter().enumerate().skip(1) {
        let bind = sym.st_bind();
        let kind = sym.st_type();
        if bind == oelf::STB_LOCAL || kind == oelf::STT_SECTION || kind == oelf::STT_FILE {
            continue;
        }
        let name = sym.name(ENDIAN, symbols.strings()).map_err(err)?;
        if name.is_empty() {
            continue;
        }
        let version = versions.as_ref().and_then(|v| {
            let index = v.version_index(ENDIAN, SymbolIndex(i)).index();
            v.version(index).ok().flatten().map(|v| v.name())
        });
        if sym.is_undefined(ENDIAN) {
            info.undefined.push(Symbol {
                name: text(name),
                version: version.map(text),
                weak: bind == oelf::STB_WEAK,
            });
        } else {
            // Defined: only its keys are kept (see `ElfInfo::defined`).
            let name = String::from_utf8_lossy(name);
            if name.starts_with("PyInit_") {
                info.inits.push(name.clone().into_owned());
            }
            defined.push((name, version.map(String::from_utf8_lossy)));
        }
    }
    info.defined = defined_keys(defined.iter().map(|(n, v)| (n.as_ref(), v.as_deref())));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::elf::testutil::{BaseAndUser, base_and_user};
    use std::fs;

    /// C source of `.nv_fatbin` arrays with a `.nvFatBinSegment` wrapper
    /// each (as nvcc writes them), and an unwrapped array between them.
    fn fatbin_object_c(containers: &[Vec<u8>], between: &[u8]) -> String {
        let array = |name: &str, bytes: &[u8]| {
            let list: Vec<String> = bytes.iter().map(|b| b.to_string()).collect();
            format!(
                "__attribute__((section(\".nv_fatbin\"), used, aligned(8))) static const unsigned char {name}[{}] = {{{}}};\n",
                bytes.len(),
                list.join(",")
            )
        };
        let mut c =
            String::from("struct w { int magic; int version; const void *data; void *unused; };\n");
        for (i, bytes) in containers.iter().enumerate() {
            c += &array(&format!("fatbin{i}"), bytes);
            c += &format!(
                "__attribute__((section(\".nvFatBinSegment\"), used, aligned(8))) static const struct w wrapper{i} = {{0x466243b1, 1, fatbin{i}, 0}};\n"
            );
            if i == 0 {
                c += &array("junk", between);
            }
        }
        c
    }

    #[test]
    fn gpu_code_is_read_from_the_containers_the_wrappers_name() {
        use crate::preflight::elf::fatbin::build::{cubin, cubin_a, ptx, section};
        use crate::preflight::elf::testutil::cc;
        let t = tempfile::tempdir().unwrap();
        let one = section(&[vec![cubin(75), cubin(80), ptx(90, (8, 7))]]);
        let two = section(&[vec![cubin_a(90), cubin(120)]]);
        // 8 KiB of bytes that are no container between them: a walk from
        // the first container cannot find the second.
        let junk = vec![0x5Au8; 8192];
        let so = cc(
            t.path(),
            "libk.so",
            &fatbin_object_c(&[one, two], &junk),
            false,
            &[],
        );
        let gpu = read_elf(&so).unwrap().unwrap().gpu.expect("GPU code");
        assert_eq!(gpu.containers, 2, "{gpu:?}");
        let names: Vec<String> = gpu.cubins.iter().map(|a| a.to_string()).collect();
        assert_eq!(names, ["sm_75", "sm_80", "sm_90a", "sm_120"]);
        assert_eq!(gpu.ptx_isa, Some((8, 7)));
        // Without wrappers the containers are walked: what follows junk is lost.
        let so = cc(
            t.path(),
            "libplain.so",
            &format!(
                "__attribute__((section(\".nv_fatbin\"), used, aligned(8))) static const unsigned char f[{}] = {{{}}};\n",
                section(&[vec![cubin(86), cubin(89)]]).len(),
                section(&[vec![cubin(86), cubin(89)]])
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            false,
            &[],
        );
        let gpu = read_elf(&so).unwrap().unwrap().gpu.expect("GPU code");
        assert_eq!(gpu.containers, 1);
        assert_eq!(gpu.cubins.len(), 2);
    }

    #[test]
    fn read_elf_facts() {
        let t = tempfile::tempdir().unwrap();
        let BaseAndUser { base, user } = base_and_user(t.path());
        let b = read_elf(&base).unwrap().unwrap();
        assert_eq!(b.soname.as_deref(), Some("libbase.so.1"));
        assert!(b.defines("base", None));
        assert!(b.defined.is_sorted());
        let u = read_elf(&user).unwrap().unwrap();
        assert_eq!(u.rpath, vec!["$ORIGIN/deps".to_owned()]);
        assert!(u.runpath.is_empty());
        assert!(u.needed.contains(&"libbase.so.1".to_owned()));
        assert!(u.needed.contains(&"libc.so.6".to_owned()));
        assert!(
            u.version_needs
                .iter()
                .any(|(f, v)| f == "libc.so.6" && v.starts_with("GLIBC_2."))
        );
        assert!(u.undefined.iter().any(|s| s.name == "base" && !s.weak));
        assert!(
            u.undefined
                .iter()
                .any(|s| s.name == "printf" && s.version.as_deref().is_some())
        );
        // gcc's weak references (__cxa_finalize, _ITM_*, __gmon_start__).
        assert!(u.undefined.iter().any(|s| s.weak));
        let libc = read_elf(Path::new("/lib/x86_64-linux-gnu/libc.so.6"))
            .unwrap()
            .unwrap();
        assert!(libc.version_defs.contains(&"GLIBC_2.34".to_owned()));
        assert!(libc.defines("printf", Some("GLIBC_2.2.5")));
        assert!(libc.defines("printf", None));
        assert!(!libc.defines("printf", Some("GLIBC_9.99")));
    }

    #[test]
    fn non_elf_is_none() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("notes.txt");
        fs::write(
            &p,
            "just some text, long enough to pass the 64 byte header length check....",
        )
        .unwrap();
        assert_eq!(read_elf(&p).unwrap(), None);
        let short = t.path().join("short");
        fs::write(&short, "\x7fELF").unwrap();
        assert_eq!(read_elf(&short).unwrap(), None);
        assert_eq!(read_elf(t.path()).unwrap(), None);
    }
}
