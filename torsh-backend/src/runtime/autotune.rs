//! The autotuner (`enable_autotuning` and `autotuning_cache_file`), shared by every backend.
//!
//! A backend that can run an op several ways lists named variants for it
//! ([`ComputeBackend::variants`]); the CPU backend, for instance, can run a GEMM on the calling thread
//! or on its thread pool. With autotuning on, the first op of each key (device fingerprint, op,
//! dtype, shape bucket, layout; see [`TunableOp::key`]) runs every variant on a scratch copy of its
//! output: the default first, whose result is the yardstick, then each other variant, whose result
//! must be within the dtype's parity bound of it before it may be timed (a variant that differs, or
//! fails to run, is counted as rejected and never chosen). Each variant that passes is timed in paired rounds
//! against the default (a batch of each, back to back, in alternating order, waited for on the
//! device), so that drift in the machine's speed cancels in each round's ratio; it wins when the
//! median ratio is below 0.90 and it was faster in three quarters of its rounds. The best such
//! variant is then timed against the default in fresh rounds and kept only when they confirm the
//! win; otherwise the default stays. The choice serves every later op of that key. The op itself
//! then runs once with the chosen variant.
//!
//! A choice is revisited: a key is tuned again, the same way, once its ops have run long enough that
//! the tuning cost at most a set fraction of their time (5 % by default, see
//! [`Backend::autotuning_revisit_overhead`]), counting each op at its stored time. A revisit that
//! confirms the choice doubles the wait before the next, so that a stable key's revisits cost ever
//! less; one that changes it starts the schedule again. The conditions of one tuning — a thread
//! pool's cores busy elsewhere, a GPU still clocking up, a neighbour on a shared host — thus do not
//! fix a key's variant for good, nor, through the cache file, for every later process: a loaded
//! choice is revisited on the same schedule, its tuning cost estimated from its stored times. A
//! revisit may change which variant serves a key and so the last bits of its results (within the
//! dtype's parity bound of the default's, as any choice is); a graph captured before keeps the
//! variants it recorded.
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
use crate::error::{BackendError, Result};

/// The cache file layout this version reads and writes.
const CACHE_FORMAT: u32 = 1;

/// Wall time of one timed batch of runs of a candidate: enough runs to fill it, at least one.
const BATCH_SECS: f64 = 2e-3;

/// Paired rounds per candidate: in each, one batch of the candidate and one of the default, back
/// to back and in alternating order, whose ratio is the round's verdict. A drift in the machine's
/// speed (a thread pool's cores clocking down, a neighbour on a shared host) moves both batches of
/// a round alike and cancels in the ratio, where separate medians of each would absorb it.
const TIMING_ROUNDS: usize = 7;

/// Paired rounds of the winner against the default once more, after every candidate's rounds: the
/// winner is kept only when these confirm it, so a win that the conditions of its own rounds made
/// does not stand.
const CONFIRM_ROUNDS: usize = 5;

/// How much faster than the default a variant must be to win, as the median of its rounds' time
/// ratios: ties and noise keep the default. A thread pool's time can drift by more than a few
/// percent between tuning and later runs, so a small win at tuning time may be a loss afterwards
/// (`docs/runtime.md` has the measurements behind 10 %).
const WIN_MARGIN: f64 = 0.90;

/// In how many of its rounds (as a fraction) a variant must be faster than the default to win,
/// besides its median: a win carried by a few fast rounds is noise.
const CONSISTENCY: f64 = 0.75;

/// The default largest fraction of a key's op time that its revisits may take (see
/// [`Backend::autotuning_revisit_overhead`]).
const REVISIT_OVERHEAD: f64 = 0.05;

/// The fewest ops of a key between its tuning and its revisit, whatever the times.
const REVISIT_MIN_HITS: u64 = 16;

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
    /// Candidates whose output differed from the default's beyond the dtype's bound, or that
    /// failed to run the op (an error, not the op's); never chosen.
    pub rejected: u64,
    /// Cache files ignored as stale, foreign or corrupt.
    pub ignored_files: u64,
    /// Saves of the cache file that failed (logged; the table in memory is unaffected).
    pub save_errors: u64,
    /// Keys tuned again on their revisit schedule (see [`Backend::autotuning_revisit_overhead`]).
    pub revisits: u64,
    /// Revisits that changed a key's variant.
    pub revised: u64,
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

