//! ELF damage: a shared object cut short (a half-finished copy). Only the
//! ELF header and the program header table are read: a `PT_LOAD` segment
//! whose file part (`p_offset + p_filesz`) ends past the end of the file
//! would be mapped beyond it, and touching that page is a SIGBUS.

use std::fs::File;
use std::os::unix::fs::FileExt;

use object::LittleEndian;
use object::elf as oelf;
use object::read::elf::{FileHeader, ProgramHeader};

type Header = oelf::FileHeader64<LittleEndian>;
const ENDIAN: LittleEndian = LittleEndian;

/// Largest program header table read (real ones are a few hundred bytes).
const MAX_PHDRS: u64 = 1 << 20;

/// Why the ELF `file` is damaged, if it is; `None` for an intact object,
/// a file that is not a 64-bit little-endian ELF, or one that cannot be
/// read (the RECORD check reports those).
pub fn damage(file: &File) -> Option<String> {
    let len = file.metadata().ok()?.len();
    let mut head = [0u8; 64];
    let n = file.read_at(&mut head, 0).ok()?;
    if n < 4 || head[..4] != oelf::ELFMAG {
        return None;
    }
    if n < 64 {
        return Some(format!("cut short: {len} bytes, less than an ELF header"));
    }
    if head[4] != oelf::ELFCLASS64.0 || head[5] != oelf::ELFDATA2LSB.0 {
        return None;
    }
    let header = Header::parse(&head[..]).ok()?;
    let phoff = header.e_phoff(ENDIAN);
    let phsize = u64::from(header.e_phnum(ENDIAN)) * u64::from(header.e_phentsize(ENDIAN));
    if phsize == 0 {
        return None;
    }
    if phsize > MAX_PHDRS {
        return Some(format!(
            "{phsize} bytes of program headers: not a sane ELF file"
        ));
    }
    let Some(end) = phoff.checked_add(phsize).filter(|e| *e <= len) else {
        return Some(format!(
            "cut short: its program headers end at byte {}, the file has {len}",
            phoff.saturating_add(phsize)
        ));
    };
    // The header and the table, read as one buffer the parser can index.
    let mut data = vec![0u8; end as usize];
    file.read_exact_at(&mut data, 0).ok()?;
    let header = Header::parse(&data[..]).ok()?;
    let phdrs = header.program_headers(ENDIAN, &data[..]).ok()?;
    let past = phdrs
        .iter()
        .filter(|p| p.p_type(ENDIAN) == oelf::PT_LOAD)
        .map(|p| p.p_offset(ENDIAN).saturating_add(p.p_filesz(ENDIAN)))
        .max()?;
    (past > len).then(|| {
        format!("cut short: its segments need {past} bytes, the file has {len} (a truncated copy)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_object_is_damaged_and_a_whole_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        // This test binary is a whole ELF file.
        let me = std::env::current_exe().unwrap();
        let open = |p: &std::path::Path| File::open(p).unwrap();
        assert_eq!(damage(&open(&me)), None);
        let bytes = std::fs::read(&me).unwrap();
        let cut = dir.path().join("cut.so");
        // Past the program headers, short of the first segment's end.
        std::fs::write(&cut, &bytes[..2000]).unwrap();
        let why = damage(&open(&cut)).expect("damaged");
        assert!(why.contains("truncated copy"), "{why}");
        let tiny = dir.path().join("tiny.so");
        std::fs::write(&tiny, &bytes[..20]).unwrap();
        assert!(
            damage(&open(&tiny))
                .unwrap()
                .contains("less than an ELF header")
        );
        let text = dir.path().join("a.py");
        std::fs::write(&text, b"print(1)\n").unwrap();
        assert_eq!(damage(&open(&text)), None);
    }
}
