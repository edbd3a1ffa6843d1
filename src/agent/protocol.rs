//! The controller–agent protocol: versioned, length-prefixed JSON frames on
//! the agent's stdin/stdout.
//!
//! Each frame is a little-endian `u32` byte length followed by one JSON value.
//! The controller speaks first with [`Request::Hello`]; the agent answers with
//! its own protocol number, and either side refuses a mismatch. Requests are
//! answered in order; long requests send [`Response::Progress`] frames before
//! their result. Paths in requests are data, never parts of a command line.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::err;
use crate::error::{Error, Result};

/// Bumped whenever a frame changes shape.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest frame accepted (a listing of a very large venv fits easily).
const MAX_FRAME: usize = 1 << 30;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    Hello {
        protocol: u32,
    },
    /// List the venv's interpreter, site-packages, distributions and the
    /// files matching `file_globs` (relative to site-packages).
    Scan {
        venv: String,
        file_globs: Vec<String>,
    },
    /// Describe `paths` (relative to site-packages): type, size, mode, and
    /// with `hash` their sha256. `shebang` rewrites script interpreters before
    /// hashing; `pycache` lists each `.py` file's compiled bytecode.
    Stat {
        venv: String,
        paths: Vec<String>,
        hash: bool,
        shebang: Option<ShebangRewrite>,
        pycache: bool,
    },
    Bye,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    Hello { protocol: u32, version: String },
    Scan(ScanReport),
    Progress(Progress),
    Stat { entries: Vec<Entry> },
    Error(Error),
    Bye,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Progress {
    pub files: u64,
    pub bytes: u64,
    pub total_files: u64,
    pub total_bytes: u64,
}

/// Replace `#!{from}/bin/` with `#!{to}/bin/` on the first line of scripts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShebangRewrite {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanReport {
    pub venv: String,
    /// site-packages relative to the venv, e.g. `lib/python3.11/site-packages`.
    pub site_packages: String,
    /// Interpreter `major.minor`, e.g. `3.11`.
    pub python: String,
    pub dists: Vec<Dist>,
    /// For each requested file glob, in request order, the matching paths.
    pub globs: Vec<Vec<String>>,
}

/// One installed distribution (a `*.dist-info` directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dist {
    pub name: String,
    /// PEP 503-normalized name.
    pub normalized: String,
    pub version: String,
    /// The true build, e.g. `2.11.0+cu130` from `torch/version.py`, when it
    /// says more than the dist-info's version.
    pub build: Option<String>,
    /// The dist-info directory, relative to site-packages.
    pub dist_info: String,
    /// Paths relative to site-packages: RECORD's entries (without
    /// `__pycache__`) plus every file inside the dist-info directory.
    pub files: Vec<String>,
    /// Why RECORD or METADATA could not be read, if so.
    pub problem: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub path: String,
    pub kind: Kind,
    /// Compiled bytecode of a `.py` file (`__pycache__/<stem>.*.pyc`), relative to site-packages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pyc: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Kind {
    Missing,
    File {
        size: u64,
        mode: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sha256: Option<String>,
    },
    Symlink {
        target: String,
    },
    Dir {
        mode: u32,
    },
    /// A device, socket or fifo: never touched.
    Other,
}

impl Kind {
    pub fn size(&self) -> u64 {
        match self {
            Kind::File { size, .. } => *size,
            _ => 0,
        }
    }
    pub fn exists(&self) -> bool {
        !matches!(self, Kind::Missing)
    }
}

/// Write one frame and flush.
pub fn write_frame<T: Serialize>(w: &mut dyn Write, value: &T) -> std::io::Result<()> {
    let body = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    w.write_all(&(body.len() as u32).to_le_bytes())?;
    w.write_all(&body)?;
    w.flush()
}

/// Read one frame. `Ok(None)` at a clean end of stream.
pub fn read_frame<T: DeserializeOwned>(r: &mut dyn Read) -> Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(err!("connection failed: {e}")),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(err!(
            hint = "the other side is not a compatible overlay agent",
            "frame of {len} bytes is too large"
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)
        .map_err(|e| err!("connection closed in the middle of a frame: {e}"))?;
    serde_json::from_slice(&body).map(Some).map_err(|e| {
        err!(
            hint = "controller and agent disagree on the protocol; upgrade overlay on both sides",
            "malformed frame: {e}"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Request::Hello { protocol: 7 }).unwrap();
        write_frame(&mut buf, &Request::Bye).unwrap();
        let mut r = &buf[..];
        let a: Request = read_frame(&mut r).unwrap().unwrap();
        assert!(matches!(a, Request::Hello { protocol: 7 }));
        let b: Request = read_frame(&mut r).unwrap().unwrap();
        assert!(matches!(b, Request::Bye));
        assert!(read_frame::<Request>(&mut r).unwrap().is_none());
    }

    #[test]
    fn truncated_and_garbage_frames_are_errors() {
        let mut r: &[u8] = &[5, 0, 0, 0, b'{'];
        assert!(read_frame::<Request>(&mut r).is_err());
        let mut r: &[u8] = &[255, 255, 255, 255];
        assert!(read_frame::<Request>(&mut r).is_err());
        let mut r: &[u8] = &[2, 0, 0, 0, b'4', b'2'];
        assert!(read_frame::<Request>(&mut r).is_err());
    }
}