/// When a key in the table is due to be tuned again.
#[derive(Clone, Copy, Debug)]
struct Revisit {
    /// Ops of the key served since its last tuning.
    hits: u64,
    /// The hit count at which it is tuned again; `u64::MAX` when revisits are off.
    due: u64,
    /// A revisit of the key is under way (on some thread): no other hit is due until it is done.
    running: bool,
    /// What its last tuning took (estimated for a choice loaded from the cache file).
    tuning_secs: f64,
    /// Revisits in a row that kept its variant: each doubles the wait for the next.
    confirmations: u32,
}

/// One backend's tuning state.
#[derive(Debug)]
pub(crate) struct Autotuner {
    /// Choices of keys met in this process (a hit is a hash of the key, no formatting).
    table: HashMap<TuneKey, TunedChoice>,
    /// Choices loaded from the cache file for keys not met yet, by their text form.
    stored: BTreeMap<String, TunedChoice>,
    /// The revisit schedule of each key in `table`.
    schedule: HashMap<TuneKey, Revisit>,
    /// The largest fraction of a key's op time its revisits may take; 0 turns them off.
    revisit_overhead: f64,
    file: Option<PathBuf>,
    stats: AutotuneStats,
}

impl Default for Autotuner {
    fn default() -> Self {
        Autotuner {
            table: HashMap::new(),
            stored: BTreeMap::new(),
            schedule: HashMap::new(),
            revisit_overhead: REVISIT_OVERHEAD,
            file: None,
            stats: AutotuneStats::default(),
        }
    }
}

/// The number of ops of a key, each taking `op_micros`, after which a tuning that took
/// `tuning_secs` cost at most `overhead` of their time (at least [`REVISIT_MIN_HITS`]), doubled per
/// confirmation; never (`u64::MAX`) when `overhead` is 0 or the wait exceeds u64.
fn revisit_due(overhead: f64, tuning_secs: f64, op_micros: f64, confirmations: u32) -> u64 {
    if overhead <= 0.0 {
        return u64::MAX;
    }
    let op_secs = (op_micros * 1e-6).max(1e-9);
    // `as` saturates: a wait beyond u64 is never.
    let first = ((tuning_secs.max(0.0) / (overhead * op_secs)).ceil() as u64).max(REVISIT_MIN_HITS);
    let doubling = 1u64.checked_shl(confirmations).unwrap_or(u64::MAX);
    first.saturating_mul(doubling)
}

