//! Custom WGSL kernels on tensors of a WebGPU backend (`WebGpuKernelExecutor` and
//! `execute_custom_kernel`).
//!
//! The source is parsed with naga before anything reaches the device, so a syntax error comes back
//! as `KernelCompile` with naga's message (line, column, and the offending text); a missing entry
//! point, a workgroup size that differs from the shader's `@workgroup_size` or exceeds the device's
//! limits, and a workgroup count beyond the limits are `InvalidArgument`. Tensors are bound in order
//! at `@group(0) @binding(0..)` as storage buffers covering exactly their elements (so
//! `arrayLength` is the tensor's length), and the uniform bytes, if any, at the next binding. What
//! only the driver can check (binding types against the shader, for instance) is caught by an error
//! scope and returned as `InvalidArgument` with wgpu's description — never a panic.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use wgpu::util::DeviceExt;

use crate::backend::Backend;
use crate::error::{BackendError, Result};
use crate::tensor::Tensor;

use super::WebGpuBackend;

/// Kernel-cache figures (`pipeline_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PipelineStats {
    /// Pipelines built and kept: the backend's own kernels and custom ones.
    pub pipeline_count: usize,
    /// Kernel launches recorded so far on the backend's device, its own and custom ones.
    pub kernel_launches: u64,
}

/// Runs WGSL compute shaders of the caller's on the tensors of one WebGPU backend.
#[derive(Clone, Debug)]
pub struct WebGpuKernelExecutor {
    backend: Backend,
}

/// One custom launch, checked.
pub(crate) struct CustomLaunch<'a> {
    pub source: &'a str,
    pub entry_point: &'a str,
    pub workgroup_count: (u32, u32, u32),
    pub uniforms: Option<&'a [u8]>,
}

impl WebGpuKernelExecutor {
    /// An executor on `backend`; `InvalidArgument` unless it is a WebGPU backend.
    pub fn new(backend: &Backend) -> Result<WebGpuKernelExecutor> {
        webgpu_of(backend)?;
        Ok(WebGpuKernelExecutor {
            backend: backend.clone(),
        })
    }

    /// Runs `entry_point` of the WGSL `source` over `workgroup_count` workgroups of `workgroup_size`
    /// (which must equal the shader's `@workgroup_size`), with `buffers` bound at
    /// `@group(0) @binding(0..)` as `read_write` or `read` storage and `uniform_data` (padded to 16
    /// bytes) at the binding after them. The launch is ordered after earlier ops of the backend and
    /// before later ones. Errors: `KernelCompile` for WGSL that does not compile, `InvalidArgument`
    /// for a missing entry point, a bad workgroup size or count, a non-contiguous tensor or one whose
    /// bytes do not start on the device's storage-offset alignment or are not a whole number of
    /// 4-byte words, and bindings the driver rejects; `DeviceMismatch` for a tensor of another backend.
    pub async fn execute_custom_kernel(
        &self,
        source: &str,
        entry_point: &str,
        buffers: &[&Tensor],
        workgroup_size: (u32, u32, u32),
        workgroup_count: (u32, u32, u32),
        uniform_data: Option<&[u8]>,
    ) -> Result<()> {
        let raw = webgpu_of(&self.backend)?;
        for (i, t) in buffers.iter().enumerate() {
            if !t.backend().same_instance(&self.backend) {
                return Err(BackendError::DeviceMismatch {
                    op: "execute_custom_kernel",
                    details: format!("buffer {i} lives on another backend instance"),
                });
            }
            if !t.is_contiguous() {
                return Err(BackendError::invalid(
                    "execute_custom_kernel",
                    format!("buffer {i} is a strided view: bind t.contiguous()? instead"),
                ));
            }
        }
        check_source(source, entry_point, workgroup_size)?;
        let bindings: Vec<(crate::compute::DevicePtr, usize)> = buffers
            .iter()
            .map(|t| {
                let first = t
                    .strided_buf()
                    .ptr
                    .offset(t.layout().offset() * t.dtype().size_in_bytes());
                first
                    .map(|p| (p, t.numel() * t.dtype().size_in_bytes()))
                    .ok_or_else(|| {
                        BackendError::overflow("execute_custom_kernel", "tensor offset overflows")
                    })
            })
            .collect::<Result<_>>()?;
        raw.custom_kernel(
            CustomLaunch {
                source,
                entry_point,
                workgroup_count,
                uniforms: uniform_data,
            },
            workgroup_size,
            &bindings,
        )
    }

