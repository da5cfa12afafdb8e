//! The caching memory pool (`runtime/pool.rs`) on every available backend: tensors reuse freed blocks,
//! ops on pooled tensors (which live inside larger device allocations) give the same answers, the
//! `max_size` bound fails cleanly and leaks nothing, and many threads can allocate at once. The
//! pool's own splitting, coalescing and fitting rules are unit-tested in `pool.rs` on a fake device.

use torsh_backend::prelude::*;
use torsh_backend::{AllocationStrategy, MemoryPoolConfig};

mod common;
use common::backends;

fn pooled(kind: BackendType, config: MemoryPoolConfig) -> Backend {
    Backend::new(kind)
        .expect("an available backend builds")
        .memory_pool(config)
        .expect("a pool")
}

#[test]
fn seed_memory_pool_snippet() -> Result<()> {
    let backend = Backend::new(BackendType::Auto)?.memory_pool(MemoryPoolConfig {
        initial_size: 1 << 30, // 1GB
        max_size: 4 << 30,     // 4GB
        strategy: AllocationStrategy::BestFit,
        enable_defrag: true,
    })?;
    let stats = backend.memory_stats();
    assert_eq!(stats.reserved_bytes, 1 << 30);
    let x = backend.randn(&[1024, 1024], DType::F32)?;
    assert_eq!(
        backend.memory_stats().segments,
        1,
        "served from the initial reservation"
    );
    drop(x);
    assert_eq!(backend.memory_stats().allocated_bytes, 0);
    Ok(())
}

#[test]
fn freed_tensors_are_reused_and_answers_are_unchanged() {
    let reference = Backend::reference().unwrap();
    for plain in backends() {
        let kind = plain.backend_type();
        eprintln!("backend: {kind}");
        let b = pooled(kind, MemoryPoolConfig::default());
        let first = b.zeros(&[1000], DType::F32).unwrap().data_ptr();
        let again = b.zeros(&[1000], DType::F32).unwrap().data_ptr();
        assert_eq!(first, again, "{kind}: the freed block is handed out again");
        let stats = b.memory_stats();
        assert_eq!((stats.alloc_count, stats.free_count), (2, 2), "{kind}");

        // A small chain of ops on tensors that share one device allocation.
        let run = |be: &Backend| {
            be.manual_seed(3);
            let x = be
                .from_slice(
                    &(0..37 * 29)
                        .map(|i| (i % 17) as f32 * 0.25 - 2.0)
                        .collect::<Vec<_>>(),
                    &[37, 29],
                )
                .unwrap();
            let w = be
                .from_slice(
                    &(0..29 * 13)
                        .map(|i| (i % 7) as f32 * 0.5 - 1.5)
                        .collect::<Vec<_>>(),
                    &[29, 13],
                )
                .unwrap();
            let y = x.matmul(&w).unwrap().tanh().unwrap().softmax(1).unwrap();
            let z = y.add(&y.mul(&y).unwrap()).unwrap().sum(0, false).unwrap();
            z.to_vec_f64().unwrap()
        };
        let (ours, theirs) = (run(&b), run(&reference));
        for (o, t) in ours.iter().zip(&theirs) {
            assert!(
                (o - t).abs() <= 1e-5 * (1.0 + t.abs()),
                "{kind}: {o} vs {t}"
            );
        }
        assert!(
            b.memory_stats().segments <= 2,
            "{kind}: {:?}",
            b.memory_stats()
        );
        assert_eq!(
            b.memory_stats().allocated_bytes,
            0,
            "{kind}: every tensor returned its block"
        );
    }
}

#[test]
fn the_max_size_bound_fails_cleanly_and_leaks_nothing() {
    for plain in backends() {
        let kind = plain.backend_type();
        eprintln!("backend: {kind}");
        drop(plain);
        let b = Backend::new(kind)
            .unwrap()
            .memory_pool(MemoryPoolConfig {
                max_size: 8 << 20,
                ..Default::default()
            })
            .unwrap();
        let baseline = b.allocated_bytes();
        let mut held = Vec::new();
        let err = loop {
            match b.zeros(&[1 << 18], DType::F32) {
                Ok(t) => held.push(t),
                Err(e) => break e,
            }
            assert!(held.len() < 100, "{kind}: the bound was not enforced");
        };
        match err {
            BackendError::MemoryPoolExhausted {
                requested, limit, ..
            } => assert_eq!((requested, limit), (1 << 20, 8 << 20)),
            other => panic!("{kind}: expected MemoryPoolExhausted, got {other}"),
        }
        assert!(b.memory_stats().reserved_bytes <= 8 << 20);
        assert_eq!(b.memory_stats().ooms, 1);
        // The backend still works: a small tensor fits in a split of the cached blocks once freed.
        drop(held);
        let stats = b.memory_stats();
        assert_eq!(stats.allocated_bytes, 0, "{kind}");
        assert!(b.ones(&[4], DType::F32).is_ok());
        b.empty_cache().unwrap();
        assert_eq!(b.memory_stats().reserved_bytes, 0, "{kind}");
        assert_eq!(
            b.allocated_bytes(),
            baseline,
            "{kind}: device memory returned"
        );
    }
}

#[test]
fn peaks_reset_and_exact_returns_memory_at_once() {
    for plain in backends() {
        let kind = plain.backend_type();
        let b = pooled(
            kind,
            MemoryPoolConfig {
                strategy: AllocationStrategy::Exact,
                ..Default::default()
            },
        );
        let t = b.zeros(&[4096], DType::F32).unwrap();
        assert_eq!(b.memory_stats().reserved_bytes, 16384, "{kind}");
        drop(t);
        let stats = b.memory_stats();
        assert_eq!(
            (stats.reserved_bytes, stats.peak_reserved_bytes),
            (0, 16384),
            "{kind}"
        );
        b.reset_peak_stats();
        assert_eq!(b.memory_stats().peak_reserved_bytes, 0, "{kind}");
    }
}

