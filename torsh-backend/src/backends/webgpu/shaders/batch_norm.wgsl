// Batch normalisation over contiguous [batch, channels, spatial] tensors of `elem` (f32, or f16 on
// devices with shader-f16: `elem_f32.wgsl` / `elem_f16.wgsl`; f32 math, each stored value rounded
// once), torch.nn.BatchNorm semantics: training normalises with the batch's mean and biased variance
// and updates the running statistics with the unbiased variance; inference normalises with the
// running statistics (or mean 0 and variance 1 without them).
// - `batch_norm`, training in one launch: one workgroup of WG threads per channel (`combine.wgsl`)
//   takes the channel's mean and variance in two passes combined with `wg_sum`, then normalises.
// - Training in three launches, for channels of several chunks (a GPU): `batch_norm_moments`, a
//   workgroup per (chunk, channel), writes each chunk's mean and sum of squared deviations to
//   `partials`; `batch_norm_stats`, an invocation per channel, combines them (Chan et al.) into the
//   batch's statistics in `partials` and updates the running ones; `batch_norm_infer` normalises
//   with them.
// - `batch_norm_infer`, inference: a grid of (chunk, channel) workgroups.
// A thread walks its channel's (image, position) pairs WG apart, advancing both without division.
// Training takes every moment of a channel relative to a pivot, the channel's first value: a constant
// channel then has deviations of exactly 0, so it normalises to exactly 0 (its bias), where a mean
// rounded in f32 would leave (x - mean) · 1/√eps, several hundred times the rounding error.
//
// Parameter words (`p`): [0] batch, [1] channels, [2] spatial, [3] training, [4] has weight,
// [5] has bias, [6] has running stats, [7] momentum and [8] eps as f32 bits, then element offsets:
// [9] input, [10] output, [11] weight, [12] bias, [13] running mean, [14] running var; [15] the
// elements of a chunk of a channel, [16] chunks per channel, [17] 1 when `batch_norm_infer` takes
// the batch's statistics from `partials`. `partials` holds the (mean, squared deviations) of chunk k
// of channel ch at 2 * (ch * chunks + k), then the batch's means and biased variances of every
// channel at 2 * channels * chunks; the means there are relative to the channel's pivot.
// [18] 1 to save each channel's mean and 1/√(var + eps) as it normalised, into `partials` at
// word offsets [19] (means) and [20] (inverse deviations), whence the host copies them
// (`batch_norm` and `batch_norm_infer` write them).

@group(0) @binding(0) var<storage, read_write> x: array<elem>;
@group(0) @binding(1) var<storage, read_write> out: array<elem>;
@group(0) @binding(2) var<storage, read_write> weight: array<elem>;
@group(0) @binding(3) var<storage, read_write> bias: array<elem>;
@group(0) @binding(4) var<storage, read_write> running_mean: array<elem>;
@group(0) @binding(5) var<storage, read_write> running_var: array<elem>;
@group(0) @binding(6) var<storage, read_write> partials: array<f32>;
@group(0) @binding(7) var<storage, read> p: array<u32>;

// How a channel's values are normalised: ((v - pivot) - mean) * inv * scale + shift.
struct Norm {
    pivot: f32,
    mean: f32,
    inv: f32,
    scale: f32,
    shift: f32,
}

// Channel `ch`'s normalisation by `mean` (relative to `pivot`) and `variance`, with its weight and
// bias (1 and 0 when absent).
fn channel_norm(ch: u32, pivot: f32, mean: f32, variance: f32) -> Norm {
    var norm = Norm(pivot, mean, 1.0 / sqrt(variance + bitcast<f32>(p[8])), 1.0, 0.0);
    if (p[4] != 0u) {
        norm.scale = load_elem(weight[p[11] + ch]);
    }
    if (p[5] != 0u) {
        norm.shift = load_elem(bias[p[12] + ch]);
    }
    return norm;
}

fn normalised(v: f32, norm: Norm) -> f32 {
    return ((v - norm.pivot) - norm.mean) * norm.inv * norm.scale + norm.shift;
}

// Channel `ch`'s pivot: its value at image 0, position 0.
fn pivot_of(ch: u32) -> f32 {
    return load_elem(x[p[9] + ch * p[2]]);
}

// Moves channel `ch`'s running statistics, where there are any, towards the batch's `mean` and the
// unbiased variance of its `count` values whose squared deviations sum to `squares`.
fn update_running(ch: u32, mean: f32, squares: f32, count: u32) {
    if (p[6] != 0u) {
        let momentum = bitcast<f32>(p[7]);
        let unbiased = squares / (f32(count) - 1.0);
        let old_mean = load_elem(running_mean[p[13] + ch]);
        let old_var = load_elem(running_var[p[14] + ch]);
        running_mean[p[13] + ch] = store_elem(fma(momentum, mean, (1.0 - momentum) * old_mean));
        running_var[p[14] + ch] = store_elem(fma(momentum, unbiased, (1.0 - momentum) * old_var));
    }
}

