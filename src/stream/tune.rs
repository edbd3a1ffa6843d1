//! `--compress auto`: the zstd level for the link, picked as the stream
//! goes, the way `zstd --adapt` does. The source's writer reports the bytes
//! of files each block carried ([`Tuner::wrote`]); the tuner measures how
//! many bytes of files per second actually get through at each level (no
//! compression, 1, 3, ...) a window at a time, and keeps the fastest,
//! probing a neighbour now and then. A fast link is best served
//! uncompressed (compression would only cost CPU); a slow one by a level
//! that the cores can keep ahead of it.

use crate::model::LevelWindow;

/// `Auto`'s levels, fastest first (0: stored).
const LADDER: [i32; 4] = [0, 1, 3, 6];
/// `Auto` measures in windows of this many bytes of files, timing only the
/// part after the first `WINDOW_SKIP` bytes (blocks packed at the previous
/// level are still draining then).
const WINDOW: u64 = 48 << 20;
const WINDOW_SKIP: u64 = 16 << 20;
/// How much faster than the level it left a probed level with more
/// compression must be to stay.
const PROBE_MARGIN: f64 = 1.1;

/// Picks `Auto`'s level: the one that moves the most bytes of files per
/// second, measured a window at a time. Starting at zstd 1, it tries the
/// neighbouring levels (faster first); each probe that loses doubles the
/// wait before the next (up to 32 windows), one that wins is kept.
pub(super) struct Tuner {
    /// Index into `LADDER` of the level in use.
    at: usize,
    /// Latest rate measured at each level (bytes of files per second).
    rates: [Option<f64>; LADDER.len()],
    window_raw: u64,
    timed_from: Option<(std::time::Instant, u64)>,
    /// Windows measured at this level since the last probe.
    since_probe: u32,
    probe_every: u32,
    /// While probing: the level the probe left.
    probing: Option<usize>,
    /// Probe downwards (less compression) next.
    down_next: bool,
    /// Every measured window.
    log: Vec<LevelWindow>,
}

impl Tuner {
    pub(super) fn new() -> Tuner {
        Tuner {
            at: 1,
            rates: [None; LADDER.len()],
            window_raw: 0,
            timed_from: None,
            since_probe: 0,
            probe_every: 1,
            probing: None,
            down_next: true,
            log: Vec::new(),
        }
    }

    pub(super) fn level(&self) -> i32 {
        LADDER[self.at]
    }

    /// Every window measured so far.
    pub(super) fn into_log(self) -> Vec<LevelWindow> {
        self.log
    }

    /// `raw` more bytes of files went out; returns a new level when it changes.
    pub(super) fn wrote(&mut self, raw: u64) -> Option<i32> {
        self.window_raw += raw;
        if self.timed_from.is_none() && self.window_raw >= WINDOW_SKIP {
            self.timed_from = Some((std::time::Instant::now(), self.window_raw));
        }
        if self.window_raw < WINDOW {
            return None;
        }
        let (t0, raw0) = self.timed_from.take()?;
        let secs = t0.elapsed().as_secs_f64().max(1e-6);
        let rate = (self.window_raw - raw0) as f64 / secs;
        self.window_raw = 0;
        self.log.push(LevelWindow {
            level: self.level(),
            bytes_per_sec: rate,
        });
        self.record(rate)
    }

    /// Decide after a window measured at `rate`.
    fn record(&mut self, rate: f64) -> Option<i32> {
        // A window's rate swings with what it holds (big objects or small
        // files, cached or not) by 2-3x at one level, so a level's rate is
        // a running mean, and a probe is kept only if it beats the level it
        // left by a margin; otherwise noise flips the level back and forth.
        let mean = match self.rates[self.at] {
            Some(r) if self.probing.is_none() => 0.5 * r + 0.5 * rate,
            _ => rate,
        };
        self.rates[self.at] = Some(mean);
        let before = self.at;
        if let Some(from) = self.probing.take() {
            // Compression must pay for its CPU: a level with less of it is
            // kept unless it is slower, one with more only if it is clearly
            // faster. (When the disk is the limit, every level moves about
            // the same; the cheapest leaves the cores to ssh and the target.)
            let need = if self.at < from { 1.0 } else { PROBE_MARGIN };
            if self.rates[from].is_some_and(|r| r * need > rate) {
                self.at = from;
                self.probe_every = (self.probe_every * 2).min(32);
            } else {
                self.probe_every = 1;
            }
            self.since_probe = 0;
        } else {
            self.since_probe += 1;
            if self.since_probe >= self.probe_every {
                let down = self.at.checked_sub(1);
                let up = (self.at + 1 < LADDER.len()).then_some(self.at + 1);
                let next = if self.down_next {
                    down.or(up)
                } else {
                    up.or(down)
                };
                self.down_next = !self.down_next;
                if let Some(n) = next {
                    self.probing = Some(self.at);
                    self.at = n;
                }
            }
        }
        (self.at != before).then(|| self.level())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    /// Feed window rates (bytes/s) per level; returns the level after each.
    fn run(t: &mut Tuner, rate_at: impl Fn(i32, usize) -> f64, windows: usize) -> Vec<i32> {
        (0..windows)
            .map(|w| {
                let r = rate_at(t.level(), w);
                t.record(r);
                t.level()
            })
            .collect()
    }

    #[test]
    fn the_tuner_drops_compression_that_does_not_pay() {
        // Disk-bound: stored and zstd 1 move the same; the cheaper wins.
        let mut t = Tuner::new();
        let levels = run(
            &mut t,
            |l, _| match l {
                0 | 1 => 100.0,
                _ => 60.0,
            },
            64,
        );
        let at_zero = levels.iter().filter(|&&l| l == 0).count();
        assert!(at_zero >= 56, "{levels:?}");
    }

    #[test]
    fn the_tuner_adds_compression_only_when_it_clearly_pays() {
        // Link-bound: zstd 1 beats stored, zstd 3 only by 4%: stay at 1.
        let mut t = Tuner::new();
        let levels = run(
            &mut t,
            |l, _| match l {
                0 => 60.0,
                1 => 100.0,
                3 => 104.0,
                _ => 50.0,
            },
            64,
        );
        let at_one = levels.iter().filter(|&&l| l == 1).count();
        assert!(at_one >= 56, "{levels:?}");
    }

    #[test]
    fn the_tuner_moves_to_a_clearly_faster_level_and_stays() {
        // On a fast link stored wins by 40%: after the first probe it stays
        // there, probing less and less often.
        let mut t = Tuner::new();
        let levels = run(
            &mut t,
            |l, _| match l {
                0 => 140.0,
                1 => 100.0,
                _ => 50.0,
            },
            64,
        );
        assert_eq!(levels[0], 0, "{levels:?}");
        let at_zero = levels.iter().filter(|&&l| l == 0).count();
        assert!(at_zero >= 56, "{levels:?}");
    }

    #[test]
    fn the_tuner_is_not_fooled_by_one_fast_window() {
        // Windows alternate between fast and slow content at every level;
        // level 1 is truly best. A probe that lands on a fast window may
        // win, but the level it left wins back soon after.
        let mut t = Tuner::new();
        let levels = run(
            &mut t,
            |l, w| {
                let base = match l {
                    0 => 80.0,
                    1 => 100.0,
                    3 => 70.0,
                    _ => 30.0,
                };
                if w % 2 == 0 { base * 1.5 } else { base }
            },
            96,
        );
        let at_one = levels.iter().filter(|&&l| l == 1).count();
        assert!(at_one >= 70, "{levels:?}");
    }
}
