// Scaled dot-product attention in f32, flash style: one workgroup per query row, keys and values
// streamed in chunks of 128 with an online softmax (running maximum and denominator, accumulators
// rescaled as the maximum grows), so no score matrix is ever stored. With a causal mask (aligned top
// left, as PyTorch's is_causal) row i reads only keys 0..=i: the chunks past it are never visited.
// Thread t owns output dims t, t + 128, ... (head_dim <= 1024). Rows are indexed over a 2-D grid.
//
// Parameter words (`p`): [0] rows (batch * heads * seq_q), [1] seq_q, [2] seq_kv, [3] head_dim,
// [4] scale as f32 bits, [5] causal, [6..10) element offsets of q, k, v, o.

@group(0) @binding(0) var<storage, read_write> q: array<f32>;
@group(0) @binding(1) var<storage, read_write> k: array<f32>;
@group(0) @binding(2) var<storage, read_write> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

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
    let q_at = p[6] + row * dim;
    let k_at = p[7] + head * skv * dim;
    let v_at = p[8] + head * skv * dim;
    let o_at = p[9] + row * dim;
    for (var d = t; d < dim; d += WG) {
        q_row[d] = q[q_at + d];
    }
    var acc: array<f32, 8>;
    for (var u = 0u; u < DIMS_PER_THREAD; u++) {
        acc[u] = 0.0;
    }
    var m = NEG_INF;
    var l = 0.0;
    workgroupBarrier();
    for (var j0 = 0u; j0 < visible; j0 += WG) {
        let j = j0 + t;
        let real = j < visible;
        var score = NEG_INF;
        if (real) {
            var dot = 0.0;
            for (var d = 0u; d < dim; d++) {
                dot = fma(q_row[d], k[k_at + j * dim + d], dot);
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
                    sum = fma(probs[jj], v[v_at + (j0 + jj) * dim + d], sum);
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
            o[o_at + d] = select(acc[u] / l, 0.0, visible == 0u);
        }
    }
}
