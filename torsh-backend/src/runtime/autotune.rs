//! The autotuner (seed 001's `enable_autotuning` + `autotuning_cache_file`), shared by every backend.
//!
//! A backend that can run an op several ways lists named variants for it
//! ([`ComputeBackend::variants`]); the CPU backend, for instance, can run a GEMM on the calling thread
//! or on its thread pool. With autotuning on, the first op of each key (device fingerprint, op,
//! dtype, shape bucket, layout; see [`TunableOp::key`]) runs every variant on a scratch copy of its
//! output: the default first, whose result is the yardstick, then each other variant, whose result
//! must be within the dtype's parity bound of it before it may be timed (a variant that differs is
//! counted as rejected and never chosen). The fastest by median wall time, waited for on the device,
//! wins and serves every later op of that key. The op itself then runs once with the winner.
//!
//! The table can live in a JSON file: the crate version, the device fingerprint and, per key, the
//! winner with its and the default's time. A file written by another crate version or for another
//! device, or one that does not parse, is ignored with a warning through the `log` crate, and
//! overwritten by the next save; a stored choice the backend no longer offers is tuned again. A save
//! takes an exclusive lock on `<file>.lock`, merges the entries other writers saved meanwhile, writes
//! a temporary file and renames it over the cache (atomic on POSIX): concurrent writers neither tear
//! the file nor lose each other's entries, and a reader never sees half a file.
//!
//! Tuning runs on the device directly, never through a graph capture's recorder: an op captured on
//! a key not tuned yet is tuned as it would be eagerly, and the capture records only the chosen
//! variant, so replay and eager execution run the same kernel.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::compute::{ComputeBackend, DevicePtr, TunableOp, TuneKey};
use crate::dtype::DType;
use crate::error::{BackendError, Result};

/// The cache file layout this version reads and writes.
const CACHE_FORMAT: u32 = 1;

/// Wall time of one timed batch of runs of a candidate: enough runs to fill it, at least one.
const BATCH_SECS: f64 = 2e-3;

/// Timed batches per candidate, taken in turns with the other candidates; the median counts.
const TIMING_ROUNDS: usize = 7;

/// How much faster than the default a variant must be to win: ties and noise keep the default. 10 %:
/// on the shared 2-vCPU machine this was measured on, a thread pool's time drifts by more than 3 %
/// between the tuning and later runs, and a 5 % win at tuning time became a 0.55× loss afterwards
/// (a conv2d that the pool ran at 372 µs, timed at 709 µs while tuning against 670 µs inline).
const WIN_MARGIN: f64 = 0.90;

/// What the autotuner has done, for [`Backend::autotuning_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AutotuneStats {
    /// Keys in the table: tuned here or loaded from the cache file.
    pub entries: usize,
    /// Keys tuned in this process (their candidates timed).
    pub tuned: u64,
    /// Entries taken from the cache file.
    pub loaded: u64,
    /// Ops served by a stored choice without tuning.
    pub hits: u64,
    /// Candidates whose output differed from the default's beyond the dtype's bound; never chosen.
    pub rejected: u64,
    /// Cache files ignored as stale, foreign or corrupt.
    pub ignored_files: u64,
    /// Saves of the cache file that failed (logged; the table in memory is unaffected).
    pub save_errors: u64,
}

/// The choice stored for one key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TunedChoice {
    /// The winning variant's name.
    pub variant: String,
    /// Its median time per op, in microseconds.
    pub micros: f64,
    /// The default variant's median time per op, in microseconds.
    pub default_micros: f64,
}

/// The cache file.
#[derive(Serialize, Deserialize)]
struct CacheFile {
    format: u32,
    crate_version: String,
    device: String,
    entries: BTreeMap<String, TunedChoice>,
}

/// One backend's tuning state.
#[derive(Debug, Default)]
pub(crate) struct Autotuner {
    enabled: bool,
    /// Choices of keys met in this process (a hit is a hash of the key, no formatting).
    table: HashMap<TuneKey, TunedChoice>,
    /// Choices loaded from the cache file for keys not met yet, by their text form.
    stored: BTreeMap<String, TunedChoice>,
    file: Option<PathBuf>,
    stats: AutotuneStats,
}

