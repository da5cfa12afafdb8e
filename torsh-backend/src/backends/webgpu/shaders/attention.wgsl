// Scaled dot-product attention with f32 math on `elem` elements (`elem_f32.wgsl`, or `elem_f16.wgsl`
// for f16 storage), flash style: one workgroup per query row, keys and values
// streamed in chunks of 128 with an online softmax (running maximum and denominator, accumulators
// rescaled as the maximum grows), so no score matrix is ever stored. With a causal mask (aligned top
// left, as PyTorch's is_causal) row i reads only keys 0..=i: the chunks past it are never visited.
// Thread t owns output dims t, t + 128, ... (head_dim <= 1024). Rows are indexed over a 2-D grid.
//
// A launch may take a range of the keys only (so that no invocation loops past the driver's limit):
// then, with p[13] set, it writes each row's unnormalised sums (relative to its running maximum)
// instead of the output, and the maximum and denominator to `stats`, from which the host combines
// the ranges. With p[13] = 2, a launch over all the keys writes the output and each row's
// log-sum-exp `m + ln l` to `stats` (for the backward).
//
// Parameter words (`p`): [0] rows (batch * heads * seq_q), [1] seq_q, [2] seq_kv, [3] head_dim,
// [4] scale as f32 bits, [5] causal, [6..10) element offsets of q, k, v, o, [10] the first key and
// [11] the end of the keys of this launch, [12] the offset in `stats` (f32 words) of row 0's
// (maximum, denominator) pair or log-sum-exp, [13] 1 to write the sums and `stats` (a range of
// keys), 2 to write the output and the log-sum-exps.

@group(0) @binding(0) var<storage, read_write> q: array<elem>;
@group(0) @binding(1) var<storage, read_write> k: array<elem>;
@group(0) @binding(2) var<storage, read_write> v: array<elem>;
@group(0) @binding(3) var<storage, read_write> o: array<elem>;
@group(0) @binding(4) var<storage, read_write> stats: array<f32>;
@group(0) @binding(5) var<storage, read> p: array<u32>;

// The value stored for an output element: the sum `acc` normalised by `l` (0 for a row that sees
// no key), or as it is where the launch takes a range of the keys.
fn result(acc: f32, l: f32, empty: bool) -> f32 {
    if (p[13] == 1u) {
        return acc;
    }
    return select(acc / l, 0.0, empty);
}

// Row `row`'s running maximum and denominator, where the launch takes a range of the keys, or its
// log-sum-exp where asked.
fn store_stats(row: u32, m: f32, l: f32) {
    if (p[13] == 1u) {
        stats[p[12] + 2u * row] = m;
        stats[p[12] + 2u * row + 1u] = l;
    } else if (p[13] == 2u) {
        stats[p[12] + row] = m + log(l);
    }
}

const WG: u32 = 128u;
const DIMS_PER_THREAD: u32 = 8u;

var<workgroup> q_row: array<f32, 1024>;
var<workgroup> probs: array<f32, 128>;
var<workgroup> red: array<f32, 128>;


