//! The MessagePack request decoder on arbitrary bytes: no panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use overlay::protocol::Request;

fuzz_target!(|data: &[u8]| {
    let _ = rmp_serde::from_slice::<Request>(data);
});
