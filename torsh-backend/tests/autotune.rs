//! The autotuner (`runtime/autotune.rs`): candidates are timed on first use of a key and checked
//! against the default's answer (a wrong candidate is never chosen, however fast), stored choices are
//! hit afterwards, and the cache file round-trips, is never trusted when stale, foreign or corrupt, and
//! survives concurrent writers. The CPU backend's GEMM threading is the real consumer; a wrapper of
//! the reference backend with planted variants proves the selection rules.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use torsh_backend::backends::reference::ReferenceBackend;
use torsh_backend::compute::*;
use torsh_backend::prelude::*;
use torsh_backend::validation::compare;
use torsh_backend::AutotuneStats;

mod common;
use common::through_op;

/// A fresh, empty folder for one test's cache files.
fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("torsh-autotune-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The CPU backend with two threads, so that its GEMM has two variants on any machine.
fn cpu() -> Backend {
    Backend::cpu().num_threads(2).build().unwrap()
}

fn product(b: &Backend, m: usize, k: usize, n: usize) -> Tensor {
    b.manual_seed((m * 31 + k * 7 + n) as u64);
    let x = b.randn(&[m, k], DType::F32).unwrap();
    let w = b.randn(&[k, n], DType::F32).unwrap();
    x.matmul(&w).unwrap()
}

#[test]
fn seed_autotuning_snippet() -> Result<()> {
    let dir = scratch_dir("seed");
    let cache = dir.join("tuning_cache.json");
    let backend = Backend::new(BackendType::Auto)?
        .enable_autotuning(true)
        .autotuning_cache_file(&cache)?;
    let a = backend.randn(&[64, 64], DType::F32)?;
    let _ = a.matmul(&a)?;
    let stats = backend.autotuning_stats();
    assert_eq!(stats.entries as u64, stats.tuned + stats.loaded);
    Ok(())
}

#[test]
fn cpu_gemm_threading_is_tuned_checked_and_hit() {
    let reference = Backend::reference().unwrap();
    let b = cpu().enable_autotuning(true);
    let shapes = [(1, 1, 1), (37, 29, 11), (200, 300, 150)];
    for (m, k, n) in shapes {
        let out = product(&b, m, k, n).to_vec_f64().unwrap();
        let want = product(&reference, m, k, n).to_vec_f64().unwrap();
        let cmp = compare(&out, &want);
        assert!(cmp.within(1e-5), "{m}x{k}x{n}: {cmp}");
    }
    let stats = b.autotuning_stats();
    assert_eq!(
        (stats.tuned, stats.hits, stats.rejected),
        (3, 0, 0),
        "{stats:?}"
    );
    assert_eq!(stats.entries, 3);
    // Shapes in the same buckets are served by the stored choices.
    let _ = product(&b, 36, 31, 12);
    let _ = product(&b, 195, 290, 145);
    let stats = b.autotuning_stats();
    assert_eq!((stats.tuned, stats.hits), (3, 2), "{stats:?}");
    let choices = b.autotuning_choices();
    assert!(
        choices.iter().any(|(k, _)| k == "gemm/f32/m12n40k32/NN"),
        "{choices:?}"
    );
    for (key, c) in &choices {
        assert!(
            ["threads:1", "threads:pool"].contains(&c.variant.as_str()),
            "{key}: {c:?}"
        );
        assert!(
            c.micros > 0.0 && c.micros <= c.default_micros,
            "{key}: {c:?}"
        );
    }
    // Off: nothing more is tuned or hit.
    let b = b.enable_autotuning(false);
    let _ = product(&b, 500, 3, 3);
    assert_eq!(b.autotuning_stats().tuned, 3);
}

#[test]
fn the_cache_file_round_trips() {
    let dir = scratch_dir("round-trip");
    let cache = dir.join("cache.json");
    let first = cpu()
        .enable_autotuning(true)
        .autotuning_cache_file(&cache)
        .unwrap();
    let _ = product(&first, 64, 64, 64);
    let _ = product(&first, 5, 7, 3);
    let saved = first.autotuning_choices();
    assert_eq!(saved.len(), 2);
    let text = std::fs::read_to_string(&cache).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["crate_version"], env!("CARGO_PKG_VERSION"));
    assert!(
        json["device"].as_str().unwrap().starts_with("cpu/"),
        "{json}"
    );

    let second = cpu()
        .enable_autotuning(true)
        .autotuning_cache_file(&cache)
        .unwrap();
    assert_eq!(second.autotuning_choices(), saved);
    let _ = product(&second, 64, 64, 64);
    let stats = second.autotuning_stats();
    assert_eq!(
        stats,
        AutotuneStats {
            entries: 2,
            loaded: 2,
            hits: 1,
            ..AutotuneStats::default()
        }
    );
    // Another thread count is another device: the file is foreign there.
    let other = Backend::cpu()
        .num_threads(3)
        .build()
        .unwrap()
        .enable_autotuning(true)
        .autotuning_cache_file(&cache)
        .unwrap();
    assert_eq!(other.autotuning_stats().ignored_files, 1);
    assert_eq!(other.autotuning_stats().loaded, 0);
}

