// Workgroup-wide combines shared by the row kernels (`rows.wgsl`) and batch norm: the workgroup size
// WG (an override constant, a power of two up to 256: 256 on GPUs, the SIMD width on CPU
// implementations, chosen by the host), the workgroup memory the combines use, and the rule for
// maximum and minimum candidates. `wg_sum`, `wg_max` and `wg_best` come from one of two files
// prepended before this one: `combine_tree.wgsl` (a tree in workgroup memory, a barrier per level) or,
// where the device has subgroups, `combine_subgroup.wgsl` (subgroup operations, two barriers).

override WG: u32 = 256u;

var<workgroup> part_v: array<f32, 256>;
var<workgroup> part_i: array<u32, 256>;

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// A (value, index) candidate of a maximum or minimum.
struct Best {
    v: f32,
    i: u32,
}

// The better of two (value, index) candidates for a maximum (`is_max`) or minimum: the first NaN wins
// outright, then the strictly better value, and on a tie (including -0 against +0) the lower index.
fn better(a: f32, ia: u32, b: f32, ib: u32, is_max: bool) -> bool {
    // True when b beats a.
    if (is_nan(a) || is_nan(b)) {
        if (is_nan(a) && is_nan(b)) {
            return ib < ia;
        }
        return is_nan(b);
    }
    if (b == a) {
        return ib < ia;
    }
    return select((b < a), (b > a), is_max);
}

