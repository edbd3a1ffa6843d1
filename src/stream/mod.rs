//! The stream of an apply: the files the generation adds or replaces, read
//! on the source into one tar stream, cut into 1 MiB blocks
//! ([`BLOCK`](crate::model::BLOCK)) and packed one by one — zstd, or stored
//! as is — behind a packing tag byte ([`TAG_STORED`], [`TAG_ZSTD`]). The
//! target decodes the blocks and unpacks the stream into the generation's
//! staging folder. The target hashes every file while it streams and
//! refuses one that is not what the plan hashed, so a file that changed
//! since the plan, or was damaged on the way, is caught without a second
//! pass; the source hashes only the files the plan did not (their hashes
//! go to the target with the end of the stream).
//!
//! Tar entries are named by their index in the generation's change list, and
//! the target writes each to `staging/<index>`: a name in the stream never
//! chooses where a file lands.
//!
//! The stream knows nothing of the protocol or the connection: the source
//! hands each packed block (tag and payload) to a [`BlockSink`], and the
//! target reads the tar stream from any [`Read`](std::io::Read) (a
//! [`ChannelReader`] of blocks decoded by [`unpack_block`]). The agent puts
//! the blocks in data frames and takes them out again.
//!
//! - [`send`] (source): read, check and hash the files into the tar
//!   stream, pack its blocks on every core, and hand them to the sink in
//!   order;
//! - `source_file`: a source file reached without a symlink and checked
//!   against the plan (the sender's and the local copy's);
//! - `read_ahead`: the page-cache read-ahead of the files the source's
//!   reader comes to next;
//! - `tune`: with [`Compression::Auto`](crate::model::Compression) the zstd
//!   level for the link, picked as the stream goes;
//! - [`unpack`] (target): parse the stream's headers (`head`), check every
//!   entry against the plan and stage it; [`check_staged`] checks a staging
//!   folder another agent filled (the direct route);
//! - `write`: the staged-file writer (`O_DIRECT` for big files, owners,
//!   modes, fsync threads);
//! - [`copy_local`] (target, the local route): no stream at all: the
//!   target's agent copies the files from a source venv on its own machine
//!   with the kernel's copy, checked as the sender and the unpacker check.
//!
//! The stream is pipelined end to end: on the source, one thread reads and
//! hashes, a compressor per core packs blocks, and a writer hands them to
//! the sink in order; on the target, one thread reads and decodes frames
//! (the agent's), another unpacks and hashes them into chunk buffers, a
//! writer writes the chunks, and fsyncs run beside all three. Neither side
//! holds more than a few tens of megabytes; the controller only relays
//! frames.
//!
//! The target trusts nothing in the stream; see `head` and `receive` for
//! what it refuses and how every staged file is created.

mod head;
mod local;
mod read_ahead;
mod receive;
mod send;
mod source_file;
pub mod testing;
mod tune;
mod write;

pub use head::{EntryHead, TAR_BLOCK, parse_head};
pub use local::copy_local;
pub use receive::{ChannelReader, Holds, check_staged, unpack, unpack_block};
pub use send::{TarWriter, send, send_tar};

/// The first byte of a packed block: stored as is.
pub const TAG_STORED: u8 = 0;
/// The first byte of a packed block: zstd-compressed.
pub const TAG_ZSTD: u8 = 1;

/// Where the source's packed blocks go, in order (the agent writes each as
/// a data frame on its connection).
pub trait BlockSink {
    /// One packed block: its packing tag ([`TAG_STORED`] or [`TAG_ZSTD`])
    /// and its payload.
    fn block(&mut self, tag: u8, payload: &[u8]) -> std::io::Result<()>;
    /// How far the stream is, every few blocks; ignored unless the sink
    /// reports progress.
    fn progress(&mut self, _progress: &crate::model::Progress) -> std::io::Result<()> {
        Ok(())
    }
    /// The blocks from here on are segment `index` of the stream (see
    /// [`send`]'s `cuts`); ignored unless the sink passes segments on.
    fn segment(&mut self, _index: usize) -> std::io::Result<()> {
        Ok(())
    }
    /// After the last block.
    fn flush(&mut self) -> std::io::Result<()>;
}
