// Stable sorts along one dim (`SortDesc`) by ranks: one invocation per element counts the elements
// of its line (the positions sharing every coordinate but DIM) that come before it in the sort's
// total order, or equal it at an earlier position, and writes itself at that rank: its bits to
// `vals` (VALUES) and its position along DIM as an i64 to `idx` (INDICES) when its rank is below k.
// The ranks of a line are a permutation, so every output element is written once. O(len) per element: lines longer than
// the loop budget are refused on the host.
//
// The order needs no float arithmetic (see order.wgsl): NaN after every number, -0 equal to +0;
// DESCENDING reverses it, equal elements keeping their input order either way.
//
// Parameter words (`p`): [0] elements, [1] rank (at most 8), [2..10) the input's shape, [10] the
// input's byte address, [11..19) its strides (elements), [19] the byte address of `vals`, [20] the
// element offset of `idx` (i64 elements), [21] the product of the dims after DIM, [22] k: the ranks
// written (the outputs have the input's shape with DIM cut to k).

override DIM: u32 = 0u;
override DESCENDING: bool = false;
override VALUES: bool = true;
override INDICES: bool = true;

@group(0) @binding(0) var<storage, read_write> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> vals: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> idx: array<u32>;
@group(0) @binding(3) var<storage, read> p: array<u32>;

const WG: u32 = 256u;
const SHAPE: u32 = 2u;
const X_VIEW: u32 = 10u;
const VALS_AT: u32 = 19u;
const IDX_AT: u32 = 20u;
const INNER: u32 = 21u;
const K: u32 = 22u;

// The element whose first byte is `at`, as (low word, high word).
fn load_x(at: u32) -> vec2<u32> {
    let w = at >> 2u;
    var w1 = 0u;
    if (WIDTH == 8u) {
        w1 = x[w + 1u];
    }
    return bits_of(x[w], w1, at, WIDTH);
}

// The element's key in the sort's total order: NaN above every number, zeros of both signs alike.
fn sort_key(v: vec2<u32>) -> vec2<u32> {
    let pv = promote(v);
    if (is_nan(pv)) {
        return vec2<u32>(0xffffffffu, 0xffffffffu);
    }
    if (is_zero(pv)) {
        return key(vec2<u32>(0u, 0u));
    }
    return key(pv);
}

fn less(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.x < b.x || (a.x == b.x && a.y < b.y);
}

// Writes the `mask` bits of word `w` of `vals` to those of `bits`.
fn store_bits(w: u32, bits: u32, mask: u32) {
    if (mask == 0xffffffffu) {
        atomicStore(&vals[w], bits);
        return;
    }
    atomicAnd(&vals[w], ~mask);
    atomicOr(&vals[w], bits & mask);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let e = (wid.x + wid.y * groups.x) * WG + lid;
    if (e >= p[0]) {
        return;
    }
    var rest = e;
    var at = 0u;
    var pos = 0u;
    for (var d = p[1]; d > 0u; d--) {
        let k = d - 1u;
        let extent = p[SHAPE + k];
        let c = rest % extent;
        rest /= extent;
        at += c * p[X_VIEW + 1u + k];
        if (k == DIM) {
            pos = c;
        }
    }
    let stride = p[X_VIEW + 1u + DIM];
    let base = at - pos * stride;
    let len = p[SHAPE + DIM];
    let mine = load_x(p[X_VIEW] + at * WIDTH);
    let k_mine = sort_key(mine);
    var rank = 0u;
    for (var i = 0u; i < len; i++) {
        let k_i = sort_key(load_x(p[X_VIEW] + (base + i * stride) * WIDTH));
        var before = less(k_i, k_mine);
        if (DESCENDING) {
            before = less(k_mine, k_i);
        }
        if (before || (all(k_i == k_mine) && i < pos)) {
            rank++;
        }
    }
    if (rank >= p[K]) {
        return;
    }
    let inner = p[INNER];
    let out = (e / (len * inner) * p[K] + rank) * inner + e % inner;
    if (VALUES) {
        let byte = p[VALS_AT] + out * WIDTH;
        if (WIDTH == 8u) {
            store_bits(byte >> 2u, mine.x, 0xffffffffu);
            store_bits((byte >> 2u) + 1u, mine.y, 0xffffffffu);
        } else if (WIDTH == 4u) {
            store_bits(byte >> 2u, mine.x, 0xffffffffu);
        } else {
            let shift = (byte & 3u) * 8u;
            let mask = select(0xffu, 0xffffu, WIDTH == 2u);
            store_bits(byte >> 2u, mine.x << shift, mask << shift);
        }
    }
    if (INDICES) {
        let w = 2u * (p[IDX_AT] + out);
        idx[w] = pos;
        idx[w + 1u] = 0u;
    }
}
