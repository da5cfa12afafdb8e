//! Events on the backend's one queue: each is a submission marker, complete when the queue has
//! finished the work submitted before it, and — where the adapter has `TIMESTAMP_QUERY` — a device
//! timestamp written by an empty compute pass, so two events time the work between them on the
//! device (the bench's clock on WebGPU, like CUDA events on CUDA).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::compute::EventId;
use crate::device::BackendType;
use crate::error::{BackendError, Result};

use super::context::Gpu;
use super::memory::map_read;

/// One recorded event.
#[derive(Debug)]
struct Event {
    submission: wgpu::SubmissionIndex,
    /// Set by the queue's work-done callback.
    done: Arc<AtomicBool>,
    /// The timestamp's read-back buffer (8 bytes, `MAP_READ`), without timestamp queries `None`.
    stamp: Option<wgpu::Buffer>,
    /// The timestamp in ticks, once read.
    ticks: Option<u64>,
}

/// The live events of one backend.
#[derive(Debug, Default)]
pub(crate) struct Events {
    next: u64,
    live: HashMap<u64, Event>,
}

impl Events {
    /// Records an event after everything submitted so far.
    pub fn record(&mut self, gpu: &Gpu) -> Result<EventId> {
        let timed = gpu.features.contains(wgpu::Features::TIMESTAMP_QUERY);
        let (submission, stamp) = gpu.scoped("recording an event", 0, || {
            let mut encoder = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("torsh event"),
                });
            let stamp = timed.then(|| {
                let queries = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("torsh event"),
                    ty: wgpu::QueryType::Timestamp,
                    count: 1,
                });
                // An empty pass whose beginning writes the timestamp.
                drop(encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("torsh event"),
                    timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                        query_set: &queries,
                        beginning_of_pass_write_index: Some(0),
                        end_of_pass_write_index: None,
                    }),
                }));
                let resolved = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("torsh event"),
                    size: 8,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                });
                encoder.resolve_query_set(&queries, 0..1, &resolved, 0);
                let read = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("torsh event"),
                    size: 8,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                encoder.copy_buffer_to_buffer(&resolved, 0, &read, 0, 8);
                read
            });
            (gpu.submit_now([encoder.finish()]), stamp)
        })?;
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        gpu.queue
            .on_submitted_work_done(move || flag.store(true, Ordering::Release));
        self.next += 1;
        self.live.insert(
            self.next,
            Event {
                submission,
                done,
                stamp,
                ticks: None,
            },
        );
        Ok(EventId(self.next))
    }

    fn get(&mut self, op: &'static str, id: EventId) -> Result<&mut Event> {
        self.live.get_mut(&id.0).ok_or_else(|| {
            BackendError::invalid(
                op,
                format!("event {} is not a live event of this backend", id.0),
            )
        })
    }

    /// `InvalidArgument` unless `id` is live (the queue is ordered, so waiting needs nothing else).
    pub fn check(&mut self, op: &'static str, id: EventId) -> Result<()> {
        self.get(op, id).map(|_| ())
    }

    /// Whether the work before `id` has completed (without blocking).
    pub fn complete(&mut self, gpu: &Gpu, id: EventId) -> Result<bool> {
        let _ = gpu.device.poll(wgpu::PollType::Poll);
        Ok(self.get("event_complete", id)?.done.load(Ordering::Acquire))
    }

    /// Blocks until the work before `id` has completed.
    pub fn synchronize(&mut self, gpu: &Gpu, id: EventId) -> Result<()> {
        let submission = self.get("event_synchronize", id)?.submission.clone();
        gpu.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(submission),
                timeout: None,
            })
            .map_err(|e| BackendError::Driver {
                backend: BackendType::WebGpu,
                code: 0,
                message: format!("waiting for an event: {e}"),
            })?;
        gpu.check_alive()
    }

    /// The device timestamp of `id` in ticks, waiting for it. `FeatureUnavailable` without
    /// timestamp queries.
    fn ticks(&mut self, gpu: &Gpu, id: EventId) -> Result<u64> {
        self.synchronize(gpu, id)?;
        let event = self.get("event_elapsed_ms", id)?;
        if let Some(t) = event.ticks {
            return Ok(t);
        }
        let Some(stamp) = &event.stamp else {
            return Err(BackendError::FeatureUnavailable {
                feature: "event timing",
                reason: "this adapter has no timestamp queries (wgpu's TIMESTAMP_QUERY); time on \
                         the host up to synchronize()"
                    .into(),
            });
        };
        let bytes = map_read(gpu, stamp)?;
        let ticks = u64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8]));
        event.ticks = Some(ticks);
        Ok(ticks)
    }

    /// Milliseconds of device time from `start` to `end`, waiting for both.
    pub fn elapsed_ms(&mut self, gpu: &Gpu, start: EventId, end: EventId) -> Result<f32> {
        let (a, b) = (self.ticks(gpu, start)?, self.ticks(gpu, end)?);
        let ns = (b as f64 - a as f64) * f64::from(gpu.queue.get_timestamp_period());
        Ok((ns / 1e6) as f32)
    }

    /// Releases `id`; `InvalidArgument` when it is not live.
    pub fn destroy(&mut self, id: EventId) -> Result<()> {
        match self.live.remove(&id.0) {
            Some(event) => {
                if let Some(stamp) = event.stamp {
                    stamp.destroy();
                }
                Ok(())
            }
            None => Err(BackendError::invalid(
                "destroy_event",
                format!("event {} is not a live event of this backend", id.0),
            )),
        }
    }
}
