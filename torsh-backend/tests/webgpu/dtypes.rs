//! Dtypes: casts between every pair bit for bit, narrow strided copies, f16/bf16 and unaligned
//! operands staged on f32 copies, random fills, f64 data without f64 math.

use super::*;

/// Runs `op` on a raw WebGPU backend and on the raw reference backend; each call gets the backend and
/// returns the bytes to compare.
fn on_both(op: impl Fn(&dyn ComputeBackend) -> Vec<u8>) -> Option<(Vec<u8>, Vec<u8>)> {
    let gpu = raw()?;
    let mut reference =
        torsh_backend::backends::reference::ReferenceBackend::new(BackendType::Reference);
    reference.init().unwrap();
    Some((op(&gpu), op(&reference)))
}

/// Uploads `bytes` at byte `at` of a fresh allocation of `at + bytes.len() + tail` bytes filled with
/// 0xA5; returns the allocation's base.
fn upload_at(
    b: &dyn ComputeBackend,
    bytes: &[u8],
    at: usize,
    tail: usize,
) -> torsh_backend::DevicePtr {
    let base = b.alloc(at + bytes.len() + tail).unwrap();
    let mut all = vec![0xA5u8; at + bytes.len() + tail];
    all[at..at + bytes.len()].copy_from_slice(bytes);
    b.copy_htod(base, &all).unwrap();
    base
}

fn download(b: &dyn ComputeBackend, ptr: torsh_backend::DevicePtr, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    b.copy_dtoh(&mut out, ptr).unwrap();
    out
}

