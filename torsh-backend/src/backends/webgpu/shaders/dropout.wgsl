// Dropout from the crate's counter-based stream (`counter.wgsl`; DropoutDesc): element i of the
// dense input is kept, times the scale, when the top 53 bits of the stream's bits at i are at least
// the threshold (compared as integers, so every backend keeps the same elements), else zeroed; the
// product in f32, stored as `elem` (`elem_f32.wgsl` / `elem_f16.wgsl`). The output may be the input.
//
// Parameter words (`p`): [0] n, [1] output element offset, [2], [3] the stream key (low, high),
// [4] input element offset, [5], [6] the threshold (low, high), [7] the scale as f32 bits.

@group(0) @binding(0) var<storage, read_write> x: array<elem>;
@group(0) @binding(1) var<storage, read_write> out: array<elem>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

const WG: u32 = 256u;

@compute @workgroup_size(256)
fn dropout(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = (wid.x + wid.y * groups.x) * WG + lid;
    if (i >= p[0]) {
        return;
    }
    let b = bits(vec2<u32>(i, 0u));
    // The top 53 bits as (low, high) words, against the threshold.
    let m = vec2<u32>((b.x >> 11u) | (b.y << 21u), b.y >> 11u);
    let kept = m.y > p[6] || (m.y == p[6] && m.x >= p[5]);
    let v = load_elem(x[p[4] + i]);
    out[p[1] + i] = store_elem(select(0.0, v * bitcast<f32>(p[7]), kept));
}
