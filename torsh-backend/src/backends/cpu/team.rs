//! The CPU backend's threads: a [`Team`] of the calling thread and `threads − 1` workers.
//!
//! An op that goes parallel runs on the thread that called it, which posts the op's tasks to the
//! team, takes tasks itself and waits for the workers that joined. Between jobs the workers spin for
//! [`SPIN`] and then park, so back-to-back ops (a training step issues hundreds, a few microseconds
//! apart) reach running workers: a hand-off costs a few atomic operations, not the two futex
//! wake-ups and the sleep of the caller that entering a thread pool from outside costs.
//!
//! Kernels reach the team through the free functions ([`par_for`], [`par_map`], [`par_chunks_mut`],
//! [`Items`]): on a thread inside [`Team::enter`] they share the tasks out; anywhere else (on a
//! worker, inside a task, with no team) they run the tasks in turn on the calling thread. A team runs
//! one job at a time; a second caller meanwhile runs its tasks itself.
//!
//! Lock discipline: a task takes no lock but the leaf locks of the job's own bookkeeping (a result
//! slot, the first error, a free scratch), each held for one store or take and never while waiting
//! on anything, and a worker runs nothing but the tasks of the job it joined, so no op can wait on
//! another from inside the team.

use std::any::Any;
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::time::{Duration, Instant};

use crate::error::{BackendError, Result};

/// How long an idle worker spins before it parks.
const SPIN: Duration = Duration::from_micros(200);

/// A job's tasks, as the workers see them.
type Task<'a> = &'a (dyn Fn(usize) + Sync);

/// The state the caller and the workers share.
struct Shared {
    /// Counts the jobs posted; a worker joins a job when it sees a new value.
    epoch: AtomicU64,
    /// The address of the current job's [`Task`] (on the caller's stack while `open`).
    job: AtomicUsize,
    /// The current job's task count.
    tasks: AtomicUsize,
    /// The next task to claim.
    next: AtomicUsize,
    /// Whether the current job still admits workers.
    open: AtomicBool,
    /// Workers inside the current job.
    active: AtomicUsize,
    /// Workers parked (or about to park) on `wake`.
    parked: AtomicUsize,
    /// The first panic of a task on a worker, resumed on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Guards parking.
    lock: Mutex<()>,
    /// Wakes parked workers.
    wake: Condvar,
    /// Ends the workers.
    stop: AtomicBool,
}

/// The calling thread and `threads − 1` workers (see the module documentation).
pub(crate) struct Team {
    shared: Arc<Shared>,
    threads: usize,
    /// Held by the caller whose job is running.
    busy: Mutex<()>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team")
            .field("threads", &self.threads)
            .finish()
    }
}

