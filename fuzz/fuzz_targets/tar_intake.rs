//! The target's tar intake on arbitrary bytes, against a small generation:
//! no panic, and nothing is written outside its staging folder.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use overlay::stream::testing::Intake;

fuzz_target!(|data: &[u8]| {
    static INTAKE: OnceLock<Intake> = OnceLock::new();
    let intake = INTAKE.get_or_init(|| Intake::new(std::path::Path::new("/dev/shm"), false));
    let _ = intake.run(data);
});