/// About what tuning a key with `variants` variants and the stored times of `choice` takes: every
/// round is a batch of two variants, each run untimed and then timed (see `tune`).
fn estimated_tuning_secs(variants: usize, choice: &TunedChoice) -> f64 {
    let batch = |micros: f64| 2.0 * BATCH_SECS.max(8.0 * micros * 1e-6);
    let rounds = variants.saturating_sub(1) * TIMING_ROUNDS + CONFIRM_ROUNDS;
    rounds as f64 * (batch(choice.micros) + batch(choice.default_micros))
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

    /// Counts a hit of `key`, whose choice is in the table, and says whether the key is due to be
    /// tuned again; when it is, no other hit is due until the revisit is done ([`Self::retuned`]).
    fn hit_is_due(&mut self, key: &TuneKey, variants: usize) -> bool {
        let overhead = self.revisit_overhead;
        let Some(choice) = self.table.get(key) else {
            return false;
        };
        let revisit = self.schedule.entry(*key).or_insert_with(|| {
            // A choice loaded from the cache file: its tuning is estimated.
            let tuning_secs = estimated_tuning_secs(variants, choice);
            Revisit {
                hits: 0,
                due: revisit_due(overhead, tuning_secs, choice.micros, 0),
                tuning_secs,
                confirmations: 0,
                running: false,
            }
        });
        revisit.hits += 1;
        if revisit.running || revisit.hits < revisit.due {
            return false;
        }
        revisit.running = true;
        true
    }

    /// Stores `choice` for `key`, tuned in `tuning_secs`, and starts its revisit schedule: from
    /// the beginning for a new or changed choice, with a doubled wait for one a revisit confirmed.
    fn retuned(&mut self, key: TuneKey, choice: TunedChoice, tuning_secs: f64, confirmed: bool) {
        let confirmations = match self.schedule.get(&key) {
            Some(r) if confirmed => r.confirmations.saturating_add(1),
            _ => 0,
        };
        let due = revisit_due(
            self.revisit_overhead,
            tuning_secs,
            choice.micros,
            confirmations,
        );
        self.schedule.insert(
            key,
            Revisit {
                hits: 0,
                due,
                tuning_secs,
                confirmations,
                running: false,
            },
        );
        self.table.insert(key, choice);
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
        let dtype = op.dtype();
        let values = host.chunks_exact(dtype.size_in_bytes());
        Ok(values.map(|b| crate::dtype::decode(dtype, b)).collect())
    };
    let default = variants[0];
    let yardstick = run_checked(default)?;
    let bound = crate::validation::tolerance(op.dtype());
    let mut contenders = vec![default];
    let mut rejected = 0;
    for &variant in &variants[1..] {
        // A variant that cannot run this op (a library declining the shape, no room for its
        // workspace) is rejected like a wrong one; the default's failure is the op's.
        let answer = match run_checked(variant) {
            Ok(answer) => answer,
            Err(e) => {
                rejected += 1;
                log::info!(
                    "torsh-backend autotuner: variant `{variant}` of {} cannot run it ({e}); it \
                     is not a candidate",
                    op.key()
                );
                continue;
            }
        };
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
    // Timing: each contender sized to a batch of about BATCH_SECS, then paired rounds against the
    // default (see TIMING_ROUNDS), each batch after an untimed one of the same contender (a pool's
    // threads woken, caches filled).
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
    let reps_for = |variant: &str| -> Result<usize> {
        let typical = batch(variant, 8)?;
        Ok((BATCH_SECS / typical.max(1e-9)).clamp(8.0, 1000.0) as usize)
    };
    let default_reps = reps_for(default)?;
    // `rounds` paired rounds of `variant` against the default: (variant, default) seconds per op.
    let paired = |variant: &str, reps: usize, rounds: usize| -> Result<Vec<(f64, f64)>> {
        (0..rounds)
            .map(|r| {
                if r % 2 == 0 {
                    let v = batch(variant, reps)?;
                    Ok((v, batch(default, default_reps)?))
                } else {
                    let d = batch(default, default_reps)?;
                    Ok((batch(variant, reps)?, d))
                }
            })
            .collect()
    };
    // Every default time of every round, for the default's figure when it stays.
    let mut default_times = Vec::new();
    let mut best: Option<(&'static str, usize, f64)> = None;
    for &variant in &contenders[1..] {
        let reps = reps_for(variant)?;
        let rounds = paired(variant, reps, TIMING_ROUNDS)?;
        default_times.extend(rounds.iter().map(|r| r.1));
        if let Some(ratio) = verdict(&rounds).filter(|&r| best.is_none_or(|b| r < b.2)) {
            best = Some((variant, reps, ratio));
        }
    }
    let median_micros = |mut t: Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2] * 1e6
    };
    if let Some((variant, reps, _)) = best {
        let rounds = paired(variant, reps, CONFIRM_ROUNDS)?;
        if verdict(&rounds).is_some() {
            let choice = TunedChoice {
                variant: variant.into(),
                micros: median_micros(rounds.iter().map(|r| r.0).collect()),
                default_micros: median_micros(rounds.iter().map(|r| r.1).collect()),
            };
            return Ok((choice, rejected));
        }
        default_times.extend(rounds.iter().map(|r| r.1));
    }
    if default_times.is_empty() {
        default_times.push(batch(default, default_reps)?);
    }
    let micros = median_micros(default_times);
    let choice = TunedChoice {
        variant: default.into(),
        micros,
        default_micros: micros,
    };
    Ok((choice, rejected))
}

/// The median time ratio to the default of a variant timed in paired `rounds` of (variant,
/// default) seconds, when it wins: a median below [`WIN_MARGIN`] and faster than the default in at
/// least [`CONSISTENCY`] of the rounds. `None` when it does not, or when there are no rounds or a
/// time is not a finite, positive number.
fn verdict(rounds: &[(f64, f64)]) -> Option<f64> {
    let timed = |&(variant, default): &(f64, f64)| {
        variant.is_finite() && variant >= 0.0 && default.is_finite() && default > 0.0
    };
    if rounds.is_empty() || !rounds.iter().all(timed) {
        return None;
    }
    let mut ratios: Vec<f64> = rounds.iter().map(|&(v, d)| v / d).collect();
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    let faster = ratios.iter().filter(|&&r| r < 1.0).count();
    let consistent = faster as f64 >= CONSISTENCY * ratios.len() as f64;
    (median < WIN_MARGIN && consistent).then_some(median)
}

