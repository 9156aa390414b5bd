//! A routed expert's SwiGLU MLP, `down(silu(gate·x) ⊙ up·x)`, straight from the expert's bytes.
//!
//! The gate and up rows of one task are computed block by block, alternating between the two
//! matrices, against the same packed activations (one parallel pass over both), combined per
//! task, and only the `m × intermediate` hidden activations are written before the down
//! projection.
//! Every element is the same canonical dot product as [`crate::matmul`] computes and the combine
//! is [`crate::swiglu_in_place`]'s expression, so the result is bit-identical to running the
//! four steps separately, on any path and thread count.
use crate::activation::silu;
use crate::dot::{isa_detect, Isa};
use crate::driver::{layout_for, par_rows, par_tile, prefetch_start, tile, SharedOut, ROW_BLOCK};
use crate::error::{Error, Result};
use crate::format::MatRef;
use crate::matmul::{check_weights, matmul_with};
use crate::xpack::{PoolBuf, XPack};

/// The three projections of one routed expert, borrowed from wherever their bytes live (a
/// cache slot, a memory map). Shapes: `gate` and `up` are `intermediate × hidden`, `down` is
/// `hidden_out × intermediate`.
#[derive(Debug, Clone, Copy)]
pub struct ExpertRef<'a> {
    /// Gate projection (`intermediate × hidden`).
    pub gate: MatRef<'a>,
    /// Up projection (`intermediate × hidden`).
    pub up: MatRef<'a>,
    /// Down projection (`hidden_out × intermediate`).
    pub down: MatRef<'a>,
}

/// Computes `out[i] = down · (silu(gate · x[i]) ⊙ (up · x[i]))` for `m` activation rows.
///
/// `x` is `m × hidden` and `out` is `m × down.rows`, row-major. Bit-identical to
/// `matmul(gate)`, `matmul(up)`, `swiglu_in_place`, `matmul(down)`.
pub fn expert_swiglu(e: &ExpertRef<'_>, x: &[f32], m: usize, out: &mut [f32]) -> Result<()> {
    expert_swiglu_with(isa_detect(), e, x, m, out)
}

