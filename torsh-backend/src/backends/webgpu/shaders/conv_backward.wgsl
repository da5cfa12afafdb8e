// The gradients of a 2-D convolution (NCHW, any stride, padding, dilation and groups) with f32 math
// on `elem` elements (`elem_f32.wgsl`, or `elem_f16.wgsl` for f16 storage). No atomics: each output
// element is summed by one invocation or one workgroup in a fixed order, so every run gives the same
// bits.
//
// `conv2d_backward_input`: one invocation per input element (n, c, y, x), summing
// grad_output[n, k, oy, ox] · weight[k, c − g·C/G, r, s] over the output channels k of c's group
// (those of [p[20], p[21]) in this launch) and the taps (r, s) whose window position
// (oy, ox) = ((y + ph − r·dh) / sh, (x + pw − s·dw) / sw) divides exactly and lies inside the output.
// Bindings: [0] grad_output, [1] weight, [2] bias (of C; bound, unused, without one), [3] grad_input.
// With p[22] set the launch adds to grad_input (a later block of output channels); else it starts
// from the bias (p[23] set) or zero.
//
// `conv2d_backward_weight`: one workgroup of 64 invocations per weight element (k, c, r, s), its
// invocations striding over the output positions of images [p[20], p[21]) and summing
// grad_output[n, k, oy, ox] · input[n, g·C/G + c, oy·sh − ph + r·dh, ox·sw − pw + s·dw] where the tap
// lands inside the input; a tree in workgroup memory adds the 64 partial sums. The workgroups are
// numbered across x and y (a grid of more than 65 535 rows folds). Bindings: [0] input,
// [1] grad_output, [2] unused, [3] grad_weight. With p[22] set the launch adds to grad_weight (a
// later block of images).
//
// Parameter words (`p`): [0] invocations (input elements, or weight elements), [1] n, [2] c, [3] h,
// [4] w, [5] k, [6] c per group, [7] r, [8] s, [9] oh, [10] ow, [11] stride y, [12] stride x,
// [13] pad y, [14] pad x, [15] dilation y, [16] dilation x, [17] k per group, [18] element offset of
// binding 0, [19] element offset of binding 1, [20], [21] the range of output channels within the
// group (input gradient) or of images (weight gradient), [22] accumulate, [23] bias present,
// [24] element offset of the bias, [25] element offset of the output.

@group(0) @binding(0) var<storage, read_write> a: array<elem>;
@group(0) @binding(1) var<storage, read_write> b: array<elem>;
@group(0) @binding(2) var<storage, read_write> bias: array<elem>;
@group(0) @binding(3) var<storage, read_write> out: array<elem>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

// The window position along an axis whose tap `t` reads input coordinate `i`:
// `o = (i + pad − t·dil) / stride` when that divides exactly and `o < n`; else 0xffffffff.
fn window_of(i: u32, t: u32, pad: u32, dil: u32, stride: u32, n: u32) -> u32 {
    let q = i + pad;
    let reach = t * dil;
    if (q < reach) {
        return 0xffffffffu;
    }
    let d = q - reach;
    let o = d / stride;
    if (o * stride != d || o >= n) {
        return 0xffffffffu;
    }
    return o;
}

@compute @workgroup_size(256)
fn conv2d_backward_input(@builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) groups: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * 256u + lid;
    if (i >= p[0]) {
        return;
    }
    let c = p[2];
    let h = p[3];
    let w = p[4];
    let k = p[5];
    let cg = p[6];
    let r = p[7];
    let s = p[8];
    let oh = p[9];
    let ow = p[10];
    let kg = p[17];
    let x = i % w;
    let y = (i / w) % h;
    let ch = (i / (h * w)) % c;
    let img = i / (c * h * w);
    let g = ch / cg;
    let cw = ch - g * cg;
    var sum = 0.0;
    for (var ko = p[20]; ko < p[21]; ko++) {
        let kk = g * kg + ko;
        let dy0 = p[18] + (img * k + kk) * oh * ow;
        let w0 = p[19] + (kk * cg + cw) * r * s;
        for (var ri = 0u; ri < r; ri++) {
            let oy = window_of(y, ri, p[13], p[15], p[11], oh);
            if (oy == 0xffffffffu) {
                continue;
            }
            for (var si = 0u; si < s; si++) {
                let ox = window_of(x, si, p[14], p[16], p[12], ow);
                if (ox == 0xffffffffu) {
                    continue;
                }
                sum += load_elem(a[dy0 + oy * ow + ox]) * load_elem(b[w0 + ri * s + si]);
            }
        }
    }
    let o = p[25] + i;
    if (p[22] != 0u) {
        sum += load_elem(out[o]);
    } else if (p[23] != 0u) {
        sum += load_elem(bias[p[24] + ch]);
    }
    out[o] = store_elem(sum);
}

const WG_WEIGHT: u32 = 64u;

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn conv2d_backward_weight(@builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) groups: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    // One weight element per workgroup; the folded grid's last row may run past them (uniformly
    // for the whole workgroup, so no barrier is skipped by only some invocations).
    let e = wid.x + wid.y * groups.x;
    if (e >= p[0]) {
        return;
    }
    let c = p[2];
    let h = p[3];
    let w = p[4];
    let k = p[5];
    let cg = p[6];
    let r = p[7];
    let s = p[8];
    let oh = p[9];
    let ow = p[10];
    let si = e % s;
    let ri = (e / s) % r;
    let cw = (e / (r * s)) % cg;
    let kk = e / (cg * r * s);
    let ch = (kk / p[17]) * cg + cw;
    let positions = oh * ow;
    let first = p[20] * positions;
    let end = p[21] * positions;
    var sum = 0.0;
    for (var j = first + lid; j < end; j += WG_WEIGHT) {
        let img = j / positions;
        let at = j % positions;
        let oy = at / ow;
        let ox = at % ow;
        let ty = oy * p[11] + ri * p[15];
        let tx = ox * p[12] + si * p[16];
        if (ty < p[13] || tx < p[14]) {
            continue;
        }
        let iy = ty - p[13];
        let ix = tx - p[14];
        if (iy >= h || ix >= w) {
            continue;
        }
        let xv = load_elem(a[p[18] + ((img * c + ch) * h + iy) * w + ix]);
        sum += load_elem(b[p[19] + (img * k + kk) * positions + at]) * xv;
    }
    partial[lid] = sum;
    for (var width = WG_WEIGHT / 2u; width > 0u; width /= 2u) {
        workgroupBarrier();
        if (lid < width) {
            partial[lid] = partial[lid] + partial[lid + width];
        }
    }
    if (lid == 0u) {
        var total = partial[0];
        let o = p[25] + e;
        if (p[22] != 0u) {
            total += load_elem(out[o]);
        }
        out[o] = store_elem(total);
    }
}
