//! The fleet: operations on many targets at once, built on the one-target
//! operations of [`crate::ops`] and never used by them.
//!
//! - [`plan_many`]: one source planned against many targets with one scan
//!   and one hash of the source, and the plans saved as a fleet plan;
//! - [`apply_many`]: a rollout of those plans (canary, batches, max-fail),
//!   each target by `ops::apply`, or several at once by the fan-out;
//! - [`fanout`]: one read of the source streamed to the targets whose plans
//!   share it;
//! - [`bundle_plan`]: a bundle as the source of the plans of one target or
//!   many (`overlay plan --bundle FILE TARGET...`).
//!
//! A new kind of work over many hosts goes here; what it does on each host
//! stays an `ops` operation.

pub mod apply_many;
pub mod bundle_plan;
mod fanout;
pub mod plan_many;