    /// Waits for every launch so far (and every other op of the backend) to finish.
    pub async fn synchronize(&self) -> Result<()> {
        self.backend.synchronize()
    }

    /// How many pipelines the backend has built, and how many kernels it has launched.
    pub fn pipeline_stats(&self) -> PipelineStats {
        let backend = webgpu_of(&self.backend).ok();
        PipelineStats {
            pipeline_count: backend.map_or(0, |b| b.pipeline_count()),
            kernel_launches: backend.and_then(|b| b.kernel_launches().ok()).unwrap_or(0),
        }
    }
}

/// The WebGPU backend behind `backend`, or `InvalidArgument`.
fn webgpu_of(backend: &Backend) -> Result<&WebGpuBackend> {
    backend
        .compute()
        .as_any()
        .and_then(|a| a.downcast_ref::<WebGpuBackend>())
        .ok_or_else(|| {
            BackendError::invalid(
                "WebGpuKernelExecutor",
                format!(
                    "custom WGSL kernels need a WebGPU backend, not {}",
                    backend.backend_type()
                ),
            )
        })
}

/// Parses `source` and checks `entry_point` and its workgroup size.
fn check_source(source: &str, entry_point: &str, workgroup_size: (u32, u32, u32)) -> Result<()> {
    let module =
        wgpu::naga::front::wgsl::parse_str(source).map_err(|e| BackendError::KernelCompile {
            backend: crate::device::BackendType::WebGpu,
            kernel: entry_point.to_string(),
            log: e.emit_to_string(source),
        })?;
    let compute: Vec<_> = module
        .entry_points
        .iter()
        .filter(|e| e.stage == wgpu::naga::ShaderStage::Compute)
        .collect();
    let Some(entry) = compute.iter().find(|e| e.name == entry_point) else {
        let names: Vec<_> = compute.iter().map(|e| e.name.as_str()).collect();
        return Err(BackendError::invalid(
            "execute_custom_kernel",
            format!("no compute entry point `{entry_point}` in the shader (it has {names:?})"),
        ));
    };
    let declared = (
        entry.workgroup_size[0],
        entry.workgroup_size[1],
        entry.workgroup_size[2],
    );
    if entry.workgroup_size_overrides.is_none() && declared != workgroup_size {
        return Err(BackendError::invalid(
            "execute_custom_kernel",
            format!("invalid workgroup size {workgroup_size:?}: `{entry_point}` declares @workgroup_size{declared:?}"),
        ));
    }
    Ok(())
}

