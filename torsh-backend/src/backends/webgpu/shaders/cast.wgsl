// Conversion and copy between any two dtypes, from a strided source to a strided destination, each at
// any element-aligned byte address: casts, copies of every dtype, fills, and the staging of 16-bit and
// misaligned operands into aligned f32 copies (and back) for the other kernels.
//
// Buffers are arrays of 32-bit words and elements are located by byte address, so 1-, 2- and 8-byte
// elements and unaligned views need no other kernel. One invocation converts one element. Writes go
// through atomics: an element narrower than a word shares its word with neighbours that other
// invocations write, and and-then-or on the element's own bits cannot lose theirs.
//
// Numbers pass through an exact intermediate form (sign, 64-bit magnitude m, exponent e: m·2^e) and
// are rounded once into the destination, to nearest with ties to even, with overflow to infinity and
// gradual underflow, as Rust's `as` and the `half` crate do through f64. Floats convert to integers by
// truncation with saturation (NaN to 0); integers to integers wrap; integers to floats round to f64
// first and then to the destination, which is what the reference's `i64 as f64` then `as f32` does.
// A cast between equal dtypes copies the bits.
//
// Dtype codes are `DType::ALL`'s order: 0 f32, 1 f64, 2 f16, 3 bf16, 4 i32, 5 i64, 6 u8.
//
// Parameter words (`p`): [0] n, [1] rank (at most 8), [2..10) shape, [10] source byte address,
// [11..19) source strides (elements), [19] destination byte address, [20..28) destination strides,
// [28], [29] the constant source's bits (low, high word) when CONST_SRC.

override SRC: u32 = 0u;
override DST: u32 = 0u;
// The source is the constant in p[28..30) (a fill), not the source buffer.
override CONST_SRC: bool = false;
// Both views are dense after coalescing (one dim of stride 1): element i is at index i, with no
// index arithmetic.
override DENSE: bool = false;

@group(0) @binding(0) var<storage, read_write> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

const WG: u32 = 256u;
const SHAPE: u32 = 2u;
const SRC_VIEW: u32 = 10u;
const DST_VIEW: u32 = 19u;
const CONSTANT: u32 = 28u;

const F32: u32 = 0u;
const F64: u32 = 1u;
const F16: u32 = 2u;
const BF16: u32 = 3u;
const I32: u32 = 4u;
const I64: u32 = 5u;
const U8: u32 = 6u;

// ---- 64-bit unsigned integers as (low, high) words ----

fn shl64(x: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) { return x; }
    if (s >= 64u) { return vec2<u32>(0u, 0u); }
    if (s >= 32u) { return vec2<u32>(0u, x.x << (s - 32u)); }
    return vec2<u32>(x.x << s, (x.y << s) | (x.x >> (32u - s)));
}

fn shr64(x: vec2<u32>, s: u32) -> vec2<u32> {
    if (s == 0u) { return x; }
    if (s >= 64u) { return vec2<u32>(0u, 0u); }
    if (s >= 32u) { return vec2<u32>(x.y >> (s - 32u), 0u); }
    return vec2<u32>((x.x >> s) | (x.y << (32u - s)), x.y >> s);
}

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn neg64(a: vec2<u32>) -> vec2<u32> {
    return add64(vec2<u32>(~a.x, ~a.y), vec2<u32>(1u, 0u));
}

// a > b
fn gt64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y > b.y || (a.y == b.y && a.x > b.x);
}

fn is_zero64(a: vec2<u32>) -> bool {
    return (a.x | a.y) == 0u;
}

// Bits in use: 64 minus the leading zeros (0 for zero).
fn bit_length64(a: vec2<u32>) -> u32 {
    if (a.y != 0u) { return 64u - countLeadingZeros(a.y); }
    return 32u - countLeadingZeros(a.x);
}

// ---- loads and stores of one element at a byte address ----

fn size_of(code: u32) -> u32 {
    switch code {
        case 1u, 5u: { return 8u; }
        case 2u, 3u: { return 2u; }
        case 6u: { return 1u; }
        default: { return 4u; }
    }
}

// 32 bits from byte address `at` (any alignment).
fn load_word(at: u32) -> u32 {
    let w = at >> 2u;
    let shift = (at & 3u) * 8u;
    if (shift == 0u) { return src[w]; }
    return (src[w] >> shift) | (src[w + 1u] << (32u - shift));
}

