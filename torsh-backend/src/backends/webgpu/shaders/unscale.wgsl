// A loss scaler's unscale with its inf/NaN check over `n` contiguous elements of `elem` (f32, or f16
// on devices with shader-f16: `elem_f32.wgsl` / `elem_f16.wgsl`): each invocation writes
// input * inv_scale (computed in f32, rounded once) and, when that product is not finite, sets the
// f32 flag to 1 (the bits of 1.0 are
// or-ed in atomically, so a flag of 0 or 1 ends as 1 and any number of invocations may set it).
//
// Parameter words (`p`): [0] n, [1] input offset, [2] output offset, [3] flag offset (32-bit words),
// [4] inv_scale as f32 bits.

@group(0) @binding(0) var<storage, read_write> input: array<elem>;
@group(0) @binding(1) var<storage, read_write> output: array<elem>;
@group(0) @binding(2) var<storage, read_write> flag: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read> p: array<u32>;

const ONE_BITS: u32 = 0x3f800000u;
const EXPONENT: u32 = 0x7f800000u;

@compute @workgroup_size(256)
fn unscale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * 256u + lid;
    if (i >= p[0]) {
        return;
    }
    let v = load_elem(input[p[1] + i]) * bitcast<f32>(p[4]);
    output[p[2] + i] = store_elem(v);
    // Not finite: all exponent bits set (inf or NaN), tested on the bits, which no compiler may
    // assume away.
    if ((bitcast<u32>(v) & EXPONENT) == EXPONENT) {
        atomicOr(&flag[p[3]], ONE_BITS);
    }
}