/// Test values of `dtype` as little-endian bytes: every bit pattern of the 8- and 16-bit types, and
/// for the others the edges of every conversion (subnormals, halfway cases of each narrower format,
/// overflow, NaN payloads, integer extremes, values whose conversion through f64 rounds twice).
fn cast_inputs(dtype: DType) -> Vec<u8> {
    let mut rng = torsh_backend::rng::HostRng::new(5);
    match dtype {
        DType::U8 => (0..=255u8).collect(),
        DType::F16 | DType::BF16 => (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect(),
        DType::F32 => {
            let mut v: Vec<u32> = vec![
                0,
                0x8000_0000,
                1,
                0x007f_ffff,
                0x0080_0000,
                0x7f7f_ffff,
                0x7f80_0000,
                0xff80_0000,
                0x7fc0_0000,
                0x7fc0_0001,
                0x7f80_0001,
                0xffa0_0000,
                0x3f80_1000,
                0x3f80_3000,
                0x3f80_1001,
                0x3f80_8000,
                0x3f81_8000,
                0x477f_f000,
                0x477f_efff,
                0x3300_0000,
                0x3340_0000,
                0x33c0_0000,
                0x4f00_0000,
                0xcf00_0000,
                0xcf00_0001,
                0x5f00_0000,
                0xdf00_0000,
                0x437f_e666,
                0xbf66_6666,
                0xc300_8000,
            ];
            v.extend(
                [
                    255.9f32,
                    -0.9,
                    300.7,
                    -300.7,
                    1.0 / 3.0,
                    1e20,
                    -1e20,
                    2.5,
                    3.5,
                    -2.5,
                ]
                .map(f32::to_bits),
            );
            v.extend((0..200).map(|_| (rng.uniform(-1e6, 1e6) as f32).to_bits()));
            v.extend((0..200).map(|_| rng.next_u64() as u32));
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
        DType::F64 => {
            let mut v: Vec<u64> = vec![
                0,
                1 << 63,
                1,
                0x000f_ffff_ffff_ffff,
                0x7fef_ffff_ffff_ffff,
                0x7ff0_0000_0000_0000,
                0xfff0_0000_0000_0000,
                0x7ff8_0000_0000_0001,
                0x7ff0_0000_0000_0001,
            ];
            v.extend(
                [
                    1.0 + 2f64.powi(-24),
                    1.0 + 2f64.powi(-24) + 2f64.powi(-60),
                    1.0 + 3.0 * 2f64.powi(-24),
                    1.0 + 2f64.powi(-11),
                    1.0 + 2f64.powi(-11) + 2f64.powi(-40),
                    65520.0,
                    65519.999,
                    3.4028235677973366e38,
                    3.4028235e38,
                    1e300,
                    -1e300,
                    1e-300,
                    1e-45,
                    7e-46,
                    2f64.powi(-150),
                    2f64.powi(-150) * 1.5,
                    2f64.powi(63),
                    -(2f64.powi(63)),
                    9.3e18,
                    -9.3e18,
                    2f64.powi(31),
                    -(2f64.powi(31)) - 0.5,
                    4294967296.5,
                    255.99,
                    256.0,
                    -0.99,
                    -1.0,
                ]
                .map(f64::to_bits),
            );
            v.extend((0..200).map(|_| rng.uniform(-1e9, 1e9).to_bits()));
            v.extend((0..200).map(|_| rng.next_u64()));
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
        DType::I32 => {
            let mut v = vec![
                0i32,
                1,
                -1,
                i32::MIN,
                i32::MAX,
                255,
                256,
                -129,
                16_777_217,
                16_777_219,
                -16_777_217,
                2049,
                2051,
                65520,
                65519,
                -65536,
            ];
            v.extend((0..200).map(|_| rng.next_u64() as i32));
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
        DType::I64 => {
            let mut v = vec![
                0i64,
                1,
                -1,
                i64::MIN,
                i64::MAX,
                (1 << 53) + 1,
                (1 << 53) + 3,
                (1 << 62) + (1 << 38) + 1,
                (1 << 62) + (1 << 38),
                -((1 << 62) + (1 << 38) + 1),
                (1 << 40) + (1 << 29),
                (1 << 40) + (1 << 29) + 1,
                4_294_967_296 + 7,
                255,
                -256,
            ];
            v.extend((0..200).map(|_| rng.next_u64() as i64));
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        }
    }
}

/// The element at `i` of `bytes` as f64 (for NaN checks).
fn element(dtype: DType, bytes: &[u8], i: usize) -> f64 {
    let s = dtype.size_in_bytes();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        DType::F16 => half::f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::BF16 => half::bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
        DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U8 => b[0] as f64,
    }
}

#[test]
fn casts_between_every_pair_of_dtypes_match_the_reference_bit_for_bit() {
    for src in DType::ALL {
        let input = cast_inputs(src);
        let n = input.len() / src.size_in_bytes();
        for dst in DType::ALL {
            let out_bytes = n * dst.size_in_bytes();
            // The source one byte into its buffer and the destination 1 to 3 bytes in, so the kernel
            // meets unaligned views; the bytes around the destination must survive.
            let lead = 1 + (src.size_in_bytes() + dst.size_in_bytes()) % 3;
            let Some((ours, theirs)) = on_both(|b| {
                let s = upload_at(b, &input, src.size_in_bytes(), 0);
                let d = upload_at(b, &vec![0x5A; out_bytes], lead, 5);
                let input_view = StridedBuf {
                    ptr: s,
                    layout: torsh_backend::Layout::new(vec![n], vec![1], 1).unwrap(),
                };
                b.cast(&torsh_backend::compute::CastDesc {
                    src_dtype: src,
                    dst_dtype: dst,
                    input: input_view,
                    output: d.offset(lead).unwrap(),
                })
                .unwrap();
                download(b, d, lead + out_bytes + 5)
            }) else {
                return;
            };
            assert_eq!(ours[..lead], theirs[..lead], "{src}→{dst}: bytes before");
            assert_eq!(
                ours[lead + out_bytes..],
                theirs[lead + out_bytes..],
                "{src}→{dst}: after"
            );
            let (o, t) = (
                &ours[lead..lead + out_bytes],
                &theirs[lead..lead + out_bytes],
            );
            for i in 0..n {
                let s = dst.size_in_bytes();
                let (a, e) = (&o[i * s..(i + 1) * s], &t[i * s..(i + 1) * s]);
                // NaN payloads may differ (hardware quiets them); NaN-ness may not.
                let both_nan = element(dst, o, i).is_nan() && element(dst, t, i).is_nan();
                assert!(
                    a == e || both_nan,
                    "{src}→{dst} element {i} (input {:?}): got {a:?}, reference {e:?}",
                    &input[i * src.size_in_bytes()..(i + 1) * src.size_in_bytes()]
                );
            }
        }
    }
}

#[test]
fn strided_copies_of_narrow_dtypes_keep_their_neighbours() {
    // A transposed [5, 7] view of u8 and of f16 copied into every other element of a buffer at an odd
    // address: the skipped elements and the bytes around must stay as they were.
    for dtype in [DType::U8, DType::F16, DType::I64] {
        let size = dtype.size_in_bytes();
        let src_bytes: Vec<u8> = (0..35 * size).map(|i| (i * 37 % 251) as u8).collect();
        let Some((ours, theirs)) = on_both(|b| {
            let s = upload_at(b, &src_bytes, 0, 0);
            let d = upload_at(b, &vec![0x11; 2 * 35 * size], size, 3);
            b.copy_strided(&torsh_backend::compute::CopyDesc {
                dtype,
                src: StridedBuf {
                    ptr: s,
                    layout: torsh_backend::Layout::new(vec![7, 5], vec![1, 7], 0).unwrap(),
                },
                dst: StridedBuf {
                    ptr: d.offset(size).unwrap(),
                    layout: torsh_backend::Layout::new(vec![7, 5], vec![10, 2], 0).unwrap(),
                },
            })
            .unwrap();
            download(b, d, size + 2 * 35 * size + 3)
        }) else {
            return;
        };
        assert_eq!(ours, theirs, "{dtype}");
    }
}

#[test]
fn f16_and_bf16_ops_run_on_f32_copies_and_free_them() {
    if raw().is_none() {
        return;
    }
    // Without shader-f16, so f16 is staged as bf16 is (with it, f16 math runs natively).
    let (_, b) = native_and_staged_f16();
    let reference = Backend::reference().unwrap();
    for dtype in [DType::F16, DType::BF16] {
        let x = b.randn(&[37, 29], DType::F32).unwrap();
        let host = x.to_vec::<f32>().unwrap();
        let xr = reference.from_slice(&host, &[37, 29]).unwrap();
        let before = b.allocated_bytes();
        let run = |x: &torsh_backend::Tensor| {
            let h = x.cast(dtype).unwrap();
            let y = h.matmul(&h.t().unwrap()).unwrap().softmax(1).unwrap();
            let z = y.add(&h.matmul(&h.t().unwrap()).unwrap()).unwrap();
            z.sum(0, false)
                .unwrap()
                .cast(DType::F64)
                .unwrap()
                .to_vec::<f64>()
                .unwrap()
        };
        let (ours, theirs) = (run(&x), run(&xr));
        let e = rel_error(&ours, &theirs);
        assert!(e <= 1e-2, "{dtype}: relative error {e}");
        assert_eq!(
            b.allocated_bytes(),
            before,
            "{dtype}: staged copies were not freed"
        );
    }
}

#[test]
fn staging_keeps_the_gaps_of_a_strided_output_bit_for_bit() {
    // f16 GEMM into C with ldc = m + 3: the three rows past m in each column are not the op's, and
    // hold patterns (a signalling NaN, a subnormal, -0) that must come back unchanged.
    let (m, n, k, ldc) = (5usize, 4usize, 3usize, 8usize);
    let a: Vec<u8> = (0..m * k)
        .flat_map(|i| half::f16::from_f32(i as f32 * 0.25 - 1.0).to_le_bytes())
        .collect();
    let bm: Vec<u8> = (0..k * n)
        .flat_map(|i| half::f16::from_f32(0.5 - i as f32 * 0.125).to_le_bytes())
        .collect();
    let c: Vec<u8> = (0..ldc * n)
        .flat_map(|i| [0x7c01u16, 0x0001, 0x8000][i % 3].to_le_bytes())
        .collect();
    let Some((ours, theirs)) = on_both(|b| {
        let (pa, pb, pc) = (
            upload_at(b, &a, 0, 0),
            upload_at(b, &bm, 0, 0),
            upload_at(b, &c, 0, 0),
        );
        b.gemm(&GemmDesc {
            dtype: DType::F16,
            trans_a: Transpose::No,
            trans_b: Transpose::No,
            m,
            n,
            k,
            alpha: 1.0,
            a: pa,
            lda: m,
            b: pb,
            ldb: k,
            beta: 0.0,
            c: pc,
            ldc,
        })
        .unwrap();
        download(b, pc, c.len())
    }) else {
        return;
    };
    assert_eq!(ours, theirs);
}

#[test]
fn f32_operands_at_unaligned_addresses_are_staged() {
    // exp of f32 values stored 2 bytes into their buffer, written 6 bytes into another.
    let xs: Vec<u8> = (0..101)
        .flat_map(|i| (i as f32 * 0.03 - 1.5).to_le_bytes())
        .collect();
    let Some((ours, theirs)) = on_both(|b| {
        let x = upload_at(b, &xs, 2, 2);
        let y = upload_at(b, &vec![0u8; xs.len()], 6, 2);
        b.unary(&UnaryDesc {
            op: UnaryOp::Exp,
            dtype: DType::F32,
            input: StridedBuf::contiguous(x.offset(2).unwrap(), &[101]),
            output: y.offset(6).unwrap(),
        })
        .unwrap();
        download(b, y, 6 + xs.len() + 2)
    }) else {
        return;
    };
    assert_eq!(ours[..6], theirs[..6]);
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&ours[6..6 + xs.len()]);
    let want: Vec<f32> = bytemuck::pod_collect_to_vec(&theirs[6..6 + xs.len()]);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 4.0 * f32::EPSILON * w.abs(), "{g} vs {w}");
    }
}