// The element of `code` at byte address `at`, zero-extended into (low, high).
fn load(code: u32, at: u32) -> vec2<u32> {
    let size = size_of(code);
    if (size == 8u) { return vec2<u32>(load_word(at), load_word(at + 4u)); }
    if (size == 4u) { return vec2<u32>(load_word(at), 0u); }
    // A narrow element may be the buffer's last bytes: read only the words it lies in.
    let w = at >> 2u;
    let shift = (at & 3u) * 8u;
    var bits = src[w] >> shift;
    if (shift + size * 8u > 32u) { bits |= src[w + 1u] << (32u - shift); }
    let mask = select(0xffffu, 0xffu, size == 1u);
    return vec2<u32>(bits & mask, 0u);
}

// Writes the `mask` bits of word `w` to those of `bits`.
fn store_bits(w: u32, bits: u32, mask: u32) {
    if (mask == 0u) { return; }
    if (mask == 0xffffffffu) {
        atomicStore(&dst[w], bits);
        return;
    }
    atomicAnd(&dst[w], ~mask);
    atomicOr(&dst[w], bits & mask);
}

// Writes `size` bytes of `bits` at byte address `at`.
fn store_bytes(at: u32, bits: u32, size: u32) {
    let w = at >> 2u;
    let shift = (at & 3u) * 8u;
    let mask = select((1u << (size * 8u)) - 1u, 0xffffffffu, size == 4u);
    store_bits(w, bits << shift, mask << shift);
    if (shift != 0u && shift + size * 8u > 32u) {
        store_bits(w + 1u, bits >> (32u - shift), mask >> (32u - shift));
    }
}

fn store(code: u32, at: u32, bits: vec2<u32>) {
    let size = size_of(code);
    if (size == 8u) {
        store_bytes(at, bits.x, 4u);
        store_bytes(at + 4u, bits.y, 4u);
    } else {
        store_bytes(at, bits.x, size);
    }
}

// ---- the exact intermediate form ----

const FINITE: u32 = 0u;
const INFINITE: u32 = 1u;
const NAN: u32 = 2u;

struct Num {
    negative: bool,
    kind: u32,
    // The magnitude m·2^e of a finite value; for a NaN, its payload left-aligned in m.
    m: vec2<u32>,
    e: i32,
}

// A float format: significand bits with the implicit one, exponent field width, smallest exponent
// of the last significand bit (that of the subnormals).
struct Format {
    p: u32,
    exp_bits: u32,
    q_min: i32,
}

fn format_of(code: u32) -> Format {
    switch code {
        case 1u: { return Format(53u, 11u, -1074); }
        case 2u: { return Format(11u, 5u, -24); }
        case 3u: { return Format(8u, 8u, -133); }
        default: { return Format(24u, 8u, -149); }
    }
}

fn is_int(code: u32) -> bool {
    return code >= I32;
}

// Splits the float bits `x` (sign at bit total-1) of format `f` into a Num.
fn decode_float(x: vec2<u32>, f: Format) -> Num {
    let frac_bits = f.p - 1u;
    let total = frac_bits + f.exp_bits + 1u;
    let negative = !is_zero64(shr64(x, total - 1u));
    let exp_mask = (1u << f.exp_bits) - 1u;
    let field = shr64(x, frac_bits).x & exp_mask;
    let frac = x & low_mask(frac_bits);
    if (field == exp_mask) {
        if (is_zero64(frac)) {
            return Num(negative, INFINITE, vec2<u32>(0u, 0u), 0);
        }
        return Num(negative, NAN, shl64(frac, 64u - frac_bits), 0);
    }
    if (field == 0u) {
        return Num(negative, FINITE, frac, f.q_min);
    }
    let m = add64(frac, shl64(vec2<u32>(1u, 0u), frac_bits));
    return Num(negative, FINITE, m, f.q_min + i32(field) - 1);
}

fn decode(code: u32, x: vec2<u32>) -> Num {
    switch code {
        case 4u: {
            let negative = (x.x >> 31u) != 0u;
            return Num(negative, FINITE, vec2<u32>(select(x.x, 0u - x.x, negative), 0u), 0);
        }
        case 5u: {
            let negative = (x.y >> 31u) != 0u;
            return Num(negative, FINITE, select(x, neg64(x), negative), 0);
        }
        case 6u: {
            return Num(false, FINITE, x, 0);
        }
        case 3u: {
            return decode_float(vec2<u32>(x.x << 16u, 0u), format_of(F32));
        }
        default: {
            return decode_float(x, format_of(code));
        }
    }
}

