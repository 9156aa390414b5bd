//! libFuzzer target over [`nectar_fuzz::session_coli_kv`] (the harness documents what it checks).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nectar_fuzz::session_coli_kv(data));
