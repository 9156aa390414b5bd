//! Fuzzes the safetensors header parser and quantised-format detection: arbitrary bytes must
//! give a value or an error, never a panic, and an accepted header must describe tensors that
//! fit the data section without overlapping.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nectar_format::quant::resolve;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if data.len() < 24 {
        return;
    }
    let word = |i: usize| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
    let data_len = word(0) % (1 << 40);
    if let Ok(h) = nectar_format::parse_header(Path::new("fuzz.safetensors"), &data[16..], data_len) {
        let mut end = 0;
        for t in h.tensors.iter().filter(|t| t.begin < t.end) {
            assert!(t.end <= data_len && t.begin >= end);
            end = t.end;
        }
    }
    // Format detection on arbitrary (but bounded) counts, with and without a stamp.
    let (o, i) = ((word(1) % 100_000) as usize, ((word(1) >> 32) % 100_000) as usize);
    let (b, q) = ((word(2) % (1 << 34)) as usize, ((word(2) >> 34) % (1 << 28)) as usize);
    let stamp = std::str::from_utf8(&data[16..data.len().min(32)]).ok();
    let _ = resolve(o, i, b, q, None);
    let _ = resolve(o, i, b, q, stamp);
});
