//! The register tile of the direct convolution and of the Winograd products: `CL` output
//! channels (`NV` vectors) × `P` pixels of accumulators, summed over terms that each load `CL`
//! weights and broadcast `P` inputs — a GEMM microkernel's shape, with the input read through
//! per-term offsets ([`Taps`]) in place of a packed panel.

use crate::backends::cpu::host::Real;
use crate::backends::cpu::vector::Vector;

/// Where a tile reads each term of its sums: for term `t`, the offset `at[t]` of its first pixel
/// in the tile's input slice (pixel `p` at `at[t] + p`); how many pixels a tile reads at most
/// (`px`); and how far the reads reach.
#[derive(Clone, Debug)]
pub(super) struct Taps {
    at: Vec<usize>,
    px: usize,
    /// Past the largest offset by `px`.
    reach: usize,
}

impl Taps {
    /// The offsets `at` for tiles of at most `px` pixels.
    pub(super) fn new(at: Vec<usize>, px: usize) -> Taps {
        let reach = at.iter().max().map_or(0, |&t| t + px);
        Taps { at, px, reach }
    }

    /// Terms of the sums.
    pub(super) fn terms(&self) -> usize {
        self.at.len()
    }

    /// Elements a tile's input slice must hold: past the largest offset by `px`.
    pub(super) fn reach(&self) -> usize {
        self.reach
    }
}

/// One block of output channels: its first channel, how many of the tile's lanes are channels,
/// its weights (`[terms][CL]`) and bias (`CL` values, zero past `lanes`, or none).
pub(super) struct Channels<'a, A> {
    pub(super) k0: usize,
    pub(super) lanes: usize,
    pub(super) weights: &'a [A],
    pub(super) bias: Option<&'a [A]>,
}

/// The sums of one register tile, `acc[p][v]`: `P` output pixels × the `CL = NV · V::LANES`
/// channels of `ch` (lanes `v · LANES ..` in vector `v`), from the bias, over every tap `t`, which
/// reads pixel `p` at `x[taps.at[t] + p]`. `x` must hold `taps.reach` elements, `P` be at most
/// `taps.px` and `ch` hold `CL` weights a tap and `CL` biases (all checked once).
///
/// # Safety
/// As [`Vector`]'s methods for `V`.
#[inline(always)]
pub(super) unsafe fn tile<A: Real, V: Vector<A>, const NV: usize, const P: usize>(
    x: &[A],
    taps: &Taps,
    ch: &Channels<'_, A>,
) -> [[V; NV]; P] {
    let cl = NV * V::LANES;
    let mut first = [V::zero(); NV];
    if let Some(bias) = ch.bias {
        let bias = &bias[..cl];
        for (v, first) in first.iter_mut().enumerate() {
            // SAFETY: lanes v·LANES .. (v + 1)·LANES ≤ cl of the bias.
            *first = V::load(bias.as_ptr().add(v * V::LANES));
        }
    }
    let mut acc = [first; P];
    assert!(P <= taps.px, "a tile wider than its taps allow");
    assert!(
        ch.weights.len() >= taps.at.len() * cl,
        "a tap without its weights"
    );
    let x = &x[..taps.reach];
    let mut w = ch.weights.as_ptr();
    for &at in &taps.at {
        let mut wv = [V::zero(); NV];
        for (v, wv) in wv.iter_mut().enumerate() {
            // SAFETY: the tap's cl weights are inside `ch.weights` (checked above).
            *wv = V::load(w.add(v * V::LANES));
        }
        for (p, acc) in acc.iter_mut().enumerate() {
            // SAFETY: at + p < at + px ≤ reach = x.len() (`Taps::new`, and the checks above).
            let xp = V::splat(*x.get_unchecked(at + p));
            for (a, &wv) in acc.iter_mut().zip(&wv) {
                *a = wv.mul_add(xp, *a);
            }
        }
        w = w.add(cl);
    }
    acc
}
