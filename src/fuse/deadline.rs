//! Requests that read shards run off the FUSE threads, with a deadline.
//!
//! A shard read can stall (a hung network filesystem, a dying disk, an injected fault). If it
//! ran on a FUSE worker, a few stalled reads would leave no worker for `stat`, `ls` or other
//! steps. So the adapter hands such a request to a [`DeadlinePool`]: a pool of threads that
//! grows while every thread is busy (up to a cap, so stalled threads cannot starve the rest)
//! and a watchdog that answers a request whose deadline passed with its timeout action
//! (`EIO`). Exactly one of the two answers reaches the kernel: both actions share the reply and
//! the first to take it answers. A stalled thread stays blocked in its read; when it returns,
//! its answer is discarded.
//!
//! Requests that need no shard (cache hits, directory listings, most attributes) never come
//! here; the size of a JSON file of a dataset with documents does (`dispatch.rs` decides).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use log::{debug, warn};

type Job = Box<dyn FnOnce() + Send>;

struct Queued {
    id: u64,
    job: Job,
}

struct State {
    queue: VecDeque<Queued>,
    threads: usize,
    idle: usize,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    /// Requests not answered yet: their deadline and timeout action.
    inflight: Mutex<HashMap<u64, (Instant, Job)>>,
    watchdog_wake: Condvar,
    next_id: AtomicU64,
    timeout: Duration,
    min_threads: usize,
    max_threads: usize,
    /// Requests answered by their timeout action.
    timed_out: AtomicU64,
}

/// The pool. Dropping it stops idle threads and the watchdog; threads still blocked in a read
/// are left to finish (their answers are discarded).
pub(crate) struct DeadlinePool {
    shared: Arc<Shared>,
    /// Started on first use (after the daemon forked).
    watchdog: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for DeadlinePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadlinePool")
            .field("timeout", &self.shared.timeout)
            .field("max_threads", &self.shared.max_threads)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl DeadlinePool {
    /// A pool whose requests time out after `timeout`, keeping `min_threads` threads and
    /// growing to `max_threads` while all are busy. Threads start on first use.
    pub(crate) fn new(timeout: Duration, min_threads: usize, max_threads: usize) -> DeadlinePool {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                threads: 0,
                idle: 0,
                shutdown: false,
            }),
            work: Condvar::new(),
            inflight: Mutex::new(HashMap::new()),
            watchdog_wake: Condvar::new(),
            next_id: AtomicU64::new(0),
            timeout,
            min_threads: min_threads.max(1),
            max_threads: max_threads.max(min_threads).max(1),
            timed_out: AtomicU64::new(0),
        });
        DeadlinePool {
            shared,
            watchdog: Mutex::new(None),
        }
    }

    /// The deadline of every request.
    pub(crate) fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Requests answered by their timeout action so far.
    #[cfg(test)]
    pub(crate) fn timed_out(&self) -> u64 {
        self.shared.timed_out.load(Ordering::Relaxed)
    }

    /// Runs `work` on a pool thread. If it has not finished `timeout` after this call,
    /// `on_timeout` runs on the watchdog thread (and `work` keeps running; the caller makes
    /// sure only the first of the two answers).
    pub(crate) fn submit(
        &self,
        work: impl FnOnce() + Send + 'static,
        on_timeout: impl FnOnce() + Send + 'static,
    ) {
        self.start_watchdog();
        let s = &self.shared;
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&s.inflight).insert(id, (Instant::now() + s.timeout, Box::new(on_timeout)));
        let mut state = lock(&s.state);
        state.queue.push_back(Queued {
            id,
            job: Box::new(work),
        });
        if state.idle == 0 && state.threads < s.max_threads {
            state.threads += 1;
            let n = state.threads;
            drop(state);
            let shared = s.clone();
            if let Err(e) = std::thread::Builder::new()
                .name(format!("shard-io-{n}"))
                .spawn(move || worker(&shared))
            {
                warn!("cannot start a shard I/O thread ({e}); queued requests wait for a busy one");
                lock(&s.state).threads -= 1;
            }
        } else {
            drop(state);
            s.work.notify_one();
        }
    }

    /// Runs `work` on the calling thread under the same deadline: if it has not returned
    /// `timeout` after this call, `on_timeout` runs on the watchdog thread while this thread
    /// stays blocked (the caller answers only once, as with [`DeadlinePool::submit`]).
    pub(crate) fn run_here<R>(
        &self,
        work: impl FnOnce() -> R,
        on_timeout: impl FnOnce() + Send + 'static,
    ) -> R {
        self.start_watchdog();
        let s = &self.shared;
        let id = s.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&s.inflight).insert(id, (Instant::now() + s.timeout, Box::new(on_timeout)));
        let result = work();
        lock(&s.inflight).remove(&id);
        result
    }

    fn start_watchdog(&self) {
        let mut handle = lock(&self.watchdog);
        if handle.is_some() {
            return;
        }
        let shared = self.shared.clone();
        match std::thread::Builder::new()
            .name("shard-io-watchdog".into())
            .spawn(move || watchdog(&shared))
        {
            Ok(h) => *handle = Some(h),
            Err(e) => warn!("cannot start the read deadline watchdog: {e}"),
        }
    }
}

