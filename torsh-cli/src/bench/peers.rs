//! The peers measured beside ours in the same run, and how their outcomes are told apart: measured,
//! skipped on purpose, not found on this machine, or failed.
//!
//! On the CPU the GEMM cases have four: OpenBLAS (loaded at run time), the `gemm` crate called directly,
//! `matrixmultiply` (in a child process, see `mmul.rs`), and ours with SIMD off ("scalar", a baseline:
//! it is not a peer in the ratio). The other sections have onnxruntime, in a co-process (see
//! `onnxruntime.rs`). Each runs at the thread count of the pass, and all but matrixmultiply are
//! timed interleaved with ours, repeat by repeat.

use std::cell::RefCell;

use torsh_backend::{Backend, DType};

use super::cases::{Case, Op};
use super::onnxruntime::OnnxRuntime;
use super::openblas::OpenBlas;
use super::{gemm_crate, mmul, wall_side, Side, Timing};

/// The largest GEMM dimension the scalar baseline is run at; beyond it, it takes too long.
pub const SCALAR_MAX_DIM: usize = 256;

/// Why a peer has no timing.
#[derive(Clone, Debug, PartialEq)]
pub enum PeerError {
    /// Not run on purpose (the reason).
    Skipped(String),
    /// The peer is not on this machine (the reason).
    NotFound(String),
    /// It ran and failed.
    Failed(String),
}

impl PeerError {
    /// The table cell.
    pub fn cell(&self) -> &'static str {
        match self {
            PeerError::Skipped(_) => "skipped",
            PeerError::NotFound(_) => "n/a",
            PeerError::Failed(_) => "error",
        }
    }

    /// The full text, as the JSON has it.
    pub fn message(&self) -> String {
        match self {
            PeerError::Skipped(why) => format!("skipped ({why})"),
            PeerError::NotFound(why) => format!("not found: {why}"),
            PeerError::Failed(e) => e.clone(),
        }
    }
}

/// A peer's measurement of a case.
pub struct PeerResult {
    /// The short name: the column of the table and the series of the chart.
    pub key: &'static str,
    /// The full name (library and version where it says).
    pub name: String,
    /// A baseline shown beside the peers but left out of "ours / best peer".
    pub baseline: bool,
    /// The timing, or why there is none.
    pub timing: Result<Timing, PeerError>,
}

/// The CPU peers of one run: OpenBLAS loaded once, onnxruntime's co-process started once, and what
/// was set up for them.
pub struct CpuPeers {
    /// The library, or why it could not be loaded.
    openblas: Result<OpenBlas, String>,
    /// onnxruntime, or why it could not be started.
    onnxruntime: Result<RefCell<OnnxRuntime>, String>,
    /// What the run set in its environment for the peers.
    pub notes: Vec<String>,
}

/// One CPU peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuPeer {
    /// OpenBLAS's cblas_?gemm.
    OpenBlas,
    /// The `gemm` crate.
    GemmCrate,
    /// The `matrixmultiply` crate.
    Matrixmultiply,
    /// Ours with `enable_simd(false)`.
    Scalar,
    /// onnxruntime's CPU execution provider, outside GEMM.
    OnnxRuntime,
}

impl CpuPeer {
    /// The column of the table.
    pub fn key(self) -> &'static str {
        match self {
            CpuPeer::OpenBlas => "OpenBLAS",
            CpuPeer::GemmCrate => "gemm",
            CpuPeer::Matrixmultiply => "matrixmultiply",
            CpuPeer::Scalar => "scalar",
            CpuPeer::OnnxRuntime => "onnxruntime",
        }
    }
}

impl CpuPeers {
    /// Loads OpenBLAS and, when `onnxruntime` is set, starts onnxruntime's co-process; `coretype`
    /// is what `openblas::set_coretype` set, called earlier, before any thread started.
    pub fn start(coretype: Option<String>, onnxruntime: bool) -> CpuPeers {
        CpuPeers {
            openblas: OpenBlas::load(),
            onnxruntime: if onnxruntime {
                OnnxRuntime::start().map(RefCell::new)
            } else {
                Err("no case outside GEMM selected".into())
            },
            notes: coretype.into_iter().collect(),
        }
    }