impl WebGpuBackend {
    /// Runs a checked custom launch with `bindings` (first byte and length of each buffer).
    pub(crate) fn custom_kernel(
        &self,
        launch: CustomLaunch<'_>,
        workgroup_size: (u32, u32, u32),
        bindings: &[(crate::compute::DevicePtr, usize)],
    ) -> Result<()> {
        let state = self.state()?;
        let gpu = &state.device.gpu;
        let l = &gpu.limits;
        let (x, y, z) = workgroup_size;
        let invocations = u64::from(x) * u64::from(y) * u64::from(z);
        if x == 0
            || y == 0
            || z == 0
            || x > l.max_compute_workgroup_size_x
            || y > l.max_compute_workgroup_size_y
            || z > l.max_compute_workgroup_size_z
            || invocations > u64::from(l.max_compute_invocations_per_workgroup)
        {
            return Err(BackendError::invalid(
                "execute_custom_kernel",
                format!(
                    "invalid workgroup size {workgroup_size:?}: this device allows up to ({}, {}, {}) and {} invocations",
                    l.max_compute_workgroup_size_x,
                    l.max_compute_workgroup_size_y,
                    l.max_compute_workgroup_size_z,
                    l.max_compute_invocations_per_workgroup
                ),
            ));
        }
        let (cx, cy, cz) = launch.workgroup_count;
        let most = l.max_compute_workgroups_per_dimension;
        if cx > most || cy > most || cz > most {
            return Err(BackendError::invalid(
                "execute_custom_kernel",
                format!(
                    "workgroup count {:?} exceeds {most} per dimension",
                    launch.workgroup_count
                ),
            ));
        }
        let mem = state.memory();
        let align = u64::from(l.min_storage_buffer_offset_alignment);
        let mut places = Vec::with_capacity(bindings.len());
        for (i, &(ptr, bytes)) in bindings.iter().enumerate() {
            let place = mem.place(ptr, bytes)?;
            if bytes == 0 || bytes % 4 != 0 || place.offset % align != 0 {
                return Err(BackendError::invalid(
                    "execute_custom_kernel",
                    format!(
                        "buffer {i} ({bytes} bytes at offset {}) must be a non-empty whole number of 4-byte words starting on a {align}-byte boundary",
                        place.offset
                    ),
                ));
            }
            places.push((place, bytes as u64));
        }
        let pipeline = state
            .kernels
            .custom(gpu, launch.source, launch.entry_point)?;
        let user_error = |e: BackendError| match e {
            BackendError::Driver { message, .. } => {
                BackendError::invalid("execute_custom_kernel", message)
            }
            other => other,
        };
        gpu.scoped(launch.entry_point, 0, || {
            let uniforms = launch.uniforms.map(|data| {
                let mut padded = data.to_vec();
                padded.resize(data.len().next_multiple_of(16).max(16), 0);
                gpu.device
                    .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                        label: Some("torsh custom uniforms"),
                        contents: &padded,
                        usage: wgpu::BufferUsages::UNIFORM,
                    })
            });
            let mut entries: Vec<wgpu::BindGroupEntry<'_>> = places
                .iter()
                .enumerate()
                .map(|(i, (place, bytes))| wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: place.buffer,
                        offset: place.offset,
                        size: std::num::NonZeroU64::new(*bytes),
                    }),
                })
                .collect();
            if let Some(u) = uniforms.as_ref() {
                entries.push(wgpu::BindGroupEntry {
                    binding: places.len() as u32,
                    resource: u.as_entire_binding(),
                });
            }
            let bind_group = (!entries.is_empty()).then(|| {
                gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(launch.entry_point),
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &entries,
                })
            });
            let mut encoder = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some(launch.entry_point),
                });
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some(launch.entry_point),
                    timestamp_writes: None,
                });
                pass.set_pipeline(&pipeline);
                if let Some(g) = bind_group.as_ref() {
                    pass.set_bind_group(0, g, &[]);
                }
                pass.dispatch_workgroups(cx, cy, cz);
                gpu.count_launch();
            }
            gpu.submit(encoder.finish());
        })
        .map_err(user_error)
    }
}

/// A cache key for a custom shader: a hash of its source, and its entry point.
pub(crate) fn custom_key(source: &str, entry_point: &str) -> (u64, String) {
    let mut h = DefaultHasher::new();
    source.hash(&mut h);
    (h.finish(), entry_point.to_string())
}

/// Shared by the kernel cache: a custom pipeline with the layout wgpu derives from the shader.
pub(crate) fn build_custom(
    gpu: &super::context::Gpu,
    source: &str,
    entry_point: &str,
) -> Result<Arc<wgpu::ComputePipeline>> {
    let kernel = format!("custom:{entry_point}");
    let compile = |e: BackendError| match e {
        BackendError::Driver { message, .. } => BackendError::KernelCompile {
            backend: crate::device::BackendType::WebGpu,
            kernel: kernel.clone(),
            log: message,
        },
        other => other,
    };
    let module = gpu
        .scoped(&kernel, 0, || {
            gpu.device
                .create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some("torsh custom kernel"),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                })
        })
        .map_err(compile)?;
    let pipeline = gpu
        .scoped(&kernel, 0, || {
            gpu.device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(entry_point),
                    layout: None,
                    module: &module,
                    entry_point: Some(entry_point),
                    compilation_options: wgpu::PipelineCompilationOptions::default(),
                    cache: None,
                })
        })
        .map_err(compile)?;
    Ok(Arc::new(pipeline))
}
