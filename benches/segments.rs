//! What cutting a shared stream into segments costs (issue 32, "measure
//! both"): the real stack's source files streamed by `stream::send` at
//! zstd level 3, not cut, cut where the targets' needs diverge (a few
//! segments), and cut before every entry (a frame boundary per entry, the
//! alternative), counting the bytes that would go on the wire.
//!
//!     cargo bench --bench segments -- [VENV] [SEGMENTS]
//!
//! VENV defaults to the real stack's source (`benches/realstack.py`);
//! SEGMENTS (default 4) is how many even cuts stand for targets whose
//! needs differ. Files go in site-packages path order; nothing is hashed.

use std::time::Instant;

use overlay::inventory::Counters;
use overlay::model::{Compression, Kind, SendFile};
use overlay::stream::{BlockSink, send};

/// Counts what the sink is handed.
#[derive(Default)]
struct Count {
    blocks: u64,
    bytes: u64,
    marks: u64,
}

impl BlockSink for Count {
    fn block(&mut self, _tag: u8, payload: &[u8]) -> std::io::Result<()> {
        self.blocks += 1;
        // A data frame: its length, its tag, its payload.
        self.bytes += 4 + 1 + payload.len() as u64;
        Ok(())
    }
    fn segment(&mut self, _index: usize) -> std::io::Result<()> {
        self.marks += 1;
        Ok(())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let venv = args
        .first()
        .cloned()
        .unwrap_or_else(|| "/work/realstack/venvs/source".into());
    let segments: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4);
    let site = walkdir::WalkDir::new(format!("{venv}/lib"))
        .max_depth(2)
        .into_iter()
        .filter_map(|e| e.ok())
        .find(|e| e.file_name() == "site-packages")
        .expect("a venv with lib/pythonX.Y/site-packages")
        .into_path();
    let mut files: Vec<SendFile> = walkdir::WalkDir::new(&site)
        .sort_by_file_name()
        .into_iter()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_file())
        .map(|e| {
            let meta = e.metadata().unwrap();
            let path = e.path().strip_prefix(&site).unwrap();
            SendFile {
                index: 0,
                path: path.to_string_lossy().into_owned(),
                kind: Kind::File {
                    size: meta.len(),
                    mode: std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
                    // A hash the receiver would check: the sender neither hashes nor
                    // checks it.
                    blake3: Some("-".into()),
                    stamp: None,
                },
            }
        })
        .collect();
    for (i, f) in files.iter_mut().enumerate() {
        f.index = i;
    }
    let n = files.len();
    let raw: u64 = files.iter().map(|f| f.kind.size()).sum();
    println!("{n} files, {raw} bytes, from {}", site.display());
    let even: Vec<usize> = (0..segments).map(|k| k * n / segments).collect();
    let every: Vec<usize> = (0..n).collect();
    let mut whole = 0u64;
    for (name, cuts) in [
        ("not cut", Vec::new()),
        ("segments", even),
        ("every entry", every),
    ] {
        let mut sink = Count::default();
        let t = Instant::now();
        let counters = Counters::default();
        send(
            &venv,
            &files,
            &cuts,
            None,
            Compression::Zstd(3),
            &mut sink,
            &counters,
        )
        .unwrap_or_else(|e| panic!("send: {e}"));
        if whole == 0 {
            whole = sink.bytes;
        }
        println!(
            "{name:>12}: {} frames, {} marks, {} bytes on the wire ({:.4}x not cut), {:.1} s",
            sink.blocks,
            sink.marks,
            sink.bytes,
            sink.bytes as f64 / whole as f64,
            t.elapsed().as_secs_f64()
        );
    }
}
