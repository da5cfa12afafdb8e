// Random fills from the crate's counter-based stream (`rng.rs`): SplitMix64 of (seed, index) in
// 32-bit integer arithmetic, so every element's 64 bits are the reference's bit for bit; uniform and
// normal (Box–Muller, cosine branch) values are then computed in f32 (WGSL has no f64), which is within
// a few f32 ulps of the reference's f64 values rounded to f32, and stored as `elem` (f32, or f16 on
// devices with shader-f16, rounded once from the f32 value as a cast would: `elem_f32.wgsl` /
// `elem_f16.wgsl`).
//
// Parameter words (`p`): [0] n, [1] output element offset, [2], [3] the stream key
// mix64(seed ^ GOLDEN) (low, high), [4] a, [5] b as f32 bits: uniform values are a + b·u (a = low,
// b = high − low), normal values a + b·z (a = mean, b = std).

override NORMAL: bool = false;

@group(0) @binding(0) var<storage, read_write> out: array<elem>;
@group(0) @binding(1) var<storage, read> p: array<u32>;

const WG: u32 = 256u;
// The top 53 bits times 2^-53: uniform on [0, 1).
fn uniform(b: vec2<u32>) -> f32 {
    return f32(b.y) * 0x1p-32f + f32(b.x >> 11u) * 0x1p-53f;
}

// ln(1 - u) for the u that `b` gives, accurate near both ends: 1 - u is formed in integers
// (2^53 - m, never 0), and near u = 0 a series replaces the logarithm.
fn log_one_minus(b: vec2<u32>) -> f32 {
    let u = uniform(b);
    if (u < 0.0625) {
        var term = u;
        var sum = 0.0;
        for (var k = 1u; k <= 9u; k++) {
            sum += term / f32(k);
            term *= u;
        }
        return -sum;
    }
    // 2^53 - (b >> 11) as (low, high) words.
    let m = vec2<u32>((b.x >> 11u) | (b.y << 21u), b.y >> 11u);
    let lo = 0u - m.x;
    let hi = 0x200000u - m.y - select(0u, 1u, m.x != 0u);
    return log(f32(hi) * 0x1p-21f + f32(lo) * 0x1p-53f);
}

// cos(2π·u) for u in [0, 1), by quadrant and Taylor polynomials on [-π/4, π/4] (WGSL's cos may
// be far less accurate on GPUs).
fn cos_turns(u: f32) -> f32 {
    let k = round(u * 4.0);
    let x = (u - k * 0.25) * 6.2831855;
    let x2 = x * x;
    let c = 1.0 + x2 * (-0.5 + x2 * (4.1666668e-2 + x2 * (-1.3888889e-3 + x2 * 2.4801587e-5)));
    let s = x * (1.0 + x2 * (-1.6666667e-1 + x2 * (8.3333333e-3 + x2 * (-1.9841270e-4 + x2 * 2.7557319e-6))));
    switch u32(k) & 3u {
        case 0u: { return c; }
        case 1u: { return -s; }
        case 2u: { return -c; }
        default: { return s; }
    }
}

@compute @workgroup_size(256)
fn random(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = (wid.x + wid.y * groups.x) * WG + lid;
    if (i >= p[0]) {
        return;
    }
    let a = bitcast<f32>(p[4]);
    let b = bitcast<f32>(p[5]);
    var value: f32;
    if (NORMAL) {
        // Uniforms 2i and 2i + 1.
        let first = vec2<u32>(i << 1u, i >> 31u);
        let r = sqrt(-2.0 * log_one_minus(bits(first)));
        let c = cos_turns(uniform(bits(vec2<u32>(first.x | 1u, first.y))));
        value = a + b * (r * c);
    } else {
        value = fma(b, uniform(bits(vec2<u32>(i, 0u))), a);
    }
    out[p[1] + i] = store_elem(value);
}