#[test]
fn dropout_of_unaligned_f32_operands_is_staged() {
    // Dropout of f32 values stored 2 bytes into their buffer, written 6 bytes into another: the
    // same mask (integer keep test) and values as the reference.
    let xs: Vec<u8> = (0..301)
        .flat_map(|i| (i as f32 * 0.01 - 1.5).to_le_bytes())
        .collect();
    let Some((ours, theirs)) = on_both(|b| {
        let x = upload_at(b, &xs, 2, 2);
        let y = upload_at(b, &vec![0u8; xs.len()], 6, 2);
        b.dropout(&DropoutDesc {
            dtype: DType::F32,
            input: x.offset(2).unwrap(),
            output: y.offset(6).unwrap(),
            len: 301,
            p: 0.4,
            seed: 17,
        })
        .unwrap();
        download(b, y, 6 + xs.len() + 2)
    }) else {
        return;
    };
    assert_eq!(ours[..6], theirs[..6]);
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&ours[6..6 + xs.len()]);
    let want: Vec<f32> = bytemuck::pod_collect_to_vec(&theirs[6..6 + xs.len()]);
    assert!(want.contains(&0.0) && want.iter().any(|&w| w != 0.0));
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 2.0 * f32::EPSILON * w.abs(), "{g} vs {w}");
    }
}