pub(crate) fn expert_swiglu_with(
    isa: Isa,
    e: &ExpertRef<'_>,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) -> Result<()> {
    let (gate, up, down) = (&e.gate, &e.up, &e.down);
    for (name, w) in [("gate", gate), ("up", up), ("down", down)] {
        check_weights(name, w)?;
    }
    let (inter, hidden) = (gate.rows, gate.cols);
    if up.rows != inter || up.cols != hidden || down.cols != inter {
        return Err(Error::Shape(format!(
            "expert_swiglu: gate {}x{}, up {}x{}, down {}x{} do not chain",
            gate.rows, gate.cols, up.rows, up.cols, down.rows, down.cols
        )));
    }
    if Some(x.len()) != m.checked_mul(hidden) || Some(out.len()) != m.checked_mul(down.rows) {
        return Err(Error::Shape(format!(
            "expert_swiglu: m = {m}, hidden {hidden}, out {}: x has {}, out has {}",
            down.rows,
            x.len(),
            out.len()
        )));
    }
    if m == 0 || down.rows == 0 {
        return Ok(());
    }
    if [gate, up, down]
        .iter()
        .any(|w| crate::digits::int4_order_covers(w.format))
    {
        // The opt-in int4 order (`digits.rs`) keeps its own products: the four steps apart.
        let mut g = PoolBuf::zeroed(m * inter);
        let mut u = PoolBuf::zeroed(m * inter);
        matmul_with(isa, gate, x, m, &mut g)?;
        matmul_with(isa, up, x, m, &mut u)?;
        crate::activation::swiglu_in_place(&mut g, &u);
        return matmul_with(isa, down, &g, m, out);
    }
    let xg = XPack::new(x, m, hidden, layout_for(isa, gate.format));
    let xu_own;
    let xu = if layout_for(isa, up.format) == layout_for(isa, gate.format) {
        &xg
    } else {
        xu_own = XPack::new(x, m, hidden, layout_for(isa, up.format));
        &xu_own
    };
    let mut h = PoolBuf::zeroed(m * inter);
    let hp = SharedOut(h.as_mut_ptr());
    let row_bytes = gate.format.row_bytes(hidden) + up.format.row_bytes(hidden);
    par_rows(0..inter, row_bytes, m, |t| {
        let n = t.len();
        let mut gu = PoolBuf::zeroed(2 * m * n);
        let (g, u) = gu.split_at_mut(m * n);
        // Gate and up alternate per register block, so both weight streams stay warm (each
        // kernel prefetches its matrix's next block while the other matrix's block runs).
        prefetch_start(gate, t.clone());
        prefetch_start(up, t.clone());
        let mut r = t.start;
        while r < t.end {
            let b = r..(r + ROW_BLOCK).min(t.end);
            let o = r - t.start;
            // SAFETY: both views are validated, rows b lie in both, the packs match (isa,
            // format) and `hidden`, `isa` comes from detection, and g / u hold m × n with row
            // stride n, of which block b writes columns o..o + b.len().
            unsafe {
                tile(isa, gate, b.clone(), &xg, g.as_mut_ptr().add(o), n);
                tile(isa, up, b.clone(), xu, u.as_mut_ptr().add(o), n);
            }
            r = b.end;
        }
        for i in 0..m {
            for k in 0..n {
                // `swiglu_in_place`'s expression, element for element.
                let v = silu(g[i * n + k]) * u[i * n + k];
                // SAFETY: this task owns hidden columns t of every row of `h`.
                unsafe { *hp.get().add(i * inter + t.start + k) = v };
            }
        }
    });
    let hx = XPack::new(&h, m, inter, layout_for(isa, down.format));
    // SAFETY: `down` is validated, `hx` is packed for it with `inter` columns, and `out` holds
    // m × down.rows with row stride down.rows.
    unsafe { par_tile(isa, down, 0..down.rows, &hx, out, down.rows) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activation::swiglu_in_place;
    use crate::format::WeightFormat;
    use crate::matmul::matmul_with;
    use crate::matmul::tests::{activations, format_of, random_matrix, FORMATS};
    use proptest::prelude::*;

    fn separate(isa: Isa, e: &ExpertRef<'_>, x: &[f32], m: usize) -> Vec<f32> {
        let inter = e.gate.rows;
        let mut g = vec![0.0; m * inter];
        let mut u = vec![0.0; m * inter];
        matmul_with(isa, &e.gate, x, m, &mut g).unwrap();
        matmul_with(isa, &e.up, x, m, &mut u).unwrap();
        swiglu_in_place(&mut g, &u);
        let mut y = vec![0.0; m * e.down.rows];
        matmul_with(isa, &e.down, &g, m, &mut y).unwrap();
        y
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn fused_equals_separate_steps_bitwise(
            hidden in 1usize..150, inter in 1usize..70, out_rows in 1usize..40, m in 1usize..10,
            fg in 0usize..FORMATS, fd in 0usize..FORMATS, seed in any::<u64>()
        ) {
            let (fg, fd) = (format_of(fg), format_of(fd));
            let (gd, gs) = random_matrix(fg, inter, hidden, seed);
            let (ud, us) = random_matrix(fg, inter, hidden, seed ^ 1);
            let (dd, ds) = random_matrix(fd, out_rows, inter, seed ^ 2);
            let e = ExpertRef {
                gate: MatRef::new(fg, inter, hidden, &gd, &gs).unwrap(),
                up: MatRef::new(fg, inter, hidden, &ud, &us).unwrap(),
                down: MatRef::new(fd, out_rows, inter, &dd, &ds).unwrap(),
            };
            let x = activations(m, hidden, seed);
            let want = separate(Isa::Scalar, &e, &x, m);
            for isa in Isa::available() {
                let mut y = vec![f32::NAN; m * out_rows];
                expert_swiglu_with(isa, &e, &x, m, &mut y).unwrap();
                for (a, b) in y.iter().zip(&want) {
                    prop_assert_eq!(a.to_bits(), b.to_bits(), "{:?}", isa);
                }
                prop_assert_eq!(&separate(isa, &e, &x, m), &y);
            }
        }
    }

    #[test]
    fn glm_expert_shape_int4_g64() {
        let f = WeightFormat::Int4Group { group: 64 };
        let (hidden, inter) = (6144, 2048);
        let (gd, gs) = random_matrix(f, inter, hidden, 1);
        let (ud, us) = random_matrix(f, inter, hidden, 2);
        let (dd, ds) = random_matrix(f, hidden, inter, 3);
        let e = ExpertRef {
            gate: MatRef::new(f, inter, hidden, &gd, &gs).unwrap(),
            up: MatRef::new(f, inter, hidden, &ud, &us).unwrap(),
            down: MatRef::new(f, hidden, inter, &dd, &ds).unwrap(),
        };
        for m in [1, 3] {
            let x = activations(m, hidden, 4);
            let mut y = vec![0.0; m * hidden];
            expert_swiglu(&e, &x, m, &mut y).unwrap();
            assert_eq!(y, separate(isa_detect(), &e, &x, m));
        }
    }

    #[test]
    fn mismatched_expert_shapes_are_errors() {
        let f = WeightFormat::F32;
        let d = vec![0u8; 4 * 6];
        let e = ExpertRef {
            gate: MatRef::new(f, 2, 3, &d, &[]).unwrap(),
            up: MatRef::new(f, 3, 2, &d, &[]).unwrap(),
            down: MatRef::new(f, 3, 2, &d, &[]).unwrap(),
        };
        let mut out = vec![0.0; 3];
        assert!(matches!(
            expert_swiglu(&e, &[0.0; 3], 1, &mut out),
            Err(Error::Shape(_))
        ));
        let e = ExpertRef { up: e.gate, ..e };
        assert!(expert_swiglu(&e, &[0.0; 2], 1, &mut out).is_err());
    }
}