// The bits of `v` rounded into format `f` (sign included).
fn encode_float(v: Num, f: Format) -> vec2<u32> {
    let frac_bits = f.p - 1u;
    let total = frac_bits + f.exp_bits + 1u;
    let sign = shl64(vec2<u32>(select(0u, 1u, v.negative), 0u), total - 1u);
    let inf = shl64(vec2<u32>((1u << f.exp_bits) - 1u, 0u), frac_bits);
    if (v.kind == INFINITE) {
        return sign | inf;
    }
    if (v.kind == NAN) {
        // The payload's leading bits; quiet only when none is left (else the result would read as
        // infinity), so a 16-bit NaN survives the round trip through f32 bit for bit.
        var payload = shr64(v.m, 64u - frac_bits);
        if (is_zero64(payload)) {
            payload = shl64(vec2<u32>(1u, 0u), frac_bits - 1u);
        }
        return sign | inf | payload;
    }
    if (is_zero64(v.m)) {
        return sign;
    }
    let top = v.e + i32(bit_length64(v.m)) - 1;
    let q = max(top - i32(frac_bits), f.q_min);
    let shift = q - v.e;
    var mant: vec2<u32>;
    if (shift <= 0) {
        mant = shl64(v.m, u32(-shift));
    } else {
        let s = u32(shift);
        mant = shr64(v.m, s);
        // Round half to even on the dropped bits (beyond 64 of them, all of m is below half).
        if (s <= 64u) {
            let below = v.m & low_mask(s);
            let half = shl64(vec2<u32>(1u, 0u), s - 1u);
            let odd = (mant.x & 1u) != 0u;
            if (gt64(below, half) || (all(below == half) && odd)) {
                mant = add64(mant, vec2<u32>(1u, 0u));
            }
        }
    }
    // Subnormal, normal and the carry of rounding into the next binade all encode as
    // ((q - q_min) << frac_bits) + mant.
    var bits = add64(shl64(vec2<u32>(u32(q - f.q_min), 0u), frac_bits), mant);
    if (!gt64(inf, bits)) {
        bits = inf;
    }
    return sign | bits;
}

// The low `s` bits set (all of them from 64 on).
fn low_mask(s: u32) -> vec2<u32> {
    return add64(shl64(vec2<u32>(1u, 0u), s), vec2<u32>(0xffffffffu, 0xffffffffu));
}

// Truncates a float toward zero into a two's complement 64-bit value, saturating at `max_pos` and
// `-max_neg`; NaN is 0.
fn float_to_int(v: Num, max_pos: vec2<u32>, max_neg: vec2<u32>) -> vec2<u32> {
    if (v.kind == NAN) {
        return vec2<u32>(0u, 0u);
    }
    var mag = vec2<u32>(0u, 0u);
    var huge = v.kind == INFINITE;
    if (!huge) {
        if (v.e >= 0) {
            huge = is_zero64(v.m) == false && bit_length64(v.m) + u32(v.e) > 64u;
            mag = shl64(v.m, u32(v.e));
        } else {
            mag = shr64(v.m, u32(-v.e));
        }
    }
    if (v.negative) {
        if (huge || gt64(mag, max_neg)) {
            return neg64(max_neg);
        }
        return neg64(mag);
    }
    if (huge || gt64(mag, max_pos)) {
        return max_pos;
    }
    return mag;
}

// ---- the fast path between f32, f16 and bf16, in 32-bit arithmetic ----

fn is_narrow_float(code: u32) -> bool {
    return code == F32 || code == F16 || code == BF16;
}

// The f32 bits of an f32, f16 or bf16 (exact; NaN payloads kept).
fn to_f32_bits(code: u32, x: u32) -> u32 {
    if (code == F32) {
        return x;
    }
    if (code == BF16) {
        return x << 16u;
    }
    let sign = (x & 0x8000u) << 16u;
    let e = (x >> 10u) & 0x1fu;
    let f = x & 0x3ffu;
    if (e == 31u) {
        return sign | 0x7f800000u | (f << 13u);
    }
    if (e == 0u) {
        // ±f·2^-24, exact in f32 (a normal number there).
        return sign | select(bitcast<u32>(f32(f) * 0x1p-24f), 0u, f == 0u);
    }
    return sign | ((e + 112u) << 23u) | (f << 13u);
}

