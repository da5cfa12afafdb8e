// The register block of the tiled kernels (`gemm.wgsl`, `conv.wgsl`), prepended to each: one thread's
// 8 x 8 outputs in sixteen vec4s, row i in r<i> (columns 0..4) and s<i> (columns 4..8), and the
// outer-product step that adds one slice of k to it. Every driver inlines these calls, so the block
// stays in registers.

struct Block {
    r0: vec4<f32>, r1: vec4<f32>, r2: vec4<f32>, r3: vec4<f32>,
    r4: vec4<f32>, r5: vec4<f32>, r6: vec4<f32>, r7: vec4<f32>,
    s0: vec4<f32>, s1: vec4<f32>, s2: vec4<f32>, s3: vec4<f32>,
    s4: vec4<f32>, s5: vec4<f32>, s6: vec4<f32>, s7: vec4<f32>,
}

// Adds the outer product of the column (a_lo, a_hi) (rows 0..8) and the row (b_lo, b_hi)
// (columns 0..8).
fn block_fma(acc: ptr<function, Block>, a_lo: vec4<f32>, a_hi: vec4<f32>, b_lo: vec4<f32>,
             b_hi: vec4<f32>) {
    (*acc).r0 = fma(vec4<f32>(a_lo.x), b_lo, (*acc).r0); (*acc).s0 = fma(vec4<f32>(a_lo.x), b_hi, (*acc).s0);
    (*acc).r1 = fma(vec4<f32>(a_lo.y), b_lo, (*acc).r1); (*acc).s1 = fma(vec4<f32>(a_lo.y), b_hi, (*acc).s1);
    (*acc).r2 = fma(vec4<f32>(a_lo.z), b_lo, (*acc).r2); (*acc).s2 = fma(vec4<f32>(a_lo.z), b_hi, (*acc).s2);
    (*acc).r3 = fma(vec4<f32>(a_lo.w), b_lo, (*acc).r3); (*acc).s3 = fma(vec4<f32>(a_lo.w), b_hi, (*acc).s3);
    (*acc).r4 = fma(vec4<f32>(a_hi.x), b_lo, (*acc).r4); (*acc).s4 = fma(vec4<f32>(a_hi.x), b_hi, (*acc).s4);
    (*acc).r5 = fma(vec4<f32>(a_hi.y), b_lo, (*acc).r5); (*acc).s5 = fma(vec4<f32>(a_hi.y), b_hi, (*acc).s5);
    (*acc).r6 = fma(vec4<f32>(a_hi.z), b_lo, (*acc).r6); (*acc).s6 = fma(vec4<f32>(a_hi.z), b_hi, (*acc).s6);
    (*acc).r7 = fma(vec4<f32>(a_hi.w), b_lo, (*acc).r7); (*acc).s7 = fma(vec4<f32>(a_hi.w), b_hi, (*acc).s7);
}

// `block_fma` where only the columns whose `lo`/`hi` lane is true take the product; the others keep
// their value (so an infinite `a` times a skipped column's zero never makes a NaN).
fn block_fma_masked(acc: ptr<function, Block>, a_lo: vec4<f32>, a_hi: vec4<f32>, b_lo: vec4<f32>,
                    b_hi: vec4<f32>, lo: vec4<bool>, hi: vec4<bool>) {
    let before = *acc;
    block_fma(acc, a_lo, a_hi, b_lo, b_hi);
    (*acc).r0 = select(before.r0, (*acc).r0, lo); (*acc).s0 = select(before.s0, (*acc).s0, hi);
    (*acc).r1 = select(before.r1, (*acc).r1, lo); (*acc).s1 = select(before.s1, (*acc).s1, hi);
    (*acc).r2 = select(before.r2, (*acc).r2, lo); (*acc).s2 = select(before.s2, (*acc).s2, hi);
    (*acc).r3 = select(before.r3, (*acc).r3, lo); (*acc).s3 = select(before.s3, (*acc).s3, hi);
    (*acc).r4 = select(before.r4, (*acc).r4, lo); (*acc).s4 = select(before.s4, (*acc).s4, hi);
    (*acc).r5 = select(before.r5, (*acc).r5, lo); (*acc).s5 = select(before.s5, (*acc).s5, hi);
    (*acc).r6 = select(before.r6, (*acc).r6, lo); (*acc).s6 = select(before.s6, (*acc).s6, hi);
    (*acc).r7 = select(before.r7, (*acc).r7, lo); (*acc).s7 = select(before.s7, (*acc).s7, hi);
}

