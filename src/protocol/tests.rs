//! Tests of `protocol`.

use super::*;
use crate::model::{Entry, FileStamp, Kind};

/// A reader that counts what was taken from it.
struct Counting<'a>(&'a [u8], usize);
impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.0.read(buf)?;
        self.1 += n;
        Ok(n)
    }
}

#[test]
fn oversize_frames_are_refused_before_their_body_is_read() {
    // A data frame claiming 512 MiB, a request claiming 300 MiB.
    for (raw, what) in [
        ((512u32 << 20) | DATA_BIT, "data frame of 536870912 bytes"),
        (
            (MAX_DATA as u32 + 1) | DATA_BIT,
            "data frame of 1048578 bytes",
        ),
        (300 << 20, "message frame of 314572800 bytes"),
    ] {
        let mut bytes = raw.to_le_bytes().to_vec();
        bytes.extend([0u8; 4096]);
        let mut r = Counting(&bytes, 0);
        let e = read_any::<Request>(&mut r).unwrap_err();
        assert!(e.message.contains(what), "{}", e.message);
        assert!(e.message.contains("larger than"), "{}", e.message);
        assert_eq!(r.1, 4, "only the length was read");
    }
    // An answer may be bigger than a request (a listing of a big venv):
    // 300 MiB is not refused for its size, only for being cut short.
    let mut bytes = (300u32 << 20).to_le_bytes().to_vec();
    bytes.extend([0u8; 16]);
    let e = read_any::<Response>(&mut bytes.as_slice()).unwrap_err();
    assert!(
        e.message.contains("in the middle of a frame"),
        "{}",
        e.message
    );
}

#[test]
fn a_full_data_frame_is_accepted() {
    let mut buf = Vec::new();
    write_data(&mut buf, &vec![1u8; MAX_DATA]).unwrap();
    let Some(Frame::Data(d)) = read_any::<Request>(&mut buf.as_slice()).unwrap() else {
        panic!()
    };
    assert_eq!(d.len(), MAX_DATA);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        /// Whatever the bytes: no panic, and no frame holds more than
        /// its cap (nor the capacity for more).
        #[test]
        fn the_frame_reader_is_bounded_on_any_input(
            data in proptest::collection::vec(any::<u8>(), 0..2048),
        ) {
            let mut r = data.as_slice();
            while let Ok(Some(f)) = read_any::<Request>(&mut r) {
                if let Frame::Data(d) = f {
                    prop_assert!(d.capacity() <= MAX_DATA);
                }
            }
        }

        /// A frame's length field alone: over the cap is refused after
        /// reading 4 bytes; under it, the capacity reserved is no more
        /// than the bytes that actually arrived or a data frame's cap.
        #[test]
        fn a_claimed_length_reserves_nothing_beyond_the_cap(
            len in any::<u32>(),
            body in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let mut bytes = len.to_le_bytes().to_vec();
            bytes.extend(&body);
            let mut r = Counting(&bytes, 0);
            let claimed = (len & !DATA_BIT) as usize;
            let cap = if len & DATA_BIT != 0 { MAX_DATA } else { <Request as Message>::MAX };
            match read_any::<Request>(&mut r) {
                Ok(Some(Frame::Data(d))) => prop_assert!(d.len() == claimed && d.capacity() <= MAX_DATA),
                _ if claimed > cap => prop_assert_eq!(r.1, 4),
                _ => prop_assert!(r.1 <= 4 + claimed),
            }
        }

        /// The MessagePack request decoder on arbitrary bytes, and on a
        /// real `Prepare` with bytes changed: no panic.
        #[test]
        fn the_request_decoder_never_panics(
            data in proptest::collection::vec(any::<u8>(), 0..1024),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        ) {
            let _ = rmp_serde::from_slice::<Request>(&data);
            let req = Request::Prepare(Box::new(crate::model::PrepareRequest {
                venv: "/v".into(),
                source: "s".into(),
                target: "t".into(),
                plan_created: 1,
                changes: vec![crate::model::GenChange {
                    path: "a/b.py".into(),
                    action: crate::model::Action::Replace,
                    source: Some(Kind::File { size: 5, mode: 0o644, blake3: Some("ab".into()), stamp: None }),
                    target: Some(Kind::Symlink { target: "x".into() }),
                    bytecode: false,
                    staged: None,
                }],
                backup: false,
                resume: false,
                same_owner: false,
                versions: Vec::new(),
                shebang: None,
                provenance: None,
                machine: None,
                allow_running: false,
            }));
            let mut m = rmp_serde::to_vec_named(&req).unwrap();
            for (at, b) in flips {
                let n = m.len();
                m[at % n] = b;
            }
            let _ = rmp_serde::from_slice::<Request>(&m);
        }
    }
}

