// How `select.wgsl` and `sort.wgsl` read and order elements of any dtype without float
// arithmetic, so f64 and i64 work and no device flushes a subnormal. Each value is promoted to a
// pair of words (hi, lo) with its sign bit on top (f16 and bf16 shifted up 16 bits, 32-bit values
// in `hi`, u8 as it is); then NaN (KIND 0) is a magnitude above +inf's (INF_HI, 0), zeros are those
// of zero magnitude, and numbers order as their keys, compared as unsigned pairs: a float's key is
// its bits with the sign set when positive and all bits flipped when negative; a signed integer's is
// its bits with the sign flipped; an unsigned one's is its bits.

// Bytes per element of the operands ordered.
override WIDTH: u32 = 4u;
// 0 float, 1 signed integer, 2 unsigned integer.
override KIND: u32 = 0u;
// The high word of +inf in the promoted form: f16 0x7c000000, f32 and bf16 0x7f800000, f64
// 0x7ff00000.
override INF_HI: u32 = 0x7f800000u;

// The `width`-byte element whose first byte is `at`, from word `w0` (and `w1`, the next word, for
// 8-byte elements), as (low word, high word).
fn bits_of(w0: u32, w1: u32, at: u32, width: u32) -> vec2<u32> {
    if (width == 8u) {
        return vec2<u32>(w0, w1);
    }
    if (width == 4u) {
        return vec2<u32>(w0, 0u);
    }
    let mask = select(0xffu, 0xffffu, width == 2u);
    return vec2<u32>((w0 >> ((at & 3u) * 8u)) & mask, 0u);
}

// Element bits (low, high) in the promoted form (hi, lo), sign bit on top for every signed type.
fn promote(v: vec2<u32>) -> vec2<u32> {
    if (WIDTH == 8u) {
        return vec2<u32>(v.y, v.x);
    }
    if (WIDTH == 2u) {
        return vec2<u32>(v.x << 16u, 0u);
    }
    return vec2<u32>(v.x, 0u);
}

fn is_zero(v: vec2<u32>) -> bool {
    let hi = select(v.x, v.x & 0x7fffffffu, KIND == 0u);
    return hi == 0u && v.y == 0u;
}

fn is_nan(v: vec2<u32>) -> bool {
    let hi = v.x & 0x7fffffffu;
    return KIND == 0u && (hi > INF_HI || (hi == INF_HI && v.y != 0u));
}

fn key(v: vec2<u32>) -> vec2<u32> {
    if (KIND == 0u) {
        if ((v.x & 0x80000000u) != 0u) {
            return ~v;
        }
        return vec2<u32>(v.x | 0x80000000u, v.y);
    }
    if (KIND == 1u) {
        return vec2<u32>(v.x ^ 0x80000000u, v.y);
    }
    return v;
}
