// The gradients of scaled dot-product attention with f32 math on `elem` elements, flash style: the
// probabilities are rebuilt from each query row's log-sum-exp, a chunk of keys (or queries) at a
// time; no score matrix is stored. Three entry points:
// - attention_backward_delta: one invocation per query row, D = dO · O into `stats` after the rows'
//   log-sum-exps (which the host copies to the front of `stats` first);
// - attention_backward_dq: one workgroup per query row over keys [p[12], p[13]): each thread takes
//   a key of the chunk, its score, probability and dS = P (dO · v − D), then thread t adds dS · k
//   into the row's dims t, t + 128, ... (head_dim <= 1024), and writes scale times the sums;
// - attention_backward_dkv: one workgroup per key row over queries [p[12], p[13]) that see it:
//   each thread takes a query of the chunk, then the key's dims gain dS · q (dK, scaled) and
//   P · dO (dV).
// With p[14] set, a launch adds to what the outputs hold (a later range of keys or queries: the
// host cuts launches to the loop budget). Causal rows see keys j <= i (aligned top left).
//
// Parameter words (`p`): [0] query rows (batch * heads * seq_q), [1] seq_q, [2] seq_kv,
// [3] head_dim, [4] scale as f32 bits, [5] causal, [6..12) element offsets of dO, q, k, v, x, y,
// [12] the first and [13] the end of this launch's keys (dq) or queries (dkv), [14] accumulate,
// [15] key rows (batch * heads * seq_kv). `x` is O (delta), dQ (dq) or dK (dkv); `y` is dV.

@group(0) @binding(0) var<storage, read_write> dout: array<elem>;
@group(0) @binding(1) var<storage, read_write> q: array<elem>;
@group(0) @binding(2) var<storage, read_write> k: array<elem>;
@group(0) @binding(3) var<storage, read_write> v: array<elem>;
@group(0) @binding(4) var<storage, read_write> x: array<elem>;
@group(0) @binding(5) var<storage, read_write> y: array<elem>;
@group(0) @binding(6) var<storage, read_write> stats: array<f32>;
@group(0) @binding(7) var<storage, read> p: array<u32>;

const WG: u32 = 128u;
const DIMS_PER_THREAD: u32 = 8u;

var<workgroup> row_a: array<f32, 1024>;
var<workgroup> row_b: array<f32, 1024>;
var<workgroup> coef_a: array<f32, 128>;
var<workgroup> coef_b: array<f32, 128>;

@compute @workgroup_size(256)
fn attention_backward_delta(@builtin(global_invocation_id) gid: vec3<u32>,
                            @builtin(num_workgroups) groups: vec3<u32>) {
    let row = gid.x + gid.y * groups.x * 256u;
    if (row >= p[0]) {
        return;
    }
    let dim = p[3];
    var acc = 0.0;
    for (var d = 0u; d < dim; d++) {
        acc = fma(load_elem(dout[p[6] + row * dim + d]), load_elem(x[p[10] + row * dim + d]), acc);
    }
    stats[p[0] + row] = acc;
}

// The value stored for an output element: `sum`, plus what the element holds when accumulating.
fn accumulated(sum: f32, held: elem) -> elem {
    if (p[14] != 0u) {
        return store_elem(sum + load_elem(held));
    }
    return store_elem(sum);
}