    /// The full name of a peer.
    pub fn name(&self, peer: CpuPeer) -> String {
        match peer {
            CpuPeer::OpenBlas => match &self.openblas {
                Ok(b) => b.name.clone(),
                Err(_) => "OpenBLAS".into(),
            },
            CpuPeer::GemmCrate => "gemm crate (x86-v4: AVX-512 kernels), called directly".into(),
            CpuPeer::Matrixmultiply => {
                "matrixmultiply crate (threading; MATMUL_NUM_THREADS per child process)".into()
            }
            CpuPeer::Scalar => "ours scalar: Backend::cpu().enable_simd(false)".into(),
            CpuPeer::OnnxRuntime => match &self.onnxruntime {
                Ok(o) => o.borrow().name.clone(),
                Err(_) => "onnxruntime".into(),
            },
        }
    }

    /// One line per peer for the header: its name, or why it is missing.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "peers (GEMM): {}; {}; {}",
            self.name(CpuPeer::GemmCrate),
            self.name(CpuPeer::Matrixmultiply),
            match &self.openblas {
                Ok(b) => b.name.clone(),
                Err(e) => format!("OpenBLAS not found: {e}"),
            }
        )];
        lines.push(format!(
            "baseline (GEMM up to {SCALAR_MAX_DIM}): {}",
            self.name(CpuPeer::Scalar)
        ));
        lines.push(match &self.onnxruntime {
            Ok(_) => format!(
                "peer of the other sections: {}, in a co-process (benches/onnxruntime_peer.py)",
                self.name(CpuPeer::OnnxRuntime)
            ),
            Err(e) => format!(
                "peer of the other sections: onnxruntime not here: {e} (pip install -r \
                 benches/requirements.txt)"
            ),
        });
        lines.push(
            "peers are timed interleaved with ours, one repeat of each per round (matrixmultiply: \
             in a child process, before the rounds)"
                .into(),
        );
        lines.extend(self.notes.iter().cloned());
        lines
    }

    /// The names of the peers that are here, for the JSON.
    pub fn names(&self) -> Vec<String> {
        let mut peers = vec![CpuPeer::GemmCrate, CpuPeer::Matrixmultiply];
        if self.openblas.is_ok() {
            peers.insert(0, CpuPeer::OpenBlas);
        }
        if self.onnxruntime.is_ok() {
            peers.push(CpuPeer::OnnxRuntime);
        }
        peers.into_iter().map(|p| self.name(p)).collect()
    }

    /// The peers of `case`, in the order they are measured: the GEMM peers, or onnxruntime outside
    /// GEMM when it is here (it says which cases it has no counterpart for).
    pub fn of(&self, case: &Case) -> Vec<CpuPeer> {
        if !matches!(case.op, Op::Matmul { .. }) {
            return if self.onnxruntime.is_ok() {
                vec![CpuPeer::OnnxRuntime]
            } else {
                Vec::new()
            };
        }
        let dt = case.dtype;
        let mut peers = Vec::new();
        if matches!(dt, DType::F32 | DType::F64 | DType::BF16) {
            peers.push(CpuPeer::OpenBlas);
        }
        if gemm_crate::supports(dt) {
            peers.push(CpuPeer::GemmCrate);
        }
        if mmul::supports(dt) {
            peers.push(CpuPeer::Matrixmultiply);
        }
        peers.push(CpuPeer::Scalar);
        peers
    }

    /// What the pass at `threads` threads needs: a rayon pool for the `gemm` crate and a scalar backend.
    pub fn pass(&self, threads: usize) -> CpuPass<'_> {
        CpuPass {
            peers: self,
            threads,
            pool: rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("bench-gemm-{i}"))
                .build()
                .map_err(|e| e.to_string()),
            scalar: Backend::cpu()
                .num_threads(threads)
                .enable_simd(false)
                .build()
                .map_err(|e| e.to_string()),
        }
    }
}

