// Batch normalisation over contiguous [batch, channels, spatial] tensors of `elem` (f32, or f16 on
// devices with shader-f16: `elem_f32.wgsl` / `elem_f16.wgsl`; f32 math, each stored value rounded
// once). `batch_norm`, training: one workgroup of WG threads per channel (`combine.wgsl`), which
// takes the channel's mean and biased variance in two passes combined with `wg_sum`, normalises the
// output with them and updates the running statistics with the unbiased variance
// (torch.nn.BatchNorm semantics). `batch_norm_infer`, inference: a grid of (chunk, channel)
// workgroups normalising with the running statistics (or mean 0 and variance 1 without them). A
// thread walks its channel's (image, position) pairs WG apart, advancing both without division.
//
// Parameter words (`p`): [0] batch, [1] channels, [2] spatial, [3] training, [4] has weight,
// [5] has bias, [6] has running stats, [7] momentum and [8] eps as f32 bits, then element offsets:
// [9] input, [10] output, [11] weight, [12] bias, [13] running mean, [14] running var; [15] the
// elements of a channel per workgroup (`batch_norm_infer`).

@group(0) @binding(0) var<storage, read_write> x: array<elem>;
@group(0) @binding(1) var<storage, read_write> out: array<elem>;
@group(0) @binding(2) var<storage, read_write> weight: array<elem>;
@group(0) @binding(3) var<storage, read_write> bias: array<elem>;
@group(0) @binding(4) var<storage, read_write> running_mean: array<elem>;
@group(0) @binding(5) var<storage, read_write> running_var: array<elem>;
@group(0) @binding(6) var<storage, read> p: array<u32>;

// The offset, within the input, of the channel's element `j` of `count` (j = image * s + position):
// `walk.x` is the image, `walk.y` the position; `step` advances it by WG elements.
fn channel_at(walk: vec2<u32>, ch: u32, c: u32, s: u32) -> u32 {
    return (walk.x * c + ch) * s + walk.y;
}

// `walk` advanced by WG elements, given WG = step.x images and step.y positions (step.y < s).
fn advance(walk: vec2<u32>, step: vec2<u32>, s: u32) -> vec2<u32> {
    var next = walk + step;
    if (next.y >= s) {
        next = vec2<u32>(next.x + 1u, next.y - s);
    }
    return next;
}

// How a channel's values are normalised: (v - mean) * inv * scale + shift.
struct Norm {
    mean: f32,
    inv: f32,
    scale: f32,
    shift: f32,
}

// Channel `ch`'s normalisation by `mean` and `variance`, with its weight and bias (1 and 0 when
// absent).
fn channel_norm(ch: u32, mean: f32, variance: f32) -> Norm {
    var norm = Norm(mean, 1.0 / sqrt(variance + bitcast<f32>(p[8])), 1.0, 0.0);
    if (p[4] != 0u) {
        norm.scale = load_elem(weight[p[11] + ch]);
    }
    if (p[5] != 0u) {
        norm.shift = load_elem(bias[p[12] + ch]);
    }
    return norm;
}

fn normalised(v: f32, norm: Norm) -> f32 {
    return (v - norm.mean) * norm.inv * norm.scale + norm.shift;
}

@compute @workgroup_size(WG)
fn batch_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
              @builtin(local_invocation_index) t: u32) {
    let ch = wid.x + wid.y * groups.x;
    let c = p[1];
    if (ch >= c) {
        return;
    }
    let s = p[2];
    let count = p[0] * s;
    let start = vec2<u32>(t / s, t % s);
    let step = vec2<u32>(WG / s, WG % s);
    var acc = 0.0;
    var walk = start;
    for (var j = t; j < count; j += WG) {
        acc += load_elem(x[p[9] + channel_at(walk, ch, c, s)]);
        walk = advance(walk, step, s);
    }
    let mean = wg_sum(acc, t) / f32(count);
    var q = 0.0;
    walk = start;
    for (var j = t; j < count; j += WG) {
        let d = load_elem(x[p[9] + channel_at(walk, ch, c, s)]) - mean;
        q = fma(d, d, q);
        walk = advance(walk, step, s);
    }
    let squares = wg_sum(q, t);
    let variance = squares / f32(count);
    if (t == 0u && p[6] != 0u) {
        let momentum = bitcast<f32>(p[7]);
        let unbiased = squares / (f32(count) - 1.0);
        let old_mean = load_elem(running_mean[p[13] + ch]);
        let old_var = load_elem(running_var[p[14] + ch]);
        running_mean[p[13] + ch] = store_elem(fma(momentum, mean, (1.0 - momentum) * old_mean));
        running_var[p[14] + ch] = store_elem(fma(momentum, unbiased, (1.0 - momentum) * old_var));
    }
    let norm = channel_norm(ch, mean, variance);
    walk = start;
    for (var j = t; j < count; j += WG) {
        let at = channel_at(walk, ch, c, s);
        out[p[10] + at] = store_elem(normalised(load_elem(x[p[9] + at]), norm));
        walk = advance(walk, step, s);
    }
}

// Inference: workgroup (x, y + z * groups.y) normalises chunk x, of p[15] elements, of that
// channel's (image, position) pairs, each thread walking them WG apart as `batch_norm` does
// (no division per element), with the same arithmetic.
@compute @workgroup_size(WG)
fn batch_norm_infer(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                    @builtin(local_invocation_index) t: u32) {
    let ch = wid.y + wid.z * groups.y;
    let c = p[1];
    let s = p[2];
    let count = p[0] * s;
    let first = wid.x * p[15] + t;
    if (ch >= c || wid.x * p[15] >= count) {
        return;
    }
    let end = wid.x * p[15] + min(p[15], count - wid.x * p[15]);
    if (first >= end) {
        return;
    }
    var norm = channel_norm(ch, 0.0, 1.0);
    if (p[6] != 0u) {
        norm = channel_norm(ch, load_elem(running_mean[p[13] + ch]), load_elem(running_var[p[14] + ch]));
    }
    var j = first;
    var walk = vec2<u32>(j / s, j % s);
    let step = vec2<u32>(WG / s, WG % s);
    loop {
        let at = channel_at(walk, ch, c, s);
        out[p[10] + at] = store_elem(normalised(load_elem(x[p[9] + at]), norm));
        if (end - j <= WG) {
            break;
        }
        j += WG;
        walk = advance(walk, step, s);
    }
}