// The mean, relative to the channel's pivot, of the `len` values of channel `ch` from its value
// `begin` on, and the sum of their squared deviations from it: two passes, each combined over the
// workgroup with `wg_sum` (so every thread of the workgroup calls this, thread `t` taking every
// WG-th value).
fn chunk_moments(ch: u32, begin: u32, len: u32, t: u32) -> vec2<f32> {
    let pivot = pivot_of(ch);
    let c = p[1];
    let s = p[2];
    let start = vec2<u32>((begin + t) / s, (begin + t) % s);
    let step = vec2<u32>(WG / s, WG % s);
    var acc = 0.0;
    var walk = start;
    for (var j = t; j < len; j += WG) {
        acc += load_elem(x[p[9] + channel_at(walk, ch, c, s)]) - pivot;
        walk = advance(walk, step, s);
    }
    let mean = wg_sum(acc, t) / f32(len);
    var q = 0.0;
    walk = start;
    for (var j = t; j < len; j += WG) {
        let d = (load_elem(x[p[9] + channel_at(walk, ch, c, s)]) - pivot) - mean;
        q = fma(d, d, q);
        walk = advance(walk, step, s);
    }
    return vec2<f32>(mean, wg_sum(q, t));
}

// Workgroup (x, y + z * groups.y) of a (chunk, channel) grid: its channel, the first value of its
// chunk x within the channel, and the chunk's length (p[15], shorter at the channel's end; 0 past
// the channels or the channel's end). The same for every thread of the workgroup.
fn chunk_of(wid: vec3<u32>, groups: vec3<u32>) -> vec3<u32> {
    let ch = wid.y + wid.z * groups.y;
    let count = p[0] * p[2];
    let begin = wid.x * p[15];
    if (ch >= p[1] || begin >= count) {
        return vec3<u32>(ch, begin, 0u);
    }
    return vec3<u32>(ch, begin, min(p[15], count - begin));
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
    let moments = chunk_moments(ch, 0u, count, t);
    let pivot = pivot_of(ch);
    let mean = moments.x;
    let squares = moments.y;
    if (t == 0u) {
        update_running(ch, pivot + mean, squares, count);
    }
    let norm = channel_norm(ch, pivot, mean, squares / f32(count));
    if (p[18] != 0u && t == 0u) {
        partials[p[19] + ch] = pivot + mean;
        partials[p[20] + ch] = norm.inv;
    }
    var walk = vec2<u32>(t / s, t % s);
    let step = vec2<u32>(WG / s, WG % s);
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
    let chunk = chunk_of(wid, groups);
    if (t >= chunk.z) {
        return;
    }
    let ch = chunk.x;
    let c = p[1];
    let s = p[2];
    let first = chunk.y + t;
    let end = chunk.y + chunk.z;
    var norm = channel_norm(ch, 0.0, 0.0, 1.0);
    if (p[17] != 0u) {
        let stats = 2u * c * p[16];
        norm = channel_norm(ch, pivot_of(ch), partials[stats + ch], partials[stats + c + ch]);
    } else if (p[6] != 0u) {
        norm = channel_norm(ch, 0.0, load_elem(running_mean[p[13] + ch]),
                            load_elem(running_var[p[14] + ch]));
    }
    if (p[18] != 0u && wid.x == 0u && t == 0u) {
        partials[p[19] + ch] = norm.pivot + norm.mean;
        partials[p[20] + ch] = norm.inv;
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

// Training, step 1: workgroup (k, y + z * groups.y) takes chunk k of that channel's values: their
// mean and the sum of their squared deviations from it, in two passes combined with `wg_sum`.
@compute @workgroup_size(WG)
fn batch_norm_moments(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                      @builtin(local_invocation_index) t: u32) {
    let chunk = chunk_of(wid, groups);
    // The same exit for the whole workgroup, so every thread that goes on reaches the barriers of
    // `wg_sum`.
    if (chunk.z == 0u) {
        return;
    }
    let moments = chunk_moments(chunk.x, chunk.y, chunk.z, t);
    if (t == 0u) {
        let at = 2u * (chunk.x * p[16] + wid.x);
        partials[at] = moments.x;
        partials[at + 1u] = moments.y;
    }
}

// Training, step 2: invocation ch combines its channel's chunks in order (Chan et al.) into the
// batch's mean (relative to the pivot) and biased variance, and updates the running statistics as
// `batch_norm` does.
@compute @workgroup_size(256)
fn batch_norm_stats(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    let ch = (wid.x + wid.y * groups.x) * 256u + lid;
    let c = p[1];
    if (ch >= c) {
        return;
    }
    let count = p[0] * p[2];
    var n = 0.0;
    var mean = 0.0;
    var squares = 0.0;
    for (var k = 0u; k < p[16]; k++) {
        let at = 2u * (ch * p[16] + k);
        let len = f32(min(p[15], count - k * p[15]));
        let total = n + len;
        let delta = partials[at] - mean;
        mean += delta * (len / total);
        squares += partials[at + 1u] + delta * delta * (n * len / total);
        n = total;
    }
    let stats = 2u * c * p[16];
    partials[stats + ch] = mean;
    partials[stats + c + ch] = squares / f32(count);

    update_running(ch, pivot_of(ch) + mean, squares, count);
}
