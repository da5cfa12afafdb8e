// 2-D max and average pooling with f32 math on `elem` elements (`elem_f32.wgsl`, or `elem_f16.wgsl`
// for f16 storage) over contiguous NCHW tensors: one invocation per output
// element, looping over its window; taps on padding are skipped. Max: NaN propagates, the first of
// equal values is kept, a window of padding only gives -inf (as the reference). Average: divided by
// the full window (count_include_pad) or by the real elements.
//
// Parameter words (`p`): [0] outputs (n * c * oh * ow), [1] h, [2] w, [3] oh, [4] ow, [5] kernel y,
// [6] kernel x, [7] stride y, [8] stride x, [9] pad y, [10] pad x, [11] kind (0 max, 1 average
// counting padding, 2 average over real elements), [12] input offset, [13] output offset.

@group(0) @binding(0) var<storage, read_write> x: array<elem>;
@group(0) @binding(1) var<storage, read_write> out: array<elem>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

@compute @workgroup_size(256)
fn pool2d(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let o = (wid.x + wid.y * groups.x) * 256u + lid;
    if (o >= p[0]) {
        return;
    }
    let h = p[1];
    let w = p[2];
    let oh = p[3];
    let ow = p[4];
    let plane = o / (oh * ow);
    let y = (o / ow) % oh;
    let xo = o % ow;
    let base = p[12] + plane * h * w;
    var best = bitcast<f32>(0xff800000u);
    var sum = 0.0;
    var count = 0u;
    for (var r = 0u; r < p[5]; r++) {
        let iy = y * p[7] + r;
        if (iy < p[9] || iy - p[9] >= h) {
            continue;
        }
        for (var s = 0u; s < p[6]; s++) {
            let ix = xo * p[8] + s;
            if (ix < p[10] || ix - p[10] >= w) {
                continue;
            }
            let v = load_elem(x[base + (iy - p[9]) * w + ix - p[10]]);
            if (is_nan(v) || is_nan(best)) {
                best = bitcast<f32>(0x7fc00000u);
            } else if (v > best) {
                best = v;
            }
            sum += v;
            count += 1u;
        }
    }
    var result = best;
    if (p[11] == 1u) {
        result = sum / f32(p[5] * p[6]);
    } else if (p[11] == 2u) {
        result = sum / f32(count);
    }
    out[p[13] + o] = store_elem(result);
}