/// One change of a `Prepare` as MessagePack: what bounds a request.
#[test]
fn a_prepare_of_100k_changes_fits_a_request_frame() {
    let change = crate::model::GenChange {
        path: "nvidia/cublas/lib/python3.11/site-packages/some/long/module_name.cpython-311-x86_64-linux-gnu.so".into(),
        action: crate::model::Action::Replace,
        source: Some(Kind::File { size: 123_456_789, mode: 0o755, blake3: Some("a".repeat(64)), stamp: Some(FileStamp { dev: 2049, ino: 1 << 40, mtime_ns: 1 << 60, ctime_ns: 1 << 60 }) }),
        target: Some(Kind::File { size: 123_456_789, mode: 0o755, blake3: Some("b".repeat(64)), stamp: Some(FileStamp { dev: 2049, ino: 1 << 40, mtime_ns: 1 << 60, ctime_ns: 1 << 60 }) }),
        bytecode: false,
        staged: None,
    };
    let one = rmp_serde::to_vec_named(&change).unwrap().len();
    eprintln!("one change of a Prepare: {one} bytes");
    assert!(
        one * 100_000 < <Request as Message>::MAX / 4,
        "{one} bytes a change"
    );
}

#[test]
fn a_json_frame_from_an_older_agent_is_named_as_such() {
    let body = br#"{"error":{"message":"malformed request"}}"#;
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(body);
    let e = read_frame::<Response>(&mut frame.as_slice()).unwrap_err();
    assert!(e.message.contains("older protocol"), "{}", e.message);
    assert!(e.message.contains("malformed request"), "{}", e.message);
    assert!(e.hint.unwrap().contains("one overlay build"));
}

#[test]
fn stat_entries_round_trip_without_path_and_drop_a_hashed_files_stamp() {
    let stamp = FileStamp {
        dev: 2049,
        ino: 7,
        mtime_ns: -1,
        ctime_ns: 1_732_999_999_123_456_789,
    };
    let kinds = [
        Kind::Missing,
        Kind::File {
            size: 5,
            mode: 0o644,
            blake3: None,
            stamp: Some(stamp),
        },
        Kind::Symlink {
            target: "../x".into(),
        },
        Kind::Dir { mode: 0o755 },
        Kind::Other,
        Kind::ThroughSymlink {
            link: "evil_data".into(),
        },
    ];
    for kind in kinds {
        let e = Entry {
            path: "a/b.py".into(),
            kind,
            pyc: vec!["a/__pycache__/b.cpython-311.pyc".into()],
        };
        let wire = serde_json::to_string(&StatEntry::from_entry(e.clone())).unwrap();
        assert!(!wire.contains("a/b.py\""), "{wire}");
        let back: StatEntry = serde_json::from_str(&wire).unwrap();
        assert_eq!(back.into_entry("a/b.py".into()), Some(e));
    }
    let hashed = Entry {
        path: "t.so".into(),
        kind: Kind::File {
            size: 5,
            mode: 0o755,
            blake3: Some("ab".into()),
            stamp: Some(stamp),
        },
        pyc: vec![],
    };
    let wire = serde_json::to_string(&StatEntry::from_entry(hashed)).unwrap();
    assert_eq!(wire, r#"[1,5,493,"ab",null,null,[]]"#);
    let bad: StatEntry = serde_json::from_str("[9,0,0,null,null,null,[]]").unwrap();
    assert_eq!(bad.into_entry("x".into()), None);
}

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