impl Backend {
    /// Turns the autotuner on or off for this backend (all its clones), returning the backend for
    /// chaining. While on, ops with several kernel variants on this
    /// backend time them on first use of each shape bucket and then use the fastest that gives the
    /// default's answer. Choices made so far are kept when it is turned off.
    pub fn enable_autotuning(self, on: bool) -> Backend {
        self.set_tuning(on);
        self
    }

    /// Keeps the autotuner's table in the JSON file at `path`:
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

    /// Sets the largest fraction of a tuned key's op time that the autotuner may spend tuning the key
    /// again (see the module documentation), returning the backend for chaining: 0.05, the default,
    /// revisits a key once its ops, at their stored time, have run 20 times as long as its tuning
    /// took, and then after ever longer waits while revisits keep its choice; 0 never revisits, so
    /// that a key keeps its variant (and its results their last bits) for the life of the backend.
    /// Values above 1 let revisits take longer than the ops they serve (a test can revisit after a
    /// few ops: the wait is at least 16 ops). Applies at once to keys already tuned.
    /// `InvalidArgument` when `fraction` is negative or not finite.
    pub fn autotuning_revisit_overhead(self, fraction: f64) -> Result<Backend> {
        if !fraction.is_finite() || fraction < 0.0 {
            return Err(BackendError::invalid(
                "autotuning_revisit_overhead",
                format!("{fraction} is not a fraction of 0 or more"),
            ));
        }
        let mut tuner = self.tuner();
        tuner.revisit_overhead = fraction;
        let Autotuner {
            table, schedule, ..
        } = &mut *tuner;
        for (key, revisit) in schedule.iter_mut() {
            if let Some(choice) = table.get(key) {
                revisit.due = revisit_due(
                    fraction,
                    revisit.tuning_secs,
                    choice.micros,
                    revisit.confirmations,
                );
            }
        }
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
        if !self.tuning() {
            return op.run_default(device);
        }
        let variants = device.variants(op);
        if variants.len() < 2 {
            return op.run_default(device);
        }
        let key = op.key();
        let (stored, due) = {
            let mut tuner = self.tuner();
            let stored = tuner.choice(&key, variants);
            tuner.stats.hits += u64::from(stored.is_some());
            let due = stored.is_some() && tuner.hit_is_due(&key, variants.len());
            (stored, due)
        };
        match stored {
            Some(v) if !due => return device.run_variant(op, v),
            Some(v) => return self.revisit(op, variants, v),
            None => {}
        }
        // Tuning runs on the device itself, never through a capture's recorder: a capture tunes as
        // eager execution would, and records only the op.
        let started = Instant::now();
        let (choice, rejected) = tune(self.unrecorded(), op, variants)?;
        let tuning_secs = started.elapsed().as_secs_f64();
        let winner = offered(variants, &choice.variant);
        {
            let fingerprint = device.fingerprint();
            let mut tuner = self.tuner();
            tuner.stats.tuned += 1;
            tuner.stats.rejected += rejected;
            tuner.retuned(key, choice, tuning_secs, false);
            tuner.save(&fingerprint);
        }
        device.run_variant(op, winner)
    }

