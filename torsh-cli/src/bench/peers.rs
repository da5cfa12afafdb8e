//! The peers measured beside ours in the same run, and how their outcomes are told apart: measured,
//! skipped on purpose, not found on this machine, or failed.
//!
//! On the CPU the GEMM cases have four: OpenBLAS (loaded at run time), the `gemm` crate called directly,
//! `matrixmultiply` (in a child process, see `mmul.rs`), and ours with SIMD off ("scalar", a baseline:
//! it is not a peer in the ratio). Each runs at the thread count of the pass.

use torsh_backend::{Backend, DType};

use super::cases::{Case, Op};
use super::openblas::OpenBlas;
use super::{gemm_crate, measure, mmul, wall_clock, Timing};

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

/// The CPU peers of one run: OpenBLAS loaded once, and what was set up for it.
pub struct CpuPeers {
    /// The library, or why it could not be loaded.
    openblas: Result<OpenBlas, String>,
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
}

impl CpuPeer {
    /// The column of the table.
    pub fn key(self) -> &'static str {
        match self {
            CpuPeer::OpenBlas => "OpenBLAS",
            CpuPeer::GemmCrate => "gemm",
            CpuPeer::Matrixmultiply => "matrixmultiply",
            CpuPeer::Scalar => "scalar",
        }
    }
}

impl CpuPeers {
    /// Loads OpenBLAS; `coretype` is what `openblas::set_coretype` set, called earlier, before any
    /// thread started.
    pub fn start(coretype: Option<String>) -> CpuPeers {
        CpuPeers {
            openblas: OpenBlas::load(),
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
        lines.push(
            "peers of the other sections: onnxruntime, through scripts/bench-cpu.sh on this run's \
             JSON"
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
        peers.into_iter().map(|p| self.name(p)).collect()
    }

    /// The peers of `case`, in the order they are measured (none outside GEMM).
    pub fn of(&self, case: &Case) -> Vec<CpuPeer> {
        if !matches!(case.op, Op::Matmul { .. }) {
            return Vec::new();
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

impl CpuPass<'_> {
    /// Measures `peer` on `case` (a GEMM case) as `measure` does ours.
    pub fn run(&self, peer: CpuPeer, case: &Case, repeats: usize, target: f64) -> PeerResult {
        PeerResult {
            key: peer.key(),
            name: self.peers.name(peer),
            baseline: peer == CpuPeer::Scalar,
            timing: self.timing(peer, case, repeats, target),
        }
    }

    /// The timing of [`CpuPass::run`].
    fn timing(
        &self,
        peer: CpuPeer,
        case: &Case,
        repeats: usize,
        target: f64,
    ) -> Result<Timing, PeerError> {
        let Op::Matmul { m, n, k } = case.op else {
            return Err(PeerError::Skipped("GEMM only".into()));
        };
        let failed = PeerError::Failed;
        let timed = |run: &mut super::cases::Runner<'_>| {
            measure(run, &wall_clock(&|| Ok(())), repeats, target).map_err(failed)
        };
        match peer {
            CpuPeer::OpenBlas => {
                let blas = self
                    .peers
                    .openblas
                    .as_ref()
                    .map_err(|e| PeerError::NotFound(e.clone()))?;
                if let Some(Err(why)) = blas.supports(case.dtype) {
                    return Err(PeerError::Skipped(why));
                }
                timed(
                    &mut blas
                        .gemm(case.dtype, m, n, k, self.threads)
                        .map_err(failed)?,
                )
            }
            CpuPeer::GemmCrate => {
                let pool = self.pool.as_ref().map_err(|e| failed(e.clone()))?;
                let mut run =
                    gemm_crate::gemm(case.dtype, m, n, k, self.threads, pool).map_err(failed)?;
                timed(&mut run)
            }
            CpuPeer::Matrixmultiply => {
                mmul::measure_in_child(case.dtype, (m, n, k), self.threads, repeats, target)
                    .map_err(failed)
            }
            CpuPeer::Scalar => {
                if m.max(n).max(k) > SCALAR_MAX_DIM {
                    return Err(PeerError::Skipped("too slow".into()));
                }
                let backend = self.scalar.as_ref().map_err(|e| failed(e.clone()))?;
                let mut run = case.prepare(backend).map_err(|e| failed(e.to_string()))?;
                timed(&mut run)
            }
        }
    }
}