// f32 bits rounded to f32, f16 or bf16: to nearest, ties to even, overflow to infinity; a NaN keeps
// its payload's leading bits and is made quiet only if none is left (as `encode_float`).
fn from_f32_bits(code: u32, x: u32) -> u32 {
    if (code == F32) {
        return x;
    }
    let a = x & 0x7fffffffu;
    if (code == BF16) {
        if (a > 0x7f800000u) {
            let top = x >> 16u;
            return select(top, top | 0x40u, (top & 0x7fu) == 0u);
        }
        return (x + 0x7fffu + ((x >> 16u) & 1u)) >> 16u;
    }
    let sign = (x >> 16u) & 0x8000u;
    if (a > 0x7f800000u) {
        let payload = (a >> 13u) & 0x3ffu;
        return sign | 0x7c00u | select(payload, 0x200u, payload == 0u);
    }
    if (a >= 0x477ff000u) {
        // From 65520 up (the tie above f16's largest finite value, which is odd): infinity.
        return sign | 0x7c00u;
    }
    if (a < 0x38800000u) {
        // Below f16's smallest normal: a subnormal, m·2^(e-150) rounded to a multiple of 2^-24.
        let e = a >> 23u;
        if (e < 102u) {
            return sign;
        }
        let m = (a & 0x7fffffu) | 0x800000u;
        let shift = 126u - e;
        var q = m >> shift;
        let rest = m & ((1u << shift) - 1u);
        let half = 1u << (shift - 1u);
        if (rest > half || (rest == half && (q & 1u) == 1u)) {
            q += 1u;
        }
        return sign | q;
    }
    let r = a - 0x38000000u;
    return sign | ((r + 0xfffu + ((r >> 13u) & 1u)) >> 13u);
}

fn convert(x: vec2<u32>) -> vec2<u32> {
    if (SRC == DST) {
        return x;
    }
    if (is_narrow_float(SRC) && is_narrow_float(DST)) {
        return vec2<u32>(from_f32_bits(DST, to_f32_bits(SRC, x.x)), 0u);
    }
    var v = decode(SRC, x);
    if (is_int(SRC)) {
        // An integer's two's complement bits, for wrapping.
        let bits = select(v.m, neg64(v.m), v.negative);
        if (is_int(DST)) {
            switch DST {
                case 4u: { return vec2<u32>(bits.x, 0u); }
                case 6u: { return vec2<u32>(bits.x & 0xffu, 0u); }
                default: { return bits; }
            }
        }
        // Through f64, as `i64 as f64` then `as` the destination.
        v = decode_float(encode_float(v, format_of(F64)), format_of(F64));
    }
    switch DST {
        case 4u: {
            return vec2<u32>(float_to_int(v, vec2<u32>(0x7fffffffu, 0u), vec2<u32>(0x80000000u, 0u)).x, 0u);
        }
        case 5u: {
            return float_to_int(v, vec2<u32>(0xffffffffu, 0x7fffffffu), vec2<u32>(0u, 0x80000000u));
        }
        case 6u: {
            return vec2<u32>(float_to_int(v, vec2<u32>(255u, 0u), vec2<u32>(0u, 0u)).x & 0xffu, 0u);
        }
        case 3u: {
            return vec2<u32>(encode_float(v, format_of(BF16)).x & 0xffffu, 0u);
        }
        default: {
            return encode_float(v, format_of(DST));
        }
    }
}

// The element offset of row-major index `i` in the view whose strides start at `view + 1`.
fn strided(i: u32, view: u32) -> u32 {
    if (DENSE) {
        return i;
    }
    var rest = i;
    var off = 0u;
    for (var d = p[1]; d > 0u; d--) {
        let extent = p[SHAPE + d - 1u];
        off += (rest % extent) * p[view + d];
        rest /= extent;
    }
    return off;
}

// The converted bits of element `i`.
fn element(i: u32) -> vec2<u32> {
    if (CONST_SRC) {
        return convert(vec2<u32>(p[CONSTANT], p[CONSTANT + 1u]));
    }
    return convert(load(SRC, p[SRC_VIEW] + strided(i, SRC_VIEW) * size_of(SRC)));
}

// One invocation per destination word instead of per element, for a dense destination of 1- or
// 2-byte elements at an element-aligned address: only its first and last words, which it may share
// with other data, need atomics.
@compute @workgroup_size(256)
fn cast_words(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let size = size_of(DST);
    let start = p[DST_VIEW];
    let end = start + p[0] * size;
    let w = (start >> 2u) + (wid.x + wid.y * groups.x) * WG + lid;
    if (w * 4u >= end) {
        return;
    }
    let element_mask = select(0xffu, 0xffffu, size == 2u);
    var bits = 0u;
    var mask = 0u;
    for (var b = 0u; b < 4u; b += size) {
        let at = w * 4u + b;
        if (at >= start && at < end) {
            bits |= (element((at - start) / size).x & element_mask) << (b * 8u);
            mask |= element_mask << (b * 8u);
        }
    }
    store_bits(w, bits, mask);
}

@compute @workgroup_size(256)
fn cast_elements(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = (wid.x + wid.y * groups.x) * WG + lid;
    if (i >= p[0]) {
        return;
    }
    store(DST, p[DST_VIEW] + strided(i, DST_VIEW) * size_of(DST), element(i));
}