@compute @workgroup_size(128)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
             @builtin(local_invocation_index) t: u32) {
    let row = wid.x + wid.y * groups.x;
    if (row >= p[0]) {
        return;
    }
    let NEG_INF = bitcast<f32>(0xff800000u);
    let sq = p[1];
    let skv = p[2];
    let dim = p[3];
    let scale = bitcast<f32>(p[4]);
    let head = row / sq;
    let i = row % sq;
    var visible = skv;
    if (p[5] != 0u) {
        visible = min(i + 1u, skv);
    }
    // This launch's keys: p[10] up to `visible`.
    let first = p[10];
    visible = min(visible, p[11]);
    let q_at = p[6] + row * dim;
    let k_at = p[7] + head * skv * dim;
    let v_at = p[8] + head * skv * dim;
    let o_at = p[9] + row * dim;
    for (var d = t; d < dim; d += WG) {
        q_row[d] = load_elem(q[q_at + d]);
    }
    var acc: array<f32, 8>;
    for (var u = 0u; u < DIMS_PER_THREAD; u++) {
        acc[u] = 0.0;
    }
    var m = NEG_INF;
    var l = 0.0;
    workgroupBarrier();
    for (var j0 = first; j0 < visible; j0 += WG) {
        let j = j0 + t;
        let real = j < visible;
        var score = NEG_INF;
        if (real) {
            var dot = 0.0;
            for (var d = 0u; d < dim; d++) {
                dot = fma(q_row[d], load_elem(k[k_at + j * dim + d]), dot);
            }
            score = scale * dot;
        }
        // The chunk's maximum, NaN ignored (a NaN score still makes the row NaN through the sums).
        red[t] = score;
        for (var width = WG / 2u; width > 0u; width /= 2u) {
            workgroupBarrier();
            if (t < width) {
                let other = red[t + width];
                red[t] = select(red[t], other, other > red[t]);
            }
        }
        workgroupBarrier();
        let chunk_max = red[0];
        let m_new = select(m, chunk_max, chunk_max > m);
        // While every score so far is -inf, nothing is accumulated (and no -inf - -inf appears).
        var prob = 0.0;
        if (real && !(score == NEG_INF && m_new == NEG_INF)) {
            prob = exp(score - m_new);
        }
        let alpha = select(exp(m - m_new), 1.0, m == m_new);
        workgroupBarrier();
        probs[t] = prob;
        red[t] = prob;
        for (var width = WG / 2u; width > 0u; width /= 2u) {
            workgroupBarrier();
            if (t < width) {
                red[t] = red[t] + red[t + width];
            }
        }
        workgroupBarrier();
        l = fma(l, alpha, red[0]);
        let count = min(WG, visible - j0);
        for (var u = 0u; u < DIMS_PER_THREAD; u++) {
            let d = t + u * WG;
            if (d < dim) {
                var sum = acc[u] * alpha;
                for (var jj = 0u; jj < count; jj++) {
                    sum = fma(probs[jj], load_elem(v[v_at + (j0 + jj) * dim + d]), sum);
                }
                acc[u] = sum;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    for (var u = 0u; u < DIMS_PER_THREAD; u++) {
        let d = t + u * WG;
        if (d < dim) {
            o[o_at + d] = store_elem(result(acc[u], l, visible <= first));
        }
    }
    if (t == 0u) {
        store_stats(row, m, l);
    }
}

// The tiled kernel, for head_dim <= 128: one workgroup per 16 query rows of one (batch, head), on the
// grid's x (row tile) and y (batch * heads). Its 64 threads stage the 16 query rows once, then keys
// and values 16 at a time, in workgroup memory as vec4s, so each key and value is read once per 16
// query rows rather than once per row. Thread t serves query row t / 4: it computes that row's
// scores for keys 4 (t % 4) .. 4 (t % 4) + 4 of the chunk, and after a barrier reads the row's 16
// scores to update the running maximum and denominator and its 32 output dims 4 c .. 4 c + 4 for
// the vec4 columns c = t % 4 + 4 u. Masking, NaN and -inf rules are the row kernel's. Parameter
// words as above.

const BR: u32 = 16u; // query rows per workgroup
const BC: u32 = 16u; // keys per chunk
const D4: u32 = 32u; // vec4 columns of a tile row (head_dim <= 128)

var<workgroup> q_tile: array<vec4<f32>, 512>; // [BR][D4]
var<workgroup> k_tile: array<vec4<f32>, 512>; // [BC][D4]
var<workgroup> v_tile: array<vec4<f32>, 512>; // [BC][D4]
var<workgroup> s_tile: array<f32, 256>; // [BR][BC]: the chunk's scores

// Query row `row` (of `dim` elements, from element `base` of q) into `quarter`'s vec4 columns of
// q_tile row `slot`: zeros past `dim`, and for the whole row when `real` is false.
fn stage_q(base: u32, row: u32, dim: u32, d4: u32, quarter: u32, slot: u32, real: bool) {
    for (var c = quarter; c < d4; c += 4u) {
        q_tile[slot * D4 + c] = load4(0u, base + row * dim, c, dim, real);
    }
}

// Key and value row `row` into k_tile and v_tile row `slot`, as `stage_q` does.
fn stage_kv(k_base: u32, v_base: u32, row: u32, dim: u32, d4: u32, quarter: u32, slot: u32,
            real: bool) {
    for (var c = quarter; c < d4; c += 4u) {
        k_tile[slot * D4 + c] = load4(1u, k_base + row * dim, c, dim, real);
        v_tile[slot * D4 + c] = load4(2u, v_base + row * dim, c, dim, real);
    }
}

// Elements 4 c .. 4 c + 4 of the row at `at` in q (which 0), k (1) or v (2), zero past `dim`.
fn load4(which: u32, at: u32, c: u32, dim: u32, real: bool) -> vec4<f32> {
    var out = vec4<f32>(0.0);
    if (!real) {
        return out;
    }
    for (var x = 0u; x < 4u; x++) {
        let d = 4u * c + x;
        if (d < dim) {
            if (which == 0u) {
                out[x] = load_elem(q[at + d]);
            } else if (which == 1u) {
                out[x] = load_elem(k[at + d]);
            } else {
                out[x] = load_elem(v[at + d]);
            }
        }
    }
    return out;
}

@compute @workgroup_size(64)
fn attention_tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let NEG_INF = bitcast<f32>(0xff800000u);
    let sq = p[1];
    let skv = p[2];
    let dim = p[3];
    let scale = bitcast<f32>(p[4]);
    let causal = p[5] != 0u;
    let head = wid.y;
    let i0 = wid.x * BR;
    let r = t / 4u;
    let quarter = t % 4u;
    let i = i0 + r;
    let d4 = (dim + 3u) / 4u;
    let k_base = p[7] + head * skv * dim;
    let v_base = p[8] + head * skv * dim;
    stage_q(p[6] + head * sq * dim, i, dim, d4, quarter, r, i < sq);
    // This launch's keys, p[10] up to p[11], of those the tile's rows see.
    let first = p[10];
    var kv_end = min(skv, p[11]);
    if (causal) {
        kv_end = min(kv_end, i0 + BR);
    }
    var a0 = vec4<f32>(0.0); var a1 = vec4<f32>(0.0); var a2 = vec4<f32>(0.0); var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0); var a5 = vec4<f32>(0.0); var a6 = vec4<f32>(0.0); var a7 = vec4<f32>(0.0);
    var m = NEG_INF;
    var l = 0.0;
    for (var j0 = first; j0 < kv_end; j0 += BC) {
        stage_kv(k_base, v_base, j0 + r, dim, d4, quarter, r, j0 + r < kv_end);
        workgroupBarrier();
        // Scores of keys j0 + 4 quarter + x for this row.
        var dots = vec4<f32>(0.0);
        let key0 = quarter * 4u;
        for (var c = 0u; c < d4; c++) {
            let qv = q_tile[r * D4 + c];
            dots.x += dot(qv, k_tile[key0 * D4 + c]);
            dots.y += dot(qv, k_tile[(key0 + 1u) * D4 + c]);
            dots.z += dot(qv, k_tile[(key0 + 2u) * D4 + c]);
            dots.w += dot(qv, k_tile[(key0 + 3u) * D4 + c]);
        }
        for (var x = 0u; x < 4u; x++) {
            let key = j0 + key0 + x;
            let visible = key < kv_end && (!causal || key <= i);
            s_tile[r * BC + key0 + x] = select(NEG_INF, scale * dots[x], visible);
        }
        workgroupBarrier();
        // The chunk's maximum, NaN ignored (a NaN score still makes the row NaN through the sums).
        var chunk_max = NEG_INF;
        for (var jj = 0u; jj < BC; jj++) {
            let s = s_tile[r * BC + jj];
            chunk_max = select(chunk_max, s, s > chunk_max);
        }
        let m_new = select(m, chunk_max, chunk_max > m);
        let alpha = select(exp(m - m_new), 1.0, m == m_new);
        l *= alpha;
        a0 *= alpha; a1 *= alpha; a2 *= alpha; a3 *= alpha;
        a4 *= alpha; a5 *= alpha; a6 *= alpha; a7 *= alpha;
        for (var jj = 0u; jj < BC; jj++) {
            let s = s_tile[r * BC + jj];
            // While every score so far is -inf, nothing is accumulated (and no -inf - -inf appears).
            var prob = 0.0;
            if (!(s == NEG_INF && m_new == NEG_INF)) {
                prob = exp(s - m_new);
            }
            l += prob;
            let pv = vec4<f32>(prob);
            let row = jj * D4 + quarter;
            a0 = fma(pv, v_tile[row], a0);
            a1 = fma(pv, v_tile[row + 4u], a1);
            if (d4 > 8u) {
                a2 = fma(pv, v_tile[row + 8u], a2);
                a3 = fma(pv, v_tile[row + 12u], a3);
            }
            if (d4 > 16u) {
                a4 = fma(pv, v_tile[row + 16u], a4);
                a5 = fma(pv, v_tile[row + 20u], a5);
                a6 = fma(pv, v_tile[row + 24u], a6);
                a7 = fma(pv, v_tile[row + 28u], a7);
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    if (i >= sq) {
        return;
    }
    let o_at = p[9] + (head * sq + i) * dim;
    var row_end = min(skv, p[11]);
    if (causal) {
        row_end = min(row_end, i + 1u);
    }
    let empty = row_end <= first;
    if (quarter == 0u) {
        store_stats(head * sq + i, m, l);
    }
    store4(o_at, quarter, dim, a0, l, empty);
    store4(o_at, quarter + 4u, dim, a1, l, empty);
    store4(o_at, quarter + 8u, dim, a2, l, empty);
    store4(o_at, quarter + 12u, dim, a3, l, empty);
    store4(o_at, quarter + 16u, dim, a4, l, empty);
    store4(o_at, quarter + 20u, dim, a5, l, empty);
    store4(o_at, quarter + 24u, dim, a6, l, empty);
    store4(o_at, quarter + 28u, dim, a7, l, empty);
}

// Writes `result` of acc and l to dims 4 c .. 4 c + 4 of the output row at `at`, inside `dim`.
fn store4(at: u32, c: u32, dim: u32, acc: vec4<f32>, l: f32, empty: bool) {
    for (var x = 0u; x < 4u; x++) {
        let d = 4u * c + x;
        if (d < dim) {
            o[at + d] = store_elem(result(acc[x], l, empty));
        }
    }
}