@compute @workgroup_size(128)
fn attention_backward_dq(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) groups: vec3<u32>,
                         @builtin(local_invocation_index) t: u32) {
    let row = wid.x + wid.y * groups.x;
    if (row >= p[0]) {
        return;
    }
    let sq = p[1];
    let skv = p[2];
    let dim = p[3];
    let scale = bitcast<f32>(p[4]);
    let head = row / sq;
    let i = row % sq;
    var visible = min(skv, p[13]);
    if (p[5] != 0u) {
        visible = min(visible, i + 1u);
    }
    let k_at = p[8] + head * skv * dim;
    let v_at = p[9] + head * skv * dim;
    for (var d = t; d < dim; d += WG) {
        row_a[d] = load_elem(q[p[7] + row * dim + d]);
        row_b[d] = load_elem(dout[p[6] + row * dim + d]);
    }
    let lse = stats[row];
    let delta = stats[p[0] + row];
    var acc: array<f32, 8>;
    for (var u = 0u; u < DIMS_PER_THREAD; u++) {
        acc[u] = 0.0;
    }
    workgroupBarrier();
    for (var j0 = p[12]; j0 < visible; j0 += WG) {
        let j = j0 + t;
        var ds = 0.0;
        if (j < visible) {
            var s = 0.0;
            var dp = 0.0;
            for (var d = 0u; d < dim; d++) {
                s = fma(row_a[d], load_elem(k[k_at + j * dim + d]), s);
                dp = fma(row_b[d], load_elem(v[v_at + j * dim + d]), dp);
            }
            ds = exp(scale * s - lse) * (dp - delta);
        }
        coef_a[t] = ds;
        workgroupBarrier();
        let count = min(WG, visible - j0);
        for (var u = 0u; u < DIMS_PER_THREAD; u++) {
            let d = t + u * WG;
            if (d < dim) {
                var sum = acc[u];
                for (var jj = 0u; jj < count; jj++) {
                    sum = fma(coef_a[jj], load_elem(k[k_at + (j0 + jj) * dim + d]), sum);
                }
                acc[u] = sum;
            }
        }
        workgroupBarrier();
    }
    let x_at = p[10] + row * dim;
    for (var u = 0u; u < DIMS_PER_THREAD; u++) {
        let d = t + u * WG;
        if (d < dim) {
            x[x_at + d] = accumulated(scale * acc[u], x[x_at + d]);
        }
    }
}

@compute @workgroup_size(128)
fn attention_backward_dkv(@builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) groups: vec3<u32>,
                          @builtin(local_invocation_index) t: u32) {
    let col = wid.x + wid.y * groups.x;
    if (col >= p[15]) {
        return;
    }
    let sq = p[1];
    let skv = p[2];
    let dim = p[3];
    let scale = bitcast<f32>(p[4]);
    let head = col / skv;
    let j = col % skv;
    // Queries of this launch that see key j: all, or (causal) those from j on.
    var start = p[12];
    if (p[5] != 0u) {
        start = max(start, j);
    }
    let end = min(sq, p[13]);
    for (var d = t; d < dim; d += WG) {
        row_a[d] = load_elem(k[p[8] + col * dim + d]);
        row_b[d] = load_elem(v[p[9] + col * dim + d]);
    }
    var acc_k: array<f32, 8>;
    var acc_v: array<f32, 8>;
    for (var u = 0u; u < DIMS_PER_THREAD; u++) {
        acc_k[u] = 0.0;
        acc_v[u] = 0.0;
    }
    workgroupBarrier();
    for (var i0 = start; i0 < end; i0 += WG) {
        let i = i0 + t;
        var prob = 0.0;
        var ds = 0.0;
        if (i < end) {
            let row = head * sq + i;
            var s = 0.0;
            var dp = 0.0;
            for (var d = 0u; d < dim; d++) {
                s = fma(load_elem(q[p[7] + row * dim + d]), row_a[d], s);
                dp = fma(load_elem(dout[p[6] + row * dim + d]), row_b[d], dp);
            }
            prob = exp(scale * s - stats[row]);
            ds = prob * (dp - stats[p[0] + row]);
        }
        coef_a[t] = ds;
        coef_b[t] = prob;
        workgroupBarrier();
        let count = min(WG, end - i0);
        for (var u = 0u; u < DIMS_PER_THREAD; u++) {
            let d = t + u * WG;
            if (d < dim) {
                var sum_k = acc_k[u];
                var sum_v = acc_v[u];
                for (var ii = 0u; ii < count; ii++) {
                    let at = (head * sq + i0 + ii) * dim + d;
                    sum_k = fma(coef_a[ii], load_elem(q[p[7] + at]), sum_k);
                    sum_v = fma(coef_b[ii], load_elem(dout[p[6] + at]), sum_v);
                }
                acc_k[u] = sum_k;
                acc_v[u] = sum_v;
            }
        }
        workgroupBarrier();
    }
    let at = col * dim;
    for (var u = 0u; u < DIMS_PER_THREAD; u++) {
        let d = t + u * WG;
        if (d < dim) {
            x[p[10] + at + d] = accumulated(scale * acc_k[u], x[p[10] + at + d]);
            y[p[11] + at + d] = accumulated(acc_v[u], y[p[11] + at + d]);
        }
    }
}
