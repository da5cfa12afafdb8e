//! Attention over more keys than one launch takes within the loop budget (`loops.rs`): the keys in
//! ranges, as flash decoding splits them.
//!
//! Each range is one launch of the kernel over every query row (`attention::attention_keys`), which
//! writes each row's sums of probability-weighted values over its keys, unnormalised, relative to
//! its running maximum score, with that maximum and the denominator. The host reads each range
//! back and combines it into f64 accumulators as the online softmax does within a launch —
//! rescaling to the larger maximum, adding sums and denominators — and writes `sums /
//! denominator` once all ranges are in, rounded once to the dtype, and each row's log-sum-exp
//! `max + ln denominator` where asked. The kernel's rules carry over:
//! a NaN score makes the row NaN, a NaN value its dim (even where its weight is 0), and a row
//! whose every score is -inf is NaN.
//!
//! The kernels run in f32: 16-bit operands (and f32 ones at unaligned addresses) are cast to f32
//! copies first, and (batch, head) problems run in blocks whose copies each fit a binding. Each
//! range costs a launch and a read-back of the sums: costs that only attention over very many keys
//! pays.

use crate::compute::{
    Access, AttentionDesc, CastDesc, ComputeBackend, DevicePtr, StridedBuf, Temporaries,
};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

use super::super::attention;
use super::super::elementwise::Launch;
use super::super::WebGpuBackend;
use super::cuts::{advance, blocks};
use super::two_pass::{read, write};

/// One query row's running combination of key ranges.
#[derive(Clone)]
struct Row {
    /// The largest maximum score of the ranges combined (-inf before the first).
    max: f64,
    /// The denominator, relative to `max`.
    denominator: f64,
    /// A NaN score was met: the whole row is NaN.
    nan: bool,
}

/// `desc`, whose kernel takes at most `span` keys a launch, over ranges of its keys.
pub(crate) fn attention(be: &WebGpuBackend, desc: &AttentionDesc, span: usize) -> Result<()> {
    let (dim, sq, skv) = (desc.head_dim, desc.seq_q, desc.seq_kv);
    let problems = desc.batch * desc.heads;
    if problems * sq * dim == 0 {
        return Ok(());
    }
    // Blocks of (batch, head) problems whose f32 copies and sums each fit a binding.
    let limit = be.state()?.memory().binding_limit();
    let room = limit.bytes.saturating_sub(2 * limit.align + 8);
    let fits = |_, len: usize| Ok((len * sq.max(skv) * dim * 4) as u64 <= room);
    let Some(ranges) = blocks(problems, fits)? else {
        return Err(BackendError::FeatureUnavailable {
            feature: "ops spanning more than one storage binding",
            reason: "attention: the f32 keys of one head, which attention over more keys than \
                     one launch takes runs on, take more than a storage binding"
                .into(),
        });
    };
    let size = desc.dtype.size_in_bytes();
    let temps = Temporaries::new(be);
    let longest = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let staged = desc.dtype != DType::F32 || [desc.q, desc.k, desc.v].iter().any(|p| p.0 % 4 != 0);
    let copies = if staged {
        Some([
            temps.alloc(longest * sq * dim * 4)?,
            temps.alloc(longest * skv * dim * 4)?,
            temps.alloc(longest * skv * dim * 4)?,
        ])
    } else {
        None
    };
    let sums = temps.alloc(longest * sq * dim * 4)?;
    let stats = temps.alloc(longest * sq * 2 * 4)?;
    for (start, len) in ranges {
        let at = |ptr: DevicePtr, per: usize| advance(ptr, start * per * dim, size);
        let part = AttentionDesc {
            q: at(desc.q, sq)?,
            k: at(desc.k, skv)?,
            v: at(desc.v, skv)?,
            o: at(desc.o, sq)?,
            lse: desc
                .lse
                .map(|lse| advance(lse, start * sq, 4))
                .transpose()?,
            batch: len,
            heads: 1,
            ..desc.clone()
        };
        let f32_part = match copies {
            Some([q, k, v]) => {
                let cast = |from: DevicePtr, to: DevicePtr, per: usize| {
                    be.cast(&CastDesc {
                        src_dtype: desc.dtype,
                        dst_dtype: DType::F32,
                        input: StridedBuf::contiguous(from, &[len * per * dim]),
                        output: to,
                    })
                };
                cast(part.q, q, sq)?;
                cast(part.k, k, skv)?;
                cast(part.v, v, skv)?;
                AttentionDesc {
                    dtype: DType::F32,
                    q,
                    k,
                    v,
                    o: sums,
                    lse: None,
                    ..part.clone()
                }
            }
            None => AttentionDesc {
                o: sums,
                lse: None,
                ..part.clone()
            },
        };
        let (out, lse) = by_ranges(be, &f32_part, span, stats)?;
        write(be, part.o, desc.dtype, &out)?;
        if let Some(ptr) = part.lse {
            write(be, ptr, DType::F32, &lse)?;
        }
    }
    Ok(())
}

