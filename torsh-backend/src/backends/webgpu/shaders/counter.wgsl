// The crate's counter-based stream (`rng.rs`) in 32-bit integer arithmetic: SplitMix64 of
// (seed, index), every element's 64 bits the reference's bit for bit. A prelude of `random.wgsl`
// and `dropout.wgsl`, which bind the parameter words `p` with the stream's key
// mix64(seed ^ GOLDEN) at [2] (low) and [3] (high). Needs `mul64` (`wide.wgsl`).

const GOLDEN: vec2<u32> = vec2<u32>(0x7F4A7C15u, 0x9E3779B9u);
const MIX1: vec2<u32> = vec2<u32>(0x1CE4E5B9u, 0xBF58476Du);
const MIX2: vec2<u32> = vec2<u32>(0x133111EBu, 0x94D049BBu);

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

// z ^ (z >> s) for 0 < s < 32.
fn xor_shift(z: vec2<u32>, s: u32) -> vec2<u32> {
    return z ^ vec2<u32>((z.x >> s) | (z.y << (32u - s)), z.y >> s);
}

fn mix64(z0: vec2<u32>) -> vec2<u32> {
    var z = mul64(xor_shift(z0, 30u), MIX1);
    z = mul64(xor_shift(z, 27u), MIX2);
    return xor_shift(z, 31u);
}

// The stream's 64 bits at `index`.
fn bits(index: vec2<u32>) -> vec2<u32> {
    return mix64(add64(vec2<u32>(p[2], p[3]), mul64(index, GOLDEN)));
}
