//! libFuzzer target over [`nectar_fuzz::openai_completions`] (the harness documents what it checks).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| nectar_fuzz::openai_completions(data));
