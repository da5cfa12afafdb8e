// Workgroup combines (`combine.wgsl`) for devices without subgroups: a pairwise tree over the
// threads' values in workgroup memory, one barrier per level. Each returns the result to every thread
// and leaves the workgroup memory free for the next combine. Call with every thread.

// The sum of every thread's `v`.
fn wg_sum(v: f32, t: u32) -> f32 {
    part_v[t] = v;
    for (var width = WG / 2u; width > 0u; width /= 2u) {
        workgroupBarrier();
        if (t < width) {
            part_v[t] = part_v[t] + part_v[t + width];
        }
    }
    workgroupBarrier();
    let total = part_v[0];
    workgroupBarrier();
    return total;
}

// The largest of every thread's `v` (no NaN may be given).
fn wg_max(v: f32, t: u32) -> f32 {
    part_v[t] = v;
    for (var width = WG / 2u; width > 0u; width /= 2u) {
        workgroupBarrier();
        if (t < width) {
            let o = part_v[t + width];
            part_v[t] = select(part_v[t], o, o > part_v[t]);
        }
    }
    workgroupBarrier();
    let top = part_v[0];
    workgroupBarrier();
    return top;
}

// The best of every thread's candidate (`v`, `i`) by `better`.
fn wg_best(v: f32, i: u32, t: u32, is_max: bool) -> Best {
    part_v[t] = v;
    part_i[t] = i;
    for (var width = WG / 2u; width > 0u; width /= 2u) {
        workgroupBarrier();
        if (t < width && better(part_v[t], part_i[t], part_v[t + width], part_i[t + width], is_max)) {
            part_v[t] = part_v[t + width];
            part_i[t] = part_i[t + width];
        }
    }
    workgroupBarrier();
    let best = Best(part_v[0], part_i[0]);
    workgroupBarrier();
    return best;
}

