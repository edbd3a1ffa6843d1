//! Where the agents' reads ahead run: the ELF and GPU-code facts read
//! while the controller is busy with other requests (`PrefetchElf`,
//! `PrefetchPreflight`). They get a rayon pool of their own, whose threads
//! run at a lower CPU priority (nice 10, which also lowers their
//! best-effort I/O priority), so that the request in flight (the hashing
//! and bytecode rounds, on the global pool) is neither queued behind
//! blocking reads of GPU code on the global pool's threads nor slowed by
//! them for CPU: measured on the H100 host, the bytecode round took 0.52 s
//! with the reads ahead on the global pool against 0.30 s without them
//! (docs/benchmarks.md, "Issue 42"). When the host is otherwise idle the
//! lower priority costs nothing.

use std::sync::OnceLock;
use std::thread::JoinHandle;

/// The niceness of the pool's threads.
const NICE: i32 = 10;

/// Run `f` on a thread of its own, with its parallel work (rayon's
/// `par_iter` inside it) on the background pool.
pub fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    std::thread::spawn(move || match pool() {
        Some(p) => p.install(f),
        None => f(),
    })
}

fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("overlay-ahead-{i}"))
            // Linux: setpriority of "this process" (pid 0) sets the
            // calling thread's niceness only.
            .start_handler(|_| {
                let _ = rustix::process::setpriority_process(None, NICE);
            })
            .build()
            .ok()
    })
    .as_ref()
}

#[cfg(test)]
mod tests {
    use rayon::prelude::*;

    #[test]
    fn runs_on_lower_priority_threads() {
        let read = super::spawn(|| {
            (0..64)
                .into_par_iter()
                .map(|_| rustix::process::getpriority_process(None).unwrap_or(0))
                .min()
        });
        assert_eq!(read.join().unwrap(), Some(super::NICE));
        // The global pool is untouched.
        let here: Vec<i32> = (0..64)
            .into_par_iter()
            .map(|_| rustix::process::getpriority_process(None).unwrap_or(0))
            .collect();
        assert!(here.iter().all(|p| *p < super::NICE));
    }
}
