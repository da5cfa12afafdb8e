// Tiled GEMM over strided operands: C = alpha * op(A) * op(B) + beta * C, C being m x n, on elements
// of type `elem` (`elem_f32.wgsl`, or `elem_f16.wgsl` for f16 storage) with f32 math.
//
// Each workgroup computes a TILE x TILE tile of C (TILE = 64 by default, or 32: an override constant, so
// the autotuner can pick the smaller tile where it gives more workgroups) with (TILE / 8)² threads, each
// thread an 8 x 8 block held in sixteen vec4 registers, stepping through k in slices of 16 staged in
// workgroup memory as vec4s: per step of k a thread loads two vec4s of A and two of B for 64
// multiply-adds. Edge tiles load zeros past
// the matrix and store only inside it; every thread reaches every barrier. Operands are given by
// element offset, row stride and column stride (so both transposes, any leading dimension, and GEMV's
// strided vectors are the same kernel), and the grid's z dimension walks a batch with per-operand
// batch strides. f32 accumulation; C is read exactly when the host's beta is not 0 (word 18, so that a
// NaN beta, which shader comparisons may not see, multiplies C as BLAS says).
//
// Parameter words (`p`): [0] m, [1] n, [2] k, [3] first batch index of this launch,
// [4..7) A offset, row stride, column stride, [7..10) B's, [10..13) C's,
// [13..16) batch strides of A, B, C, [16] alpha and [17] beta as f32 bits, [18] 1 when C is read.

@group(0) @binding(0) var<storage, read_write> a: array<elem>;
@group(0) @binding(1) var<storage, read_write> b: array<elem>;
@group(0) @binding(2) var<storage, read_write> c: array<elem>;
@group(0) @binding(3) var<storage, read> p: array<u32>;

override TILE: u32 = 64u;
override SIDE: u32 = TILE / 8u; // threads along each side of the workgroup
const TK: u32 = 16u;

var<workgroup> tile_a: array<vec4<f32>, TK * TILE / 4u>; // [TK][TILE / 4]
var<workgroup> tile_b: array<vec4<f32>, TK * TILE / 4u>; // [TK][TILE / 4]

@compute @workgroup_size(SIDE, SIDE)
fn gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let m = p[0];
    let n = p[1];
    let k = p[2];
    let batch = p[3] + wid.z;
    let a0 = p[4] + batch * p[13];
    let b0 = p[7] + batch * p[14];
    let c0 = p[10] + batch * p[15];
    let row0 = wid.x * TILE;
    let col0 = wid.y * TILE;
    let threads = SIDE * SIDE;

    // The thread's 8 x 8 block (`block.wgsl`).
    var acc = Block();

    for (var k0 = 0u; k0 < k; k0 += TK) {
        for (var q = 0u; q < (TILE * TK) / threads; q++) {
            let e = li + q * threads;
            let i = e % TILE;
            let kk = e / TILE;
            let gi = row0 + i;
            let gk = k0 + kk;
            var v = 0.0;
            if (gi < m && gk < k) {
                v = load_elem(a[a0 + gi * p[5] + gk * p[6]]);
            }
            tile_a[kk * (TILE / 4u) + i / 4u][i % 4u] = v;
        }
        for (var q = 0u; q < (TILE * TK) / threads; q++) {
            let e = li + q * threads;
            let kk = e % TK;
            let j = e / TK;
            let gj = col0 + j;
            let gk = k0 + kk;
            var v = 0.0;
            if (gj < n && gk < k) {
                v = load_elem(b[b0 + gk * p[8] + gj * p[9]]);
            }
            tile_b[kk * (TILE / 4u) + j / 4u][j % 4u] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            let a_lo = tile_a[kk * (TILE / 4u) + lid.x * 2u];
            let a_hi = tile_a[kk * (TILE / 4u) + lid.x * 2u + 1u];
            let b_lo = tile_b[kk * (TILE / 4u) + lid.y * 2u];
            let b_hi = tile_b[kk * (TILE / 4u) + lid.y * 2u + 1u];
            block_fma(&acc, a_lo, a_hi, b_lo, b_hi);
        }
        workgroupBarrier();
    }

    let gi = row0 + lid.x * 8u;
    let gj = col0 + lid.y * 8u;
    store(gi, gj, c0, acc.r0, acc.s0);
    store(gi + 1u, gj, c0, acc.r1, acc.s1);
    store(gi + 2u, gj, c0, acc.r2, acc.s2);
    store(gi + 3u, gj, c0, acc.r3, acc.s3);
    store(gi + 4u, gj, c0, acc.r4, acc.s4);
    store(gi + 5u, gj, c0, acc.r5, acc.s5);
    store(gi + 6u, gj, c0, acc.r6, acc.s6);
    store(gi + 7u, gj, c0, acc.r7, acc.s7);
}

// Writes alpha * (lo, hi) (+ beta * C where C is read) to row gi, columns gj .. gj + 8, inside C.
fn store(gi: u32, gj: u32, c0: u32, lo: vec4<f32>, hi: vec4<f32>) {
    let alpha = bitcast<f32>(p[16]);
    let beta = bitcast<f32>(p[17]);
    if (gi >= p[0]) {
        return;
    }
    for (var y = 0u; y < 8u; y++) {
        let col = gj + y;
        if (col < p[1]) {
            let at = c0 + gi * p[11] + col * p[12];
            var v = alpha * select(hi[y % 4u], lo[y % 4u], y < 4u);
            if (p[18] != 0u) {
                v = fma(beta, load_elem(c[at]), v);
            }
            c[at] = store_elem(v);
        }
    }
}
