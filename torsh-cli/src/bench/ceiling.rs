//! The machine's ceilings that each row is compared with: peak FLOP/s from an FMA loop and copy
//! bandwidth from a large copy (the better of memcpy and a streaming-store copy), measured at the
//! start of a CPU run for each thread count, with the read bandwidth of one stream per thread
//! beside them (what a reduction, which reads and hardly writes, can reach); on the device
//! backends, the copy bandwidth of the run's own memcpy case.

use std::sync::Barrier;
use std::time::Instant;

use serde_json::{json, Value};
use torsh_backend::DType;

use super::cases::{Case, MemOp, Op, Work};
use super::fma::FmaIsa;
use super::Measured;

/// Bytes copied by the copy-bandwidth measurement of a full run.
const COPY_BYTES: usize = 256 << 20;
/// The same under `--quick`.
const QUICK_COPY_BYTES: usize = 32 << 20;
/// Seconds one FMA trial lasts in a full run: short, so that the best of [`FMA_TRIALS`] finds a slice
/// of time when no other process shares the core.
const FMA_TRIAL_S: f64 = 0.01;
/// The same under `--quick`.
const QUICK_FMA_TRIAL_S: f64 = 0.005;
/// Trials of the copy measurement; the best is kept (a ceiling).
const TRIALS: usize = 5;
/// Trials of the FMA loop; the best is kept.
const FMA_TRIALS: usize = 10;

/// What the rows of one thread count are compared with.
#[derive(Clone, Debug, PartialEq)]
pub struct Ceilings {
    /// The thread count they were measured with (`None` on the device backends).
    pub threads: Option<usize>,
    /// Peak f32 GFLOP/s of the FMA loop on all threads.
    pub fma_f32_gflops: Option<f64>,
    /// Peak f64 GFLOP/s likewise.
    pub fma_f64_gflops: Option<f64>,
    /// How the peak was measured.
    pub fma_how: Option<String>,
    /// Copy bandwidth in GB/s, bytes read + written.
    pub copy_gbps: Option<f64>,
    /// How the bandwidth was measured.
    pub copy_how: String,
    /// Read bandwidth in GB/s of one sequential stream per thread (the host only): the pace of
    /// a row reduction, shown beside the copy bandwidth that the rows' fractions are of.
    pub read_gbps: Option<f64>,
}

/// Which ceiling a row is a fraction of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CeilingKind {
    /// The f32 FMA peak (f32, f16, bf16 and TF32 compute).
    FmaF32,
    /// The f64 FMA peak.
    FmaF64,
    /// The copy bandwidth.
    Copy,
}

impl CeilingKind {
    /// The name in the JSON.
    pub fn key(self) -> &'static str {
        match self {
            CeilingKind::FmaF32 => "fma_f32",
            CeilingKind::FmaF64 => "fma_f64",
            CeilingKind::Copy => "copy",
        }
    }
}

impl Ceilings {
    /// Measures the host with `threads` threads: the FMA loop on each, then a copy split among them
    /// (by memcpy and by streaming stores, the better kept).
    pub fn host(threads: usize, quick: bool) -> Ceilings {
        let isa = FmaIsa::detect();
        let trial_s = if quick {
            QUICK_FMA_TRIAL_S
        } else {
            FMA_TRIAL_S
        };
        let peak = |f64_lanes| fma_gflops(isa, threads, f64_lanes, trial_s);
        let bytes = if quick { QUICK_COPY_BYTES } else { COPY_BYTES };
        Ceilings {
            threads: Some(threads),
            fma_f32_gflops: peak(false),
            fma_f64_gflops: peak(true),
            fma_how: (isa != FmaIsa::None).then(|| {
                format!("{} on {threads} thread(s), best of {FMA_TRIALS}", isa.describe())
            }),
            copy_gbps: copy_gbps(bytes, threads),
            copy_how: format!(
                "copy of {} MiB split over {threads} thread(s), bytes read + written, best of {TRIALS} \
                 memcpy and {TRIALS} streaming-store passes",
                bytes >> 20
            ),
            read_gbps: read_gbps(bytes, threads),
        }
    }

