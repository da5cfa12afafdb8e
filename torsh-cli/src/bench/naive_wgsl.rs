//! The WebGPU GEMM peer: a naive WGSL matmul (one invocation per output element, a plain loop over
//! k, no workgroup memory), run through the backend's own custom-kernel path on the same device, so
//! the tiled kernel's gain over the textbook shader is measured side by side.

use torsh_backend::webgpu::{block_on, WebGpuKernelExecutor};
use torsh_backend::{Backend, DType};

use super::cases::Runner;

/// Row-major `C[m, n] = A[m, k] · B[k, n]`, one invocation per element of C.
const NAIVE_MATMUL: &str = r#"
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
struct Dims { m: u32, n: u32, k: u32, pad: u32 }
@group(0) @binding(3) var<uniform> dims: Dims;

@compute @workgroup_size(16, 16)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let row = id.y;
    let col = id.x;
    if (row >= dims.m || col >= dims.n) {
        return;
    }
    var sum = 0.0;
    for (var p = 0u; p < dims.k; p++) {
        sum += a[row * dims.k + p] * b[p * dims.n + col];
    }
    c[row * dims.n + col] = sum;
}
"#;

/// Its name in tables.
pub const NAME: &str = "naive WGSL matmul (one invocation per output, no tiling)";

/// A runner of the naive shader on `backend` for an `m × n × k` f32 product.
pub fn prepare(backend: &Backend, m: usize, n: usize, k: usize) -> Result<Runner<'static>, String> {
    let exec = WebGpuKernelExecutor::new(backend).map_err(|e| e.to_string())?;
    let a = backend
        .randn(&[m, k], DType::F32)
        .map_err(|e| e.to_string())?;
    let b = backend
        .randn(&[k, n], DType::F32)
        .map_err(|e| e.to_string())?;
    let c = backend
        .zeros(&[m, n], DType::F32)
        .map_err(|e| e.to_string())?;
    let word = |v: usize| u32::try_from(v).map_err(|_| format!("{v} exceeds 32 bits"));
    let dims: Vec<u8> = [word(m)?, word(n)?, word(k)?, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let groups = (word(n.div_ceil(16))?, word(m.div_ceil(16))?, 1);
    Ok(Box::new(move || {
        block_on(exec.execute_custom_kernel(
            NAIVE_MATMUL,
            "main",
            &[&a, &b, &c],
            (16, 16, 1),
            groups,
            Some(&dims),
        ))
        .map_err(|e| e.to_string())
    }))
}
