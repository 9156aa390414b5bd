//! libFuzzer target over [`nectar_fuzz::anthropic_messages`] (the harness documents what it checks).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nectar_fuzz::anthropic_messages(data));