    /// The copy bandwidth of a run's first memcpy case that ran (the device backends).
    pub fn from_memcpy(results: &[Measured]) -> Ceilings {
        let copy_gbps = results.iter().find_map(|r| match (r.case.op, &r.ours) {
            (
                Op::Memory {
                    op: MemOp::Memcpy, ..
                },
                Ok(t),
            ) => Some(r.case.work().per_second(t.median)),
            _ => None,
        });
        Ceilings {
            threads: None,
            fma_f32_gflops: None,
            fma_f64_gflops: None,
            fma_how: None,
            copy_gbps,
            copy_how: "ComputeBackend::copy_dtod of a dense f32 buffer; bytes read + written"
                .into(),
            read_gbps: None,
        }
    }

    /// The ceiling `case` is compared with, and its value (GFLOP/s or GB/s).
    pub fn for_case(&self, case: &Case) -> Option<(CeilingKind, f64)> {
        let (kind, value) = match case.work() {
            Work::Bytes(_) => (CeilingKind::Copy, self.copy_gbps),
            Work::Flops(_) if case.dtype == DType::F64 => {
                (CeilingKind::FmaF64, self.fma_f64_gflops)
            }
            Work::Flops(_) => (CeilingKind::FmaF32, self.fma_f32_gflops),
        };
        value.filter(|v| *v > 0.0).map(|v| (kind, v))
    }

    /// The line printed before a thread count's tables.
    pub fn line(&self) -> String {
        let mut parts = Vec::new();
        if let (Some(f32), Some(f64)) = (self.fma_f32_gflops, self.fma_f64_gflops) {
            parts.push(format!(
                "FMA peak {f32:.1} GFLOP/s f32, {f64:.1} GFLOP/s f64 ({})",
                self.fma_how.as_deref().unwrap_or("")
            ));
        }
        match self.copy_gbps {
            Some(c) => parts.push(format!("copy {c:.1} GB/s ({})", self.copy_how)),
            None => parts.push("copy bandwidth not measured".into()),
        }
        if let Some(r) = self.read_gbps {
            parts.push(format!(
                "read {r:.1} GB/s (one sequential stream per thread, summed; best of {TRIALS} passes \
                 and {TRIALS} with prefetches {READ_AHEAD} bytes ahead)"
            ));
        }
        let head = match self.threads {
            Some(n) => format!("ceilings at {n} thread(s)"),
            None => "ceiling".into(),
        };
        format!("{head}: {}", parts.join("; "))
    }

    /// The JSON object.
    pub fn json(&self) -> Value {
        json!({
            "threads": self.threads,
            "fma_f32_gflops": self.fma_f32_gflops,
            "fma_f64_gflops": self.fma_f64_gflops,
            "fma_how": self.fma_how,
            "copy_gbps": self.copy_gbps,
            "how": self.copy_how,
            "read_gbps": self.read_gbps,
        })
    }
}

/// GFLOP/s of the FMA loop on `threads` threads at once, each running the same number of iterations
/// (calibrated so that a trial lasts about `trial_s`); the best of [`FMA_TRIALS`].
fn fma_gflops(isa: FmaIsa, threads: usize, f64_lanes: bool, trial_s: f64) -> Option<f64> {
    if isa == FmaIsa::None {
        return None;
    }
    // Calibrate on one thread, growing until the loop lasts long enough to time.
    let mut iters = 1u64 << 12;
    let per_iter = loop {
        let start = Instant::now();
        std::hint::black_box(isa.run(iters, f64_lanes));
        let t = start.elapsed().as_secs_f64();
        if t > 2e-3 || iters >= 1 << 40 {
            break t / iters as f64;
        }
        iters *= 4;
    };
    let iters = ((trial_s / per_iter.max(1e-12)) as u64).max(1);
    let best = (0..FMA_TRIALS)
        .filter_map(|_| {
            on_threads(threads, |_| {
                std::hint::black_box(isa.run(iters, f64_lanes));
            })
        })
        .fold(f64::INFINITY, f64::min);
    let flops = isa.flops_per_iter(f64_lanes) * iters as f64 * threads as f64;
    (best.is_finite() && best > 0.0).then(|| flops / best / 1e9)
}

