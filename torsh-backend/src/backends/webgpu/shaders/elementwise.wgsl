// Elementwise kernels: fill, strided copy, unary and binary ops over strided operands, with f32 math
// on elements of type `elem`, which a prelude defines with its `load_elem` and `store_elem`:
// `elem_f32.wgsl` (f32) or, on devices with `shader-f16`, `elem_f16.wgsl` (f16 storage).
//
// Every entry point computes `n` elements, one per invocation, indexed over a 2-D grid of 256-wide
// workgroups (so more than 65 535 workgroups fit). Operands, the output included, are strided views:
// the row-major element index is split over the (coalesced) shape and dotted with each view's strides.
// The op is a pipeline-overridable constant, so each op is its own specialised pipeline.
//
// Parameter words (`p`): [0] n, [1] rank (at most 8), [2..10) shape, then three views of nine words
// each (offset, then eight strides): the output at [10], a at [19], b at [28]; [37] a scalar operand
// as f32 bits (the fill value, or `binary_scalar`'s right operand).

override OP: u32 = 0u;
// Every view is dense (after coalescing: one dim of stride 1): element i is at offset + i, with no
// index arithmetic (integer division is slow on many devices, software Vulkan above all).
override DENSE: bool = false;

@group(0) @binding(0) var<storage, read_write> a: array<elem>;
@group(0) @binding(1) var<storage, read_write> b: array<elem>;
@group(0) @binding(2) var<storage, read_write> out: array<elem>;
@group(0) @binding(3) var<storage, read> p: array<u32>;

const WG: u32 = 256u;
const SHAPE: u32 = 2u;
const OUT_VIEW: u32 = 10u;
const A_VIEW: u32 = 19u;
const B_VIEW: u32 = 28u;
const SCALAR: u32 = 37u;

// The invocation's element index.
fn index_of(wid: vec3<u32>, groups: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * groups.x) * WG + lid;
}

// The element offset of row-major index `i` in the view whose offset and strides start at `view`.
fn strided(i: u32, view: u32) -> u32 {
    if (DENSE) {
        return p[view] + i;
    }
    var rest = i;
    var off = p[view];
    for (var d = p[1]; d > 0u; d--) {
        let extent = p[SHAPE + d - 1u];
        off += (rest % extent) * p[view + d];
        rest /= extent;
    }
    return off;
}

// erf(a)/a - 1 for |a| <= 1, a minimax polynomial in a^2 (the CPU kernels' coefficients).
fn erf_small(a: f32) -> f32 {
    let s = a * a;
    var q = 7.806903159e-05;
    q = fma(q, s, -7.997853099e-04);
    q = fma(q, s, 5.187162198e-03);
    q = fma(q, s, -2.685334720e-02);
    q = fma(q, s, 1.128357872e-01);
    q = fma(q, s, -3.761262596e-01);
    q = fma(q, s, 1.283791661e-01);
    return fma(a, q, a);
}

// erfc(a) for a >= 0: t * exp(-a^2 + g(t)) with t = 1/(1 + 0.4a), g a degree-10 polynomial in
// u = 2.495t - 1.495 (the CPU kernels' coefficients).
fn erfc_pos(a_in: f32) -> f32 {
    let a = min(a_in, 12.0);
    let t = 1.0 / fma(0.4, a, 1.0);
    let u = fma(t, 2.495049477, -1.495049477);
    var g = 2.583925561e-05;
    g = fma(g, u, 2.011218021e-05);
    g = fma(g, u, -2.075331868e-04);
    g = fma(g, u, -1.604764839e-04);
    g = fma(g, u, 1.335734734e-03);
    g = fma(g, u, 1.361416769e-03);
    g = fma(g, u, -9.392266162e-03);
    g = fma(g, u, -1.897915266e-02);
    g = fma(g, u, 7.896436751e-02);
    g = fma(g, u, 6.539266706e-01);
    g = fma(g, u, -7.068946958e-01);
    return t * exp(g - a * a);
}

fn erf_f32(x: f32) -> f32 {
    let a = abs(x);
    var y: f32;
    if (a < 1.0) {
        y = erf_small(a);
    } else {
        y = 1.0 - erfc_pos(a);
    }
    return select(-y, y, x >= 0.0);
}

