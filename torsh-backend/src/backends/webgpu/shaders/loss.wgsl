// Cross-entropy of [rows, classes] logits against a class index per row, on `elem` (f32, or f16
// on devices with shader-f16; f32 math, one rounding per stored value). A workgroup of WG threads
// per row (`combine.wgsl`): the row's maximum m, then s = Σ exp(x - m) and Σ x in blocks of
// SUM_BLOCK, lse = m + log(s); then either the loss lse - (1 - ε) · x_t - ε · mean(x) (terms with a
// factor of 0 skipped) or the logits' gradient w · (exp(x - lse) - ε / classes - (1 - ε) · [c == t]).
// A row whose target is the ignore index gives 0; any other target outside [0, classes) raises the
// error flag (`flag`: [0] how many raised it, [1] the op's code, [2], [3] the target as (low, high)
// words, [4] the class count) and leaves its row unwritten. Every thread reaches every combine: the
// row's statistics are taken whatever its target (only params decide the control flow around them).
//
// Parameter words (`p`): [0] rows, [1] classes, [2] logits offset, [3] target offset (words),
// [4] 1 for I64 targets (two words each), 0 for I32, [5] 1 for the backward (`w` the [rows]
// gradients), [6] w offset, [7] output offset, [8] 1 when there is an ignore index, [9], [10] it as
// (low, high) words, [11] ε as f32 bits, [12] the flag's op code.

@group(0) @binding(0) var<storage, read_write> x: array<elem>;
@group(0) @binding(1) var<storage, read_write> classes_of: array<u32>;
@group(0) @binding(2) var<storage, read_write> w: array<elem>;
@group(0) @binding(3) var<storage, read_write> out: array<elem>;
@group(0) @binding(4) var<storage, read_write> flag: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read> p: array<u32>;

// Values a thread adds up before adding their sum to its total (`rows.wgsl`'s SUM_BLOCK).
const SUM_BLOCK: u32 = 64u;

// Raises the error flag for target (lo, hi) of a row of `classes`.
fn raise(lo: u32, hi: u32, classes: u32) {
    if (atomicAdd(&flag[0], 1u) == 0u) {
        atomicStore(&flag[1], p[12]);
        atomicStore(&flag[2], lo);
        atomicStore(&flag[3], hi);
        atomicStore(&flag[4], classes);
    }
}

@compute @workgroup_size(WG)
fn cross_entropy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                 @builtin(local_invocation_index) t: u32) {
    let r = wid.x + wid.y * groups.x;
    if (r >= p[0]) {
        return;
    }
    let classes = p[1];
    let at = p[2] + r * classes;
    var m = bitcast<f32>(0xff800000u);
    for (var j = t; j < classes; j += WG) {
        let v = load_elem(x[at + j]);
        m = select(m, v, v > m);
    }
    m = wg_max(m, t);
    var s = 0.0;
    var sx = 0.0;
    var i = t;
    loop {
        if (i >= classes) {
            break;
        }
        var block = 0.0;
        var block_x = 0.0;
        for (var k = 0u; k < SUM_BLOCK && i < classes; k++) {
            let v = load_elem(x[at + i]);
            block += exp(v - m);
            block_x += v;
            i += WG;
        }
        s += block;
        sx += block_x;
    }
    let lse = m + log(wg_sum(s, t));
    let total_x = wg_sum(sx, t);
    // The target as (low, high) words of an i64.
    var lo: u32;
    var hi: u32;
    if (p[4] != 0u) {
        lo = classes_of[p[3] + 2u * r];
        hi = classes_of[p[3] + 2u * r + 1u];
    } else {
        lo = classes_of[p[3] + r];
        hi = select(0u, 0xffffffffu, (lo & 0x80000000u) != 0u);
    }
    let backward = p[5] != 0u;
    let ignored = p[8] != 0u && lo == p[9] && hi == p[10];
    if (!ignored && (hi != 0u || lo >= classes)) {
        if (t == 0u) {
            raise(lo, hi, classes);
        }
        return;
    }
    let eps = bitcast<f32>(p[11]);
    if (!backward) {
        if (t == 0u) {
            var loss = 0.0;
            if (!ignored) {
                loss = lse;
                if (eps < 1.0) {
                    loss -= (1.0 - eps) * load_elem(x[at + lo]);
                }
                if (eps > 0.0) {
                    loss -= eps * total_x / f32(classes);
                }
            }
            out[p[7] + r] = store_elem(loss);
        }
        return;
    }
    let k = select(load_elem(w[p[6] + r]), 0.0, ignored);
    let spread = eps / f32(classes);
    let base = p[7] + r * classes;
    for (var j = t; j < classes; j += WG) {
        var g = 0.0;
        if (!ignored) {
            g = exp(load_elem(x[at + j]) - lse) - spread;
            if (j == lo) {
                g -= 1.0 - eps;
            }
        }
        out[base + j] = store_elem(k * g);
    }
}
