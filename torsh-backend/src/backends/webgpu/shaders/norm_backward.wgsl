// The gradients of layer norm and batch norm from the statistics the forward saved, on `elem`
// (f32, or f16 on devices with shader-f16; f32 math, one rounding per stored value). `stats` holds
// `mean` and `invstd` hold the statistics (f32); xhat = (x - mean) * invstd. Gradients of the
// weight and bias are sums kept in f32 in `sums`, which `norm_backward_store` then rounds into
// `out` (a launch for each).
//
// Layer norm, over [rows, cols]:
// - `layer_norm_backward_input`: a workgroup per row takes Σ g and Σ g · xhat (g = dy · weight) in
//   one strided pass combined with `wg_sum`, then writes dx = invstd · (g - mean(g) - xhat ·
//   mean(g · xhat)) to `out` in a second.
// - `layer_norm_backward_params`: an invocation per column sums dy · xhat and dy over rows
//   [p[13], p[13] + p[0]) into `sums` (2 words a column, Σ dy · xhat then Σ dy), adding to what
//   is there when p[14] is 1 (the host cuts the rows into launches within the loop budget).
// Parameter words: [0] rows, [1] cols, [2] dy offset, [3] x offset, [4] weight present, [5] weight
// offset, [6] mean offset, [7] invstd offset, [8] out offset, [13] first row, [14] add.
//
// Batch norm, over [batch, channels, spatial] in chunks of p[10] values of a channel (p[11] a
// channel), as the forward's three launches:
// - `batch_norm_backward_sums`: a workgroup per (chunk, channel) writes the chunk's Σ dy and
//   Σ dy · (x - mean) to `sums` at 2 * (ch * chunks + k);
// - `batch_norm_backward_params`: an invocation per channel adds its chunks in order into the
//   channel's Σ dy · xhat (at p[13] + 2 * ch) and Σ dy (the next word), adding to what is there
//   when p[14] is 1 (a batch cut into pieces of images, summed piece by piece);
// - `batch_norm_backward_input`: a workgroup per (chunk, channel) writes dx = weight · invstd ·
//   (dy - Σ dy / M - xhat · Σ dy · xhat / M) in training (M = p[15], the whole batch's values of a
//   channel), weight · invstd · dy otherwise.
// Parameter words: [0] batch, [1] channels, [2] spatial, [3] dy offset, [4] x offset, [5] weight
// present, [6] weight offset, [7] mean offset, [8] invstd offset, [9] out offset, [10] chunk
// length, [11] chunks a channel, [12] training, [13] totals offset (in `sums`), [14] add to the
// totals, [15] M.
//
// `norm_backward_store`: out[p[3] + i] = sums[p[1] + 2 * i] for i < p[0].

@group(0) @binding(0) var<storage, read_write> dy: array<elem>;
@group(0) @binding(1) var<storage, read_write> x: array<elem>;
@group(0) @binding(2) var<storage, read_write> weight: array<elem>;
@group(0) @binding(3) var<storage, read_write> mean_of: array<f32>;
@group(0) @binding(4) var<storage, read_write> invstd_of: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<elem>;
@group(0) @binding(6) var<storage, read_write> sums: array<f32>;
@group(0) @binding(7) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn norm_backward_store(@builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) groups: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * 256u + lid;
    if (i < p[0]) {
        out[p[3] + i] = store_elem(sums[p[1] + 2u * i]);
    }
}

// ---------------------------------------------------------------------------------------------
// Layer norm.

@compute @workgroup_size(WG)
fn layer_norm_backward_input(@builtin(workgroup_id) wid: vec3<u32>,
                             @builtin(num_workgroups) groups: vec3<u32>,
                             @builtin(local_invocation_index) t: u32) {
    let r = wid.x + wid.y * groups.x;
    if (r >= p[0]) {
        return;
    }
    let cols = p[1];
    let mean = mean_of[p[6] + r];
    let inv = invstd_of[p[7] + r];
    var sg = 0.0;
    var sgx = 0.0;
    for (var j = t; j < cols; j += WG) {
        var g = load_elem(dy[p[2] + r * cols + j]);
        if (p[4] != 0u) {
            g *= load_elem(weight[p[5] + j]);
        }
        sg += g;
        sgx = fma(g, (load_elem(x[p[3] + r * cols + j]) - mean) * inv, sgx);
    }
    let mean_g = wg_sum(sg, t) / f32(cols);
    let mean_gx = wg_sum(sgx, t) / f32(cols);
    for (var j = t; j < cols; j += WG) {
        var g = load_elem(dy[p[2] + r * cols + j]);
        if (p[4] != 0u) {
            g *= load_elem(weight[p[5] + j]);
        }
        let h = (load_elem(x[p[3] + r * cols + j]) - mean) * inv;
        out[p[8] + r * cols + j] = store_elem(inv * ((g - mean_g) - h * mean_gx));
    }
}

