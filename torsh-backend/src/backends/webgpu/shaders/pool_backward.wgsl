// The max pool that writes its positions, and the input gradients of 2-D pooling, with f32 math on
// `elem` elements (`elem_f32.wgsl`, or `elem_f16.wgsl` for f16 storage) over contiguous NCHW tensors.
//
// `max_pool2d_indices`: one invocation per output element. The position of a window's maximum is the
// first tap holding the largest value in row-major window order, or the last NaN tap; the value
// written is the input there. Positions are I64 (two words, low first), `iy * w + ix` in the plane.
//
// `pool2d_backward`: one invocation per input element, which sums over the windows holding it, in
// row-major window order (the reference's order): max: the gradient of each window whose position
// is this element; average: each window's gradient divided by its divisor. No atomics, so the result
// is the same on every run. A position that is not an element inside its own window is never
// followed: the invocation of the window's first real tap raises the error flag (`flag`: [0] how
// many raised it, [1] the op's code, [2], [3] the index as (low, high) words, [4] the plane size),
// which the host reads at the next synchronize or host read.
//
// Bindings: [0] input (forward) or gradient (backward), [1] output, [2] positions as u32 words,
// [3] the error flag (bound, unused, by the forward and the average gradient).
//
// Parameter words (`p`): [0] invocations (outputs, or inputs for the gradient), [1] h, [2] w,
// [3] oh, [4] ow, [5] kernel y, [6] kernel x, [7] stride y, [8] stride x, [9] pad y, [10] pad x,
// [11] kind (0 max, 1 average counting padding, 2 average over real elements), [12] element offset of
// binding 0, [13] element offset of the output, [14] word offset of the positions, [15] the op's code
// for the flag.

@group(0) @binding(0) var<storage, read_write> x: array<elem>;
@group(0) @binding(1) var<storage, read_write> out: array<elem>;
@group(0) @binding(2) var<storage, read_write> idx: array<u32>;
@group(0) @binding(3) var<storage, read_write> flag: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// The first (`.x`) and one past the last (`.y`) tap of a window starting at padded coordinate
// `start` along an axis of `size` with window `k` and padding `pad` that lie inside the input.
fn real_taps(start: u32, k: u32, pad: u32, size: u32) -> vec2<u32> {
    let lo = select(0u, pad - start, pad > start);
    let hi = min(select(0u, size + pad - start, size + pad > start), k);
    return vec2<u32>(lo, max(hi, lo));
}

@compute @workgroup_size(256)
fn max_pool2d_indices(@builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) groups: vec3<u32>,
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
    let oy = (o / ow) % oh;
    let ox = o % ow;
    let base = p[12] + plane * h * w;
    let rows = real_taps(oy * p[7], p[5], p[9], h);
    let cols = real_taps(ox * p[8], p[6], p[10], w);
    var best = bitcast<f32>(0xff800000u);
    var at = 0xffffffffu;
    for (var r = rows.x; r < rows.y; r++) {
        let iy = oy * p[7] + r - p[9];
        for (var s = cols.x; s < cols.y; s++) {
            let i = iy * w + ox * p[8] + s - p[10];
            let v = load_elem(x[base + i]);
            if (at == 0xffffffffu || v > best || is_nan(v)) {
                best = v;
                at = i;
            }
        }
    }
    // Every window holds a real tap (padding is at most half the window).
    out[p[13] + o] = x[base + at];
    idx[p[14] + 2u * o] = at;
    idx[p[14] + 2u * o + 1u] = 0u;
}

// Raises the error flag for position (lo, hi) in a plane of `size` elements.
fn raise(lo: u32, hi: u32, size: u32) {
    if (atomicAdd(&flag[0], 1u) == 0u) {
        atomicStore(&flag[1], p[15]);
        atomicStore(&flag[2], lo);
        atomicStore(&flag[3], hi);
        atomicStore(&flag[4], size);
    }
}

// The windows along an axis that hold input position `i`: `o` with `o * stride <= i + pad <
// o * stride + k`, `o < n`, as [first, end).
fn windows_over(i: u32, n: u32, k: u32, stride: u32, pad: u32) -> vec2<u32> {
    let q = i + pad;
    let lo = select(0u, (q + 1u - k + stride - 1u) / stride, q + 1u > k);
    let hi = min(q / stride + 1u, n);
    return vec2<u32>(lo, max(hi, lo));
}

@compute @workgroup_size(256)
fn pool2d_backward(@builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) groups: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * 256u + lid;
    if (i >= p[0]) {
        return;
    }
    let h = p[1];
    let w = p[2];
    let oh = p[3];
    let ow = p[4];
    let plane = i / (h * w);
    let at = i % (h * w);
    let iy = at / w;
    let ix = at % w;
    let wy = windows_over(iy, oh, p[5], p[7], p[9]);
    let wx = windows_over(ix, ow, p[6], p[8], p[10]);
    let first = p[12] + plane * oh * ow;
    var sum = 0.0;
    for (var oy = wy.x; oy < wy.y; oy++) {
        let rows = real_taps(oy * p[7], p[5], p[9], h);
        for (var ox = wx.x; ox < wx.y; ox++) {
            let o = oy * ow + ox;
            let g = load_elem(x[first + o]);
            let cols = real_taps(ox * p[8], p[6], p[10], w);
            if (p[11] == 0u) {
                let word = p[14] + 2u * (plane * oh * ow + o);
                let lo = idx[word];
                let hi = idx[word + 1u];
                if (hi == 0u && lo == at) {
                    sum += g;
                }
                // The window's first real tap checks that its position is inside the window.
                if (iy == oy * p[7] + rows.x - p[9] && ix == ox * p[8] + cols.x - p[10]) {
                    let py = lo / w + p[9];
                    let px = lo % w + p[10];
                    let inside = hi == 0u && lo < h * w && py >= oy * p[7] && py < oy * p[7] + p[5]
                        && px >= ox * p[8] && px < ox * p[8] + p[6];
                    if (!inside) {
                        raise(lo, hi, h * w);
                    }
                }
            } else {
                var divisor = f32(p[5] * p[6]);
                if (p[11] == 2u) {
                    divisor = f32((rows.y - rows.x) * (cols.y - cols.x));
                }
                sum += g / divisor;
            }
        }
    }
    out[p[13] + i] = store_elem(sum);
}
