// Inclusive scans along one dim (`ScanDesc`): y[.., i, ..] = x[.., 0, ..] + ... + x[.., i, ..] (or
// the product, PROD), for f32 (KIND 0), 32-bit integers (KIND 1) and 64-bit integers (KIND 2: two
// words, low first; products by wide.wgsl's mul64); integers wrap. One invocation per line (the
// positions sharing every coordinate but DIM), walking indices [start, end) of DIM in order; with
// start > 0 the running value starts from the output at start - 1, written by the launch before, so
// a dim longer than the loop budget runs as launches over consecutive ranges.
//
// Parameter words (`p`): [0] lines, [1] rank (at most 8), [2..10) the input's shape, [10] the
// input's element offset, [11..19) its strides, [19] the output's element offset, [20..28) its
// strides (dense), [28] start, [29] end.

override DIM: u32 = 0u;
override PROD: bool = false;
override KIND: u32 = 0u;

@group(0) @binding(0) var<storage, read_write> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> y: array<u32>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

const WG: u32 = 256u;
const SHAPE: u32 = 2u;
const X_VIEW: u32 = 10u;
const Y_VIEW: u32 = 19u;
const START: u32 = 28u;
const END: u32 = 29u;

// Element `at` as (low word, high word).
fn load_x(at: u32) -> vec2<u32> {
    if (KIND == 2u) {
        return vec2<u32>(x[2u * at], x[2u * at + 1u]);
    }
    return vec2<u32>(x[at], 0u);
}

fn load_y(at: u32) -> vec2<u32> {
    if (KIND == 2u) {
        return vec2<u32>(y[2u * at], y[2u * at + 1u]);
    }
    return vec2<u32>(y[at], 0u);
}

fn store_y(at: u32, v: vec2<u32>) {
    if (KIND == 2u) {
        y[2u * at] = v.x;
        y[2u * at + 1u] = v.y;
    } else {
        y[at] = v.x;
    }
}

fn combine(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    if (KIND == 0u) {
        let fa = bitcast<f32>(a.x);
        let fb = bitcast<f32>(b.x);
        return vec2<u32>(bitcast<u32>(select(fa + fb, fa * fb, PROD)), 0u);
    }
    if (KIND == 1u) {
        return vec2<u32>(select(a.x + b.x, a.x * b.x, PROD), 0u);
    }
    if (PROD) {
        return mul64(a, b);
    }
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let line = (wid.x + wid.y * groups.x) * WG + lid;
    if (line >= p[0]) {
        return;
    }
    var rest = line;
    var at_x = p[X_VIEW];
    var at_y = p[Y_VIEW];
    for (var d = p[1]; d > 0u; d--) {
        let k = d - 1u;
        if (k == DIM) {
            continue;
        }
        let extent = p[SHAPE + k];
        let c = rest % extent;
        rest /= extent;
        at_x += c * p[X_VIEW + 1u + k];
        at_y += c * p[Y_VIEW + 1u + k];
    }
    let sx = p[X_VIEW + 1u + DIM];
    let sy = p[Y_VIEW + 1u + DIM];
    var i = p[START];
    var acc: vec2<u32>;
    if (i == 0u) {
        acc = load_x(at_x);
        store_y(at_y, acc);
        i = 1u;
    } else {
        acc = load_y(at_y + (i - 1u) * sy);
    }
    for (; i < p[END]; i++) {
        acc = combine(acc, load_x(at_x + i * sx));
        store_y(at_y + i * sy, acc);
    }
}