/// Writes `text` as the cache file and opens a tuning CPU backend on it.
fn opened_on(path: &Path, text: &str) -> Backend {
    std::fs::write(path, text).unwrap();
    cpu()
        .enable_autotuning(true)
        .autotuning_cache_file(path)
        .unwrap()
}

#[test]
fn stale_foreign_and_corrupt_files_are_ignored_and_replaced() {
    let dir = scratch_dir("untrusted");
    let cache = dir.join("cache.json");
    let good = cpu()
        .enable_autotuning(true)
        .autotuning_cache_file(&cache)
        .unwrap();
    let _ = product(&good, 64, 64, 64);
    let valid: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();

    let mut stale = valid.clone();
    stale["crate_version"] = "0.0.0-old".into();
    let mut foreign = valid.clone();
    foreign["device"] = "cuda/Some Other GPU".into();
    let mut malformed = valid.clone();
    for (_, entry) in malformed["entries"].as_object_mut().unwrap() {
        entry["micros"] = (-1.0).into();
    }
    for (what, text) in [
        ("stale", stale.to_string()),
        ("foreign", foreign.to_string()),
        ("malformed", malformed.to_string()),
        ("corrupt", "{\"format\": 1, \"crate_ver".to_string()),
        ("empty", String::new()),
    ] {
        let b = opened_on(&cache, &text);
        let stats = b.autotuning_stats();
        assert_eq!(
            (stats.ignored_files, stats.loaded, stats.entries),
            (1, 0, 0),
            "{what}"
        );
        let _ = product(&b, 64, 64, 64);
        assert_eq!(
            b.autotuning_stats().tuned,
            1,
            "{what}: tuned again, not trusted"
        );
        let now: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
        assert_eq!(
            now["device"], valid["device"],
            "{what}: replaced by a valid file"
        );
    }

    // A stored variant the backend does not offer is never run: the key is tuned again.
    let mut unknown = valid.clone();
    for (_, entry) in unknown["entries"].as_object_mut().unwrap() {
        entry["variant"] = "threads:all-the-gpus".into();
    }
    let b = opened_on(&cache, &unknown.to_string());
    assert_eq!(b.autotuning_stats().loaded, 1);
    let _ = product(&b, 64, 64, 64);
    let stats = b.autotuning_stats();
    assert_eq!((stats.tuned, stats.hits), (1, 0), "{stats:?}");

    // A folder that does not exist is an I/O error at once, not a silent loss later.
    let missing = dir.join("no/such/folder/cache.json");
    assert!(matches!(
        cpu().autotuning_cache_file(missing),
        Err(BackendError::Io(_))
    ));
}

#[test]
fn concurrent_writers_keep_every_entry_and_a_whole_file() {
    let dir = scratch_dir("writers");
    let cache = dir.join("cache.json");
    std::thread::scope(|s| {
        for t in 0..4usize {
            let cache = &cache;
            s.spawn(move || {
                let b = cpu()
                    .enable_autotuning(true)
                    .autotuning_cache_file(cache)
                    .unwrap();
                // Each writer tunes keys of its own (m buckets 2^(t+1) and 2^(t+6)).
                let _ = product(&b, 2 << t, 8, 8);
                let _ = product(&b, 64 << t, 8, 8);
            });
        }
    });
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
    assert_eq!(json["entries"].as_object().unwrap().len(), 8, "{json}");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    let reader = cpu()
        .enable_autotuning(true)
        .autotuning_cache_file(&cache)
        .unwrap();
    assert_eq!(reader.autotuning_stats().loaded, 8);
}

