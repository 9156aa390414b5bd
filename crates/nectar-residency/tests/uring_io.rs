//! The io_uring backend against the pread one on real files: the same bytes for aligned and
//! unaligned tails (direct and buffered handles, pieces smaller than a range so reads are
//! resubmitted), many threads sharing the ring pool, and a truncated file reported with its
//! path and offset through the manager. (Failing pieces and the EINVAL fallback are tested in
//! `io/uring.rs`, which can hand the ring a descriptor no public API opens.) Each test skips,
//! saying why, where this process may not create an io_uring (old kernel, sysctl, seccomp).
#![cfg(all(target_os = "linux", feature = "io-uring"))]

use nectar_format::experts::{ExpertExtent, ExpertPart, Segment};
use nectar_format::quant::QuantFormat;
use nectar_format::DType;
use nectar_residency::io::{ExpertIo, FileIo, UringIo};
use nectar_residency::layout::{plan, ReadOp};
use nectar_residency::{Admission, Error, Residency, ResidencyConfig, Slab, ALIGN};
use std::path::PathBuf;
use std::sync::Arc;

fn uring_available() -> bool {
    match UringIo::probe() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("skipping io_uring test: {e}");
            false
        }
    }
}

/// A file of `len` pseudo-random bytes in a fresh directory (kept alive by the returned guard).
fn random_file(len: usize) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shard-00001.safetensors");
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let bytes: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&path, &bytes).unwrap();
    (dir, path, bytes)
}

/// The op that reads `[start, start + len)` of shard 0, widened to 4 KiB as `layout::plan` does,
/// with `needed` cut at the end of a file of `file_len` bytes.
fn op(start: usize, len: usize, file_len: usize) -> ReadOp {
    let a0 = start / ALIGN * ALIGN;
    let a1 = (start + len).div_ceil(ALIGN) * ALIGN;
    ReadOp {
        shard: 0,
        file_offset: a0 as u64,
        len: a1 - a0,
        needed: (start + len).min(file_len) - a0,
        slot_offset: 0,
    }
}

fn read_with(io: &dyn ExpertIo, op: &ReadOp) -> std::io::Result<Vec<u8>> {
    let buf = Slab::new(1, op.len).unwrap();
    // SAFETY: this test owns the one-slot buffer; nothing else touches it.
    let dst = unsafe { buf.slot_mut(0) };
    io.read(op, &mut dst[..op.len])?;
    Ok(dst[..op.needed].to_vec())
}

#[test]
fn uring_reads_the_same_bytes_as_pread() {
    if !uring_available() {
        return;
    }
    // 5 MiB and an unaligned 1,234-byte tail.
    let file_len = 5 * (1 << 20) + 1234;
    let (_dir, path, bytes) = random_file(file_len);
    let paths = [path];
    let ops = [
        op(0, 1 << 20, file_len),                   // aligned, one piece
        op(12_345, 3 * (1 << 20) + 77, file_len),   // unaligned both ends, many pieces
        op(4 * (1 << 20) + 100, 1 << 20, file_len), // runs into the unaligned end of file
        op(file_len - 1234, 1234, file_len),        // only the tail block
        op(2 * (1 << 20), 3 * (1 << 20), file_len), // ends exactly at the last byte
    ];
    for direct in [true, false] {
        let pread = FileIo::open(&paths, direct).unwrap();
        // 64 KiB pieces, 4 in flight: ranges of many pieces are queued and resubmitted.
        let small = UringIo::open_with(&paths, direct, 64 << 10, 4).unwrap();
        let default = UringIo::open(&paths, direct).unwrap();
        assert_eq!(small.direct_count(), pread.direct_count());
        for o in &ops {
            let want = &bytes[o.file_offset as usize..o.file_offset as usize + o.needed];
            let p = read_with(&pread, o).unwrap();
            assert_eq!(p, want, "pread, direct {direct}, {o:?}");
            for u in [&small, &default] {
                let got = read_with(u, o).unwrap();
                assert_eq!(got, p, "uring vs pread, direct {direct}, {o:?}");
            }
        }
    }
}

#[test]
fn uring_reads_concurrently_from_many_threads() {
    if !uring_available() {
        return;
    }
    let file_len = 8 << 20;
    let (_dir, path, bytes) = random_file(file_len);
    let io = UringIo::open_with(&[path], true, 128 << 10, 8).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (io, bytes) = (&io, &bytes);
            s.spawn(move || {
                for k in 0..8 {
                    let start = ((t * 8 + k) * 257 * ALIGN + t * 99) % (file_len - (1 << 20));
                    let o = op(start, 1 << 20, file_len);
                    let got = read_with(io, &o).unwrap();
                    let a = o.file_offset as usize;
                    assert_eq!(got, &bytes[a..a + o.needed]);
                }
            });
        }
    });
}

#[test]
fn a_truncated_file_is_reported_with_its_path_and_offset() {
    if !uring_available() {
        return;
    }
    // One f32 expert: gate/up [8, 256], down [256, 8], contiguous after a 100-byte header.
    let part_len = 8 * 256 * 4;
    let file_len = 100 + 3 * part_len;
    let (_dir, path, _bytes) = random_file(file_len);
    let parts: Vec<ExpertPart> = [(8, 256), (8, 256), (256, 8)]
        .iter()
        .enumerate()
        .map(|(i, &(rows, cols))| ExpertPart {
            rows,
            cols,
            format: QuantFormat::Float,
            dtype: DType::F32,
            weight: Segment {
                shard: 0,
                offset: (100 + i * part_len) as u64,
                len: part_len as u64,
            },
            scales: None,
        })
        .collect();
    let ext = ExpertExtent {
        layer: 0,
        expert: 0,
        parts: [parts[0].clone(), parts[1].clone(), parts[2].clone()],
        coalesced: Some(Segment {
            shard: 0,
            offset: 100,
            len: 3 * part_len as u64,
        }),
        coalesced_scales: None,
    };
    let layout = plan(&ext).unwrap();
    // The file loses its last 5,000 bytes after the layout was planned.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len((file_len - 5000) as u64)
        .unwrap();
    let io = Arc::new(UringIo::open(std::slice::from_ref(&path), true).unwrap());
    let cfg = ResidencyConfig {
        lru_per_layer: vec![1],
        working_slots: 1,
        prefetch_slots: 0,
        io_threads: 1,
        pinned: Vec::new(),
        mlock: false,
        admission: Admission::Lru,
    };
    let r = Residency::new(cfg, vec![vec![layout]], io).unwrap();
    let err = r.acquire(0, &[0]).unwrap().pop().unwrap().wait().err();
    match err {
        Some(e @ Error::Read { .. }) => {
            let msg = e.to_string();
            let Error::Read {
                path: p, offset, ..
            } = e
            else {
                unreachable!()
            };
            assert_eq!(p, path);
            assert_eq!(offset, 0);
            assert!(msg.contains("short read"), "{msg}");
            assert!(msg.contains(&path.display().to_string()), "{msg}");
        }
        other => panic!("expected a read error, got {other:?}"),
    }
}
