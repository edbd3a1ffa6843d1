//! The stream's tar headers, as the target reads them: overlay's own
//! subset of ustar/GNU, parsed by hand ([`parse_head`]) so that nothing in
//! a header is trusted before it is checked — checksum, name (a change
//! index), type and size. Only regular files and symlinks are accepted: no
//! GNU long-name or PAX records, hard links, devices, FIFOs or directories,
//! each refused from its header before a byte after it is read. A
//! symlink's target is its entry's data (protocol 7: no long-link record is
//! ever needed), never the header's link name.

use crate::err;
use crate::error::Result;

/// One entry of the stream, as its 512-byte header declares it. The stream
/// is overlay's own: a ustar/GNU header per file, named by change index,
/// and nothing else — no long names, no PAX records, no links, devices or
/// directories. Anything else is refused from the header alone, before a
/// byte of what follows it is read.
#[derive(Debug, PartialEq, Eq)]
pub struct EntryHead {
    pub index: usize,
    /// A symlink (its target follows as the entry's data), or a regular file.
    pub symlink: bool,
    pub size: u64,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// The source file's modification time (whole seconds), which the
    /// staged file takes: a `.py` keeps the mtime its bytecode records.
    pub mtime: Option<u64>,
}

/// The size of a tar header and the unit entries are padded to.
pub const TAR_BLOCK: usize = 512;

/// A tar header's checksum: the sum of its 512 bytes, with the checksum
/// field itself counted as spaces.
pub(super) fn header_sum(block: &[u8]) -> u32 {
    block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                b as u32
            }
        })
        .sum()
}

/// Read the header in `block`: `Ok(None)` for a zero block, which ends a
/// sender's stream (another sender's may follow in the same stage).
pub fn parse_head(block: &[u8; TAR_BLOCK]) -> Result<Option<EntryHead>> {
    if block.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let bad = |what: String| {
        err!(
            kind = Protocol,
            hint = "the stream did not come from a compatible overlay source; nothing was switched, run `overlay apply` again",
            "Refused an entry of the stream: {what}"
        )
    };
    let h = tar::Header::from_byte_slice(block);
    if h.cksum().ok() != Some(header_sum(block)) {
        return Err(bad("its header's checksum is wrong".into()));
    }
    let symlink = match h.entry_type() {
        tar::EntryType::Regular => false,
        tar::EntryType::Symlink => true,
        other => {
            return Err(bad(format!(
                "type {:?} ({other:?}) is not a regular file or a symlink",
                other.as_byte() as char
            )));
        }
    };
    let name = &h.as_old().name;
    let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
    let index = std::str::from_utf8(name)
        .ok()
        .filter(|n| !n.is_empty() && n.len() <= 12 && n.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|n| n.parse::<usize>().ok())
        .ok_or_else(|| {
            bad(format!(
                "its name {:?} is not a change index",
                String::from_utf8_lossy(name)
            ))
        })?;
    // The link name is unused: a symlink's target comes as its data.
    if h.as_old().linkname[0] != 0 {
        return Err(bad(format!("entry {index} has a link name")));
    }
    let size = h
        .entry_size()
        .map_err(|_| bad(format!("entry {index} has no readable size")))?;
    let id = |v: std::io::Result<u64>| {
        v.ok()
            .and_then(|v| u32::try_from(v).ok())
            .filter(|&v| v != u32::MAX)
    };
    Ok(Some(EntryHead {
        index,
        symlink,
        size,
        uid: id(h.uid()),
        gid: id(h.gid()),
        mtime: h.mtime().ok(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::testing::{Intake, raw_header, staged_names};

    #[test]
    fn extensions_links_and_special_files_are_refused_from_the_header_alone() {
        let intake = Intake::new(&std::env::temp_dir(), false);
        // GNU long name/link, PAX, hard link, char/block device, directory,
        // FIFO, contiguous, sparse, volume label: each claims 512 MiB, none
        // has a body.
        for kind in [
            b'L', b'K', b'x', b'g', b'1', b'3', b'4', b'5', b'6', b'7', b'S', b'V',
        ] {
            let stream = raw_header("0", kind, 512 << 20);
            let e = intake
                .run_with(&stream, 512, |staging| {
                    assert!(staged_names(staging).is_empty());
                })
                .unwrap_err();
            assert!(
                e.message.contains("is not a regular file or a symlink"),
                "{}: {}",
                kind as char,
                e.message
            );
        }
    }

    #[test]
    fn malformed_headers_are_refused() {
        let intake = Intake::new(&std::env::temp_dir(), false);
        let mut bad_sum = raw_header("0", b'0', 10);
        bad_sum[0] = b'1';
        let mut link_name = raw_header("1", b'2', 4);
        link_name[157] = b'a';
        let sum = header_sum(&link_name);
        link_name[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        for (stream, says) in [
            (bad_sum, "checksum"),
            (raw_header("../x", b'0', 10), "not a change index"),
            (raw_header("1e3", b'0', 10), "not a change index"),
            (raw_header("99", b'0', 10), "unexpected entry 99"),
            (raw_header("1", b'0', 4), "arrived as a regular file"),
            (link_name, "has a link name"),
        ] {
            let e = intake.run(&stream).unwrap_err();
            assert!(e.message.contains(says), "{says}: {}", e.message);
        }
    }
}