thread_local! {
    /// The team of the innermost [`Team::enter`] on this thread.
    static CURRENT: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

impl Team {
    /// A team of `threads` threads (the caller and `threads − 1` workers named `torsh-cpu-{i}`).
    /// `FeatureUnavailable` when a worker cannot be started.
    pub(crate) fn new(threads: usize) -> Result<Team> {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: AtomicUsize::new(0),
            tasks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            open: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            panic: Mutex::new(None),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let mut team = Team {
            shared,
            threads: threads.max(1),
            busy: Mutex::new(()),
            workers: Vec::new(),
        };
        for i in 1..team.threads {
            let shared = Arc::clone(&team.shared);
            let worker = std::thread::Builder::new()
                .name(format!("torsh-cpu-{i}"))
                .spawn(move || work(&shared))
                .map_err(|e| BackendError::FeatureUnavailable {
                    feature: "CPU worker threads",
                    reason: e.to_string(),
                })?;
            team.workers.push(worker);
        }
        Ok(team)
    }

    /// How many jobs have been shared with the workers so far (for tests of the threading policy).
    #[cfg(test)]
    pub(crate) fn jobs(&self) -> u64 {
        self.shared.epoch.load(SeqCst)
    }

    /// Runs `f` with this team as the calling thread's current one, so the kernels it runs share
    /// their tasks with the workers.
    pub(crate) fn enter<R>(&self, f: impl FnOnce() -> R) -> R {
        struct Restore(*const Team);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.set(self.0);
            }
        }
        let _restore = Restore(CURRENT.replace(self));
        f()
    }

    /// Runs `f(0) … f(tasks − 1)` on the caller and the workers; in turn on the caller when another
    /// job is running. A panic of a task is resumed here once every worker has left the job.
    fn run(&self, tasks: usize, f: Task<'_>) {
        let _busy = match self.busy.try_lock() {
            Ok(guard) => guard,
            // A panicking task unwound through an earlier job's guard; the team itself is intact
            // (every worker left that job before the panic was resumed).
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                (0..tasks).for_each(f);
                return;
            }
        };
        let s = &*self.shared;
        let job: *const Task<'_> = &f;
        s.job.store(job as usize, SeqCst);
        s.tasks.store(tasks, SeqCst);
        s.next.store(0, SeqCst);
        s.open.store(true, SeqCst);
        s.epoch.fetch_add(1, SeqCst);
        if s.parked.load(SeqCst) > 0 {
            let _lock = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = panic::catch_unwind(AssertUnwindSafe(|| claim(s, tasks, f)));
        // No worker may join once `open` is false, and none still inside touches `f` after it
        // leaves, so `f` outlives every use once `active` reaches 0.
        s.open.store(false, SeqCst);
        while s.active.load(SeqCst) != 0 {
            std::hint::spin_loop();
        }
        let theirs = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Err(payload) = mine {
            panic::resume_unwind(payload);
        }
        if let Some(payload) = theirs {
            panic::resume_unwind(payload);
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        {
            let _lock = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// Claims and runs tasks of the current job until none is left.
fn claim(s: &Shared, tasks: usize, f: Task<'_>) {
    loop {
        let i = s.next.fetch_add(1, SeqCst);
        if i >= tasks {
            return;
        }
        f(i);
    }
}

/// A worker: waits for a job (spinning, then parked), joins it while it is open, repeats.
fn work(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let idle = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.stop.load(SeqCst) {
                return;
            }
            let epoch = s.epoch.load(SeqCst);
            if epoch != seen {
                seen = epoch;
                break;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && idle.elapsed() > SPIN {
                let mut lock = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                s.parked.fetch_add(1, SeqCst);
                while s.epoch.load(SeqCst) == seen && !s.stop.load(SeqCst) {
                    lock = s.wake.wait(lock).unwrap_or_else(|e| e.into_inner());
                }
                s.parked.fetch_sub(1, SeqCst);
            }
        }
        // Registered before `open` is read: the caller either sees this worker in `active` and
        // waits for it, or closed the job first and this worker leaves it untouched. A job posted
        // after `seen` publishes its fields before `open`, so whatever job is open here is whole.
        s.active.fetch_add(1, SeqCst);
        if s.open.load(SeqCst) {
            // SAFETY: the job is open, so the caller is inside `Team::run` with `f` alive, and it
            // waits for `active` to fall back before `f` goes.
            let f: Task<'_> = unsafe { *(s.job.load(SeqCst) as *const Task<'_>) };
            let tasks = s.tasks.load(SeqCst);
            if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| claim(s, tasks, f))) {
                s.panic
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(payload);
            }
        }
        s.active.fetch_sub(1, SeqCst);
    }
}

/// Runs `f(0) … f(tasks − 1)`, shared with the current team's workers (see the module
/// documentation), or in turn where there is none.
pub(crate) fn par_for(tasks: usize, f: impl Fn(usize) + Sync) {
    let team = CURRENT.get();
    if tasks <= 1 || team.is_null() {
        (0..tasks).for_each(f);
        return;
    }
    // SAFETY: `CURRENT` is set only inside `Team::enter`, which borrows the team for its whole extent.
    let team = unsafe { &*team };
    if team.threads == 1 {
        (0..tasks).for_each(f);
    } else {
        team.run(tasks, &f);
    }
}