/// Why a cache file cannot be trusted.
enum Untrusted {
    Missing,
    Rejected(String),
}

/// The entries of the cache file at `path` when it was written by this crate version for
/// `device`; otherwise why not.
fn read_cache(path: &Path, device: &str) -> std::result::Result<CacheFile, Untrusted> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Untrusted::Missing),
        Err(e) => return Err(Untrusted::Rejected(format!("it cannot be read: {e}"))),
    };
    let file: CacheFile = serde_json::from_str(&text)
        .map_err(|e| Untrusted::Rejected(format!("it is corrupt: {e}")))?;
    let version = env!("CARGO_PKG_VERSION");
    if file.format != CACHE_FORMAT || file.crate_version != version {
        return Err(Untrusted::Rejected(format!(
            "it is stale: written by torsh-backend {} (format {}), this is {version} (format {CACHE_FORMAT})",
            file.crate_version, file.format
        )));
    }
    if file.device != device {
        return Err(Untrusted::Rejected(format!(
            "it is foreign: written for device `{}`, this is `{device}`",
            file.device
        )));
    }
    let bad = file
        .entries
        .iter()
        .find(|(_, c)| c.variant.is_empty() || !c.micros.is_finite() || c.micros < 0.0);
    if let Some((key, _)) = bad {
        return Err(Untrusted::Rejected(format!(
            "it is corrupt: entry `{key}` is malformed"
        )));
    }
    Ok(file)
}