/// `d` (f32, its output the sums' scratch) over ranges of `span` keys, each range's row
/// statistics in `stats`; the output values and each row's log-sum-exp, combined on the host.
fn by_ranges(
    be: &WebGpuBackend,
    d: &AttentionDesc,
    span: usize,
    stats: DevicePtr,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let dim = d.head_dim;
    let rows = d.batch * d.heads * d.seq_q;
    let mut row = vec![
        Row {
            max: f64::NEG_INFINITY,
            denominator: 0.0,
            nan: false,
        };
        rows
    ];
    let mut sums = vec![0.0f64; rows * dim];
    for first in (0..d.seq_kv).step_by(span.max(1)) {
        let end = (first + span).min(d.seq_kv);
        let mut acc = d.accesses()?;
        acc.push("stats", stats, rows * 2 * 4, Access::Write, true);
        be.run_direct(acc, |gpu, kernels, mem| {
            match attention::attention_keys(gpu, kernels, mem, d, (first, end), Some(stats))? {
                Launch::Done => Ok(()),
                Launch::Stage => Err(BackendError::FeatureUnavailable {
                    feature: "ops spanning more than one storage binding",
                    reason: "attention: operands past the kernel's 32-bit offsets".into(),
                }),
            }
        })?;
        let part = read(be, d.o, DType::F32, rows * dim)?;
        let pairs = read(be, stats, DType::F32, rows * 2)?;
        for (r, state) in row.iter_mut().enumerate() {
            let (max, denominator) = (pairs[2 * r], pairs[2 * r + 1]);
            let (into, from) = (
                &mut sums[r * dim..(r + 1) * dim],
                &part[r * dim..(r + 1) * dim],
            );
            combine(state, into, (max, denominator), from);
        }
    }
    let out = row
        .iter()
        .enumerate()
        .flat_map(|(r, state)| {
            sums[r * dim..(r + 1) * dim].iter().map(move |&s| {
                // No score but -inf (0 / 0), or a NaN: NaN, as in one launch.
                if state.nan || state.denominator == 0.0 {
                    f64::NAN
                } else {
                    s / state.denominator
                }
            })
        })
        .collect();
    let lse = row
        .iter()
        .map(|state| {
            if state.nan {
                f64::NAN
            } else {
                state.max + state.denominator.ln()
            }
        })
        .collect();
    Ok((out, lse))
}

/// Adds one range's results for a row — its maximum and denominator, and its unnormalised sums
/// `part` — to the row's running `state` and `sums`.
fn combine(state: &mut Row, sums: &mut [f64], (max, denominator): (f64, f64), part: &[f64]) {
    if denominator.is_nan() {
        state.nan = true;
        return;
    }
    if denominator == 0.0 {
        // No key of the range weighs anything; a NaN value there still makes its dim NaN (0 · NaN).
        for (s, p) in sums.iter_mut().zip(part) {
            if p.is_nan() {
                *s = f64::NAN;
            }
        }
        return;
    }
    if max > state.max {
        let rescale = (state.max - max).exp();
        sums.iter_mut().for_each(|s| *s *= rescale);
        state.denominator *= rescale;
        state.max = max;
    }
    let weight = (max - state.max).exp();
    for (s, p) in sums.iter_mut().zip(part) {
        *s += weight * p;
    }
    state.denominator += weight * denominator;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Row {
        Row {
            max: f64::NEG_INFINITY,
            denominator: 0.0,
            nan: false,
        }
    }

    #[test]
    fn ranges_combine_as_one_softmax_over_all_keys() {
        // Scores 1, 3 (one range) and 2 (another), values 10, 20, 30: weights e^1, e^3, e^2.
        let (e1, e2, e3) = (1f64.exp(), 2f64.exp(), 3f64.exp());
        let want = (10.0 * e1 + 20.0 * e3 + 30.0 * e2) / (e1 + e2 + e3);
        for order in [[0, 1], [1, 0]] {
            let below = (1.0f64 - 3.0).exp();
            let ranges = [(3.0, below + 1.0, 10.0 * below + 20.0), (2.0, 1.0, 30.0)];
            let (mut state, mut sums) = (fresh(), [0.0]);
            for i in order {
                let (max, den, sum) = ranges[i];
                combine(&mut state, &mut sums, (max, den), &[sum]);
            }
            let got = sums[0] / state.denominator;
            assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        }
    }

    #[test]
    fn empty_and_nan_ranges_follow_the_kernel() {
        // A range of -inf scores only adds nothing, but its NaN values still reach their dims.
        let (mut state, mut sums) = (fresh(), [0.0, 0.0]);
        combine(
            &mut state,
            &mut sums,
            (f64::NEG_INFINITY, 0.0),
            &[0.0, f64::NAN],
        );
        combine(&mut state, &mut sums, (0.5, 2.0), &[4.0, 6.0]);
        assert_eq!(sums[0] / state.denominator, 2.0);
        assert!(sums[1].is_nan());
        // A NaN denominator (a NaN score) marks the row.
        combine(&mut state, &mut sums, (0.5, f64::NAN), &[1.0, 1.0]);
        assert!(state.nan);
    }
}
