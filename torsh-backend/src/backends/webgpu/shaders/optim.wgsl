// One fused Adam / AdamW step over `n` contiguous elements of `elem` (f32, or f16 on devices with
// shader-f16: `elem_f32.wgsl` / `elem_f16.wgsl`; f32 math, each stored value rounded once), with
// torch.optim semantics (no AMSGrad): each invocation reads a parameter, its gradient and both
// moments once and writes the parameter and the moments once. Every scalar that is a difference of
// near-equal numbers is formed on the host in f64 and rounded once (1 - 0.999 in f32 would be off
// by 1.3e-5): `step_size` = lr / (1 - beta1^t), `bc2_sqrt` = sqrt(1 - beta2^t), `decay` = 1 - lr * wd.
//
// Parameter words (`p`): [0] n, [1..5) element offsets of params, grads, exp_avg, exp_avg_sq,
// then as f32 bits: [5] decay (AdamW) or 1, [6] beta1, [7] beta2, [8] eps, [9] weight decay (Adam)
// or 0, [10] step_size, [11] bc2_sqrt, [12] 1 - beta1, [13] 1 - beta2.

@group(0) @binding(0) var<storage, read_write> params: array<elem>;
@group(0) @binding(1) var<storage, read_write> grads: array<elem>;
@group(0) @binding(2) var<storage, read_write> exp_avg: array<elem>;
@group(0) @binding(3) var<storage, read_write> exp_avg_sq: array<elem>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

fn f(i: u32) -> f32 {
    return bitcast<f32>(p[i]);
}

@compute @workgroup_size(256)
fn adam(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * groups.x) * 256u + lid;
    if (i >= p[0]) {
        return;
    }
    let param = load_elem(params[p[1] + i]);
    // L2 decay only where it is on, as the reference does (0 * inf would turn a gradient into NaN).
    let grad = load_elem(grads[p[2] + i]);
    let g = select(grad, fma(f(9u), param, grad), f(9u) != 0.0);
    let m = fma(f(6u), load_elem(exp_avg[p[3] + i]), f(12u) * g);
    let v = fma(f(7u), load_elem(exp_avg_sq[p[4] + i]), f(13u) * g * g);
    exp_avg[p[3] + i] = store_elem(m);
    exp_avg_sq[p[4] + i] = store_elem(v);
    params[p[1] + i] = store_elem(param * f(5u) - f(10u) * m / (sqrt(v) / f(11u) + f(8u)));
}