    /// Tunes the key of `op`, served so far by `current`, again, stores what wins, and runs `op`
    /// with it. A revisit that fails (no memory for its scratch output, say) is logged and leaves the
    /// choice as it is, with a doubled wait for the next revisit, and runs `op` with `current`.
    fn revisit(
        &self,
        op: &TunableOp,
        variants: &[&'static str],
        current: &'static str,
    ) -> Result<()> {
        let device = self.compute();
        let key = op.key();
        let started = Instant::now();
        let tuned = tune(self.unrecorded(), op, variants);
        let tuning_secs = started.elapsed().as_secs_f64();
        let fingerprint = device.fingerprint();
        let mut tuner = self.tuner();
        let (choice, rejected) = match tuned {
            Ok(tuned) => tuned,
            Err(e) => {
                log::warn!(
                    "torsh-backend autotuner: revisiting {key} failed ({e}); `{current}` stays"
                );
                if let Some(choice) = tuner.table.get(&key).cloned() {
                    tuner.retuned(key, choice, tuning_secs, true);
                }
                drop(tuner);
                return device.run_variant(op, current);
            }
        };
        let winner = offered(variants, &choice.variant);
        let kept = winner == current;
        tuner.stats.revisits += 1;
        tuner.stats.revised += u64::from(!kept);
        tuner.stats.rejected += rejected;
        if !kept {
            log::info!(
                "torsh-backend autotuner: revisiting {key} chose `{winner}` ({:.1} µs against \
                 the default's {:.1} µs) over `{current}`",
                choice.micros,
                choice.default_micros
            );
        }
        tuner.retuned(key, choice, tuning_secs, kept);
        tuner.save(&fingerprint);
        drop(tuner);
        device.run_variant(op, winner)
    }
}

/// The variant of `variants` named `name`; the default (the first) when none is.
fn offered(variants: &[&'static str], name: &str) -> &'static str {
    variants
        .iter()
        .find(|&&v| v == name)
        .copied()
        .unwrap_or(variants[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paired rounds of a variant taking `ratios` of a default's 1 ms, the default drifting from
    /// 1 ms to 3 ms over the rounds.
    fn rounds(ratios: &[f64]) -> Vec<(f64, f64)> {
        ratios
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let default = 1e-3 * (1.0 + 2.0 * i as f64 / ratios.len() as f64);
                (r * default, default)
            })
            .collect()
    }

    #[test]
    fn a_variant_wins_only_by_a_consistent_median_margin_whatever_the_drift() {
        // 20 % faster in every round, while the machine slows threefold: a win, at its ratio.
        let steady = verdict(&rounds(&[0.8; 7])).unwrap();
        assert!((steady - 0.8).abs() < 1e-9, "{steady}");
        // 5 % faster throughout: within the margin, the default stays.
        assert_eq!(verdict(&rounds(&[0.95; 7])), None);
        // A median of 0.7 carried by four fast rounds, slower in the other three: noise.
        assert_eq!(verdict(&rounds(&[0.5, 1.2, 0.6, 1.3, 0.7, 1.1, 0.7])), None);
        // Faster in six of seven rounds, by 15 % in the median: a win.
        assert!(verdict(&rounds(&[0.85, 0.8, 1.05, 0.85, 0.9, 0.8, 0.86])).is_some());
        // No rounds, or a time that is not a finite, positive number: no verdict.
        assert_eq!(verdict(&[]), None);
        assert_eq!(verdict(&[(1e-3, f64::NAN)]), None);
        assert_eq!(verdict(&[(1e-3, 0.0)]), None);
    }

    #[test]
    fn a_revisit_is_due_when_the_tuning_cost_its_share_of_the_ops_and_later_per_confirmation() {
        // A 0.1 s tuning of an op of 50 µs, at 5 %: after 0.1 / 0.05 = 2 s of ops, 40 000 of them.
        // (Within one of it: 0.1 / 2.5e-6 rounds up from just above 40 000.)
        let first = revisit_due(0.05, 0.1, 50.0, 0);
        assert!((40_000..=40_001).contains(&first), "{first}");
        // Each confirmation doubles the wait.
        assert_eq!(revisit_due(0.05, 0.1, 50.0, 1), 2 * first);
        assert_eq!(revisit_due(0.05, 0.1, 50.0, 3), 8 * first);
        // Never before REVISIT_MIN_HITS ops, however cheap the tuning; never at all at 0 %; a
        // wait beyond u64 (many confirmations, an op timed at 0) is never too.
        assert_eq!(revisit_due(1e9, 0.1, 50.0, 0), REVISIT_MIN_HITS);
        assert_eq!(revisit_due(1e9, 0.1, 50.0, 2), 4 * REVISIT_MIN_HITS);
        assert_eq!(revisit_due(0.0, 0.1, 50.0, 0), u64::MAX);
        assert_eq!(revisit_due(0.05, 0.1, 50.0, 200), u64::MAX);
        assert_eq!(revisit_due(0.05, 0.1, 0.0, 40), u64::MAX);
        // A loaded choice's tuning is estimated from its times: two variants, 12 rounds of two
        // batches of at least 2 ms each run twice.
        let choice = TunedChoice {
            variant: "v".into(),
            micros: 10.0,
            default_micros: 20.0,
        };
        let secs = estimated_tuning_secs(2, &choice);
        assert!(
            (secs - 12.0 * 2.0 * 2.0 * BATCH_SECS).abs() < 1e-12,
            "{secs}"
        );
    }
}