#[test]
fn random_fills_follow_the_reference_stream() {
    let Some(b) = backend() else { return };
    let reference = Backend::reference().unwrap();
    for distribution in [
        Distribution::Normal {
            mean: -1.0,
            std: 3.0,
        },
        Distribution::Uniform {
            low: -2.0,
            high: 5.0,
        },
    ] {
        // Many workgroups, and an odd length.
        let draw = |be: &Backend| {
            be.random_seeded(&[300_007], DType::F32, distribution, 99)
                .unwrap()
                .to_vec_f64()
                .unwrap()
        };
        let (ours, theirs) = (draw(&b), draw(&reference));
        let worst = ours
            .iter()
            .zip(&theirs)
            .map(|(o, t)| (o - t).abs() / t.abs().max(1.0))
            .fold(0.0, f64::max);
        assert!(worst <= 1e-5, "{distribution:?}: worst error {worst}");
        if let Distribution::Uniform { low, high } = distribution {
            assert!(ours.iter().all(|&v| (low..=high).contains(&v)));
        }
    }
}

#[test]
fn f64_math_is_unsupported_but_f64_data_moves() {
    let Some(b) = backend() else { return };
    let x = b.from_slice(&[1.5f64, -2.25, 1e300], &[3]).unwrap();
    let err = x.exp().unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::Unsupported {
                dtype: DType::F64,
                ..
            }
        ),
        "{err}"
    );
    assert!(matches!(
        b.matmul(&x.reshape(&[1, 3]).unwrap(), &x.reshape(&[3, 1]).unwrap()),
        Err(BackendError::Unsupported { .. })
    ));
    let back = x
        .cast(DType::F32)
        .unwrap()
        .cast(DType::F64)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    assert_eq!(back, vec![1.5, -2.25, f64::INFINITY]);
    assert_eq!(
        b.full(&[2], 0.1, DType::F64)
            .unwrap()
            .to_vec::<f64>()
            .unwrap(),
        vec![0.1, 0.1]
    );
}
