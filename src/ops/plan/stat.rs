//! Phase 1 of a plan: stat both sides. The sides' stat requests
//! ([`StatSide`], [`stat_sides`]), the sets' members and their order, and
//! the phase itself (`stat_phase`): no content is read, but hashes the
//! hosts' caches still vouch for come along.

use crate::client::Client;
use crate::error::Result;
use crate::manifest::Host;
use crate::model::{Entry, HashMode, Progress, ScanReport, Set, ShebangRewrite};
use crate::ops::Meter;
use crate::plan;

use super::connect::both;

/// One side of the plan's stat rounds.
pub struct StatSide<'a> {
    pub host: &'a str,
    pub venv: &'a str,
    pub shebang: Option<ShebangRewrite>,
    pub pycache: bool,
}

impl StatSide<'_> {
    /// Stat the members of `sets` on this side's host, plus `extra` paths,
    /// with the hashes its cache still vouches for; the answer is for
    /// `order` ([`plan::stat_order`] of the same).
    pub fn stat_members(
        &self,
        client: &mut Client,
        sets: &[Set],
        globs: &[String],
        extra: &[&str],
        order: &[&str],
    ) -> Result<Vec<Entry>> {
        if order.is_empty() {
            return Ok(Vec::new());
        }
        client.stat_members(
            self.venv,
            sets,
            globs,
            extra.iter().map(|p| p.to_string()).collect(),
            order.iter().map(|p| p.to_string()).collect(),
            plan::order_check(order),
            HashMode::Cached,
            self.shebang.clone(),
            self.pycache,
            &mut |_| {},
        )
    }

    /// Stat `paths` on this side's host (hashing them with `HashMode::All`,
    /// with progress on `meter`). An empty list costs no round trip.
    pub fn stat(
        &self,
        client: &mut Client,
        paths: Vec<String>,
        mode: HashMode,
        meter: &dyn Meter,
    ) -> Result<Vec<Entry>> {
        if paths.is_empty() {
            return Ok(Vec::new());
        }
        let mut progress = |p: Progress| {
            if mode == HashMode::All {
                meter.update(&p);
            }
        };
        client.stat(
            self.venv,
            paths,
            mode,
            self.shebang.clone(),
            self.pycache,
            &mut progress,
        )
    }
}

/// The sets' members on one host and the order of their stat.
pub fn members_and_order<'a>(
    sets: &[Set],
    scan: &'a ScanReport,
    globs: &[String],
) -> (Vec<plan::Members<'a>>, Vec<&'a str>) {
    let members = plan::members_of(sets, scan, globs);
    let order = plan::stat_order(&members, &[]);
    (members, order)
}

/// Stat entries by path. (The path moves into the key; the entry's own
/// `path` is left empty.)
pub fn index(v: Vec<Entry>) -> plan::Entries {
    let mut map = plan::Entries::with_capacity_and_hasher(v.len(), Default::default());
    for mut e in v {
        map.insert(std::mem::take(&mut e.path), e);
    }
    map
}

/// Both sides' members and their stat entries.
pub(super) struct Stated<'s> {
    pub(super) src_members: Vec<plan::Members<'s>>,
    pub(super) dst_members: Vec<plan::Members<'s>>,
    pub(super) src_entries: plan::Entries,
    pub(super) dst_entries: plan::Entries,
    /// The target's machine facts, asked for once the stat was done
    /// (`make_plan`; default until then).
    pub(super) dst_machine: crate::model::Machine,
}

/// Phase 1: stat both sides; no content is read, but hashes the hosts'
/// caches still vouch for come along.
pub(super) fn stat_phase<'s>(
    sets: &[Set],
    globs: &[String],
    (src_side, src, src_scan): (&StatSide, &mut Client, &'s ScanReport),
    (dst_side, dst, dst_scan): (&StatSide, &mut Client, &'s ScanReport),
) -> Result<Stated<'s>> {
    // Which paths each side must describe: the source its members, the
    // target its own and the source's. Each agent works its members out
    // from the scan it sent, as this side does, so only the paths the
    // target lacks travel (a torch stack's 35,000 paths do not).
    let ((src_members, src_order), (dst_members, dst_own)) = both(
        || members_and_order(sets, src_scan, globs),
        || members_and_order(sets, dst_scan, globs),
    );
    let extra = plan::sorted_difference(&src_order, &dst_own);
    // The order the target's agent states them in.
    let dst_order = plan::stat_order(&dst_members, &extra);
    let (s, d) = both(
        || {
            src_side
                .stat_members(src, sets, globs, &[], &src_order)
                .map(index)
        },
        || {
            dst_side
                .stat_members(dst, sets, globs, &extra, &dst_order)
                .map(index)
        },
    );
    Ok(Stated {
        src_entries: s?,
        dst_entries: d?,
        src_members,
        dst_members,
        dst_machine: Default::default(),
    })
}

/// The sides' stat requests. What differs between them: the source's
/// `bin/` scripts are hashed as they would read on the target, and both
/// sides list the bytecode beside their `.py` files (the source's travels
/// with a changed `.py`; the target's is replaced or deleted as stale).
pub fn stat_sides<'a>(src_host: &'a Host, dst_host: &'a Host) -> (StatSide<'a>, StatSide<'a>) {
    let src_side = StatSide {
        host: &src_host.name,
        venv: &src_host.venv,
        shebang: Some(ShebangRewrite {
            from: src_host.venv.clone(),
            to: dst_host.venv.clone(),
        }),
        pycache: true,
    };
    let dst_side = StatSide {
        host: &dst_host.name,
        venv: &dst_host.venv,
        shebang: None,
        pycache: true,
    };
    (src_side, dst_side)
}