/// The reference backend offering four GEMM variants: the default (slow: it sleeps 2 ms), one that
/// is fast but wrong (alpha off by 1 %), one that fails (as a library declining a shape does), and
/// one that is right and fast until a test makes it sleep ([`Planted::right_sleeps_ms`]).
#[derive(Debug)]
struct Planted {
    inner: ReferenceBackend,
    /// Runs of the slow default.
    slow_runs: AtomicUsize,
    /// How long the right variant sleeps: 0 unless a test sets it, as if the machine had changed.
    right_sleeps_ms: AtomicUsize,
}

/// A tuning backend on [`Planted`].
fn planted() -> Backend {
    Backend::from_compute(Box::new(Planted {
        inner: ReferenceBackend::new(BackendType::Reference),
        slow_runs: AtomicUsize::new(0),
        right_sleeps_ms: AtomicUsize::new(0),
    }))
    .unwrap()
    .enable_autotuning(true)
}

/// The planted device under `b`.
fn planted_of(b: &Backend) -> &Planted {
    let planted = b
        .compute()
        .as_any()
        .and_then(|a| a.downcast_ref::<Planted>());
    planted.unwrap()
}

/// How often `b`'s slow default GEMM has run.
fn slow_runs(b: &Backend) -> usize {
    planted_of(b).slow_runs.load(Ordering::SeqCst)
}

impl Planted {
    /// Runs `desc` on the reference backend; the plain GEMM is the slow default (counted).
    fn op<D: OpDesc>(&self, desc: &D) -> Result<()> {
        if (desc as &dyn std::any::Any).is::<GemmDesc>() {
            self.slow_runs.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(2));
        }
        desc.run(&self.inner)
    }
}

impl ComputeBackend for Planted {
    fn name(&self) -> &str {
        "planted"
    }
    fn backend_type(&self) -> BackendType {
        BackendType::Cpu
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
    common::forward_device!(inner);
    torsh_backend::for_each_op!(through_op);
    fn variants(&self, op: &TunableOp) -> &'static [&'static str] {
        match op {
            TunableOp::Gemm(_) => &["slow", "wrong", "failing", "right"],
            _ => &[],
        }
    }
    fn run_variant(&self, op: &TunableOp, variant: &str) -> Result<()> {
        let TunableOp::Gemm(d) = op else {
            return Err(BackendError::invalid("variant", "not a gemm"));
        };
        match variant {
            "slow" => self.gemm(d),
            "wrong" => self.inner.gemm(&GemmDesc {
                alpha: d.alpha * 1.01,
                ..d.clone()
            }),
            "failing" => Err(BackendError::FeatureUnavailable {
                feature: "the failing variant",
                reason: "it declines every shape".into(),
            }),
            "right" => {
                let ms = self.right_sleeps_ms.load(Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(ms as u64));
                self.inner.gemm(d)
            }
            other => Err(BackendError::invalid("variant", other.to_string())),
        }
    }
}

#[test]
fn a_fast_wrong_variant_is_never_chosen_and_a_failing_one_is_passed_over() {
    let b = planted();
    let reference = Backend::reference().unwrap();
    let out = product(&b, 9, 5, 7);
    let want = product(&reference, 9, 5, 7);
    assert_eq!(out.to_bytes().unwrap(), want.to_bytes().unwrap());
    let stats = b.autotuning_stats();
    assert_eq!((stats.tuned, stats.rejected), (1, 2), "{stats:?}");
    let choices = b.autotuning_choices();
    assert_eq!(choices.len(), 1);
    assert_eq!(choices[0].1.variant, "right", "{choices:?}");
    assert!(choices[0].1.default_micros > choices[0].1.micros);
    // The op's own output came from the winner, once: the answer is the reference's bit for bit.
    let again = product(&b, 9, 5, 7);
    assert_eq!(again.to_bytes().unwrap(), want.to_bytes().unwrap());
    assert_eq!(b.autotuning_stats().hits, 1);
    let slow = slow_runs(&b);
    let _ = product(&b, 9, 5, 7);
    assert_eq!(
        slow_runs(&b),
        slow,
        "a hit runs the winner, not the default"
    );
}