/// The CPU peers at one thread count.
pub struct CpuPass<'p> {
    /// The run's peers.
    peers: &'p CpuPeers,
    /// The thread count.
    threads: usize,
    /// The `gemm` crate's pool.
    pool: Result<rayon::ThreadPool, String>,
    /// Ours with SIMD off.
    scalar: Result<Backend, String>,
}

/// How a peer's side of a case is measured.
pub enum PeerRun<'r> {
    /// A batch timer, measured interleaved with ours (`measure_interleaved`).
    Interleaved(Side<'r>),
    /// Measured on its own already (matrixmultiply, in a child process), or why it was not.
    Done(Result<Timing, PeerError>),
}

impl CpuPass<'_> {
    /// The result of `peer` with `timing`.
    pub fn result(&self, peer: CpuPeer, timing: Result<Timing, PeerError>) -> PeerResult {
        PeerResult {
            key: peer.key(),
            name: self.peers.name(peer),
            baseline: peer == CpuPeer::Scalar,
            timing,
        }
    }

    /// Prepares `peer`'s side of `case` at this pass's thread count: a batch timer for the peers in
    /// this process and onnxruntime's co-process, or the timing of matrixmultiply, measured now in
    /// a child process (`repeats` repeats of at least `target` seconds).
    pub fn prepare(&self, peer: CpuPeer, case: &Case, repeats: usize, target: f64) -> PeerRun<'_> {
        match self.side(peer, case, repeats, target) {
            Ok(run) => run,
            Err(e) => PeerRun::Done(Err(e)),
        }
    }

    /// The work of [`CpuPass::prepare`].
    fn side(
        &self,
        peer: CpuPeer,
        case: &Case,
        repeats: usize,
        target: f64,
    ) -> Result<PeerRun<'_>, PeerError> {
        let failed = PeerError::Failed;
        let gemm_dims = || match case.op {
            Op::Matmul { m, n, k } => Ok((m, n, k)),
            _ => Err(PeerError::Skipped("GEMM only".into())),
        };
        let run = match peer {
            CpuPeer::OnnxRuntime => {
                let ort = self
                    .peers
                    .onnxruntime
                    .as_ref()
                    .map_err(|e| PeerError::NotFound(e.clone()))?;
                ort.borrow_mut().prepare(case, self.threads, target)?;
                return Ok(PeerRun::Interleaved(Box::new(move |k| {
                    ort.borrow_mut().batch(k)
                })));
            }
            CpuPeer::OpenBlas => {
                let (m, n, k) = gemm_dims()?;
                let blas = self
                    .peers
                    .openblas
                    .as_ref()
                    .map_err(|e| PeerError::NotFound(e.clone()))?;
                if let Some(Err(why)) = blas.supports(case.dtype) {
                    return Err(PeerError::Skipped(why));
                }
                blas.gemm(case.dtype, m, n, k, self.threads)
                    .map_err(failed)?
            }
            CpuPeer::GemmCrate => {
                let (m, n, k) = gemm_dims()?;
                let pool = self.pool.as_ref().map_err(|e| failed(e.clone()))?;
                gemm_crate::gemm(case.dtype, m, n, k, self.threads, pool).map_err(failed)?
            }
            CpuPeer::Matrixmultiply => {
                let dims = gemm_dims()?;
                return Ok(PeerRun::Done(
                    mmul::measure_in_child(case.dtype, dims, self.threads, repeats, target)
                        .map_err(failed),
                ));
            }
            CpuPeer::Scalar => {
                let (m, n, k) = gemm_dims()?;
                if m.max(n).max(k) > SCALAR_MAX_DIM {
                    return Err(PeerError::Skipped("too slow".into()));
                }
                let backend = self.scalar.as_ref().map_err(|e| failed(e.clone()))?;
                case.prepare(backend).map_err(|e| failed(e.to_string()))?
            }
        };
        Ok(PeerRun::Interleaved(wall_side(run, || Ok(()))))
    }
}