/// `[f(0), …, f(tasks − 1)]`, computed as [`par_for`] runs tasks.
pub(crate) fn par_map<R: Send>(tasks: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let slots: Vec<Mutex<Option<R>>> = (0..tasks).map(|_| Mutex::new(None)).collect();
    par_for(tasks, |i| {
        *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(f(i));
    });
    slots
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("par_for ran every task")
        })
        .collect()
}

/// Runs `f(i, chunk)` on the `chunk`-element pieces of `data` (the last may be shorter), as
/// [`par_for`] runs tasks.
pub(crate) fn par_chunks_mut<T: Send>(
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    struct Base<T>(*mut T);
    // SAFETY: tasks reach disjoint pieces of the slice through it, each piece from one task.
    unsafe impl<T: Send> Sync for Base<T> {}
    let chunk = chunk.max(1);
    let len = data.len();
    let base = Base(data.as_mut_ptr());
    let base = &base;
    par_for(len.div_ceil(chunk), |i| {
        let start = i * chunk;
        let n = chunk.min(len - start);
        // SAFETY: piece `i` is `start .. start + n` of `data`, borrowed mutably for this call, and
        // no other task reaches it.
        f(i, unsafe {
            std::slice::from_raw_parts_mut(base.0.add(start), n)
        });
    });
}

/// Jobs per thread that [`Items`] cuts its items into (fewer where there are fewer items): fine
/// enough that when one thread runs slower than the others (its core busy elsewhere, as on a
/// shared host), the op waits on at most one small job of it, not on a quarter of its share.
const JOBS_PER_THREAD: usize = 16;

/// Work items `0..items` grouped into at most [`JOBS_PER_THREAD`] jobs per thread, whose scratch
/// is made a few times per op, not once per item or job (see [`Items::try_for_each_init`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Items {
    items: usize,
    per_job: usize,
}

impl Items {
    /// The items `0..items` for `threads` threads.
    pub(crate) fn new(items: usize, threads: usize) -> Items {
        Items {
            items,
            per_job: items.div_ceil(JOBS_PER_THREAD * threads.max(1)).max(1),
        }
    }