#[test]
fn a_captured_graph_replays_the_tuned_variant() {
    let b = planted();
    let x = b.randn(&[6, 4], DType::F32).unwrap();
    let w = b.randn(&[4, 3], DType::F32).unwrap();
    // The key is first met inside the capture: it is tuned there, outside the recording.
    let graph = b.capture_graph(|| x.matmul(&w)).unwrap();
    assert_eq!(b.autotuning_stats().tuned, 1);
    assert_eq!(graph.num_ops(), 1, "only the op itself was recorded");
    let slow = slow_runs(&b);
    let out = b.launch_graph(&graph, &[x.clone(), w.clone()]).unwrap();
    assert_eq!(
        slow_runs(&b),
        slow,
        "the replay ran the chosen variant, not the default"
    );
    let eager = x.matmul(&w).unwrap();
    assert_eq!(out[0].to_bytes().unwrap(), eager.to_bytes().unwrap());
    assert_eq!(b.autotuning_stats().hits, 1);
}

/// The variant stored for the one key `b` has tuned.
fn the_choice(b: &Backend) -> String {
    let choices = b.autotuning_choices();
    assert_eq!(choices.len(), 1, "{choices:?}");
    choices[0].1.variant.clone()
}

#[test]
fn a_choice_is_revisited_on_schedule_and_changed_when_timings_drift_even_through_the_cache_file() {
    let dir = scratch_dir("revisits");
    let cache = dir.join("cache.json");
    // An overhead this large revisits after the fewest ops the schedule allows: 16.
    let b = planted()
        .autotuning_revisit_overhead(1e9)
        .unwrap()
        .autotuning_cache_file(&cache)
        .unwrap();
    let reference = Backend::reference().unwrap();
    let x = b.randn(&[9, 5], DType::F32).unwrap();
    let w = b.randn(&[5, 7], DType::F32).unwrap();
    let want = reference
        .from_slice(&x.to_vec::<f32>().unwrap(), &[9, 5])
        .unwrap()
        .matmul(
            &reference
                .from_slice(&w.to_vec::<f32>().unwrap(), &[5, 7])
                .unwrap(),
        )
        .unwrap()
        .to_bytes()
        .unwrap();
    let run = |times: usize| {
        for _ in 0..times {
            assert_eq!(x.matmul(&w).unwrap().to_bytes().unwrap(), want);
        }
        let s = b.autotuning_stats();
        (s.tuned, s.hits, s.revisits, s.revised)
    };
    assert_eq!(run(1), (1, 0, 0, 0));
    assert_eq!(the_choice(&b), "right");
    // The 16th op served by the choice revisits it; it stands, and the wait doubles to 32 ops.
    assert_eq!(run(15), (1, 15, 0, 0));
    assert_eq!(run(1), (1, 16, 1, 0));
    assert_eq!(run(31), (1, 47, 1, 0));
    assert_eq!(run(1), (1, 48, 2, 0));
    assert_eq!(the_choice(&b), "right");
    // The machine changes: the chosen variant now takes four times the default. The next revisit,
    // 64 ops on, finds the default faster and serves the key with it from then on.
    planted_of(&b).right_sleeps_ms.store(8, Ordering::SeqCst);
    assert_eq!(run(63), (1, 111, 2, 0));
    assert_eq!(run(1), (1, 112, 3, 1));
    assert_eq!(the_choice(&b), "slow");
    let slow = slow_runs(&b);
    assert_eq!(run(1), (1, 113, 3, 1));
    assert_eq!(slow_runs(&b), slow + 1, "the default serves the key now");
    // The revisit saved its choice. A process that loads it on a machine where the right variant is
    // fast again revisits the loaded choice as well, after 16 ops, and turns back to it.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cache).unwrap()).unwrap();
    let entries = json["entries"].as_object().unwrap();
    assert_eq!(entries.len(), 1, "{json}");
    assert!(entries.values().all(|e| e["variant"] == "slow"), "{json}");
    let again = planted()
        .autotuning_revisit_overhead(1e9)
        .unwrap()
        .autotuning_cache_file(&cache)
        .unwrap();
    let (x2, w2) = (
        again
            .from_slice(&x.to_vec::<f32>().unwrap(), &[9, 5])
            .unwrap(),
        again
            .from_slice(&w.to_vec::<f32>().unwrap(), &[5, 7])
            .unwrap(),
    );
    for _ in 0..16 {
        assert_eq!(x2.matmul(&w2).unwrap().to_bytes().unwrap(), want);
    }
    let stats = again.autotuning_stats();
    assert_eq!(
        (
            stats.loaded,
            stats.tuned,
            stats.hits,
            stats.revisits,
            stats.revised
        ),
        (1, 0, 16, 1, 1),
        "{stats:?}"
    );
    assert_eq!(the_choice(&again), "right");
}