// x * Phi(x), the erf form: the tail below zero through erfc so it keeps its relative accuracy.
fn gelu(x: f32) -> f32 {
    let a = abs(x) * 0.7071067811865476;
    if (a < 0.5 || (x >= 0.0 && a < 1.0)) {
        let e = select(-erf_small(a), erf_small(a), x >= 0.0);
        return x * fma(0.5, e, 0.5);
    }
    if (x < 0.0) {
        return 0.5 * x * erfc_pos(a);
    }
    return x * (1.0 - 0.5 * erfc_pos(a));
}

// 0.5x(1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715x^3): no cancellation below 0.
fn gelu_tanh(x: f32) -> f32 {
    let u = 0.7978845608028654 * fma(0.044715 * x, x * x, x);
    return x / (1.0 + exp(-2.0 * u));
}

fn sigmoid(x: f32) -> f32 {
    if (x >= 0.0) {
        return 1.0 / (1.0 + exp(-x));
    }
    let e = exp(x);
    return e / (1.0 + e);
}

fn is_nan(x: f32) -> bool {
    // NaN is the only value whose bits lie above the infinities once the sign is cleared.
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// Op codes, as `UnaryOp::code` and `BinaryOp::code` number them (a test in elementwise.rs reads
// these lines). An unknown code gives NaN.
const UNARY_NEG: u32 = 0u;
const UNARY_ABS: u32 = 1u;
const UNARY_EXP: u32 = 2u;
const UNARY_LOG: u32 = 3u;
const UNARY_SQRT: u32 = 4u;
const UNARY_RSQRT: u32 = 5u;
const UNARY_RECIP: u32 = 6u;
const UNARY_SQUARE: u32 = 7u;
const UNARY_RELU: u32 = 8u;
const UNARY_GELU: u32 = 9u;
const UNARY_GELU_TANH: u32 = 10u;
const UNARY_SIGMOID: u32 = 11u;
const UNARY_SILU: u32 = 12u;
const UNARY_TANH: u32 = 13u;
const UNARY_SIN: u32 = 14u;
const UNARY_COS: u32 = 15u;
const UNARY_ERF: u32 = 16u;
const BINARY_ADD: u32 = 0u;
const BINARY_SUB: u32 = 1u;
const BINARY_MUL: u32 = 2u;
const BINARY_DIV: u32 = 3u;
const BINARY_MAXIMUM: u32 = 4u;
const BINARY_MINIMUM: u32 = 5u;
const BINARY_POW: u32 = 6u;

fn unary_op(x: f32) -> f32 {
    switch OP {
        case UNARY_NEG: { return -x; }
        case UNARY_ABS: { return abs(x); }
        case UNARY_EXP: { return exp(x); }
        case UNARY_LOG: { return log(x); }
        case UNARY_SQRT: { return sqrt(x); }
        case UNARY_RSQRT: { return 1.0 / sqrt(x); }
        case UNARY_RECIP: { return 1.0 / x; }
        case UNARY_SQUARE: { return x * x; }
        case UNARY_RELU: { return select(0.0, x, x > 0.0 || is_nan(x)); }
        case UNARY_GELU: { return gelu(x); }
        case UNARY_GELU_TANH: { return gelu_tanh(x); }
        case UNARY_SIGMOID: { return sigmoid(x); }
        case UNARY_SILU: { return x * sigmoid(x); }
        case UNARY_TANH: { return tanh(x); }
        case UNARY_SIN: { return sin(x); }
        case UNARY_COS: { return cos(x); }
        case UNARY_ERF: { return erf_f32(x); }
        default: { return bitcast<f32>(0x7fc00000u); }
    }
}

// a^b as the reference's powf: negative bases with integer exponents keep their sign.
fn power(x: f32, y: f32) -> f32 {
    if (y == 0.0) {
        return 1.0;
    }
    let m = pow(abs(x), y);
    if (x < 0.0 && floor(y) == y) {
        let odd = abs(y) < 16777216.0 && (i32(abs(y)) & 1) == 1;
        return select(m, -m, odd);
    }
    if (x < 0.0) {
        return bitcast<f32>(0x7fc00000u);
    }
    return m;
}

// Maximum and minimum propagate NaN.
fn binary_op(x: f32, y: f32) -> f32 {
    switch OP {
        case BINARY_ADD: { return x + y; }
        case BINARY_SUB: { return x - y; }
        case BINARY_MUL: { return x * y; }
        case BINARY_DIV: { return x / y; }
        case BINARY_MAXIMUM: {
            if (is_nan(x) || is_nan(y)) { return bitcast<f32>(0x7fc00000u); }
            return max(x, y);
        }
        case BINARY_MINIMUM: {
            if (is_nan(x) || is_nan(y)) { return bitcast<f32>(0x7fc00000u); }
            return min(x, y);
        }
        case BINARY_POW: { return power(x, y); }
        default: { return bitcast<f32>(0x7fc00000u); }
    }
}

@compute @workgroup_size(256)
fn fill(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = index_of(wid, groups, lid);
    if (i < p[0]) {
        out[strided(i, OUT_VIEW)] = store_elem(bitcast<f32>(p[SCALAR]));
    }
}

@compute @workgroup_size(256)
fn copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = index_of(wid, groups, lid);
    if (i < p[0]) {
        out[strided(i, OUT_VIEW)] = a[strided(i, A_VIEW)];
    }
}

