//! Regression tests for defects that random inputs and threads found where example-based tests had
//! not looked: silent wrong answers, a deadlock, panics and aborts on valid input, and checks that
//! differed between backends. Each test names the behaviour it pins down and runs on every backend
//! available here (the reference, the CPU, and WebGPU and CUDA where present).

use std::sync::mpsc;
use std::time::Duration;

use torsh_backend::compute::{BatchedGemmDesc, GemmDesc, UnscaleDesc};
use torsh_backend::prelude::*;
use torsh_backend::{DevicePtr, MemoryPoolConfig, Transpose};

mod common;
use common::{backends, download, upload};

/// Runs `f` on a thread of its own and fails the test if it has not returned within `limit` (a hang
/// or deadlock is reported instead of stalling the suite).
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: no answer within {limit:?} (hang)"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: the worker thread panicked"),
    }
}

fn gemm(a: DevicePtr, b: DevicePtr, c: DevicePtr, (m, n, k): (usize, usize, usize)) -> GemmDesc {
    GemmDesc {
        dtype: DType::F32,
        trans_a: Transpose::No,
        trans_b: Transpose::No,
        m,
        n,
        k,
        alpha: 1.0,
        a,
        lda: m.max(1),
        b,
        ldb: k.max(1),
        beta: 0.0,
        c,
        ldc: m.max(1),
    }
}

// ---------------------------------------------------------------------------------------------------
// Long rows (WebGPU's loops were cut short past 524 256 elements a row)
// ---------------------------------------------------------------------------------------------------

