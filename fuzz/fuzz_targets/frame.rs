//! The agent's frame reader on arbitrary input: no panic, and no frame
//! larger than its cap is ever held.
#![no_main]

use libfuzzer_sys::fuzz_target;
use overlay::protocol::{Frame, MAX_DATA, Message, Request, read_any};

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    while let Ok(Some(f)) = read_any::<Request>(&mut r) {
        if let Frame::Data(d) = f {
            assert!(d.len() <= MAX_DATA && d.capacity() <= MAX_DATA);
        }
    }
    let _ = <Request as Message>::MAX;
});
