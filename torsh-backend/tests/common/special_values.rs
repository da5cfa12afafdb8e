//! Max, min, argmax and argmin of rows of special values against the reference, compared exactly
//! (bits of the values, indices): shared by `tests/parity.rs` and the WebGPU configuration tests.

use torsh_backend::Backend;

/// Rows of special values for max/min and their arg forms: NaN early, late and alone, infinities,
/// extremes at ±0 where the first of the tied zeros decides the sign, all-equal rows, and plain
/// random rows, at lane lengths that take every group size of the GPU kernels (1, 7, 33, 300, 1000).
pub fn special_rows(len: usize) -> Vec<Vec<f32>> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ len as u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 8.0 - 4.0
    };
    let plain: Vec<f32> = (0..len).map(|_| next()).collect();
    let with = |i: usize, v: f32| {
        let mut r = plain.clone();
        r[i.min(len - 1)] = v;
        r
    };
    let negative: Vec<f32> = plain.iter().map(|x| -x.abs() - 1.0).collect();
    let zeros_at = |first: f32, second: f32| {
        let mut r = negative.clone();
        r[(len / 3).min(len - 1)] = first;
        r[len - 1] = second;
        r
    };
    vec![
        plain.clone(),
        with(0, f32::NAN),
        with(len / 2, f32::NAN),
        with(len - 1, f32::NAN),
        with(len / 2, f32::INFINITY),
        with(len / 3, f32::NEG_INFINITY),
        zeros_at(-0.0, 0.0),
        zeros_at(0.0, -0.0),
        plain.iter().map(|x| x.abs() + 1.0).collect(),
        vec![f32::NEG_INFINITY; len],
        vec![f32::INFINITY; len],
        vec![-0.0; len],
        vec![2.5; len],
    ]
}

/// Every disagreement of `target` with `reference` on [`special_rows`], described.
pub fn mismatches(target: &Backend, reference: &Backend) -> Vec<String> {
    let mut failures = Vec::new();
    for len in [1, 7, 33, 300, 1000] {
        let rows = special_rows(len);
        let data: Vec<f32> = rows.concat();
        let shape = [rows.len(), len];
        let x = target.from_slice(&data, &shape).expect("upload");
        let xr = reference.from_slice(&data, &shape).expect("upload");
        let bits = |t: &torsh_backend::Tensor| -> Vec<u32> {
            let v: Vec<f32> = t.to_vec().expect("download");
            v.iter()
                .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
                .collect()
        };
        for (name, got, want) in [
            (
                "max",
                target.max(&x, 1, false),
                reference.max(&xr, 1, false),
            ),
            (
                "min",
                target.min(&x, 1, false),
                reference.min(&xr, 1, false),
            ),
        ] {
            let (got, want) = (bits(&got.expect(name)), bits(&want.expect(name)));
            if got != want {
                failures.push(format!(
                    "{name} len {len} on {}: {got:08x?} vs {want:08x?}",
                    target.backend_type()
                ));
            }
        }
        for (name, got, want) in [
            (
                "argmax",
                target.argmax(&x, 1, false),
                reference.argmax(&xr, 1, false),
            ),
            (
                "argmin",
                target.argmin(&x, 1, false),
                reference.argmin(&xr, 1, false),
            ),
        ] {
            let got: Vec<i64> = got.expect(name).to_vec().expect("download");
            let want: Vec<i64> = want.expect(name).to_vec().expect("download");
            if got != want {
                failures.push(format!(
                    "{name} len {len} on {}: {got:?} vs {want:?}",
                    target.backend_type()
                ));
            }
        }
    }
    failures
}