#[test]
fn revisits_can_be_turned_off_and_their_overhead_must_be_a_fraction_of_zero_or_more() {
    let b = planted().autotuning_revisit_overhead(0.0).unwrap();
    let x = b.randn(&[4, 3], DType::F32).unwrap();
    let w = b.randn(&[3, 2], DType::F32).unwrap();
    for _ in 0..100 {
        x.matmul(&w).unwrap();
    }
    let stats = b.autotuning_stats();
    assert_eq!((stats.tuned, stats.hits, stats.revisits), (1, 99, 0));
    // Turned on again, the schedule applies at once to the key tuned already.
    let b = b.autotuning_revisit_overhead(1e9).unwrap();
    for _ in 0..16 {
        x.matmul(&w).unwrap();
    }
    assert_eq!(b.autotuning_stats().revisits, 1);
    for bad in [-0.5, f64::NAN, f64::INFINITY] {
        assert!(
            matches!(
                planted().autotuning_revisit_overhead(bad),
                Err(BackendError::InvalidArgument { .. })
            ),
            "{bad}"
        );
    }
}

/// Every variant every available backend offers computes the GEMM of the reference, on odd shapes,
/// transposed operands, padded leading dimensions and beta ≠ 0, into poisoned outputs.
#[test]
fn every_offered_gemm_variant_matches_the_reference() {
    let reference = Backend::reference().unwrap();
    let mut offered = 0;
    let backends: Vec<Backend> = Backend::available()
        .into_iter()
        .map(|k| match k {
            BackendType::Cpu => cpu(),
            other => Backend::new(other).unwrap(),
        })
        .collect();
    for b in backends {
        let kind = b.backend_type();
        // (m, n, k, trans_a, trans_b, padding of each leading dimension, beta)
        let cases = [
            (1, 1, 1, false, false, 0, 0.0),
            (37, 29, 11, false, false, 0, 0.0),
            (65, 33, 70, true, false, 3, 0.0),
            (31, 97, 17, false, true, 1, 0.5),
            (128, 64, 40, true, true, 0, -1.0),
        ];
        for (m, n, k, ta, tb, pad, beta) in cases {
            let (ar, ac) = if ta { (k, m) } else { (m, k) };
            let (br, bc) = if tb { (n, k) } else { (k, n) };
            let (lda, ldb, ldc) = (ar + pad, br + pad, m + pad);
            let data = |len: usize, seed: usize| -> Vec<f32> {
                (0..len)
                    .map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0) - 1.0)
                    .collect()
            };
            let a_host = data(lda * ac, 1);
            let b_host = data(ldb * bc, 2);
            let c_host = data(ldc * n, 3);
            let tr = |t: bool| if t { Transpose::Yes } else { Transpose::No };
            let desc = |a: &Tensor, b: &Tensor, c: &Tensor| GemmDesc {
                dtype: DType::F32,
                trans_a: tr(ta),
                trans_b: tr(tb),
                m,
                n,
                k,
                alpha: 1.25,
                a: a.data_ptr(),
                lda,
                b: b.data_ptr(),
                ldb,
                beta,
                c: c.data_ptr(),
                ldc,
            };
            let on = |be: &Backend| {
                (
                    be.from_slice(&a_host, &[a_host.len()]).unwrap(),
                    be.from_slice(&b_host, &[b_host.len()]).unwrap(),
                    be.from_slice(&c_host, &[c_host.len()]).unwrap(),
                )
            };
            let (ra, rb, rc) = on(&reference);
            reference.compute().gemm(&desc(&ra, &rb, &rc)).unwrap();
            let want = rc.to_vec_f64().unwrap();
            let (xa, xb, xc) = on(&b);
            let op = TunableOp::Gemm(desc(&xa, &xb, &xc));
            for variant in b.compute().variants(&op) {
                offered += 1;
                let c = b.from_slice(&c_host, &[c_host.len()]).unwrap();
                if beta == 0.0 {
                    c.copy_from(&b.full(&[c_host.len()], f64::NAN, DType::F32).unwrap())
                        .unwrap();
                }
                let before = c.to_vec::<f32>().unwrap();
                let op = TunableOp::Gemm(desc(&xa, &xb, &c));
                b.compute().run_variant(&op, variant).unwrap();
                let got = c.to_vec_f64().unwrap();
                // The gaps of a padded C are never written: compare only m rows of each column.
                let pick = |v: &[f64]| -> Vec<f64> {
                    (0..n)
                        .flat_map(|j| v[j * ldc..j * ldc + m].to_vec())
                        .collect()
                };
                let cmp = compare(&pick(&got), &pick(&want));
                assert!(
                    cmp.within(1e-5),
                    "{kind} {variant} {m}x{n}x{k} ta={ta} tb={tb}: {cmp}"
                );
                if pad > 0 {
                    let after = c.to_vec::<f32>().unwrap();
                    assert_eq!(
                        after[m].to_bits(),
                        before[m].to_bits(),
                        "{kind} {variant}: a gap of C was written"
                    );
                }
            }
            assert!(
                b.compute().run_variant(&op, "no-such-variant").is_err(),
                "{kind}: unknown variants are refused"
            );
        }
    }
    assert!(offered > 0, "the CPU backend offers GEMM variants");
}

