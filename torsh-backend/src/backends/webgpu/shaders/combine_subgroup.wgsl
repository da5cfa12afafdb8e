// Workgroup combines (`combine.wgsl`) for devices with subgroups: each subgroup combines its lanes'
// values with one subgroup operation, its first lane posts the result in workgroup memory, and after
// one barrier every subgroup combines the posted results (its lanes striding over the 256 slots) and
// then its lanes' partial results, so every thread holds the answer; a second barrier frees the
// workgroup memory for the next combine. Nothing assumes a subgroup size or which threads share a
// subgroup: a lane's number and the subgroup's size are counted with subgroup operations, and a
// subgroup posts in the slot of its first lane. Call with every thread. (WGSL's `enable subgroups;`
// directive is left out: naga rejects it and gates the subgroup functions on the device feature.)

// Whether this thread is its subgroup's first active lane.
fn first_lane(t: u32) -> bool {
    return subgroupBroadcastFirst(t) == t;
}

// The sum of every thread's `v`.
fn wg_sum(v: f32, t: u32) -> f32 {
    let mine = subgroupAdd(v);
    part_v[t] = select(0.0, mine, first_lane(t));
    workgroupBarrier();
    let lane = subgroupExclusiveAdd(1u);
    let size = subgroupAdd(1u);
    var acc = 0.0;
    for (var e = lane; e < WG; e += size) {
        acc += part_v[e];
    }
    let total = subgroupAdd(acc);
    workgroupBarrier();
    return total;
}

// The largest of every thread's `v` (no NaN may be given).
fn wg_max(v: f32, t: u32) -> f32 {
    let lowest = bitcast<f32>(0xff800000u);
    let mine = subgroupMax(v);
    part_v[t] = select(lowest, mine, first_lane(t));
    workgroupBarrier();
    let lane = subgroupExclusiveAdd(1u);
    let size = subgroupAdd(1u);
    var acc = lowest;
    for (var e = lane; e < WG; e += size) {
        acc = max(acc, part_v[e]);
    }
    let top = subgroupMax(acc);
    workgroupBarrier();
    return top;
}

// `v` as an unsigned key that orders as `better` does for a maximum (`is_max`, the larger key wins)
// or a minimum (the smaller wins): a NaN beats every number, and -0 and +0 are the same key.
fn order_key(v: f32, is_max: bool) -> u32 {
    if (is_nan(v)) {
        return select(0u, 0xffffffffu, is_max);
    }
    let bits = bitcast<u32>(select(v, 0.0, v == 0.0));
    return select(bits | 0x80000000u, ~bits, (bits & 0x80000000u) != 0u);
}

// The best of the subgroup's candidates by `better`: the best key, the lowest index holding it, and
// that lane's value, bit for bit.
fn subgroup_best(v: f32, i: u32, is_max: bool) -> Best {
    let key = order_key(v, is_max);
    let top = select(subgroupMin(key), subgroupMax(key), is_max);
    let holds = key == top;
    let index = subgroupMin(select(0xffffffffu, i, holds));
    let bits = subgroupOr(select(0u, bitcast<u32>(v), holds && i == index));
    return Best(bitcast<f32>(bits), index);
}

// The best of every thread's candidate (`v`, `i`) by `better`.
fn wg_best(v: f32, i: u32, t: u32, is_max: bool) -> Best {
    let mine = subgroup_best(v, i, is_max);
    part_v[t] = mine.v;
    part_i[t] = select(0xffffffffu, mine.i, first_lane(t)); // 0xffffffff: an empty slot
    workgroupBarrier();
    let lane = subgroupExclusiveAdd(1u);
    let size = subgroupAdd(1u);
    var acc = mine;
    for (var e = lane; e < WG; e += size) {
        if (part_i[e] != 0xffffffffu && better(acc.v, acc.i, part_v[e], part_i[e], is_max)) {
            acc = Best(part_v[e], part_i[e]);
        }
    }
    let best = subgroup_best(acc.v, acc.i, is_max);
    workgroupBarrier();
    return best;
}

