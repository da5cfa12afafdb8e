// Batch normalisation in f32 over contiguous [batch, channels, spatial] tensors, one workgroup of
// 256 threads per channel. Training: the channel's mean and biased variance by two passes and a tree
// in workgroup memory, the output normalised with them, and the running statistics updated with the
// unbiased variance (torch.nn.BatchNorm semantics); inference: the running statistics.
//
// Parameter words (`p`): [0] batch, [1] channels, [2] spatial, [3] training, [4] has weight,
// [5] has bias, [6] has running stats, [7] momentum and [8] eps as f32 bits, then element offsets:
// [9] input, [10] output, [11] weight, [12] bias, [13] running mean, [14] running var.

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<storage, read_write> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> running_mean: array<f32>;
@group(0) @binding(5) var<storage, read_write> running_var: array<f32>;
@group(0) @binding(6) var<storage, read> p: array<u32>;

const WG: u32 = 256u;

var<workgroup> part: array<f32, 256>;

// Sums part[0..256) into part[0]. Call with every thread.
fn tree_sum(t: u32) {
    for (var width = WG / 2u; width > 0u; width /= 2u) {
        workgroupBarrier();
        if (t < width) {
            part[t] = part[t] + part[t + width];
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn batch_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
              @builtin(local_invocation_index) t: u32) {
    let ch = wid.x + wid.y * groups.x;
    let c = p[1];
    if (ch >= c) {
        return;
    }
    let s = p[2];
    let count = p[0] * s;
    var mean: f32;
    var variance: f32;
    if (p[3] != 0u) {
        var acc = 0.0;
        for (var j = t; j < count; j += WG) {
            acc += x[p[9] + ((j / s) * c + ch) * s + j % s];
        }
        part[t] = acc;
        tree_sum(t);
        mean = part[0] / f32(count);
        workgroupBarrier();
        var q = 0.0;
        for (var j = t; j < count; j += WG) {
            let d = x[p[9] + ((j / s) * c + ch) * s + j % s] - mean;
            q = fma(d, d, q);
        }
        part[t] = q;
        tree_sum(t);
        variance = part[0] / f32(count);
        if (t == 0u && p[6] != 0u) {
            let momentum = bitcast<f32>(p[7]);
            let unbiased = part[0] / (f32(count) - 1.0);
            running_mean[p[13] + ch] = fma(momentum, mean, (1.0 - momentum) * running_mean[p[13] + ch]);
            running_var[p[14] + ch] = fma(momentum, unbiased, (1.0 - momentum) * running_var[p[14] + ch]);
        }
    } else if (p[6] != 0u) {
        mean = running_mean[p[13] + ch];
        variance = running_var[p[14] + ch];
    } else {
        mean = 0.0;
        variance = 1.0;
    }
    let inv = 1.0 / sqrt(variance + bitcast<f32>(p[8]));
    var scale = 1.0;
    var shift = 0.0;
    if (p[4] != 0u) {
        scale = weight[p[11] + ch];
    }
    if (p[5] != 0u) {
        shift = bias[p[12] + ch];
    }
    for (var j = t; j < count; j += WG) {
        let at = ((j / s) * c + ch) * s + j % s;
        out[p[10] + at] = (x[p[9] + at] - mean) * inv * scale + shift;
    }
}