#[test]
fn many_threads_allocate_at_once() {
    for plain in backends() {
        let kind = plain.backend_type();
        eprintln!("backend: {kind}");
        let b = pooled(kind, MemoryPoolConfig::default());
        std::thread::scope(|scope| {
            for t in 0..8usize {
                let b = b.clone();
                scope.spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..60usize {
                        let len = 1 + (i * 7919 + t * 104_729) % 5000;
                        let x = b.full(&[len], (t * 1000 + i) as f64, DType::F32).unwrap();
                        live.push((x, (t * 1000 + i) as f32));
                        if i % 3 == 0 {
                            live.remove(0);
                        }
                    }
                    // Nobody else wrote into this thread's blocks.
                    for (x, v) in &live {
                        assert!(x.to_vec::<f32>().unwrap().iter().all(|e| e == v));
                    }
                });
            }
        });
        let stats = b.memory_stats();
        assert_eq!(stats.allocated_bytes, 0, "{kind}: {stats:?}");
        assert_eq!(stats.alloc_count, stats.free_count, "{kind}");
    }
}

#[test]
fn a_pool_with_tensors_in_use_is_not_replaced() {
    let b = pooled(BackendType::Cpu, MemoryPoolConfig::default());
    let x = b.zeros(&[10], DType::F32).unwrap();
    let err = b
        .clone()
        .memory_pool(MemoryPoolConfig::default())
        .unwrap_err();
    assert!(matches!(err, BackendError::InvalidArgument { .. }), "{err}");
    drop(x);
    let b = b.memory_pool(MemoryPoolConfig::default()).unwrap();
    assert_eq!(b.memory_stats().reserved_bytes, 0);
    let err = Backend::cpu()
        .build()
        .unwrap()
        .memory_pool(MemoryPoolConfig {
            initial_size: 2,
            max_size: 1,
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(err, BackendError::InvalidArgument { .. }), "{err}");
}

#[test]
fn reused_blocks_are_poisoned_in_debug_builds() {
    if !cfg!(debug_assertions) {
        common::skipped("blocks are poisoned in debug builds (or with TORSH_POISON=1) only");
        return;
    }
    for plain in backends() {
        let kind = plain.backend_type();
        let b = pooled(kind, MemoryPoolConfig::default());
        let first = b.ones(&[300], DType::F32).unwrap();
        let at = first.data_ptr();
        drop(first);
        let again = b.empty(&[300], DType::F32).unwrap();
        assert_eq!(again.data_ptr(), at, "{kind}");
        assert!(
            again.to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()),
            "{kind}: the old ones are still visible"
        );
    }
}

#[test]
fn blocks_freed_while_another_stream_may_use_them_wait_for_it() {
    let reference = Backend::reference().unwrap();
    for plain in backends() {
        let kind = plain.backend_type();
        let b = pooled(kind, MemoryPoolConfig::default());
        let side = b.create_stream().unwrap();
        b.manual_seed(5);
        let x = b.randn(&[256, 256], DType::F32).unwrap();
        let y = side.run(|| x.matmul(&x)).unwrap();
        let fences = b.compute().memory_fence().unwrap().is_some();
        // Freed while the side stream's product may still read it.
        drop(x);
        let stats = b.memory_stats();
        if fences {
            assert!(stats.fenced_bytes >= 256 * 256 * 4, "{kind}: {stats:?}");
        } else {
            assert_eq!(stats.fenced_bytes, 0, "{kind}");
        }
        if kind == BackendType::Cuda {
            assert!(fences, "CUDA fences frees once a second stream exists");
        }
        // A new tensor written at once on the default stream must not land in x's block while the
        // product reads it: the product's answer is the reference's.
        let scribble = b.full(&[256, 256], f64::NAN, DType::F32).unwrap();
        reference.manual_seed(5);
        let xr = reference.randn(&[256, 256], DType::F32).unwrap();
        let want = xr.matmul(&xr).unwrap().to_vec_f64().unwrap();
        let got = y.to_vec_f64().unwrap();
        let err = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
            .fold(0.0, f64::max);
        assert!(err < 1e-3, "{kind}: error {err}");
        drop((y, scribble));
        b.synchronize().unwrap();
        // An allocation reclaims every completed fence; the probe's own block is fenced again when
        // it is freed, so the count is read while it lives.
        let probe = b.zeros(&[1], DType::F32).unwrap();
        assert_eq!(b.memory_stats().fenced_bytes, 0, "{kind}: all reclaimed");
        drop(probe);
        assert_eq!(b.memory_stats().allocated_bytes, 0, "{kind}");
    }
}

#[test]
fn scalar_operands_allocate_nothing_but_the_output() {
    for plain in backends() {
        let kind = plain.backend_type();
        let b = pooled(kind, MemoryPoolConfig::default());
        let x = b.randn(&[7, 5], DType::F32).unwrap().t().unwrap();
        let mask = x.gt_scalar(0.0).unwrap();
        let count = || b.memory_stats().alloc_count;
        let check = |name: &str, run: &dyn Fn() -> Result<Tensor>| {
            let before = count();
            let y = run().unwrap();
            assert_eq!(count() - before, 1, "{kind} {name}: only the output");
            assert_eq!(y.shape(), x.shape());
        };
        check("add_scalar", &|| x.add_scalar(0.5));
        check("pow_scalar", &|| x.pow_scalar(2.0));
        check("lt_scalar", &|| x.lt_scalar(0.25));
        check("masked_fill", &|| x.masked_fill(&mask, -1.0));
        check("clamp", &|| x.clamp(Some(-0.5), Some(0.5)));
    }
}
