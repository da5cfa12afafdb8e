// Row kernels (binding x is the input; weight and bias serve layer norm and are bound to the input
// elsewhere; out receives values, idx the i64 indices of argmax and argmin as pairs of 32-bit words,
// bound to the output buffer too): reductions along an axis, softmax and log-softmax, layer norm.
// Elements are `elem` (f32, or f16 on devices with shader-f16: `elem_f32.wgsl` / `elem_f16.wgsl`),
// loaded to f32 for the math and rounded once on the store. One workgroup of WG threads per row (an
// output element of a reduction, a softmax row, a layer-norm row), its threads striding over the row
// and combining through `combine.wgsl` (`wg_sum`, `wg_max`, `wg_best`). Rows are indexed over a 2-D
// grid of workgroups. Every thread reaches every barrier and every subgroup operation: the row index
// and all loop bounds come from the workgroup id and the read-only parameter words, which are uniform.
//
// Parameter words (`p`), shared layout: [0] rows, [1] row length, [2] stride between a row's
// elements, [3] op, [4] output offset (in elements; in 32-bit words for indices), [5] input offset,
// then per kernel:
// reduce: [6] correction, [7] rank of the row index, [8..16) its shape, [16..24) its input strides;
// softmax: [6] inner (rows are `outer x inner`, row r = (r / inner, r % inner)), [7] log-softmax;
// softmax_backward: as softmax, the output's gradient as the input (`x`) and the forward's output
// bound as `weight`, [8] its offset;
// layer norm: [6] eps as f32 bits, [7] weight present, [8] bias present, [9] weight offset,
// [10] bias offset, [11] 1 when the row's mean and 1/√(var + eps) are saved (as f32 bits in
// `idx`, bound to the statistics' buffer), [12] and [13] their word offsets.

@group(0) @binding(0) var<storage, read_write> x: array<elem>;
@group(0) @binding(1) var<storage, read_write> weight: array<elem>;
@group(0) @binding(2) var<storage, read_write> bias: array<elem>;
@group(0) @binding(3) var<storage, read_write> out: array<elem>;
@group(0) @binding(4) var<storage, read_write> idx: array<u32>;
@group(0) @binding(5) var<storage, read> p: array<u32>;

// Reduction op codes (word [3]), as `ReduceOp::code` numbers them (a test in rows.rs reads these
// lines).
const RED_SUM: u32 = 0u;
const RED_MEAN: u32 = 1u;
const RED_MAX: u32 = 2u;
const RED_MIN: u32 = 3u;
const RED_VAR: u32 = 4u;
const RED_ARGMAX: u32 = 5u;
const RED_ARGMIN: u32 = 6u;

// Element `i` of the input, as f32.
fn xv(i: u32) -> f32 {
    return load_elem(x[i]);
}

// Sums along a row add each thread's values in blocks of SUM_BLOCK, then the blocks' sums: a plain
// running sum rounds once per element at the size of the whole partial sum, so equal values (which
// round alike) drift with the row's length (65 537 f32 values of 0.378 came out 2e-5 off); blocks
// bound that growth by the block's length plus the number of blocks. (Kahan's compensated sum would
// do better, but shader compilers may simplify its compensation away.) `loops.rs` counts these
// loops' passes.
const SUM_BLOCK: u32 = 64u;

// Thread t's part of the sum of (x[at + j * step] - shift) over its values j = t, t + WG, ... < len,
// added in blocks of SUM_BLOCK.
fn part_sum(at: u32, step: u32, len: u32, t: u32, shift: f32) -> f32 {
    var s = 0.0;
    var j = t;
    loop {
        if (j >= len) {
            break;
        }
        var block = 0.0;
        for (var k = 0u; k < SUM_BLOCK && j < len; k++) {
            block += xv(at + j * step) - shift;
            j += WG;
        }
        s += block;
    }
    return s;
}

// Thread t's part of the sum of ((x[at + j * step] - shift) - mean)^2, blocked as in part_sum.
fn part_squares(at: u32, step: u32, len: u32, t: u32, shift: f32, mean: f32) -> f32 {
    var q = 0.0;
    var j = t;
    loop {
        if (j >= len) {
            break;
        }
        var block = 0.0;
        for (var k = 0u; k < SUM_BLOCK && j < len; k++) {
            let d = (xv(at + j * step) - shift) - mean;
            block = fma(d, d, block);
            j += WG;
        }
        q += block;
    }
    return q;
}

fn nan() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

fn row_of(wid: vec3<u32>, groups: vec3<u32>) -> u32 {
    return wid.x + wid.y * groups.x;
}

// The input offset of reduction row `r`: r split over the row-index shape, dotted with its strides.
fn reduce_base(r: u32) -> u32 {
    var rest = r;
    var off = p[5];
    for (var d = p[7]; d > 0u; d--) {
        let extent = p[8u + d - 1u];
        off += (rest % extent) * p[16u + d - 1u];
        rest /= extent;
    }
    return off;
}