#[test]
fn reductions_softmax_norm_and_products_of_long_rows_are_exact() -> Result<()> {
    let n = 700_000usize;
    for b in backends() {
        let name = b.backend_type();
        let ones = b.ones(&[n], DType::F32)?;
        assert_eq!(ones.sum_all()?.item()?, n as f64, "{name}: sum_all");
        assert_eq!(ones.mean_all()?.item()?, 1.0, "{name}: mean_all");
        let ramp = b.arange(0.0, n as f64, 1.0, DType::F32)?;
        assert_eq!(ramp.max(0, false)?.item()?, (n - 1) as f64, "{name}: max");
        assert_eq!(
            ramp.argmax(0, false)?.item()?,
            (n - 1) as f64,
            "{name}: argmax"
        );
        assert_eq!(ramp.min(0, false)?.item()?, 0.0, "{name}: min");
        let row = ones.reshape(&[1, n])?;
        let soft = row.softmax(1)?.to_vec_f64()?;
        let want = 1.0 / n as f64;
        assert!(
            soft.iter().all(|&v| (v - want).abs() <= want * 1e-5),
            "{name}: softmax of ones gives {:?}, want {want}",
            &soft[..4]
        );
        let normed = row.layer_norm(&[n], None, None, 1e-5)?.to_vec_f64()?;
        assert!(
            normed.iter().all(|&v| v == 0.0),
            "{name}: layer norm of ones gives {:?}",
            &normed[..4]
        );
        let dot = row.matmul(&ones.reshape(&[n, 1])?)?.item()?;
        assert_eq!(dot, n as f64, "{name}: ones[1, n] @ ones[n, 1]");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// f16 products with one row or one column (the CPU accumulated them in f16)
// ---------------------------------------------------------------------------------------------------

#[test]
fn f16_matrix_vector_products_accumulate_in_f32() -> Result<()> {
    // 2100 is exact in f16, but an f16 running sum of ones stops at 2048.
    let k = 2100;
    for b in backends() {
        let name = b.backend_type();
        for (m, n) in [(1, 1), (1, 3), (1, 8), (1, 64), (5, 1), (40, 1)] {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let a = if ta {
                    b.ones(&[k, m], DType::F16)?.t()?
                } else {
                    b.ones(&[m, k], DType::F16)?
                };
                let w = if tb {
                    b.ones(&[n, k], DType::F16)?.t()?
                } else {
                    b.ones(&[k, n], DType::F16)?
                };
                let got = a.matmul(&w)?.to_vec_f64()?;
                assert!(
                    got.iter().all(|&v| v == k as f64),
                    "{name}: f16 ({m}×{k}{}) @ ({k}×{n}{}) gives {:?}",
                    if ta { "ᵀ" } else { "" },
                    if tb { "ᵀ" } else { "" },
                    &got[..got.len().min(4)]
                );
            }
        }
        let v = b.ones(&[k], DType::F16)?;
        let got = v.matmul(&b.ones(&[k, 8], DType::F16)?)?.to_vec_f64()?;
        assert!(
            got.iter().all(|&x| x == k as f64),
            "{name}: 1-D f16 lhs: {got:?}"
        );
        for trans in [false, true] {
            let a = if trans {
                b.ones(&[k, 3], DType::F16)?.t()?
            } else {
                b.ones(&[3, k], DType::F16)?
            };
            let y = b.zeros(&[3], DType::F16)?;
            let got = a.gemv(&v, 1.0, &y, 0.0)?.to_vec_f64()?;
            assert!(
                got.iter().all(|&x| x == k as f64),
                "{name}: f16 gemv (transposed {trans}): {got:?}"
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Threads sharing one backend (the CPU backend deadlocked)
// ---------------------------------------------------------------------------------------------------

/// `threads` threads each run `rounds` fills and sums of 400 000 elements (large enough for the CPU
/// backend's thread pool) on clones of `b`, checking every sum.
fn hammer(b: &Backend, threads: usize, rounds: usize) {
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let b = b.clone();
            std::thread::spawn(move || {
                for i in 0..rounds {
                    let x = b.full(&[400_000], 1.0, DType::F32).unwrap();
                    let s = x.sum_all().unwrap().item().unwrap();
                    assert_eq!(s, 400_000.0, "thread {t}, round {i}");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker panicked");
    }
}

#[test]
fn threads_sharing_a_cpu_backend_do_not_deadlock() {
    let limit = Duration::from_secs(120);
    let two = Backend::cpu().num_threads(2).build().unwrap();
    within(limit, "2 threads on a 2-thread CPU backend", move || {
        hammer(&two, 2, 200)
    });
    let pooled = Backend::cpu()
        .num_threads(2)
        .build()
        .unwrap()
        .memory_pool(MemoryPoolConfig::default())
        .unwrap();
    within(
        limit,
        "8 threads on a CPU backend with a memory pool",
        move || hammer(&pooled, 8, 40),
    );
}

#[test]
fn ops_called_from_rayon_workers_do_not_deadlock() {
    use rayon::prelude::*;
    let b = Backend::cpu().num_threads(2).build().unwrap();
    within(
        Duration::from_secs(120),
        "ops from a rayon pool",
        move || {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(4)
                .build()
                .unwrap();
            pool.install(|| {
                (0..64).into_par_iter().for_each(|i| {
                    let x = b.full(&[300_000], i as f64, DType::F32).unwrap();
                    assert_eq!(x.sum_all().unwrap().item().unwrap(), 300_000.0 * i as f64);
                })
            })
        },
    );
}

#[test]
fn backends_opened_from_many_threads_at_once_do_not_deadlock() {
    // Eight threads open every backend together (each GPU backend its own context or device) and
    // use it: concurrent CUDA context and Vulkan device creation on one NVIDIA GPU hung before
    // device opening was serialised.
    within(
        Duration::from_secs(120),
        "eight threads opening every backend at once",
        || {
            let start = std::sync::Barrier::new(8);
            std::thread::scope(|s| {
                for _ in 0..8 {
                    s.spawn(|| {
                        start.wait();
                        for b in backends() {
                            let x = b.full(&[1000], 2.0, DType::F32).unwrap();
                            assert_eq!(x.sum_all().unwrap().item().unwrap(), 2000.0);
                        }
                    });
                }
            });
        },
    );
}

#[test]
fn threads_sharing_every_backend_get_right_answers() {
    for b in backends() {
        let name = b.backend_type();
        within(
            Duration::from_secs(300),
            &format!("{name}: 4 threads"),
            move || hammer(&b, 4, 10),
        );
    }
}

// ---------------------------------------------------------------------------------------------------
// Pooling with strides wider than the input (the CPU panicked or aborted)
// ---------------------------------------------------------------------------------------------------

#[test]
fn pooling_with_a_stride_wider_than_the_input() -> Result<()> {
    for b in backends() {
        let name = b.backend_type();
        let x = b.ones(&[1, 1, 1, 1], DType::F32)?;
        let config = Pool2dConfig {
            kernel: [3, 1],
            stride: [1, 3],
            padding: [1, 0],
            count_include_pad: false,
        };
        assert_eq!(x.max_pool2d(config)?.to_vec_f64()?, [1.0], "{name}: max");
        assert_eq!(x.avg_pool2d(config)?.to_vec_f64()?, [1.0], "{name}: avg");
        // A broadcast view of one row, pooled with a column stride past its width.
        let row = b.from_slice(&[1.0f32, 5.0, 2.0], &[1, 1, 1, 3])?;
        let wide = row.broadcast_to(&[2, 3, 4, 3])?;
        let config = Pool2dConfig {
            kernel: [2, 2],
            stride: [3, 7],
            padding: [1, 1],
            count_include_pad: true,
        };
        let got = wide.max_pool2d(config)?;
        assert_eq!(got.shape(), &[2, 3, 2, 1], "{name}");
        assert!(
            got.to_vec_f64()?.iter().all(|&v| v == 1.0),
            "{name}: {got:?}"
        );
    }
    Ok(())
}

#[test]
fn pooling_with_huge_strides_answers_without_aborting() -> Result<()> {
    for b in backends() {
        let name = b.backend_type();
        let x = b.from_slice(&[3.0f32, 1.0, 4.0, 1.0, 5.0, 9.0], &[1, 2, 1, 3])?;
        for stride in [1usize << 32, 1 << 62, usize::MAX] {
            let config = Pool2dConfig {
                kernel: [1, 2],
                stride: [stride, stride],
                padding: [0, 0],
                count_include_pad: true,
            };
            match x.max_pool2d(config) {
                Ok(y) => assert_eq!(y.to_vec_f64()?, [3.0, 5.0], "{name}: stride {stride}"),
                // A backend whose kernels take 32-bit parameters may decline, with a typed error.
                Err(BackendError::FeatureUnavailable { .. }) => {}
                Err(e) => panic!("{name}: stride {stride}: {e}"),
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Empty views (a narrowed empty tensor pointed past its allocation)
// ---------------------------------------------------------------------------------------------------

#[test]
fn narrowed_empty_views_work_in_later_ops() -> Result<()> {
    for b in backends() {
        let name = b.backend_type();
        let z = b.zeros(&[2, 0], DType::F32)?;
        let v = z.narrow(0, 1, 1)?;
        assert_eq!(v.shape(), &[1, 0]);
        assert!(v.to_vec_f64()?.is_empty(), "{name}: read-back");
        assert_eq!(v.add(&v)?.shape(), &[1, 0], "{name}: add");
        assert_eq!(v.exp()?.shape(), &[1, 0], "{name}: exp");
        assert_eq!(v.contiguous()?.shape(), &[1, 0], "{name}: copy");
        assert_eq!(
            v.sum(0, false)?.to_vec_f64()?,
            Vec::<f64>::new(),
            "{name}: sum"
        );
        let e = b.zeros(&[3, 0, 2], DType::F32)?.narrow(2, 1, 1)?;
        assert!(e.to_vec_f64()?.is_empty(), "{name}: narrow of another dim");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Batched GEMM: all or nothing, one rule on every backend
// ---------------------------------------------------------------------------------------------------

fn batched(g: GemmDesc, strides: (usize, usize, usize), batch_count: usize) -> BatchedGemmDesc {
    BatchedGemmDesc {
        gemm: g,
        stride_a: strides.0,
        stride_b: strides.1,
        stride_c: strides.2,
        batch_count,
    }
}

#[test]
fn batched_gemm_writes_nothing_when_a_later_batch_is_out_of_bounds() {
    for b in backends() {
        let name = b.backend_type();
        let c = b.compute();
        let a = upload(c, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let w = upload(c, &[1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]);
        // C holds one 2×2 product of the two asked for.
        let out = upload(c, &[-7.0; 4]);
        let desc = batched(gemm(a, w, out, (2, 2, 2)), (4, 4, 4), 2);
        let err = c
            .batched_gemm(&desc)
            .expect_err("C is too short for the second batch");
        assert!(
            matches!(
                err,
                BackendError::OutOfBounds { .. } | BackendError::InvalidPointer { .. }
            ),
            "{name}: {err:?}"
        );
        assert_eq!(
            download(c, out, 4),
            [-7.0; 4],
            "{name}: batch 0 was written"
        );
        for p in [a, w, out] {
            c.free(p).unwrap();
        }
    }
}

#[test]
fn batched_gemm_of_empty_products_is_valid_and_quick() {
    for b in backends() {
        let name = b.backend_type();
        let c = b.compute();
        let a = upload(c, &[1.0; 8]);
        let w = upload(c, &[1.0; 8]);
        let out = upload(c, &[-7.0; 4]);
        for (m, n, k) in [(0, 2, 2), (2, 0, 2), (0, 0, 0)] {
            let desc = batched(gemm(a, w, out, (m, n, k)), (4, 4, 4), 2);
            c.batched_gemm(&desc)
                .unwrap_or_else(|e| panic!("{name}: {m}×{n}×{k} × 2 batches: {e}"));
        }
        // 2³¹ empty batches: nothing to do, at once.
        let desc = batched(gemm(a, w, out, (0, 2, 2)), (0, 0, 0), 1 << 31);
        let started = std::time::Instant::now();
        within(Duration::from_secs(60), "2^31 empty batches", {
            let b = b.clone();
            move || b.compute().batched_gemm(&desc).map_err(|e| e.to_string())
        })
        .unwrap_or_else(|e| panic!("{name}: 2^31 empty batches: {e}"));
        assert!(started.elapsed() < Duration::from_secs(60));
        assert_eq!(download(c, out, 4), [-7.0; 4], "{name}");
        for p in [a, w, out] {
            c.free(p).unwrap();
        }
    }
}

#[test]
fn batched_gemm_rejects_overlap_across_batches() {
    for b in backends() {
        let name = b.backend_type();
        let c = b.compute();
        // One buffer: batch 0's C is also batch 1's A.
        let buf = upload(c, &[1.0; 16]);
        let w = upload(c, &[1.0; 8]);
        let a = buf;
        let out = buf.offset(16).unwrap();
        let desc = batched(gemm(a, w, out, (2, 2, 2)), (4, 4, 4), 2);
        let err = c
            .batched_gemm(&desc)
            .expect_err("the C of batch 0 overlaps the A of batch 1");
        assert!(
            matches!(err, BackendError::Aliasing { .. }),
            "{name}: {err:?}"
        );
        assert_eq!(download(c, buf, 16), [1.0; 16], "{name}: written");
        c.free(buf).unwrap();
        c.free(w).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------------
// The loss scaler's fused unscale: its flag is an operand like any other
// ---------------------------------------------------------------------------------------------------

#[test]
fn unscale_checks_its_flag_even_with_nothing_to_unscale() {
    let other = Backend::reference().unwrap();
    let foreign = other.compute().alloc(4).unwrap();
    for b in backends() {
        let name = b.backend_type();
        let c = b.compute();
        // f16 with a scale below 1 takes the composed path on WebGPU, f32 the fused kernels.
        for (dtype, inv_scale) in [(DType::F32, 0.5), (DType::F16, 2.0)] {
            let grads = upload(c, &[0.25; 4]);
            let short = c.alloc(2).unwrap();
            let desc = |len, output, found_inf| UnscaleDesc {
                dtype,
                input: grads,
                output,
                len,
                inv_scale,
                found_inf,
            };
            for (len, what) in [(0, "no elements"), (4, "four elements")] {
                let out = c.alloc(16).unwrap();
                // Freed just before the call: a caching allocator would hand its address to the
                // next allocation, so the op must check the flag before allocating anything.
                let freed = c.alloc(4).unwrap();
                c.free(freed).unwrap();
                for (flag, kind) in [(foreign, "foreign"), (short, "short"), (freed, "freed")] {
                    let err = c
                        .unscale_and_check(&desc(len, out, flag))
                        .expect_err("a bad flag pointer");
                    assert!(
                        matches!(
                            err,
                            BackendError::InvalidPointer { .. } | BackendError::OutOfBounds { .. }
                        ),
                        "{name} {dtype}: {what}, {kind} flag: {err:?}"
                    );
                }
                c.free(out).unwrap();
            }
            // The output overlapping the flag.
            let both = upload(c, &[0.0; 5]);
            let size = dtype.size_in_bytes();
            let err = c
                .unscale_and_check(&desc(4, both, both.offset(3 * size).unwrap()))
                .expect_err("output overlaps found_inf");
            assert!(
                matches!(err, BackendError::Aliasing { .. }),
                "{name} {dtype}: {err:?}"
            );
            let err = c
                .unscale_and_check(&desc(4 / size, both, both))
                .expect_err("output is found_inf");
            assert!(
                matches!(err, BackendError::Aliasing { .. }),
                "{name} {dtype}: {err:?}"
            );
            for p in [grads, short, both] {
                c.free(p).unwrap();
            }
        }
    }
    other.compute().free(foreign).unwrap();
}

// ---------------------------------------------------------------------------------------------------
// GEMM's beta: 0 means C is not read, anything else (NaN included) multiplies it
// ---------------------------------------------------------------------------------------------------

#[test]
fn gemm_with_a_nan_beta_gives_nan_and_a_zero_beta_ignores_nan_in_c() -> Result<()> {
    for b in backends() {
        let name = b.backend_type();
        let a = b.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
        let c = b.from_slice(&[1.0f32, 1.0, 1.0, 1.0], &[2, 2])?;
        let got = b.gemm(&a, &a, 1.0, &c, f32::NAN)?.to_vec_f64()?;
        assert!(
            got.iter().all(|v| v.is_nan()),
            "{name}: beta NaN gives {got:?}"
        );
        let nan_c = b.from_slice(&[f32::NAN; 4], &[2, 2])?;
        let got = b.gemm(&a, &a, 1.0, &nan_c, 0.0)?.to_vec_f64()?;
        assert_eq!(got, [7.0, 10.0, 15.0, 22.0], "{name}: beta 0");
        let x = b.from_slice(&[1.0f32, 1.0], &[2])?;
        let y = b.from_slice(&[1.0f32, 1.0], &[2])?;
        let got = a.gemv(&x, 1.0, &y, f32::NAN)?.to_vec_f64()?;
        assert!(
            got.iter().all(|v| v.is_nan()),
            "{name}: gemv beta NaN gives {got:?}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Normalising constant rows gives exactly 0
// ---------------------------------------------------------------------------------------------------

#[test]
fn normalising_constant_rows_gives_zero() -> Result<()> {
    for b in backends() {
        let name = b.backend_type();
        for value in [0.1f32, -3.7, 1234.567, 1e-3] {
            for len in [1usize, 7, 64, 257, 1000] {
                let x = b.full(&[3, len], value as f64, DType::F32)?;
                let y = x.layer_norm(&[len], None, None, 1e-5)?.to_vec_f64()?;
                assert!(
                    y.iter().all(|&v| v == 0.0),
                    "{name}: layer norm of {len} × {value}: {:?}",
                    &y[..y.len().min(4)]
                );
                let img = b.full(&[2, 3, 1, len], value as f64, DType::F32)?;
                let y = img
                    .batch_norm(BatchNormConfig {
                        training: true,
                        ..Default::default()
                    })?
                    .to_vec_f64()?;
                assert!(
                    y.iter().all(|&v| v == 0.0),
                    "{name}: batch norm of {len} × {value}: {:?}",
                    &y[..y.len().min(4)]
                );
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Arguments are validated before a backend says whether it supports the dtype
// ---------------------------------------------------------------------------------------------------

#[test]
fn bad_arguments_are_reported_before_unsupported_dtypes() -> Result<()> {
    for b in backends() {
        let name = b.backend_type();
        for dtype in [DType::F64, DType::I32] {
            let x = b.zeros(&[2, 3], dtype)?;
            let err = x
                .layer_norm(&[3], None, None, f64::NAN)
                .expect_err("a NaN eps");
            assert!(
                matches!(err, BackendError::InvalidArgument { .. }),
                "{name} {dtype}: layer norm with a NaN eps: {err:?}"
            );
            let err = x.softmax(5).expect_err("an axis out of range");
            assert!(
                matches!(err, BackendError::InvalidArgument { .. }),
                "{name} {dtype}: softmax along axis 5: {err:?}"
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// WebGPU under threads: a batch belongs to the thread that opened it
// ---------------------------------------------------------------------------------------------------

#[cfg(feature = "webgpu")]
#[test]
fn webgpu_work_of_other_threads_is_not_taken_into_a_batch() {
    use torsh_backend::webgpu;
    let b = match Backend::webgpu().build() {
        Ok(b) => b,
        Err(e) => {
            common::skip("webgpu", e);
            return;
        }
    };
    let (opened, wait_open) = mpsc::channel();
    let (finished, wait_finished) = mpsc::channel::<()>();
    let holder = {
        let b = b.clone();
        std::thread::spawn(move || {
            b.compute().batch(&mut || {
                opened.send(()).unwrap();
                wait_finished.recv().unwrap();
                Ok(())
            })
        })
    };
    wait_open.recv().unwrap();
    // While another thread's batch is open, this thread's work is submitted as it comes (not held
    // in that batch, whose error scopes are the other thread's), and reads back as usual.
    let gpu = b
        .compute()
        .as_any()
        .and_then(|a| a.downcast_ref::<webgpu::WebGpuBackend>())
        .expect("a WebGPU backend");
    let y = b.zeros(&[3], DType::F32).unwrap();
    let before = gpu.queue_submissions().unwrap();
    b.compute()
        .fill(&torsh_backend::compute::FillDesc {
            dtype: DType::F32,
            ptr: y.data_ptr(),
            len: 3,
            value: 2.5,
        })
        .unwrap();
    assert!(
        gpu.queue_submissions().unwrap() > before,
        "a fill on this thread was held back by another thread's batch"
    );
    assert_eq!(y.to_vec_f64().unwrap(), [2.5; 3]);
    let x = b.from_slice(&[1.0f32, -2.0, 3.0], &[3]).unwrap();
    assert_eq!(x.relu().unwrap().to_vec_f64().unwrap(), [1.0, 0.0, 3.0]);
    finished.send(()).unwrap();
    holder.join().unwrap().unwrap();
}

// ---------------------------------------------------------------------------------------------------
// Copies between blocks of one memory-pool segment (one WebGPU buffer)
// ---------------------------------------------------------------------------------------------------

#[test]
fn copies_and_graph_launches_within_a_memory_pool() -> Result<()> {
    for kind in Backend::available() {
        let b = Backend::new(kind)?.memory_pool(MemoryPoolConfig::default())?;
        let x = b.from_slice(&[1.0f32, -2.0, 3.0, 4.5, 5.0, 6.0], &[2, 3])?;
        let y = b.zeros(&[2, 3], DType::F32)?;
        y.copy_from(&x)?;
        assert_eq!(y.to_vec_f64()?, x.to_vec_f64()?, "{kind}: copy_from");
        let z = b.zeros(&[2, 3], DType::F32)?;
        b.compute().copy_dtod(z.data_ptr(), x.data_ptr(), 24)?;
        assert_eq!(z.to_vec_f64()?, x.to_vec_f64()?, "{kind}: copy_dtod");
        let odd = b.from_slice(&[7u8, 8, 9], &[3])?;
        let to = b.zeros(&[3], DType::U8)?;
        to.copy_from(&odd)?;
        assert_eq!(
            to.to_vec_f64()?,
            [7.0, 8.0, 9.0],
            "{kind}: an odd byte count"
        );
        let w = b.from_slice(&[0.5f32, 1.0, -1.0], &[3, 1])?;
        let graph = b.capture_graph(|| x.matmul(&w)?.relu())?;
        let x2 = b.from_slice(&[2.0f32, 0.0, 1.0, -4.0, 1.0, 1.0], &[2, 3])?;
        let out = b.launch_graph(&graph, &[x2.clone(), w.clone()])?;
        assert_eq!(out[0].to_vec_f64()?, [0.0, 0.0], "{kind}: graph launch");
        let x3 = b.from_slice(&[2.0f32, 4.0, 1.0, 4.0, 1.0, 1.0], &[2, 3])?;
        let out = b.launch_graph(&graph, &[x3, w.clone()])?;
        assert_eq!(out[0].to_vec_f64()?, [4.0, 2.0], "{kind}: graph launch");
    }
    Ok(())
}

#[cfg(feature = "webgpu")]
#[test]
fn webgpu_copies_between_pool_blocks_further_apart_than_a_binding() -> Result<()> {
    use torsh_backend::webgpu::{WebGpuBackend, WebGpuBackendConfig, MIN_BINDING_SIZE};
    if !Backend::available().contains(&BackendType::WebGpu) {
        return Ok(());
    }
    let config = WebGpuBackendConfig {
        max_binding_size: MIN_BINDING_SIZE,
        ..Default::default()
    };
    let b = Backend::from_compute(Box::new(WebGpuBackend::new(config)))?
        .memory_pool(MemoryPoolConfig::default())?;
    let x = b.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4])?;
    // 256 KiB between the two blocks of one pool segment.
    let _gap = b.zeros(&[1 << 16], DType::F32)?;
    let y = b.zeros(&[4], DType::F32)?;
    b.compute().copy_dtod(y.data_ptr(), x.data_ptr(), 16)?;
    assert_eq!(y.to_vec_f64()?, [1.0, 2.0, 3.0, 4.0]);
    b.compute()
        .copy_dtod(y.data_ptr().offset(1).unwrap(), x.data_ptr(), 7)?;
    let bytes = y.to_bytes()?;
    assert_eq!(&bytes[1..8], &x.to_bytes()?[..7], "an unaligned copy");
    Ok(())
}

#[cfg(feature = "webgpu")]
#[test]
fn webgpu_composed_layer_norm_of_a_constant_row_gives_zero() -> Result<()> {
    use torsh_backend::webgpu::{WebGpuBackend, WebGpuBackendConfig, MIN_LOOP_ITERATIONS};
    if !Backend::available().contains(&BackendType::WebGpu) {
        return Ok(());
    }
    // A row past the loop budget runs composed of reductions and elementwise ops.
    let config = WebGpuBackendConfig {
        max_loop_iterations: Some(MIN_LOOP_ITERATIONS),
        ..Default::default()
    };
    let b = Backend::from_compute(Box::new(WebGpuBackend::new(config)))?;
    for value in [0.1, -3.7, 1234.567] {
        let x = b.full(&[2, 65_537], value, DType::F32)?;
        let y = x.layer_norm(&[65_537], None, None, 1e-5)?.to_vec_f64()?;
        assert!(y.iter().all(|&v| v == 0.0), "{value}: {:?}", &y[..4]);
    }
    Ok(())
}

#[cfg(feature = "webgpu")]
#[test]
fn webgpu_reductions_of_an_empty_leading_dim_past_a_binding() -> Result<()> {
    use torsh_backend::webgpu::{WebGpuBackend, WebGpuBackendConfig, MIN_BINDING_SIZE};
    if !Backend::available().contains(&BackendType::WebGpu) {
        return Ok(());
    }
    for pool in [false, true] {
        let config = WebGpuBackendConfig {
            max_binding_size: MIN_BINDING_SIZE,
            ..Default::default()
        };
        let mut b = Backend::from_compute(Box::new(WebGpuBackend::new(config)))?;
        if pool {
            b = b.memory_pool(MemoryPoolConfig::default())?;
        }
        // The outputs (450 KB) are past the binding; the reduced dim has no element.
        let x = b.zeros(&[0, 97, 129, 9], DType::F32)?;
        let var = x.var(0, 1, true)?.to_vec_f64()?;
        assert!(var.iter().all(|v| v.is_nan()), "pool {pool}: var");
        let mean = x.mean(0, false)?.to_vec_f64()?;
        assert!(mean.iter().all(|v| v.is_nan()), "pool {pool}: mean");
        let sum = x.sum(0, false)?.to_vec_f64()?;
        assert!(sum.iter().all(|&v| v == 0.0), "pool {pool}: sum");
        assert_eq!(sum.len(), 97 * 129 * 9);
    }
    Ok(())
}

#[test]
fn long_sums_of_equal_values_are_accurate() -> Result<()> {
    // Equal values round alike at every step of a plain running sum, so its error grows with the
    // row: 65 537 × 0.378 in f32 came out 8e-5 too large on WebGPU.
    for b in backends() {
        let name = b.backend_type();
        for n in [65_537usize, 300_007] {
            let x = b.full(&[1, n], 0.378, DType::F32)?;
            let want = n as f64 * f64::from(0.378f32);
            let sum = x.sum(1, false)?.item()?;
            assert!(
                (sum - want).abs() <= want * 1e-5,
                "{name}: sum of {n}: {sum} vs {want}"
            );
            let soft = x.softmax(1)?.to_vec_f64()?;
            let each = 1.0 / n as f64;
            assert!(
                soft.iter().all(|v| (v - each).abs() <= each * 1e-5),
                "{name}: softmax of {n} equal values: {}",
                soft[0]
            );
        }
    }
    Ok(())
}

#[cfg(feature = "webgpu")]
#[test]
fn webgpu_products_with_an_empty_inner_dim_past_a_binding() -> Result<()> {
    use torsh_backend::compute::GemvDesc;
    use torsh_backend::webgpu::{WebGpuBackend, WebGpuBackendConfig, MIN_BINDING_SIZE};
    if !Backend::available().contains(&BackendType::WebGpu) {
        return Ok(());
    }
    // Outputs past the binding are cut into pieces; with k = 0 the operands are zero-byte
    // allocations, which a piece must not advance into.
    let config = WebGpuBackendConfig {
        max_binding_size: MIN_BINDING_SIZE,
        ..Default::default()
    };
    let b = Backend::from_compute(Box::new(WebGpuBackend::new(config)))?;
    for (a, w) in [
        ([3, 0, 127], [3, 0, 129]),
        ([1, 0, 20_000], [1, 0, 1]),
        ([1, 0, 1], [1, 0, 20_000]),
        ([1, 0, 300], [1, 0, 300]),
    ] {
        let a = b.zeros(&a, DType::F32)?.transpose(1, 2)?;
        let w = b.zeros(&w, DType::F32)?;
        for a in [a.clone(), a.contiguous()?] {
            let y = a.matmul(&w)?.to_vec_f64()?;
            assert!(
                y.iter().all(|&v| v == 0.0),
                "{:?} @ {:?}",
                a.shape(),
                w.shape()
            );
        }
    }
    // y = A·x with x empty: A is 20 000 × 0.
    let c = b.compute();
    let (a, x) = (upload(c, &[]), upload(c, &[]));
    let y = upload(c, &[f32::NAN; 20_000]);
    c.gemv(&GemvDesc {
        dtype: DType::F32,
        trans: Transpose::No,
        m: 20_000,
        n: 0,
        alpha: 1.0,
        a,
        lda: 20_000,
        x,
        incx: 1,
        beta: 0.0,
        y,
        incy: 1,
    })?;
    assert!(download(c, y, 20_000).iter().all(|&v| v == 0.0));
    for p in [a, x, y] {
        c.free(p)?;
    }
    Ok(())
}