fn worker(s: &Shared) {
    loop {
        let mut state = lock(&s.state);
        let next = loop {
            if let Some(q) = state.queue.pop_front() {
                break Some(q);
            }
            if state.shutdown {
                break None;
            }
            state.idle += 1;
            let (guard, wait) = s
                .work
                .wait_timeout(state, Duration::from_secs(10))
                .unwrap_or_else(|p| p.into_inner());
            state = guard;
            state.idle -= 1;
            if wait.timed_out() && state.queue.is_empty() && state.threads > s.min_threads {
                break None;
            }
        };
        let Some(Queued { id, job }) = next else {
            state.threads -= 1;
            return;
        };
        drop(state);
        job();
        // Answered in time (or the watchdog already ran the timeout action and removed it).
        lock(&s.inflight).remove(&id);
    }
}

fn watchdog(s: &Shared) {
    let tick = (s.timeout / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
    let mut inflight = lock(&s.inflight);
    loop {
        if lock(&s.state).shutdown {
            return;
        }
        let now = Instant::now();
        let expired: Vec<u64> = inflight
            .iter()
            .filter(|(_, (deadline, _))| *deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        if !expired.is_empty() {
            let actions: Vec<Job> = expired
                .iter()
                .filter_map(|id| inflight.remove(id).map(|(_, action)| action))
                .collect();
            drop(inflight);
            for action in actions {
                s.timed_out.fetch_add(1, Ordering::Relaxed);
                action();
            }
            debug!("{} shard request(s) passed their deadline", expired.len());
            inflight = lock(&s.inflight);
        }
        inflight = s
            .watchdog_wake
            .wait_timeout(inflight, tick)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

impl Drop for DeadlinePool {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        self.shared.work.notify_all();
        if let Some(handle) = lock(&self.watchdog).take() {
            self.shared.work.notify_all();
            self.shared.watchdog_wake.notify_all();
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn runs_work_and_never_times_out_a_finished_request() {
        let pool = DeadlinePool::new(Duration::from_secs(60), 1, 4);
        let (tx, rx) = mpsc::channel();
        for i in 0..100 {
            let tx = tx.clone();
            let tx2 = tx.clone();
            pool.submit(
                move || tx.send(Ok(i)).unwrap(),
                move || tx2.send(Err(i)).unwrap(),
            );
        }
        let mut got: Vec<i32> = (0..100).map(|_| rx.recv().unwrap().unwrap()).collect();
        got.sort_unstable();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        assert_eq!(pool.timed_out(), 0);
    }

    #[test]
    fn a_stalled_request_times_out_while_others_are_served() {
        // One request blocks until released; the pool grows past it and the watchdog answers
        // it. The assertion is about which answers arrive; the 1 s deadline only has to be
        // longer than serving the other request.
        let pool = DeadlinePool::new(Duration::from_secs(1), 1, 4);
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let (tx, rx) = mpsc::channel();
        let (t1, t2) = (tx.clone(), tx.clone());
        pool.submit(
            move || {
                release_rx.recv().ok();
                t1.send("stalled work finished").unwrap();
            },
            move || t2.send("stalled timed out").unwrap(),
        );
        let (t3, t4) = (tx.clone(), tx.clone());
        pool.submit(
            move || t3.send("other served").unwrap(),
            move || t4.send("other timed out").unwrap(),
        );
        let mut first_two = vec![rx.recv().unwrap(), rx.recv().unwrap()];
        first_two.sort_unstable();
        assert_eq!(first_two, ["other served", "stalled timed out"]);
        release_tx.send(()).unwrap();
        assert_eq!(rx.recv().unwrap(), "stalled work finished");
        assert_eq!(pool.timed_out(), 1);
    }
}