#[test]
fn webgpu_gemm_tiles_are_tuned() {
    let Ok(b) = Backend::new(BackendType::WebGpu) else {
        eprintln!("no WebGPU adapter here");
        return;
    };
    let b = b.enable_autotuning(true);
    let reference = Backend::reference().unwrap();
    for (m, k, n) in [(40, 24, 36), (130, 70, 65)] {
        let got = product(&b, m, k, n).to_vec_f64().unwrap();
        let want = product(&reference, m, k, n).to_vec_f64().unwrap();
        let cmp = compare(&got, &want);
        assert!(cmp.within(1e-5), "{m}x{k}x{n}: {cmp}");
    }
    let stats = b.autotuning_stats();
    assert_eq!((stats.tuned, stats.rejected), (2, 0), "{stats:?}");
    for (key, c) in b.autotuning_choices() {
        assert!(
            ["tile:64", "tile:32"].contains(&c.variant.as_str()),
            "{key}: {c:?}"
        );
    }
}

/// A convolution of `x` (`[n, c, hw, hw + 2]`) with `k` output channels, `r`×`r` windows, padding 1
/// and a bias, from fixed seeds.
fn convolution(b: &Backend, n: usize, c: usize, hw: usize, k: usize, r: usize) -> Tensor {
    b.manual_seed((n * 131 + c * 17 + hw * 5 + k + r) as u64);
    let x = b.randn(&[n, c, hw, hw + 2], DType::F32).unwrap();
    let w = b.randn(&[k, c, r, r], DType::F32).unwrap();
    let bias = b.randn(&[k], DType::F32).unwrap();
    let config = ConvConfig {
        padding: [1, 1],
        ..ConvConfig::default()
    };
    b.conv2d_with_bias(&x, &w, Some(&bias), config).unwrap()
}

/// Asserts [`convolution`] of each `(n, c, hw, k, r)` of `shapes` on `b` is the reference's.
fn convolutions_match(
    b: &Backend,
    reference: &Backend,
    shapes: &[(usize, usize, usize, usize, usize)],
) {
    for &(n, c, hw, k, r) in shapes {
        let got = convolution(b, n, c, hw, k, r).to_vec_f64().unwrap();
        let want = convolution(reference, n, c, hw, k, r).to_vec_f64().unwrap();
        let cmp = compare(&got, &want);
        assert!(cmp.within(1e-5), "{n}x{c}x{hw} -> {k} ({r}x{r}): {cmp}");
    }
}

/// On CUDA with cuDNN, conv2d is tuned among cuDNN's algorithms (each alone), its heuristic order
/// and the implicit-GEMM kernel; the answer is the reference's whichever wins. Skipped (saying so)
/// without CUDA or cuDNN; `TORSH_REQUIRE=cuda` makes a missing CUDA backend fail.
#[test]
fn cuda_conv2d_is_tuned_among_cudnn_algorithms_and_its_kernel() {
    let b = match Backend::new(BackendType::Cuda) {
        Ok(b) => b.enable_autotuning(true),
        Err(e) => {
            common::skip("cuda", e);
            return;
        }
    };
    let reference = Backend::reference().unwrap();
    let shapes = [(2, 16, 20, 24, 3), (1, 64, 28, 32, 1)];
    convolutions_match(&b, &reference, &shapes);
    let stats = b.autotuning_stats();
    if stats.tuned == 0 {
        common::skipped("cuDNN is absent, so conv2d offers no variants to tune");
        return;
    }
    assert_eq!(stats.tuned, 2, "{stats:?}");
    for (key, choice) in b.autotuning_choices() {
        eprintln!("cuda conv2d {key}: {choice:?}");
        let known = choice.variant == "cudnn"
            || choice.variant == "kernel"
            || choice.variant.starts_with("cudnn_");
        assert!(known, "{key}: {choice:?}");
    }
}