/// Writes `file` to `path` through a temporary file in the same folder and a rename.
fn write_atomically(path: &Path, file: &CacheFile) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let text = serde_json::to_string_pretty(file).map_err(std::io::Error::other)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "autotune".into());
    let tmp = path.with_file_name(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Reads the cache at `path`, merges `table` into it and writes it back, holding an exclusive lock on
/// `<path>.lock` throughout so that writers in other processes (or backends) do not lose each
/// other's entries.
fn merge_and_write(
    path: &Path,
    device: &str,
    table: &BTreeMap<String, TunedChoice>,
) -> std::io::Result<()> {
    let mut lock_name = path.as_os_str().to_owned();
    lock_name.push(".lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(PathBuf::from(lock_name))?;
    lock.lock()?;
    let mut entries = read_cache(path, device)
        .map(|f| f.entries)
        .unwrap_or_default();
    entries.extend(table.iter().map(|(k, v)| (k.clone(), v.clone())));
    let file = CacheFile {
        format: CACHE_FORMAT,
        crate_version: env!("CARGO_PKG_VERSION").into(),
        device: device.into(),
        entries,
    };
    let written = write_atomically(path, &file);
    let _ = lock.unlock();
    written
}

impl Autotuner {
    /// Every choice, by the text form of its key.
    fn all(&self) -> BTreeMap<String, TunedChoice> {
        let mut all = self.stored.clone();
        all.extend(self.table.iter().map(|(k, v)| (k.to_string(), v.clone())));
        all
    }

    /// The stored variant for `key` when it is one of `offered`, moving a choice loaded from the
    /// file into the table on first use.
    fn choice(&mut self, key: &TuneKey, offered: &[&'static str]) -> Option<&'static str> {
        if !self.table.contains_key(key) {
            let loaded = self.stored.remove(&key.to_string())?;
            self.table.insert(*key, loaded);
        }
        let stored = &self.table.get(key)?.variant;
        offered.iter().find(|&&v| v == stored).copied()
    }

    /// Saves the table to the cache file, if one is set, keeping entries another writer saved for
    /// keys this one has not tuned.
    fn save(&mut self, device: &str) {
        let Some(path) = self.file.clone() else {
            return;
        };
        if let Err(e) = merge_and_write(&path, device, &self.all()) {
            self.stats.save_errors += 1;
            log::warn!(
                "torsh-backend autotuner: could not save {}: {e}",
                path.display()
            );
        }
    }
}

/// A device buffer freed on drop.
struct Scratch<'a> {
    device: &'a dyn ComputeBackend,
    ptr: DevicePtr,
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        let _ = self.device.free(self.ptr);
    }
}

/// The values of `bytes` of `dtype`, as f64.
fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    fn each<T: crate::dtype::Element>(bytes: &[u8]) -> Vec<f64> {
        bytes
            .chunks_exact(std::mem::size_of::<T>())
            .map(|c| bytemuck::pod_read_unaligned::<T>(c).to_f64())
            .collect()
    }
    match dtype {
        DType::F32 => each::<f32>(bytes),
        DType::F64 => each::<f64>(bytes),
        DType::F16 => each::<half::f16>(bytes),
        DType::BF16 => each::<half::bf16>(bytes),
        DType::I32 => each::<i32>(bytes),
        DType::I64 => each::<i64>(bytes),
        DType::U8 => each::<u8>(bytes),
    }
}

/// Times `variants` of `op` on scratch copies of its output and returns the winner, with the number
/// of candidates rejected for a wrong answer. The op's own output is not touched.
fn tune(
    device: &dyn ComputeBackend,
    op: &TunableOp,
    variants: &[&'static str],
) -> Result<(TunedChoice, u64)> {
    let (out, bytes) = op.output()?;
    let scratch = Scratch {
        device,
        ptr: device.alloc(bytes)?,
    };
    let on_scratch = op.with_output(scratch.ptr);
    // Each check starts from the output as it is now, as the op would (beta ≠ 0 reads it).
    let run_checked = |variant: &str| -> Result<Vec<f64>> {
        device.copy_dtod(scratch.ptr, out, bytes)?;
        device.run_variant(&on_scratch, variant)?;
        let mut host = vec![0u8; bytes];
        device.copy_dtoh(&mut host, scratch.ptr)?;
        Ok(decode(op.dtype(), &host))
    };
    let default = variants[0];
    let yardstick = run_checked(default)?;
    let bound = crate::validation::tolerance(op.dtype());
    let mut contenders = vec![default];
    let mut rejected = 0;
    for &variant in &variants[1..] {
        let answer = run_checked(variant)?;
        let cmp = crate::validation::compare(&answer, &yardstick);
        if cmp.within(bound) {
            contenders.push(variant);
        } else {
            rejected += 1;
            log::warn!(
                "torsh-backend autotuner: variant `{variant}` of {} gave a different answer \
                 ({cmp}); it is never chosen",
                op.key()
            );
        }
    }
    // Timing: each contender sized to a batch of about BATCH_SECS, then batches taken in turns, each
    // after an untimed batch of the same contender (a pool's threads woken, caches filled), so drift
    // affects all alike.
    let run = |variant: &str| device.run_variant(&on_scratch, variant);
    let batch = |variant: &str, reps: usize| -> Result<f64> {
        // As long untimed first: idle cores (and a virtual machine's idle vCPUs) take a while to
        // come back to speed after another contender's turn.
        for _ in 0..reps {
            run(variant)?;
        }
        device.synchronize()?;
        // Then each run timed alone, waited for; the batch's median resists the odd preempted run.
        let mut each = Vec::with_capacity(reps);
        for _ in 0..reps {
            let start = Instant::now();
            run(variant)?;
            device.synchronize()?;
            each.push(start.elapsed().as_secs_f64());
        }
        each.sort_by(f64::total_cmp);
        Ok(each[reps / 2])
    };
    let mut reps = Vec::with_capacity(contenders.len());
    for &variant in &contenders {
        let typical = batch(variant, 8)?;
        reps.push((BATCH_SECS / typical.max(1e-9)).clamp(8.0, 1000.0) as usize);
    }
    let mut samples = vec![Vec::with_capacity(TIMING_ROUNDS); contenders.len()];
    for _ in 0..TIMING_ROUNDS {
        for (i, &variant) in contenders.iter().enumerate() {
            samples[i].push(batch(variant, reps[i])?);
        }
    }
    let medians: Vec<f64> = samples
        .iter_mut()
        .map(|s| {
            s.sort_by(f64::total_cmp);
            s[s.len() / 2] * 1e6
        })
        .collect();
    let default_micros = medians[0];
    let (mut best, mut best_micros) = (default, default_micros);
    for (&variant, &micros) in contenders.iter().zip(&medians).skip(1) {
        if micros < best_micros.min(default_micros * WIN_MARGIN) {
            (best, best_micros) = (variant, micros);
        }
    }
    Ok((
        TunedChoice {
            variant: best.into(),
            micros: best_micros,
            default_micros,
        },
        rejected,
    ))
}

impl Backend {
    /// Turns the autotuner on or off for this backend (all its clones), returning the backend for
    /// chaining (seed 001's `enable_autotuning`). While on, ops with several kernel variants on this
    /// backend time them on first use of each shape bucket and then use the fastest that gives the
    /// default's answer. Choices made so far are kept when it is turned off.
    pub fn enable_autotuning(self, on: bool) -> Backend {
        self.tuner().enabled = on;
        self
    }

    /// Keeps the autotuner's table in the JSON file at `path` (seed 001's `autotuning_cache_file`):
    /// loads its entries now when it was written by this crate version for this device, and saves
    /// the table there after every new tuning. A stale, foreign or corrupt file is ignored with a
    /// `log` warning and replaced at the next save; a missing file is created then. Returns the
    /// backend for chaining; `Io` when the folder of `path` does not exist.
    pub fn autotuning_cache_file(self, path: impl AsRef<Path>) -> Result<Backend> {
        let path = path.as_ref().to_path_buf();
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !folder.is_dir() {
            return Err(BackendError::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "the autotuning cache file's folder {} does not exist",
                    folder.display()
                ),
            )));
        }
        let device = self.compute().fingerprint();
        let mut tuner = self.tuner();
        match read_cache(&path, &device) {
            Ok(file) => {
                tuner.stats.loaded += file.entries.len() as u64;
                tuner.stored.extend(file.entries);
            }
            Err(Untrusted::Missing) => {}
            Err(Untrusted::Rejected(why)) => {
                tuner.stats.ignored_files += 1;
                log::warn!(
                    "torsh-backend autotuner: ignoring the cache file {}: {why}",
                    path.display()
                );
            }
        }
        tuner.file = Some(path);
        drop(tuner);
        Ok(self)
    }

    /// What the autotuner has done: entries, keys tuned, entries loaded, hits, rejected candidates.
    pub fn autotuning_stats(&self) -> AutotuneStats {
        let tuner = self.tuner();
        AutotuneStats {
            entries: tuner.table.len() + tuner.stored.len(),
            ..tuner.stats
        }
    }

    /// The stored choices, by the text form of their key ([`TunableOp::key`]), sorted.
    pub fn autotuning_choices(&self) -> Vec<(String, TunedChoice)> {
        self.tuner().all().into_iter().collect()
    }

    /// Runs `op` with the variant the autotuner chose for its key, tuning the key first when it has
    /// no choice yet; the plain way when autotuning is off or the backend offers fewer than two
    /// variants.
    pub(crate) fn run_tunable(&self, op: &TunableOp) -> Result<()> {
        let device = self.compute();
        if !self.tuner().enabled {
            return op.run_default(device);
        }
        let variants = device.variants(op);
        if variants.len() < 2 {
            return op.run_default(device);
        }
        let key = op.key();
        let stored = {
            let mut tuner = self.tuner();
            let stored = tuner.choice(&key, variants);
            tuner.stats.hits += u64::from(stored.is_some());
            stored
        };
        if let Some(v) = stored {
            return device.run_variant(op, v);
        }
        // Tuning runs on the device itself, never through a capture's recorder: a capture tunes as
        // eager execution would, and records only the op.
        let (choice, rejected) = tune(self.unrecorded(), op, variants)?;
        let winner = variants
            .iter()
            .find(|&&v| v == choice.variant)
            .copied()
            .unwrap_or(variants[0]);
        {
            let fingerprint = device.fingerprint();
            let mut tuner = self.tuner();
            tuner.stats.tuned += 1;
            tuner.stats.rejected += rejected;
            tuner.table.insert(key, choice);
            tuner.save(&fingerprint);
        }
        device.run_variant(op, winner)
    }
}
