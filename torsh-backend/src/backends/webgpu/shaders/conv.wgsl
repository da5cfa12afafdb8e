// 2-D convolution (cross-correlation, NCHW) in f32 as an implicit GEMM: for each group, the output
// channels of the group are the rows, the output pixels of every image (n, y, x) the columns, and the
// reduction runs over (input channel, r, s) of the group; the input patch is gathered on the fly
// (no im2col buffer). Each workgroup computes a 64 x 64 tile with 16 x 16 threads, 4 x 4 outputs per
// thread, over slices of 16 staged in workgroup memory. Taps that land on padding are skipped, as the
// reference does (so an infinite weight there does not turn the output into NaN). The grid's z
// dimension is the group. f32 accumulation, bias added last.
//
// Parameter words (`p`): [0] n, [1] c, [2] h, [3] w, [4] k, [5] c per group, [6] r, [7] s, [8] oh,
// [9] ow, [10] stride y, [11] stride x, [12] pad y, [13] pad x, [14] dilation y, [15] dilation x,
// [16] k per group, [17] input offset, [18] weight offset, [19] bias offset, [20] output offset,
// [21] bias present.

@group(0) @binding(0) var<storage, read_write> input: array<f32>;
@group(0) @binding(1) var<storage, read_write> weight: array<f32>;
@group(0) @binding(2) var<storage, read_write> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;
const THREADS: u32 = 256u;

var<workgroup> tile_a: array<f32, 1024>; // [TK][TM]
var<workgroup> tile_b: array<f32, 1024>; // [TK][TN]
var<workgroup> tile_real: array<u32, 1024>; // 1 where tile_b holds an input element, 0 for padding

@compute @workgroup_size(16, 16)
fn conv2d(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let c = p[1];
    let h = p[2];
    let w = p[3];
    let k = p[4];
    let cg = p[5];
    let r = p[6];
    let s = p[7];
    let oh = p[8];
    let ow = p[9];
    let kg = p[16];
    let g = wid.z;
    let taps = r * s;
    let depth = cg * taps;
    let pixels = oh * ow;
    let cols = p[0] * pixels;
    let row0 = wid.x * TM;
    let col0 = wid.y * TN;

    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = 0.0;
    }

    for (var k0 = 0u; k0 < depth; k0 += TK) {
        for (var q = 0u; q < (TM * TK) / THREADS; q++) {
            let e = li + q * THREADS;
            let i = e % TM;
            let kk = e / TM;
            let gi = row0 + i;
            let gk = k0 + kk;
            var v = 0.0;
            if (gi < kg && gk < depth) {
                v = weight[p[18] + (g * kg + gi) * depth + gk];
            }
            tile_a[kk * TM + i] = v;
        }
        for (var q = 0u; q < (TN * TK) / THREADS; q++) {
            let e = li + q * THREADS;
            let j = e % TN;
            let kk = e / TN;
            let gj = col0 + j;
            let gk = k0 + kk;
            var v = 0.0;
            var real = 0u;
            if (gj < cols && gk < depth) {
                let ci = gk / taps;
                let ri = (gk % taps) / s;
                let si = gk % s;
                let ni = gj / pixels;
                let y = (gj % pixels) / ow;
                let x = gj % ow;
                // Padded coordinates: the tap is real when pad <= coordinate < pad + size.
                let iy = y * p[10] + ri * p[14];
                let ix = x * p[11] + si * p[15];
                if (iy >= p[12] && iy - p[12] < h && ix >= p[13] && ix - p[13] < w) {
                    v = input[p[17] + ((ni * c + g * cg + ci) * h + iy - p[12]) * w + ix - p[13]];
                    real = 1u;
                }
            }
            tile_b[kk * TN + j] = v;
            tile_real[kk * TN + j] = real;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            var av: array<f32, 4>;
            var bv: array<f32, 4>;
            var ok: array<bool, 4>;
            for (var x = 0u; x < 4u; x++) {
                av[x] = tile_a[kk * TM + lid.x + x * 16u];
                bv[x] = tile_b[kk * TN + lid.y + x * 16u];
                ok[x] = tile_real[kk * TN + lid.y + x * 16u] != 0u;
            }
            for (var x = 0u; x < 4u; x++) {
                for (var y = 0u; y < 4u; y++) {
                    let at = x * 4u + y;
                    acc[at] = select(acc[at], fma(av[x], bv[y], acc[at]), ok[y]);
                }
            }
        }
        workgroupBarrier();
    }

    for (var x = 0u; x < 4u; x++) {
        let gi = row0 + lid.x + x * 16u;
        if (gi >= kg) {
            continue;
        }
        let channel = g * kg + gi;
        var b = 0.0;
        if (p[21] != 0u) {
            b = bias[p[19] + channel];
        }
        for (var y = 0u; y < 4u; y++) {
            let gj = col0 + lid.y + y * 16u;
            if (gj < cols) {
                let ni = gj / pixels;
                let pixel = gj % pixels;
                out[p[20] + (ni * k + channel) * pixels + pixel] = acc[x * 4u + y] + b;
            }
        }
    }
}
