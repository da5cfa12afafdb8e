//! The CPU backend in each of its configurations — SIMD on and off, one and two threads — through the
//! whole parity suite; every op family again on shapes large enough to be split into blocks and across
//! threads, with strided and broadcast views; GEMM in every transpose; and operands the SIMD path must
//! hand to the scalar one (misaligned raw pointers).

use torsh_backend::compute::{BinaryOp, CompareOp, GemmDesc, ReduceOp, Transpose, UnaryOp};
use torsh_backend::ops::conv::ConvConfig;
use torsh_backend::ops::norm::BatchNormConfig;
use torsh_backend::ops::optim::AdamState;
use torsh_backend::ops::pool::Pool2dConfig;
use torsh_backend::validation::{self, cases, run_case, Inputs, Outcome, ParityCase};
use torsh_backend::{Backend, BackendError, BackendType, DType, Result, Tensor};

fn configurations() -> Vec<(String, Backend)> {
    let mut all = Vec::new();
    for threads in [1, 2] {
        for simd in [true, false] {
            let b = Backend::cpu()
                .num_threads(threads)
                .enable_simd(simd)
                .build()
                .unwrap();
            all.push((format!("{threads} thread(s), simd {simd}"), b));
        }
    }
    all
}

#[test]
fn every_parity_case_passes_in_every_configuration() {
    let reference = Backend::reference().unwrap();
    let mut failures = Vec::new();
    for (name, cpu) in configurations() {
        for (index, case) in cases::all().iter().enumerate() {
            for &dtype in case.dtypes {
                let r = run_case(case, &cpu, &reference, dtype, validation::case_seed(index));
                if r.outcome != Outcome::Passed {
                    failures.push(format!("{} {dtype} ({name}): {:?}", case.op, r.outcome));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_gather_split_over_rows_reports_its_first_bad_index() {
    // 512 rows of 300 gathered along the last dim, so that rows go to several tasks: a bad index
    // late in the tensor and another, earlier in memory order, in a row of another task. The
    // error names the earlier one, and a good index after it gathers as the reference does.
    let (rows, cols) = (512, 300);
    let reference = Backend::reference().unwrap();
    for (name, cpu) in configurations() {
        let x = cpu.randn(&[rows, cols], DType::F32).unwrap();
        let mut picks: Vec<i64> = (0..rows * cols)
            .map(|i| ((i * 7919) % cols) as i64)
            .collect();
        let good = cpu.from_slice(&picks, &[rows, cols]).unwrap();
        let got = x.gather(1, &good).unwrap().to_vec::<f32>().unwrap();
        let xr = reference
            .from_slice(&x.to_vec::<f32>().unwrap(), &[rows, cols])
            .unwrap();
        let want = xr
            .gather(1, &reference.from_slice(&picks, &[rows, cols]).unwrap())
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(got, want, "{name}");
        picks[400 * cols + 17] = cols as i64 + 1;
        picks[100 * cols + 250] = -5;
        let bad = cpu.from_slice(&picks, &[rows, cols]).unwrap();
        match x.gather(1, &bad) {
            Err(BackendError::IndexOutOfRange { index, size, .. }) => {
                assert_eq!((index, size), (-5, cols), "{name}")
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn a_large_gather_along_rows_matches_the_reference() {
    // Past 16 MiB of output, in rows of at least 4 KiB in every dtype: the dense-row gather streams
    // its output a block at a time and reads each input row in order first. Input rows are wider
    // than the index rows, and the row count is odd, so blocks and tasks end mid-row.
    let (rows, cols, wide) = (4099, 2053, 2111);
    let reference = Backend::reference().unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let picks: Vec<i64> = (0..rows * cols)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % wide as u64) as i64
        })
        .collect();
    let narrow: Vec<i32> = picks.iter().map(|&i| i as i32).collect();
    for (name, cpu) in configurations() {
        for dtype in [DType::F32, DType::F64, DType::F16] {
            let x = cpu.randn(&[rows, wide], dtype).unwrap();
            let xr = reference
                .from_f64(&x.to_vec_f64().unwrap(), &[rows, wide], dtype)
                .unwrap();
            let (index, index_ref) = if dtype == DType::F64 {
                let i = cpu.from_slice(&narrow, &[rows, cols]).unwrap();
                (i, reference.from_slice(&narrow, &[rows, cols]).unwrap())
            } else {
                let i = cpu.from_slice(&picks, &[rows, cols]).unwrap();
                (i, reference.from_slice(&picks, &[rows, cols]).unwrap())
            };
            let got = x.gather(1, &index).unwrap().to_vec_f64().unwrap();
            let want = xr.gather(1, &index_ref).unwrap().to_vec_f64().unwrap();
            assert!(got == want, "{name}, {dtype}: the gathers differ");
        }
    }
}

#[test]
fn device_info_reports_threads_and_simd_level() {
    for (name, cpu) in configurations() {
        let info = cpu.device_info();
        let get = |k: &str| {
            info.details
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        assert!(name.starts_with(&get("threads used")), "{name}: {info:?}");
        if name.ends_with("false") {
            assert_eq!(get("simd"), "none (scalar)");
        }
    }
}

/// Relative error of a product computed on `b` against the reference, for a row-major
/// `[m,k]·[k,n]` with the given operand views.
fn matmul_error(
    b: &Backend,
    m: usize,
    k: usize,
    n: usize,
    dtype: DType,
    transpose: (bool, bool),
) -> f64 {
    let reference = Backend::reference().unwrap();
    let make = |be: &Backend, rows: usize, cols: usize, t: bool, seed: u64| {
        be.manual_seed(seed);
        let x = be
            .randn(
                &[if t { cols } else { rows }, if t { rows } else { cols }],
                dtype,
            )
            .unwrap();
        if t {
            x.transpose(0, 1).unwrap()
        } else {
            x
        }
    };
    let got = make(b, m, k, transpose.0, 1)
        .matmul(&make(b, k, n, transpose.1, 2))
        .unwrap()
        .to_vec_f64()
        .unwrap();
    let want = make(&reference, m, k, transpose.0, 1)
        .matmul(&make(&reference, k, n, transpose.1, 2))
        .unwrap()
        .to_vec_f64()
        .unwrap();
    let num: f64 = got.iter().zip(&want).map(|(g, w)| (g - w) * (g - w)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    (num / den).sqrt()
}

#[test]
fn threaded_gemm_matches_the_reference_for_every_transpose() {
    let two = Backend::cpu().num_threads(2).build().unwrap();
    for (dtype, bound) in [
        (DType::F32, 1e-5),
        (DType::F64, 1e-12),
        (DType::F16, 1e-2),
        (DType::BF16, 1e-2),
    ] {
        for transpose in [(false, false), (true, false), (false, true), (true, true)] {
            let e = matmul_error(&two, 131, 257, 67, dtype, transpose);
            assert!(e <= bound, "{dtype} {transpose:?}: {e}");
        }
    }
}

#[test]
fn misaligned_raw_operands_take_the_scalar_path() {
    let cpu = Backend::cpu().build().unwrap();
    let c = cpu.compute();
    let (m, n, k) = (5usize, 3usize, 4usize);
    let a = c.alloc(m * k * 4 + 2).unwrap();
    let b = c.alloc(k * n * 4).unwrap();
    let out = c.alloc(m * n * 4).unwrap();
    let av: Vec<u8> = (0..m * k)
        .flat_map(|i| (i as f32 * 0.5 - 3.0).to_le_bytes())
        .collect();
    let bv: Vec<u8> = (0..k * n)
        .flat_map(|i| (1.0 - i as f32 * 0.25).to_le_bytes())
        .collect();
    // A starts 2 bytes into its allocation: not f32-aligned.
    let a2 = a.offset(2).unwrap();
    c.copy_htod(a2, &av).unwrap();
    c.copy_htod(b, &bv).unwrap();
    c.gemm(&GemmDesc {
        dtype: DType::F32,
        trans_a: Transpose::No,
        trans_b: Transpose::No,
        m,
        n,
        k,
        alpha: 1.0,
        a: a2,
        lda: m,
        b,
        ldb: k,
        beta: 0.0,
        c: out,
        ldc: m,
    })
    .unwrap();
    let mut bytes = vec![0u8; m * n * 4];
    c.copy_dtoh(&mut bytes, out).unwrap();
    let got: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|x| f32::from_le_bytes(x.try_into().unwrap()))
        .collect();
    for j in 0..n {
        for i in 0..m {
            let want: f32 = (0..k)
                .map(|l| (((i + l * m) as f32) * 0.5 - 3.0) * (1.0 - ((l + j * k) as f32) * 0.25))
                .sum();
            assert!(
                (got[i + j * m] - want).abs() <= 1e-5 * want.abs().max(1.0),
                "({i},{j})"
            );
        }
    }
    assert_eq!(cpu.backend_type(), BackendType::Cpu);
}

/// Elementwise ops and `where` on 3 × 40 009 elements (more than one block and one thread's share),
/// a transposed input, a row broadcast and a scalar broadcast.
fn large_elementwise(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let b = i.backend();
    let x = i.uniform(&[3, 40_009], -3.0, 3.0)?;
    let positive = i.uniform(&[40_009, 3], 0.25, 4.0)?.t()?;
    let row = i.uniform(&[1, 40_009], 0.5, 2.0)?;
    let scalar = i.uniform(&[1, 1], 0.5, 2.0)?;
    let mut out = Vec::new();
    for &op in UnaryOp::ALL {
        let input = match op {
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => &positive,
            _ => &x,
        };
        out.push(b.unary(op, input)?);
    }
    for &op in BinaryOp::ALL {
        if op == BinaryOp::Pow {
            out.push(b.binary(op, &positive, &scalar)?);
            continue;
        }
        out.push(b.binary(op, &x, &row)?);
        out.push(b.binary(op, &positive, &x)?);
        out.push(b.binary(op, &scalar, &x)?);
    }
    // `where` by a random mask (no pattern a branch predictor could learn): dense operands, a
    // transposed one, a broadcast row and a broadcast scalar.
    let mask = b.compare_scalar(CompareOp::Gt, &i.uniform(&[3, 40_009], -1.0, 1.0)?, 0.0)?;
    out.push(x.where_(&mask, &positive)?);
    out.push(positive.where_(&mask, &row)?);
    out.push(scalar.where_(&mask, &x)?);
    out.push(x.t()?.contiguous()?);
    out.push(x.cast(DType::F32)?.cast(DType::F64)?);
    out.push(x.cast(DType::I32)?);
    Ok(out)
}

/// Softmax, norms and reductions on rows long enough to be split, and across a strided axis.
fn large_rows(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let b = i.backend();
    let x = i.uniform(&[67, 1031], -4.0, 4.0)?;
    let w = i.normal(&[1031])?;
    let bias = i.normal(&[1031])?;
    let mut out = vec![
        x.softmax(-1)?,
        x.log_softmax(-1)?,
        x.softmax(0)?,
        x.t()?.log_softmax(1)?,
        x.layer_norm(&[1031], Some(&w), Some(&bias), 1e-5)?,
        x.t()?.layer_norm(&[67], None, None, 1e-5)?,
        x.sum_all()?,
    ];
    for op in [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Var { correction: 1 },
    ] {
        out.push(b.reduce(op, &x, 1, false)?);
        out.push(b.reduce(op, &x, 0, true)?);
    }
    let distinct = i.distinct(&[67, 1031])?;
    for op in [ReduceOp::ArgMax, ReduceOp::ArgMin] {
        out.push(b.reduce(op, &distinct, 1, false)?);
        out.push(b.reduce(op, &distinct, 0, false)?);
    }
    Ok(out)
}

/// Batch norm, pooling and Adam over tensors of tens of thousands of elements.
fn large_training(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let x = i.normal(&[3, 16, 29, 31])?;
    let rm = i.normal(&[16])?;
    let rv = i.uniform(&[16], 0.5, 2.0)?;
    let w = i.normal(&[16])?;
    let bias = i.normal(&[16])?;
    let train = x.batch_norm(BatchNormConfig {
        weight: Some(&w),
        bias: Some(&bias),
        running_mean: Some(&rm),
        running_var: Some(&rv),
        training: true,
        momentum: Some(0.1),
        eps: Some(1e-5),
    })?;
    let window = Pool2dConfig {
        kernel: [3, 3],
        stride: [2, 2],
        padding: [1, 1],
        count_include_pad: false,
    };
    let mut out = vec![train, rm, rv, x.max_pool2d(window)?, x.avg_pool2d(window)?];
    let mut state = AdamState::adamw(0.01);
    let mut params = vec![i.normal(&[70_001])?, i.normal(&[3, 5])?];
    for _ in 0..2 {
        let grads = vec![i.normal(&[70_001])?, i.normal(&[3, 5])?];
        i.backend()
            .fused_adam_step(&mut params, &grads, &mut state, 1e-3, (0.9, 0.999))?;
    }
    out.extend(params);
    out.extend(state.exp_avg().iter().cloned());
    out.extend(state.exp_avg_sq().iter().cloned());
    Ok(out)
}

/// Convolutions and attention big enough for the blocked and threaded paths.
fn large_conv_attention(i: &mut Inputs) -> Result<Vec<Tensor>> {
    let b = i.backend();
    let x = i.normal(&[2, 16, 23, 19])?;
    let plain = b.conv2d_with_bias(
        &x,
        &i.normal(&[24, 16, 3, 3])?,
        Some(&i.normal(&[24])?),
        ConvConfig {
            padding: [1, 1],
            ..Default::default()
        },
    )?;
    let pointwise = b.conv2d(&x, &i.normal(&[8, 16, 1, 1])?, ConvConfig::default())?;
    let depthwise = b.conv2d(
        &x,
        &i.normal(&[16, 1, 3, 3])?,
        ConvConfig {
            groups: 16,
            padding: [1, 1],
            stride: [2, 2],
            ..Default::default()
        },
    )?;
    let q = i.normal(&[1, 2, 193, 64])?;
    let k = i.normal(&[1, 2, 193, 64])?;
    let v = i.normal(&[1, 2, 193, 64])?;
    Ok(vec![
        plain,
        pointwise,
        depthwise,
        b.attention(&q, &k, &v, false)?,
        b.attention(&q, &k, &v, true)?,
    ])
}

#[test]
fn large_shapes_match_the_reference_on_the_simd_paths() {
    let reference = Backend::reference().unwrap();
    let large = [
        ParityCase {
            op: "large elementwise",
            dtypes: &DType::FLOATS,
            body: large_elementwise,
        },
        ParityCase {
            op: "large rows",
            dtypes: &DType::FLOATS,
            body: large_rows,
        },
        ParityCase {
            op: "large training",
            dtypes: &DType::FLOATS,
            body: large_training,
        },
        ParityCase {
            op: "large conv/attention",
            dtypes: &DType::FLOATS,
            body: large_conv_attention,
        },
    ];
    let mut failures = Vec::new();
    for threads in [1, 2] {
        let cpu = Backend::cpu().num_threads(threads).build().unwrap();
        for (index, case) in large.iter().enumerate() {
            for &dtype in case.dtypes {
                let r = run_case(case, &cpu, &reference, dtype, validation::case_seed(index));
                if r.outcome != Outcome::Passed {
                    failures.push(format!(
                        "{} {dtype} ({threads} threads): {:?}",
                        case.op, r.outcome
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn bf16_gemm_is_right_across_tile_and_cache_block_edges() {
    for threads in [1, 2] {
        let cpu = Backend::cpu().num_threads(threads).build().unwrap();
        let path = cpu
            .device_info()
            .details
            .into_iter()
            .find(|(k, _)| k == "bf16 GEMM")
            .map(|(_, v)| v);
        assert!(path.is_some(), "device_info names the bf16 GEMM path");
        for (m, k, n) in [(1, 1, 1), (33, 3, 13), (97, 1031, 25), (130, 515, 37)] {
            for transpose in [(false, false), (true, true), (true, false)] {
                let e = matmul_error(&cpu, m, k, n, DType::BF16, transpose);
                assert!(
                    e <= 1e-2,
                    "{m}x{k}x{n} {transpose:?} {threads} threads: {e}"
                );
            }
        }
    }
}