#[test]
fn cpu_conv_threading_is_tuned_checked_hit_and_cached() {
    let dir = scratch_dir("conv");
    let cache = dir.join("tuning_cache.json");
    let reference = Backend::reference().unwrap();
    let b = cpu()
        .enable_autotuning(true)
        .autotuning_cache_file(&cache)
        .unwrap();
    let shapes = [(1, 3, 9, 5, 3), (2, 16, 20, 24, 3), (1, 64, 28, 32, 1)];
    convolutions_match(&b, &reference, &shapes);
    let stats = b.autotuning_stats();
    assert_eq!((stats.tuned, stats.rejected), (3, 0), "{stats:?}");
    // The same layers again: served by the stored choices.
    for (n, c, hw, k, r) in shapes {
        let _ = convolution(&b, n, c, hw, k, r);
    }
    assert_eq!(b.autotuning_stats().hits, 3);
    let choices = b.autotuning_choices();
    let conv_keys: Vec<&String> = choices
        .iter()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("conv2d/f32/"))
        .collect();
    assert_eq!(conv_keys.len(), 3, "{choices:?}");
    assert!(
        choices
            .iter()
            .any(|(k, _)| k == "conv2d/f32/m24n896k160/--+B"),
        "{choices:?}"
    );
    // A new process (a new backend) loads them from the file and tunes nothing.
    let again = cpu()
        .enable_autotuning(true)
        .autotuning_cache_file(&cache)
        .unwrap();
    for (n, c, hw, k, r) in shapes {
        let _ = convolution(&again, n, c, hw, k, r);
    }
    let stats = again.autotuning_stats();
    assert_eq!((stats.tuned, stats.hits), (0, 3), "{stats:?}");
}

/// Every conv variant every available backend offers computes the reference's convolution into
/// poisoned outputs, grouped, strided, dilated and depthwise layers included: the CPU's (calling
/// thread, pool, and for 3×3 stride-1 ungrouped layers the kernel family its default does not
/// take, im2col or Winograd), and on CUDA cuDNN's algorithms each alone and the implicit-GEMM kernel. Only a
/// `cudnn_*` variant may decline a layer (`FeatureUnavailable`: cuDNN does not accept that
/// algorithm for it), which the autotuner passes over.
#[test]
fn every_offered_conv_variant_matches_the_reference() {
    let reference = Backend::reference().unwrap();
    let mut backends = vec![cpu()];
    backends.extend(
        Backend::available()
            .into_iter()
            .filter(|k| !matches!(k, BackendType::Cpu | BackendType::Reference))
            .map(|k| Backend::new(k).unwrap()),
    );
    for b in &backends {
        every_conv_variant_on(b, &reference);
    }
}

