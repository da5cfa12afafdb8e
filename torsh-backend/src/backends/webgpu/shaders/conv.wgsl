// 2-D convolution (cross-correlation, NCHW) as an implicit GEMM, with f32 math on `elem` elements
// (`elem_f32.wgsl`, or `elem_f16.wgsl` for f16 storage): for each group, the output
// channels of the group are the rows, the output pixels of every image (n, y, x) the columns, and the
// reduction runs over (input channel, r, s) of the group; the input patch is gathered on the fly
// (no im2col buffer). The blocking is `gemm.wgsl`'s: each workgroup computes a 64 x 64 tile with
// 8 x 8 threads, each thread an 8 x 8 block held in sixteen vec4 registers, stepping through the
// reduction in slices of 16 staged in workgroup memory as vec4s. Taps that land on padding are
// skipped, as the reference does (so an infinite weight there does not turn the output into NaN):
// with the override constant PADDED (set when the convolution pads) a mask staged beside the input
// patch keeps each accumulator unchanged for them; without padding every tap is real and the mask is
// never built. The grid's x dimension is the tile of output channels; its y and z dimensions
// together number the (group, tile of output pixels) pairs, so that a grid of more pixel tiles
// than one dimension holds (65 535) folds into the next. f32 accumulation, bias added last.
//
// Parameter words (`p`): [0] n, [1] c, [2] h, [3] w, [4] k, [5] c per group, [6] r, [7] s, [8] oh,
// [9] ow, [10] stride y, [11] stride x, [12] pad y, [13] pad x, [14] dilation y, [15] dilation x,
// [16] k per group, [17] input offset, [18] weight offset, [19] bias offset, [20] output offset,
// [21] bias present, [22] tiles of output pixels per group, [23] groups.

@group(0) @binding(0) var<storage, read_write> input: array<elem>;
@group(0) @binding(1) var<storage, read_write> weight: array<elem>;
@group(0) @binding(2) var<storage, read_write> bias: array<elem>;
@group(0) @binding(3) var<storage, read_write> out: array<elem>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

override PADDED: bool = true;
const TILE: u32 = 64u;
const SIDE: u32 = 8u; // threads along each side of the workgroup
const THREADS: u32 = 64u;
const TK: u32 = 16u;

var<workgroup> tile_a: array<vec4<f32>, 256>; // [TK][TILE / 4]: weights
var<workgroup> tile_b: array<vec4<f32>, 256>; // [TK][TILE / 4]: the input patch
var<workgroup> tile_real: array<vec4<u32>, 256>; // 1 where tile_b holds an input element (PADDED only)