@compute @workgroup_size(256)
fn unary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = index_of(wid, groups, lid);
    if (i < p[0]) {
        out[strided(i, OUT_VIEW)] = store_elem(unary_op(load_elem(a[strided(i, A_VIEW)])));
    }
}

@compute @workgroup_size(256)
fn binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = index_of(wid, groups, lid);
    if (i < p[0]) {
        let x = load_elem(a[strided(i, A_VIEW)]);
        out[strided(i, OUT_VIEW)] = store_elem(binary_op(x, load_elem(b[strided(i, B_VIEW)])));
    }
}

// `binary` with one value for every right operand: the scalar word.
@compute @workgroup_size(256)
fn binary_scalar(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = index_of(wid, groups, lid);
    if (i < p[0]) {
        let x = load_elem(a[strided(i, A_VIEW)]);
        out[strided(i, OUT_VIEW)] = store_elem(binary_op(x, bitcast<f32>(p[SCALAR])));
    }
}

// g * op'(v) with the formulas of math.rs::unary_grad, from v: the op's input x or its output y as
// `UnaryOp::saved` says (y for exp, sqrt, rsqrt, recip, relu, sigmoid, tanh).
fn unary_grad(v: f32, g: f32) -> f32 {
    switch OP {
        case UNARY_NEG: { return -g; }
        case UNARY_ABS: {
            if (v > 0.0) { return g; }
            if (v < 0.0) { return -g; }
            return 0.0 * g;
        }
        case UNARY_EXP: { return g * v; }
        case UNARY_LOG: { return g / v; }
        case UNARY_SQRT: { return g / (2.0 * v); }
        case UNARY_RSQRT: { return -0.5 * g * v * v * v; }
        case UNARY_RECIP: { return -g * v * v; }
        case UNARY_SQUARE: { return 2.0 * g * v; }
        case UNARY_RELU: { return select(g, 0.0, v <= 0.0); }
        case UNARY_GELU: {
            // Phi(v) through erfc below zero, so it keeps its relative accuracy in the tail.
            let a = abs(v) * 0.7071067811865476;
            var cdf = 0.5 * erfc_pos(a);
            if (v >= 0.0) { cdf = 1.0 - cdf; }
            let pdf = exp(-0.5 * v * v) * 0.3989422804014327;
            return g * (cdf + v * pdf);
        }
        case UNARY_GELU_TANH: {
            let c = 0.7978845608028654;
            let u = c * fma(0.044715 * v, v * v, v);
            let t = 1.0 - 2.0 / (1.0 + exp(2.0 * u));
            let du = c * fma(0.134145 * v, v, 1.0);
            return g * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du);
        }
        case UNARY_SIGMOID: { return g * v * (1.0 - v); }
        case UNARY_SILU: {
            let s = sigmoid(v);
            return g * (s + v * s * (1.0 - s));
        }
        case UNARY_TANH: { return g * (1.0 - v * v); }
        case UNARY_SIN: { return g * cos(v); }
        case UNARY_COS: { return -g * sin(v); }
        case UNARY_ERF: { return g * 1.1283791670955126 * exp(-v * v); }
        default: { return bitcast<f32>(0x7fc00000u); }
    }
}

// The gradient of a unary op's input: out = b * op'(a), a the saved input or output, b the
// gradient of the op's output.
@compute @workgroup_size(256)
fn unary_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let i = index_of(wid, groups, lid);
    if (i < p[0]) {
        let v = load_elem(a[strided(i, A_VIEW)]);
        let g = load_elem(b[strided(i, B_VIEW)]);
        out[strided(i, OUT_VIEW)] = store_elem(unary_grad(v, g));
    }
}
