// Comparison and selection. `compare` (`CompareDesc`): out[i] = OP(a[i], b[i]) as a U8 0 or 1.
// `select` (`WhereDesc`): out[i] = a[i] != 0 ? b[i] : c[i], elements moved as bits. Operands are
// strided (broadcast dims have stride 0) over the output's shape; b and c may instead be scalars
// held in the parameter words (B_SCALAR, C_SCALAR).
//
// Comparisons need no float arithmetic, so every dtype compares exactly, f64 and i64 included, and
// no device flushes a subnormal: each value is promoted to a pair of words (hi, lo) with its sign
// bit on top (f16 and bf16 shifted up 16 bits, 32-bit values in `hi`, u8 as it is), then
// - NaN (KIND 0) is a magnitude above +inf's (INF_HI, 0): every comparison with it is false but NE;
// - two zeros of any sign are equal;
// - otherwise values order as their keys, compared as unsigned pairs: a float's key is its bits
//   with the sign set when positive and all bits flipped when negative; a signed integer's is its
//   bits with the sign flipped; an unsigned one's is its bits.
// The logical ops take any value but a zero as true (NaN included).
//
// Buffers are arrays of 32-bit words; each operand is located by the byte address of its element 0
// and its elements are aligned to their width (1, 2, 4 or 8 bytes). Output elements are OUT_WIDTH
// bytes (compare: 1); one invocation writes one output word, holding up to 4 / OUT_WIDTH elements
// (an 8-byte element: one invocation, two words), through atomics where the word is shared with
// memory outside the output.
//
// Parameter words (`p`): [0] invocations, [1] rank (at most 8), [2..10) the output's shape,
// [10..19) a: byte address then strides (elements), [19..28) b, [28..37) c, [37] the output's byte
// address, [38] output elements, [39..41) b's scalar bits (low word, high word), [41..43) c's.

// Compare: the CompareOp code.
override OP: u32 = 0u;
// WIDTH (order.wgsl): bytes per element of b and c (compare: of a too).
// Bytes per element of a (select: 1).
override A_WIDTH: u32 = 4u;
// Bytes per output element.
override OUT_WIDTH: u32 = 1u;
override B_SCALAR: bool = false;
override C_SCALAR: bool = false;
// `select` instead of `compare`.
override SELECT: bool = false;

@group(0) @binding(0) var<storage, read_write> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> c: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

const WG: u32 = 256u;
const SHAPE: u32 = 2u;
const A_VIEW: u32 = 10u;
const B_VIEW: u32 = 19u;
const C_VIEW: u32 = 28u;
const OUT_AT: u32 = 37u;
const N: u32 = 38u;
const B_BITS: u32 = 39u;
const C_BITS: u32 = 41u;

const CMP_EQ: u32 = 0u;
const CMP_NE: u32 = 1u;
const CMP_LT: u32 = 2u;
const CMP_LE: u32 = 3u;
const CMP_GT: u32 = 4u;
const CMP_GE: u32 = 5u;
const CMP_LOGICAL_AND: u32 = 6u;
const CMP_LOGICAL_OR: u32 = 7u;
const CMP_LOGICAL_XOR: u32 = 8u;

// One loader per binding (WGSL functions cannot take a pointer to a storage buffer). `at` is the
// element's byte address.
fn load_a(at: u32) -> vec2<u32> {
    let w = at >> 2u;
    var w1 = 0u;
    if (A_WIDTH == 8u) {
        w1 = a[w + 1u];
    }
    return bits_of(a[w], w1, at, A_WIDTH);
}

fn load_b(at: u32) -> vec2<u32> {
    if (B_SCALAR) {
        return vec2<u32>(p[B_BITS], p[B_BITS + 1u]);
    }
    let w = at >> 2u;
    var w1 = 0u;
    if (WIDTH == 8u) {
        w1 = b[w + 1u];
    }
    return bits_of(b[w], w1, at, WIDTH);
}

fn load_c(at: u32) -> vec2<u32> {
    if (C_SCALAR) {
        return vec2<u32>(p[C_BITS], p[C_BITS + 1u]);
    }
    let w = at >> 2u;
    var w1 = 0u;
    if (WIDTH == 8u) {
        w1 = c[w + 1u];
    }
    return bits_of(c[w], w1, at, WIDTH);
}

// OP(x, y) for promoted values.
fn compare_values(x: vec2<u32>, y: vec2<u32>) -> bool {
    let tx = !is_zero(x);
    let ty = !is_zero(y);
    switch OP {
        case CMP_LOGICAL_AND: { return tx && ty; }
        case CMP_LOGICAL_OR: { return tx || ty; }
        case CMP_LOGICAL_XOR: { return tx != ty; }
        default: {}
    }
    if (is_nan(x) || is_nan(y)) {
        return OP == CMP_NE;
    }
    let eq = all(x == y) || (!tx && !ty);
    let kx = key(x);
    let ky = key(y);
    let lt = !eq && (kx.x < ky.x || (kx.x == ky.x && kx.y < ky.y));
    switch OP {
        case CMP_EQ: { return eq; }
        case CMP_NE: { return !eq; }
        case CMP_LT: { return lt; }
        case CMP_LE: { return lt || eq; }
        case CMP_GT: { return !lt && !eq; }
        default: { return !lt; }
    }
}

// Output element `e` as bits (low, high).
fn element(e: u32) -> vec2<u32> {
    var rest = e;
    var at_a = 0u;
    var at_b = 0u;
    var at_c = 0u;
    for (var d = p[1]; d > 0u; d--) {
        let extent = p[SHAPE + d - 1u];
        let k = rest % extent;
        rest /= extent;
        at_a += k * p[A_VIEW + d];
        at_b += k * p[B_VIEW + d];
        at_c += k * p[C_VIEW + d];
    }
    let va = load_a(p[A_VIEW] + at_a * A_WIDTH);
    if (SELECT) {
        if (va.x != 0u) {
            return load_b(p[B_VIEW] + at_b * WIDTH);
        }
        return load_c(p[C_VIEW] + at_c * WIDTH);
    }
    let vb = load_b(p[B_VIEW] + at_b * WIDTH);
    return vec2<u32>(select(0u, 1u, compare_values(promote(va), promote(vb))), 0u);
}

// Writes output word `w` of the invocation (see the header).
fn write(w: u32) {
    let base = p[OUT_AT];
    let n = p[N];
    if (OUT_WIDTH == 8u) {
        let v = element(w);
        atomicStore(&out[(base >> 2u) + 2u * w], v.x);
        atomicStore(&out[(base >> 2u) + 2u * w + 1u], v.y);
        return;
    }
    let word = (base >> 2u) + w;
    let m = 0xffffffffu >> (32u - 8u * min(OUT_WIDTH, 4u));
    var bits = 0u;
    var mask = 0u;
    for (var j = 0u; j < 4u / OUT_WIDTH; j++) {
        let byte = 4u * word + j * OUT_WIDTH;
        if (byte < base) {
            continue;
        }
        let e = (byte - base) / OUT_WIDTH;
        if (e >= n) {
            break;
        }
        let shift = 8u * j * OUT_WIDTH;
        bits |= (element(e).x & m) << shift;
        mask |= m << shift;
    }
    if (mask == 0xffffffffu) {
        atomicStore(&out[word], bits);
    } else if (mask != 0u) {
        atomicAnd(&out[word], ~mask);
        atomicOr(&out[word], bits);
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let w = (wid.x + wid.y * groups.x) * WG + lid;
    if (w >= p[0]) {
        return;
    }
    write(w);
}
