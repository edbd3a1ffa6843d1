//! A reader of an opened bundle by positional reads ([`At`]): every
//! reader of a [`super::Bundle`] reads the file that was checked when it
//! was opened, whatever its path names since.

use std::fs::File;
use std::io::{self, Read};
use std::sync::Arc;

/// The file from `pos` on.
pub(super) struct At {
    file: Arc<File>,
    pos: u64,
}

impl At {
    pub(super) fn new(file: Arc<File>) -> At {
        At { file, pos: 0 }
    }
}

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}
