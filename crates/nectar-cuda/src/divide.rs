//! Division by a run-time constant as a multiply and a shift, for the kernels' column → scale
//! group index (`c / group`): a hardware integer division costs about twenty instructions per
//! weight word, this costs three. Host-side and GPU-free, so CI tests it.

/// The multiplier and shift for dividing by `d`: `c / d == (umulhi(c, magic) + c) >> shift` for
/// every `c < 2^31` (the addition cannot overflow there). `d` must be in `1..=2^31`.
///
/// This is the round-up method with a 33-bit multiplier `2^32 + magic`: with
/// `l = ceil(log2 d)`, `magic = floor(2^32 (2^l - d) / d) + 1`.
pub fn magic(d: u32) -> (u32, u32) {
    assert!((1..=1 << 31).contains(&d), "divisor {d} out of range");
    let l = if d == 1 {
        0
    } else {
        32 - (d - 1).leading_zeros()
    };
    let m = ((1u64 << 32) * ((1u64 << l) - d as u64)) / d as u64 + 1;
    (m as u32, l)
}

/// `c / d` evaluated as the kernels do (for tests and the scalar mirror of the kernel).
pub fn divide(c: u32, (magic, shift): (u32, u32)) -> u32 {
    let hi = ((c as u64 * magic as u64) >> 32) as u32;
    (hi + c) >> shift
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn exact_for_every_column_of_real_groups() {
        // Every group size detection knows, odd ones, and per-row "groups" of whole rows.
        for d in [
            1, 2, 3, 5, 7, 8, 16, 32, 48, 64, 96, 128, 192, 256, 512, 2048, 6144, 16384,
        ] {
            let mg = magic(d);
            for c in 0..(1u32 << 20) {
                assert_eq!(divide(c, mg), c / d, "c = {c}, d = {d}");
            }
        }
    }

    proptest! {
        #[test]
        fn exact_below_2_pow_31(d in 1u32..=(1 << 31), c in 0u32..(1 << 31)) {
            prop_assert_eq!(divide(c, magic(d)), c / d);
        }
    }
}
