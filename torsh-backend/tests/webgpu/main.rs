//! The WebGPU backend on whatever adapter wgpu finds — in CI, Mesa's lavapipe (Vulkan on the CPU).
//! The parity suite (`tests/parity.rs`) and the bad-input tests (`tests/errors/`) run on it as on
//! every available backend; this file adds what is particular to it: the WGSL kernels really serve
//! f32 ops (pipelines get built), GEMM tile edges and transposes, launches larger than one grid
//! dimension, copies that start or end inside a 4-byte word, casts between every pair of dtypes bit
//! for bit, the staging of f16/bf16 and unaligned operands, random fills, the buffer pool, and device
//! selection.
//!
//! Without an adapter every test says why it skips; `TORSH_REQUIRE=webgpu` (set by CI) makes that a
//! failure.

#![cfg(feature = "webgpu")]

use torsh_backend::compute::{
    ComputeBackend, Distribution, DropoutDesc, FillDesc, GemmDesc, StridedBuf, Transpose, UnaryDesc,
};
use torsh_backend::validation;
use torsh_backend::webgpu::{self, WebGpuBackend, WebGpuBackendConfig};
use torsh_backend::{Backend, BackendError, BackendType, DType, UnaryOp};

#[path = "../common/mod.rs"]
mod common;
use common::special_values;

/// An initialised raw backend on the best adapter, or `None` (after saying why) when there is none.
fn raw() -> Option<WebGpuBackend> {
    let mut b = WebGpuBackend::new(WebGpuBackendConfig::default());
    match b.init() {
        Ok(()) => Some(b),
        Err(e) => {
            common::skip("webgpu", e);
            None
        }
    }
}

/// The tensor-level backend, or `None` when there is no adapter.
fn backend() -> Option<Backend> {
    match Backend::webgpu().build() {
        Ok(b) => Some(b),
        Err(e) => {
            common::skip("webgpu", e);
            None
        }
    }
}

fn upload_f32(b: &WebGpuBackend, xs: &[f32]) -> torsh_backend::DevicePtr {
    let ptr = b.alloc(xs.len() * 4).unwrap();
    b.copy_htod(ptr, bytemuck::cast_slice(xs)).unwrap();
    ptr
}

fn download_f32(b: &WebGpuBackend, ptr: torsh_backend::DevicePtr, len: usize) -> Vec<f32> {
    let mut out = vec![0f32; len];
    b.copy_dtoh(bytemuck::cast_slice_mut(&mut out), ptr)
        .unwrap();
    out
}

mod custom;
mod device;
mod dtypes;
mod f16;
mod grid;
mod kernels;
mod large;
mod loop_limit;
mod memory;

use f16::*;
use kernels::*;
use large::*;
