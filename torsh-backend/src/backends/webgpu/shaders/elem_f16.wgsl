enable f16;

// The stored element type of `elementwise.wgsl` for f16 tensors on devices with `shader-f16`: values
// widen exactly to f32 for the math and are rounded back once, to nearest with ties to even, with
// overflow to infinity and gradual underflow, as the `half` crate (and so the reference and the
// staged path) rounds. The rounding is done on the bits, not by the device's conversion, whose
// rounding WGSL leaves to the implementation; the rounded value then converts exactly. A NaN stays a
// NaN (its payload is the device's).

alias elem = f16;

fn load_elem(v: elem) -> f32 {
    return f32(v);
}

fn store_elem(v: f32) -> elem {
    // The rounded bits widened to f32 (exact), then narrowed to f16 (exact: the value is an f16).
    // naga does not type a bitcast from u32 to vec2<f16>, which would take the bits directly.
    return f16(unpack2x16float(f16_bits(v)).x);
}

// The f16 bits (in the low 16 bits) nearest `v`.
fn f16_bits(v: f32) -> u32 {
    let x = bitcast<u32>(v);
    let sign = (x >> 16u) & 0x8000u;
    let exp = x & 0x7f800000u;
    let man = x & 0x007fffffu;
    if (exp == 0x7f800000u) {
        // Infinity, or NaN made quiet with the top of its payload.
        return sign | 0x7c00u | select(0u, 0x0200u, man != 0u) | (man >> 13u);
    }
    let half_exp = i32(exp >> 23u) - 127 + 15;
    if (half_exp >= 0x1f) {
        return sign | 0x7c00u;
    }
    if (half_exp <= 0) {
        if (14 - half_exp > 24) {
            return sign;
        }
        let full = man | 0x00800000u;
        let shift = u32(14 - half_exp);
        let round_bit = 1u << (shift - 1u);
        var half_man = full >> shift;
        if ((full & round_bit) != 0u && (full & (3u * round_bit - 1u)) != 0u) {
            half_man += 1u;
        }
        return sign | half_man;
    }
    let bits = sign | (u32(half_exp) << 10u) | (man >> 13u);
    let round_bit = 0x1000u;
    if ((man & round_bit) != 0u && (man & (3u * round_bit - 1u)) != 0u) {
        return bits + 1u;
    }
    return bits;
}