/// Copy bandwidth in GB/s (bytes read + written) of copying `bytes` split in `threads` slices copied
/// at once, by `memcpy` and by a copy with streaming stores ([`stream_copy`], which the library's
/// large copies and elementwise outputs use); the best of [`TRIALS`] of each after a pass that
/// touches every page.
fn copy_gbps(bytes: usize, threads: usize) -> Option<f64> {
    let threads = threads.max(1);
    let src = huge_page_vec(bytes, 0x5a);
    let chunk = bytes.div_ceil(threads).next_multiple_of(4096);
    let dst: Vec<std::sync::Mutex<Vec<u8>>> = src
        .chunks(chunk)
        .map(|s| std::sync::Mutex::new(huge_page_vec(s.len(), 0)))
        .collect();
    let pass = |streamed: bool| {
        on_threads(dst.len(), |i| {
            if let Ok(mut d) = dst[i].lock() {
                let (start, len) = (i * chunk, d.len());
                let s = &src[start..start + len];
                if streamed {
                    stream_copy(s, &mut d);
                } else {
                    d.copy_from_slice(s);
                }
            }
        })
    };
    pass(false);
    let best = (0..2 * TRIALS)
        .filter_map(|t| pass(t % 2 == 1))
        .fold(f64::INFINITY, f64::min);
    std::hint::black_box(&dst);
    (best.is_finite() && best > 0.0).then(|| 2.0 * bytes as f64 / best / 1e9)
}

/// Read bandwidth in GB/s of `bytes` split in `threads` slices, each read once from start to end
/// by its own thread at the same time (a wrapping sum of its 64-bit words into eight
/// accumulators, so that the adds never wait on one another); the best of [`TRIALS`] passes that
/// leave the reads to the hardware prefetchers and [`TRIALS`] that also prefetch each line
/// [`READ_AHEAD`] bytes ahead, after a pass that touches every page. Prefetching matters where the
/// hardware prefetchers fall behind a stream: on a Xeon VM one thread read a 64 MiB buffer (which
/// its large cache may have held) at 26 GB/s with it and 18 GB/s without, while over this
/// function's 256 MiB both kinds of pass read about 16 GB/s.
fn read_gbps(bytes: usize, threads: usize) -> Option<f64> {
    let threads = threads.max(1);
    let src = huge_page_vec(bytes, 0x5a);
    let chunk = bytes.div_ceil(threads).next_multiple_of(4096);
    let pass = |prefetch: bool| {
        on_threads(threads, |i| {
            let start = (i * chunk).min(src.len());
            let end = (start + chunk).min(src.len());
            std::hint::black_box(read_sum(&src[start..end], prefetch));
        })
    };
    pass(false);
    let best = (0..2 * TRIALS)
        .filter_map(|t| pass(t % 2 == 1))
        .fold(f64::INFINITY, f64::min);
    (best.is_finite() && best > 0.0).then(|| bytes as f64 / best / 1e9)
}

/// How far ahead [`read_sum`] prefetches, in bytes.
const READ_AHEAD: usize = 4096;

