// Tiled f32 GEMM over strided operands: C = alpha * op(A) * op(B) + beta * C, C being m x n.
//
// Each workgroup computes a 64 x 64 tile of C with 16 x 16 threads, 4 x 4 outputs per thread,
// stepping through k in slices of 16 staged in workgroup memory. Edge tiles load zeros past the
// matrix and store only inside it; every thread reaches every barrier. Operands are given by element
// offset, row stride and column stride (so both transposes, any leading dimension, and GEMV's strided
// vectors are the same kernel), and the grid's z dimension walks a batch with per-operand batch
// strides. f32 accumulation; beta = 0 never reads C.
//
// Parameter words (`p`): [0] m, [1] n, [2] k, [3] first batch index of this launch,
// [4..7) A offset, row stride, column stride, [7..10) B's, [10..13) C's,
// [13..16) batch strides of A, B, C, [16] alpha and [17] beta as f32 bits.

@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@group(0) @binding(1) var<storage, read_write> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<storage, read> p: array<u32>;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;
const THREADS: u32 = 256u;

var<workgroup> tile_a: array<f32, 1024>; // [TK][TM]
var<workgroup> tile_b: array<f32, 1024>; // [TK][TN]

@compute @workgroup_size(16, 16)
fn gemm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let m = p[0];
    let n = p[1];
    let k = p[2];
    let batch = p[3] + wid.z;
    let a0 = p[4] + batch * p[13];
    let b0 = p[7] + batch * p[14];
    let c0 = p[10] + batch * p[15];
    let row0 = wid.x * TM;
    let col0 = wid.y * TN;

    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i++) {
        acc[i] = 0.0;
    }

    for (var k0 = 0u; k0 < k; k0 += TK) {
        for (var r = 0u; r < (TM * TK) / THREADS; r++) {
            let e = li + r * THREADS;
            let i = e % TM;
            let kk = e / TM;
            let gi = row0 + i;
            let gk = k0 + kk;
            var v = 0.0;
            if (gi < m && gk < k) {
                v = a[a0 + gi * p[5] + gk * p[6]];
            }
            tile_a[kk * TM + i] = v;
        }
        for (var r = 0u; r < (TN * TK) / THREADS; r++) {
            let e = li + r * THREADS;
            let kk = e % TK;
            let j = e / TK;
            let gj = col0 + j;
            let gk = k0 + kk;
            var v = 0.0;
            if (gj < n && gk < k) {
                v = b[b0 + gk * p[8] + gj * p[9]];
            }
            tile_b[kk * TN + j] = v;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            var av: array<f32, 4>;
            var bv: array<f32, 4>;
            for (var x = 0u; x < 4u; x++) {
                av[x] = tile_a[kk * TM + lid.x + x * 16u];
                bv[x] = tile_b[kk * TN + lid.y + x * 16u];
            }
            for (var x = 0u; x < 4u; x++) {
                for (var y = 0u; y < 4u; y++) {
                    acc[x * 4u + y] = fma(av[x], bv[y], acc[x * 4u + y]);
                }
            }
        }
        workgroupBarrier();
    }

    let alpha = bitcast<f32>(p[16]);
    let beta = bitcast<f32>(p[17]);
    for (var x = 0u; x < 4u; x++) {
        let gi = row0 + lid.x + x * 16u;
        for (var y = 0u; y < 4u; y++) {
            let gj = col0 + lid.y + y * 16u;
            if (gi < m && gj < n) {
                let at = c0 + gi * p[11] + gj * p[12];
                var v = alpha * acc[x * 4u + y];
                if (beta != 0.0) {
                    v = fma(beta, c[at], v);
                }
                c[at] = v;
            }
        }
    }
}