// Ops: 0 sum, 1 mean, 2 max, 3 min, 4 var, 5 argmax, 6 argmin. Index results are i64 (two words).
@compute @workgroup_size(WG)
fn reduce(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
          @builtin(local_invocation_index) t: u32) {
    let r = row_of(wid, groups);
    if (r >= p[0]) {
        return;
    }
    let len = p[1];
    let stride = p[2];
    let op = p[3];
    let base = reduce_base(r);
    if (op == RED_MAX || op == RED_MIN || op == RED_ARGMAX || op == RED_ARGMIN) {
        let is_max = op == RED_MAX || op == RED_ARGMAX;
        var v = xv(base);
        var i = 0u;
        for (var j = t; j < len; j += WG) {
            let c = xv(base + j * stride);
            if (better(v, i, c, j, is_max)) {
                v = c;
                i = j;
            }
        }
        let best = wg_best(v, i, t, is_max);
        if (t == 0u) {
            if (op == RED_ARGMAX || op == RED_ARGMIN) {
                idx[p[4] + 2u * r] = best.i;
                idx[p[4] + 2u * r + 1u] = 0u;
            } else {
                out[p[4] + r] = store_elem(best.v);
            }
        }
        return;
    }
    // Variance takes both passes relative to the row's first value, so a constant row has
    // deviations of exactly 0 (a mean rounded in f32 would not); sum and mean shift by 0.
    var pivot = 0.0;
    if (op == RED_VAR && len > 0u) {
        pivot = xv(base);
    }
    let total = wg_sum(part_sum(base, stride, len, t, pivot), t);
    if (op == RED_SUM || op == RED_MEAN) {
        if (t == 0u) {
            var v = total;
            if (op == RED_MEAN) {
                v = select(nan(), total / f32(len), len > 0u);
            }
            out[p[4] + r] = store_elem(v);
        }
        return;
    }
    // Variance: a second pass around the mean.
    let mean = total / f32(len);
    let squares = wg_sum(part_squares(base, stride, len, t, pivot, mean), t);
    if (t == 0u) {
        let denom = max(f32(len) - f32(p[6]), 0.0);
        var v = squares / denom;
        if (len == 0u) {
            v = nan();
        }
        out[p[4] + r] = store_elem(v);
    }
}

@compute @workgroup_size(WG)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
           @builtin(local_invocation_index) t: u32) {
    let r = row_of(wid, groups);
    if (r >= p[0]) {
        return;
    }
    let len = p[1];
    let inner = p[6];
    let start = (r / inner) * len * inner + r % inner;
    let at_in = p[5] + start;
    let at_out = p[4] + start;
    // The maximum, NaN ignored (a NaN row still ends NaN through the sum).
    var m = bitcast<f32>(0xff800000u);
    for (var j = t; j < len; j += WG) {
        let v = xv(at_in + j * inner);
        m = select(m, v, v > m);
    }
    m = wg_max(m, t);
    var s = 0.0;
    var i = t;
    loop {
        if (i >= len) {
            break;
        }
        var block = 0.0;
        for (var k = 0u; k < SUM_BLOCK && i < len; k++) {
            block += exp(xv(at_in + i * inner) - m);
            i += WG;
        }
        s += block;
    }
    let total = wg_sum(s, t);
    let log_total = log(total);
    for (var j = t; j < len; j += WG) {
        let v = xv(at_in + j * inner) - m;
        var y: f32;
        if (p[7] != 0u) {
            y = v - log_total;
        } else {
            y = exp(v) / total;
        }
        out[at_out + j * inner] = store_elem(y);
    }
}

// The input gradient of softmax (y · (g - Σ g·y)) or log-softmax (g - exp(y) · Σ g) along a row,
// g the output's gradient (`x`) and y the forward's output (`weight`).
@compute @workgroup_size(WG)
fn softmax_backward(@builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) groups: vec3<u32>,
                    @builtin(local_invocation_index) t: u32) {
    let r = row_of(wid, groups);
    if (r >= p[0]) {
        return;
    }
    let len = p[1];
    let inner = p[6];
    let log_softmax = p[7] != 0u;
    let start = (r / inner) * len * inner + r % inner;
    let at_g = p[5] + start;
    let at_y = p[8] + start;
    let at_out = p[4] + start;
    var s = 0.0;
    var i = t;
    loop {
        if (i >= len) {
            break;
        }
        var block = 0.0;
        for (var k = 0u; k < SUM_BLOCK && i < len; k++) {
            let g = xv(at_g + i * inner);
            if (log_softmax) {
                block += g;
            } else {
                block = fma(g, load_elem(weight[at_y + i * inner]), block);
            }
            i += WG;
        }
        s += block;
    }
    let total = wg_sum(s, t);
    for (var j = t; j < len; j += WG) {
        let g = xv(at_g + j * inner);
        let y = load_elem(weight[at_y + j * inner]);
        var d: f32;
        if (log_softmax) {
            d = g - exp(y) * total;
        } else {
            d = y * (g - total);
        }
        out[at_out + j * inner] = store_elem(d);
    }
}

@compute @workgroup_size(WG)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
              @builtin(local_invocation_index) t: u32) {
    let r = row_of(wid, groups);
    if (r >= p[0]) {
        return;
    }
    let len = p[1];
    let at_in = p[5] + r * len;
    let at_out = p[4] + r * len;
    // Moments relative to the row's first value, so that a constant row normalises to exactly 0
    // (with a mean rounded in f32, (x - mean) · 1/√eps is hundreds of times the rounding error).
    var pivot = 0.0;
    if (len > 0u) {
        pivot = xv(at_in);
    }
    let mean = wg_sum(part_sum(at_in, 1u, len, t, pivot), t) / f32(len);
    let squares = wg_sum(part_squares(at_in, 1u, len, t, pivot, mean), t);
    let inv = 1.0 / sqrt(squares / f32(len) + bitcast<f32>(p[6]));
    if (p[11] != 0u && t == 0u) {
        idx[p[12] + r] = bitcast<u32>(pivot + mean);
        idx[p[13] + r] = bitcast<u32>(inv);
    }
    for (var j = t; j < len; j += WG) {
        var y = ((xv(at_in + j) - pivot) - mean) * inv;
        if (p[7] != 0u) {
            y *= load_elem(weight[p[9] + j]);
        }
        if (p[8] != 0u) {
            y += load_elem(bias[p[10] + j]);
        }
        out[at_out + j] = store_elem(y);
    }
}