@compute @workgroup_size(SIDE, SIDE)
fn conv2d(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) grid: vec3<u32>,
          @builtin(local_invocation_id) lid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    // The (group, pixel tile) pair of this workgroup; the folded grid's last row may run past
    // them (uniformly for the whole workgroup, so no barrier is skipped by only some threads).
    let pair = wid.y + wid.z * grid.y;
    if (pair >= p[22] * p[23]) {
        return;
    }
    let c = p[1];
    let h = p[2];
    let w = p[3];
    let k = p[4];
    let cg = p[5];
    let s = p[7];
    let oh = p[8];
    let ow = p[9];
    let kg = p[16];
    let g = pair / p[22];
    let depth = cg * p[6] * s;
    let pixels = oh * ow;
    let cols = p[0] * pixels;
    let row0 = wid.x * TILE;
    let col0 = (pair % p[22]) * TILE;

    // The thread's 8 x 8 block (`block.wgsl`).
    var acc = Block();

    // Staging: thread `li` loads weight row `li` and input-patch column `li` of the tile at every step
    // of the reduction (THREADS == TILE), so its output pixel is decomposed once, and the tap
    // (channel ci, row ri, column si) of reduction index gk advances one step at a time with no
    // division.
    let gj_load = col0 + li;
    let col_real = gj_load < cols;
    let pixel_load = gj_load % pixels;
    let iy0 = (pixel_load / ow) * p[10];
    let ix0 = (pixel_load % ow) * p[11];
    let in_base = p[17] + ((gj_load / pixels) * c + g * cg) * h * w;
    let row_real = row0 + li < kg;
    let w_base = p[18] + (g * kg + row0 + li) * depth;
    var ci = 0u;
    var ri = 0u;
    var si = 0u;

    for (var k0 = 0u; k0 < depth; k0 += TK) {
        for (var kk = 0u; kk < TK; kk++) {
            let gk = k0 + kk;
            let at = kk * (TILE / 4u) + li / 4u;
            var wv = 0.0;
            if (row_real && gk < depth) {
                wv = load_elem(weight[w_base + gk]);
            }
            tile_a[at][li % 4u] = wv;
            var v = 0.0;
            var real = 0u;
            if (col_real && gk < depth) {
                // Padded coordinates: the tap is real when pad <= coordinate < pad + size.
                let iy = iy0 + ri * p[14];
                let ix = ix0 + si * p[15];
                if (iy >= p[12] && iy - p[12] < h && ix >= p[13] && ix - p[13] < w) {
                    v = load_elem(input[in_base + (ci * h + iy - p[12]) * w + ix - p[13]]);
                    real = 1u;
                }
            }
            tile_b[at][li % 4u] = v;
            if (PADDED) {
                tile_real[at][li % 4u] = real;
            }
            si += 1u;
            if (si == s) {
                si = 0u;
                ri += 1u;
                if (ri == p[6]) {
                    ri = 0u;
                    ci += 1u;
                }
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            let a_lo = tile_a[kk * (TILE / 4u) + lid.x * 2u];
            let a_hi = tile_a[kk * (TILE / 4u) + lid.x * 2u + 1u];
            let b_lo = tile_b[kk * (TILE / 4u) + lid.y * 2u];
            let b_hi = tile_b[kk * (TILE / 4u) + lid.y * 2u + 1u];
            if (PADDED) {
                let lo = tile_real[kk * (TILE / 4u) + lid.y * 2u] != vec4<u32>(0u);
                let hi = tile_real[kk * (TILE / 4u) + lid.y * 2u + 1u] != vec4<u32>(0u);
                block_fma_masked(&acc, a_lo, a_hi, b_lo, b_hi, lo, hi);
            } else {
                block_fma(&acc, a_lo, a_hi, b_lo, b_hi);
            }
        }
        workgroupBarrier();
    }

    let gi = row0 + lid.x * 8u;
    let gj = col0 + lid.y * 8u;
    store(g, gi, gj, acc.r0, acc.s0);
    store(g, gi + 1u, gj, acc.r1, acc.s1);
    store(g, gi + 2u, gj, acc.r2, acc.s2);
    store(g, gi + 3u, gj, acc.r3, acc.s3);
    store(g, gi + 4u, gj, acc.r4, acc.s4);
    store(g, gi + 5u, gj, acc.r5, acc.s5);
    store(g, gi + 6u, gj, acc.r6, acc.s6);
    store(g, gi + 7u, gj, acc.r7, acc.s7);
}

// Writes (lo, hi) + bias to output channel gi of group g at output columns gj .. gj + 8, inside the
// output.
fn store(g: u32, gi: u32, gj: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if (gi >= p[16]) {
        return;
    }
    let channel = g * p[16] + gi;
    var b = 0.0;
    if (p[21] != 0u) {
        b = load_elem(bias[p[19] + channel]);
    }
    let pixels = p[8] * p[9];
    let cols = p[0] * pixels;
    for (var y = 0u; y < 8u; y++) {
        let col = gj + y;
        if (col < cols) {
            let ni = col / pixels;
            let pixel = col % pixels;
            let value = select(hi[y % 4u], lo[y % 4u], y < 4u) + b;
            out[p[20] + (ni * p[4] + channel) * pixels + pixel] = store_elem(value);
        }
    }
}