@compute @workgroup_size(256)
fn layer_norm_backward_params(@builtin(workgroup_id) wid: vec3<u32>,
                              @builtin(num_workgroups) groups: vec3<u32>,
                              @builtin(local_invocation_index) lid: u32) {
    let col = (wid.x + wid.y * groups.x) * 256u + lid;
    let cols = p[1];
    if (col >= cols) {
        return;
    }
    var dw = 0.0;
    var db = 0.0;
    if (p[14] != 0u) {
        dw = sums[2u * col];
        db = sums[2u * col + 1u];
    }
    let first = p[13];
    for (var r = first; r < first + p[0]; r++) {
        let g = load_elem(dy[p[2] + r * cols + col]);
        let h = (load_elem(x[p[3] + r * cols + col]) - mean_of[p[6] + r]) * invstd_of[p[7] + r];
        dw = fma(g, h, dw);
        db += g;
    }
    sums[2u * col] = dw;
    sums[2u * col + 1u] = db;
}

// ---------------------------------------------------------------------------------------------
// Batch norm.

// Workgroup (x, y + z * groups.y) of a (chunk, channel) grid: its channel, the first value of its
// chunk x within the channel, and the chunk's length (0 past the channels or the channel's end).
fn grad_chunk_of(wid: vec3<u32>, groups: vec3<u32>) -> vec3<u32> {
    let ch = wid.y + wid.z * groups.y;
    let count = p[0] * p[2];
    let begin = wid.x * p[10];
    if (ch >= p[1] || begin >= count) {
        return vec3<u32>(ch, begin, 0u);
    }
    return vec3<u32>(ch, begin, min(p[10], count - begin));
}

@compute @workgroup_size(WG)
fn batch_norm_backward_sums(@builtin(workgroup_id) wid: vec3<u32>,
                            @builtin(num_workgroups) groups: vec3<u32>,
                            @builtin(local_invocation_index) t: u32) {
    let chunk = grad_chunk_of(wid, groups);
    // The same exit for the whole workgroup, so every thread that goes on reaches the barriers.
    if (chunk.z == 0u) {
        return;
    }
    let ch = chunk.x;
    let c = p[1];
    let s = p[2];
    let mean = mean_of[p[7] + ch];
    let step = vec2<u32>(WG / s, WG % s);
    var walk = vec2<u32>((chunk.y + t) / s, (chunk.y + t) % s);
    var sd = 0.0;
    var sdx = 0.0;
    for (var j = t; j < chunk.z; j += WG) {
        let at = channel_at(walk, ch, c, s);
        let g = load_elem(dy[p[3] + at]);
        sd += g;
        sdx = fma(g, load_elem(x[p[4] + at]) - mean, sdx);
        walk = advance(walk, step, s);
    }
    let total_d = wg_sum(sd, t);
    let total_dx = wg_sum(sdx, t);
    if (t == 0u) {
        let at = 2u * (ch * p[11] + wid.x);
        sums[at] = total_d;
        sums[at + 1u] = total_dx;
    }
}

@compute @workgroup_size(256)
fn batch_norm_backward_params(@builtin(workgroup_id) wid: vec3<u32>,
                              @builtin(num_workgroups) groups: vec3<u32>,
                              @builtin(local_invocation_index) lid: u32) {
    let ch = (wid.x + wid.y * groups.x) * 256u + lid;
    let c = p[1];
    if (ch >= c) {
        return;
    }
    var sd = 0.0;
    var sdx = 0.0;
    for (var k = 0u; k < p[11]; k++) {
        sd += sums[2u * (ch * p[11] + k)];
        sdx += sums[2u * (ch * p[11] + k) + 1u];
    }
    let at = p[13] + 2u * ch;
    var before = vec2<f32>(0.0, 0.0);
    if (p[14] != 0u) {
        before = vec2<f32>(sums[at], sums[at + 1u]);
    }
    sums[at] = before.x + sdx * invstd_of[p[8] + ch];
    sums[at + 1u] = before.y + sd;
}

@compute @workgroup_size(WG)
fn batch_norm_backward_input(@builtin(workgroup_id) wid: vec3<u32>,
                             @builtin(num_workgroups) groups: vec3<u32>,
                             @builtin(local_invocation_index) t: u32) {
    let chunk = grad_chunk_of(wid, groups);
    if (t >= chunk.z) {
        return;
    }
    let ch = chunk.x;
    let c = p[1];
    let s = p[2];
    let mean = mean_of[p[7] + ch];
    let inv = invstd_of[p[8] + ch];
    var a = inv;
    if (p[5] != 0u) {
        a *= load_elem(weight[p[6] + ch]);
    }
    // dx = a · ((dy - k) - (x - mean) · b): the mean gradient subtracted before the scale.
    var b = 0.0;
    var k = 0.0;
    if (p[12] != 0u) {
        let count = f32(p[15]);
        b = inv * sums[p[13] + 2u * ch] / count;
        k = sums[p[13] + 2u * ch + 1u] / count;
    }
    let step = vec2<u32>(WG / s, WG % s);
    let end = chunk.y + chunk.z;
    var j = chunk.y + t;
    var walk = vec2<u32>(j / s, j % s);
    loop {
        let at = channel_at(walk, ch, c, s);
        let v = a * ((load_elem(dy[p[3] + at]) - k) - (load_elem(x[p[4] + at]) - mean) * b);
        out[p[9] + at] = store_elem(v);
        if (end - j <= WG) {
            break;
        }
        j += WG;
        walk = advance(walk, step, s);
    }
}
