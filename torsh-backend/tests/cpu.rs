//! The CPU backend in each of its configurations — SIMD on and off, one and two threads — through the
//! whole parity suite, plus GEMM shapes large enough to be split across threads, every transpose, and
//! operands the SIMD path must hand to the scalar one (misaligned raw pointers).

use torsh_backend::compute::{GemmDesc, Transpose};
use torsh_backend::validation::{self, cases, run_case, Outcome};
use torsh_backend::{Backend, BackendType, DType};

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