fn every_conv_variant_on(b: &Backend, reference: &Backend) {
    let layers = [
        (2, 6, 11, 9, 3, [2, 1], [1, 1], [1, 2], 3),
        (1, 8, 13, 8, 3, [1, 1], [1, 1], [1, 1], 8),
        (1, 5, 7, 7, 1, [1, 1], [0, 0], [1, 1], 1),
        (3, 4, 33, 10, 5, [1, 1], [2, 2], [1, 1], 1),
        // 3×3 at stride 1, one group: Winograd by default with these channels, im2col offered;
        // with fewer channels the other way round.
        (2, 16, 10, 17, 3, [1, 1], [1, 1], [1, 1], 1),
        (1, 5, 9, 6, 3, [1, 1], [0, 0], [1, 1], 1),
        // 5×5 on eight channels: im2col by default, the first-layer kernel offered (the 5×5 on
        // four channels above is the other way round).
        (1, 8, 12, 6, 5, [2, 2], [2, 2], [1, 1], 1),
    ];
    for (n, c, hw, k, r, stride, padding, dilation, groups) in layers {
        let make = |be: &Backend| {
            be.manual_seed(9);
            let x = be.randn(&[n, c, hw, hw + 1], DType::F32).unwrap();
            let w = be.randn(&[k, c / groups, r, r], DType::F32).unwrap();
            let bias = be.randn(&[k], DType::F32).unwrap();
            (x, w, bias)
        };
        let (x, w, bias) = make(b);
        let (xr, wr, br) = make(reference);
        let config = ConvConfig {
            stride,
            padding,
            dilation,
            groups,
        };
        let want = reference
            .conv2d_with_bias(&xr, &wr, Some(&br), config)
            .unwrap();
        let desc = |out: &Tensor| Conv2dDesc {
            dtype: DType::F32,
            input: x.data_ptr(),
            input_shape: [n, c, hw, hw + 1],
            weight: w.data_ptr(),
            weight_shape: [k, c / groups, r, r],
            bias: Some(bias.data_ptr()),
            output: out.data_ptr(),
            output_shape: want.shape().try_into().unwrap(),
            stride,
            padding,
            dilation,
            groups,
        };
        let probe = b.empty(want.shape(), DType::F32).unwrap();
        let op = TunableOp::Conv2d(desc(&probe));
        let variants = b.compute().variants(&op);
        if b.backend_type() == BackendType::Cpu {
            // The family the default does not take: im2col where Winograd or the first-layer
            // kernel is the default, else Winograd where it applies, else the first-layer kernel
            // on few channels.
            let winograd = r == 3 && stride == [1, 1] && dilation == [1, 1] && groups == 1;
            let direct = groups == 1 && c <= 4 && c * r * r >= 25;
            let other = if direct || (winograd && c >= 16 && k >= 16) {
                Some("im2col")
            } else if winograd {
                Some("winograd")
            } else if groups == 1 && c <= 16 && r > 1 {
                Some("direct")
            } else {
                None
            };
            assert_eq!(
                variants.len(),
                2 + usize::from(other.is_some()),
                "{variants:?}"
            );
            if let Some(other) = other {
                assert!(
                    variants.iter().any(|v| v.starts_with(other)),
                    "{variants:?}"
                );
            }
        }
        for &variant in variants {
            let out = b.full(want.shape(), f64::NAN, DType::F32).unwrap();
            let ran = b
                .compute()
                .run_variant(&TunableOp::Conv2d(desc(&out)), variant);
            let name = format!("{variant} on {} {n}x{c}x{hw} g{groups}", b.backend_type());
            match ran {
                Ok(()) => {}
                Err(BackendError::FeatureUnavailable { .. }) if variant.starts_with("cudnn_") => {
                    continue
                }
                Err(e) => panic!("{name}: {e}"),
            }
            let cmp = compare(&out.to_vec_f64().unwrap(), &want.to_vec_f64().unwrap());
            assert!(cmp.within(1e-5), "{name}: {cmp}");
        }
    }
}

#[test]
fn a_captured_tuned_conv_replays_on_new_inputs_as_eager() {
    let b = cpu().enable_autotuning(true);
    let config = ConvConfig {
        padding: [1, 1],
        ..ConvConfig::default()
    };
    let x = b.randn(&[1, 8, 12, 12], DType::F32).unwrap();
    let w = b.randn(&[16, 8, 3, 3], DType::F32).unwrap();
    let bias = b.randn(&[16], DType::F32).unwrap();
    let graph = b
        .capture_graph(|| b.conv2d_with_bias(&x, &w, Some(&bias), config))
        .unwrap();
    assert_eq!(b.autotuning_stats().tuned, 1, "tuned inside the capture");
    let (x2, w2, bias2) = (
        b.randn(&[1, 8, 12, 12], DType::F32).unwrap(),
        b.randn(&[16, 8, 3, 3], DType::F32).unwrap(),
        b.randn(&[16], DType::F32).unwrap(),
    );
    let out = b
        .launch_graph(&graph, &[x2.clone(), w2.clone(), bias2.clone()])
        .unwrap();
    let eager = b.conv2d_with_bias(&x2, &w2, Some(&bias2), config).unwrap();
    assert_eq!(out[0].to_bytes().unwrap(), eager.to_bytes().unwrap());
}