/// The wrapping sum of the native-endian 64-bit words of `bytes`' whole 64-byte lines (a trailing
/// partial line is not read), in eight independent accumulators, one per word of a line; with
/// `prefetch` (x86-64 only), each line [`READ_AHEAD`] bytes ahead is prefetched as a line is read.
fn read_sum(bytes: &[u8], prefetch: bool) -> u64 {
    let mut acc = [0u64; 8];
    for line in bytes.chunks_exact(64) {
        #[cfg(target_arch = "x86_64")]
        if prefetch {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // SAFETY: a prefetch is a hint that never faults, even past the end of `bytes`;
            // SSE is part of x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().wrapping_add(READ_AHEAD).cast()) };
        }
        for (a, w) in acc.iter_mut().zip(line.chunks_exact(8)) {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            *a = a.wrapping_add(u64::from_ne_bytes(word));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = prefetch;
    acc.iter().fold(0, |s, a| s.wrapping_add(*a))
}

/// Copies `src` into `dst` (equal lengths): on x86-64 the aligned middle of `dst` with the widest
/// streaming stores the CPU has (a 64-byte line a store with AVX-512F, else 16 bytes with SSE2),
/// as the library's streamed outputs are written, and a store fence, so that no destination line
/// is read before it is written; elsewhere `copy_from_slice`.
fn stream_copy(src: &[u8], dst: &mut [u8]) {
    assert_eq!(src.len(), dst.len(), "stream_copy of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        let wide = std::arch::is_x86_feature_detected!("avx512f");
        let align = if wide { 64 } else { 16 };
        let n = dst.len();
        let head = dst.as_ptr().align_offset(align).min(n);
        let body = (n - head) / align * align;
        dst[..head].copy_from_slice(&src[..head]);
        if wide {
            // SAFETY: AVX-512F was detected; the range is inside both slices and `dst + head`
            // is 64-byte aligned.
            unsafe { stream_lines(&src[head..head + body], &mut dst[head..head + body]) };
        } else {
            use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
            for i in (head..head + body).step_by(16) {
                // SAFETY: `i + 16 ≤ n` for both slices; `dst + i` is 16-byte aligned; SSE2 is
                // part of x86-64.
                unsafe {
                    let v = _mm_loadu_si128(src.as_ptr().add(i).cast::<__m128i>());
                    _mm_stream_si128(dst.as_mut_ptr().add(i).cast::<__m128i>(), v);
                }
            }
        }
        dst[head + body..].copy_from_slice(&src[head + body..]);
        // SAFETY: SSE is part of x86-64; orders the streamed stores before the thread's later ones.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// `dst = src` (equal lengths, a multiple of 64 bytes, `dst` 64-byte aligned), a streaming store
/// of a whole line at a time (unfenced).
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn stream_lines(src: &[u8], dst: &mut [u8]) {
    use std::arch::x86_64::{__m512i, _mm512_loadu_si512, _mm512_stream_si512};
    for (s, d) in src.chunks_exact(64).zip(dst.chunks_exact_mut(64)) {
        // SAFETY: 64 bytes of each; `d` is 64-byte aligned (the caller's contract).
        unsafe {
            let v = _mm512_loadu_si512(s.as_ptr().cast::<__m512i>());
            _mm512_stream_si512(d.as_mut_ptr().cast::<__m512i>(), v);
        }
    }
}

/// `len` bytes of `value`, on transparent huge pages where Linux grants them (`MADV_HUGEPAGE` before
/// the first touch), as the library backs its large host buffers: the ceiling and the kernels it
/// bounds then stream through memory under the same TLB conditions.
fn huge_page_vec(len: usize, value: u8) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    #[cfg(target_os = "linux")]
    {
        const HUGE_PAGE: usize = 2 << 20;
        let first = (v.as_mut_ptr() as usize).next_multiple_of(HUGE_PAGE);
        let end = (v.as_mut_ptr() as usize + len) & !(HUGE_PAGE - 1);
        if end > first {
            // SAFETY: the range lies inside the vector's reserved allocation; the advice changes
            // only how its pages are backed.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
            }
        }
    }
    v.resize(len, value);
    v
}

/// Seconds `threads` threads take to each run `work` (given its index), started together behind a
/// barrier: from the first start to the last end, as the threads themselves see it (the spawning thread
/// may be descheduled meanwhile); `None` if a thread panicked.
fn on_threads(threads: usize, work: impl Fn(usize) + Sync) -> Option<f64> {
    let barrier = Barrier::new(threads);
    let spans: Option<Vec<(Instant, Instant)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let (barrier, work) = (&barrier, &work);
                scope.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    work(i);
                    (start, Instant::now())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().ok()).collect()
    });
    let spans = spans?;
    let first = spans.iter().map(|s| s.0).min()?;
    let last = spans.iter().map(|s| s.1).max()?;
    Some(last.duration_since(first).as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ceilings_are_positive() {
        let c = Ceilings::host(1, true);
        assert!(c.copy_gbps.is_some_and(|g| g > 0.0), "{c:?}");
        assert!(c.read_gbps.is_some_and(|g| g > 0.0), "{c:?}");
        if FmaIsa::detect() != FmaIsa::None {
            let (f32, f64) = (c.fma_f32_gflops.unwrap(), c.fma_f64_gflops.unwrap());
            assert!(f32 > 0.0 && f64 > 0.0, "{c:?}");
        }
        assert!(c.line().starts_with("ceilings at 1 thread(s)"));
    }

    #[test]
    fn read_sum_adds_every_whole_word() {
        let words: Vec<u64> = (1..=19).map(|i| i * 0x0101_0101).collect();
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        bytes.extend([0xff; 5]);
        // 19 words: two whole lines (16 words) are read; the three words and the five bytes after
        // them are not.
        let expected = words[..16].iter().fold(0u64, |s, w| s.wrapping_add(*w));
        assert_eq!(read_sum(&bytes, false), expected);
        assert_eq!(read_sum(&bytes, true), expected);
    }
}