    /// Runs `f(&mut scratch, i)` for every item, jobs of consecutive items as [`par_for`] runs
    /// tasks; the first error (in item order within a job) is returned, after every job has
    /// ended. Each job takes a scratch that an earlier job of this call handed back, or makes one
    /// with `init()` when none is free, and hands it back when its items are done (one after an
    /// error is dropped): at most as many are made as jobs run at once, and an item may find its
    /// scratch as any earlier item of the call left it. The free scratches are kept under a lock
    /// taken only to take or hand back one, never while a job runs.
    pub(crate) fn try_for_each_init<S: Send, E: Send>(
        self,
        init: impl Fn() -> S + Sync,
        f: impl Fn(&mut S, usize) -> std::result::Result<(), E> + Sync,
    ) -> std::result::Result<(), E> {
        let error = Mutex::new(None);
        let free = Mutex::new(Vec::new());
        par_for(self.items.div_ceil(self.per_job), |job| {
            let kept = free.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let mut scratch = kept.unwrap_or_else(&init);
            let end = ((job + 1) * self.per_job).min(self.items);
            for i in job * self.per_job..end {
                if let Err(e) = f(&mut scratch, i) {
                    error
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert(e);
                    return;
                }
            }
            free.lock().unwrap_or_else(|e| e.into_inner()).push(scratch);
        });
        match error.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Runs `f` with a context of `threads` threads inside a fresh team of that size (for tests).
#[cfg(test)]
pub(crate) fn on_threads<R>(threads: usize, f: impl FnOnce(super::host::Ctx) -> R) -> R {
    let ctx = super::host::Ctx {
        threads,
        simd: super::SimdLevel::detect(),
    };
    Team::new(threads).unwrap().enter(|| f(ctx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_runs_once_on_the_team() {
        let team = Team::new(3).unwrap();
        for tasks in [0, 1, 2, 7, 1000] {
            let counts: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            team.enter(|| par_for(tasks, |i| _ = counts[i].fetch_add(1, SeqCst)));
            assert!(counts.iter().all(|c| c.load(SeqCst) == 1));
        }
    }

    #[test]
    fn workers_take_tasks() {
        let team = Team::new(2).unwrap();
        let caller = std::thread::current().id();
        let elsewhere = AtomicUsize::new(0);
        team.enter(|| {
            par_for(64, |_| {
                std::thread::sleep(Duration::from_millis(1));
                if std::thread::current().id() != caller {
                    elsewhere.fetch_add(1, SeqCst);
                }
            })
        });
        assert!(elsewhere.load(SeqCst) > 0);
    }

    #[test]
    fn map_chunks_and_items_keep_order() {
        let team = Team::new(2).unwrap();
        team.enter(|| {
            assert_eq!(
                par_map(100, |i| i * i),
                (0..100).map(|i| i * i).collect::<Vec<_>>()
            );
            let mut v = vec![0usize; 1001];
            par_chunks_mut(&mut v, 64, |c, piece| {
                for (j, x) in piece.iter_mut().enumerate() {
                    *x = c * 64 + j;
                }
            });
            assert!(v.iter().enumerate().all(|(i, &x)| i == x));
            // 37 items in jobs of two: a scratch for each job running at once (at most one per
            // thread), handed on to later jobs.
            let seen: Vec<AtomicUsize> = (0..37).map(|_| AtomicUsize::new(0)).collect();
            let (made, used) = (AtomicUsize::new(0), AtomicUsize::new(0));
            let r: std::result::Result<(), ()> = Items::new(37, 2).try_for_each_init(
                || {
                    made.fetch_add(1, SeqCst);
                    0usize
                },
                |items_seen, i| {
                    *items_seen += 1;
                    used.fetch_max(*items_seen, SeqCst);
                    seen[i].fetch_add(1, SeqCst);
                    Ok(())
                },
            );
            assert!(r.is_ok() && seen.iter().all(|c| c.load(SeqCst) == 1));
            let made = made.load(SeqCst);
            assert!((1..=2).contains(&made), "{made} scratches for two threads");
            assert!(used.load(SeqCst) > 2, "a scratch served more than one job");
            let r = Items::new(37, 2)
                .try_for_each_init(|| (), |_, i| if i == 20 { Err(i) } else { Ok(()) });
            assert_eq!(r, Err(20));
        });
    }

    #[test]
    fn nested_and_concurrent_jobs_run_in_turn() {
        let team = Arc::new(Team::new(2).unwrap());
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    team.enter(|| {
                        for _ in 0..200 {
                            par_for(4, |_| {
                                par_for(3, |_| _ = total.fetch_add(1, SeqCst));
                            });
                        }
                    })
                });
            }
        });
        assert_eq!(total.load(SeqCst), 4 * 200 * 4 * 3);
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_team_goes_on() {
        let team = Team::new(2).unwrap();
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            team.enter(|| par_for(16, |i| assert!(i != 9, "task 9")))
        }));
        assert!(r.is_err());
        // The workers still take tasks (the job is not run on the caller alone).
        let caller = std::thread::current().id();
        let (n, elsewhere) = (AtomicUsize::new(0), AtomicUsize::new(0));
        team.enter(|| {
            par_for(64, |_| {
                std::thread::sleep(Duration::from_millis(1));
                n.fetch_add(1, SeqCst);
                if std::thread::current().id() != caller {
                    elsewhere.fetch_add(1, SeqCst);
                }
            })
        });
        assert_eq!(n.load(SeqCst), 64);
        assert!(elsewhere.load(SeqCst) > 0);
    }

    #[test]
    fn parked_workers_wake_for_the_next_job() {
        let team = Team::new(2).unwrap();
        std::thread::sleep(SPIN * 5);
        let n = AtomicUsize::new(0);
        team.enter(|| par_for(8, |_| _ = n.fetch_add(1, SeqCst)));
        assert_eq!(n.load(SeqCst), 8);
    }
}
