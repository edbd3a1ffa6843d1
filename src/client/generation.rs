//! The requests that move a venv between generations: open one
//! ([`Client::prepare`]) or finish an interrupted one, switch it into
//! place and commit it, roll back, list and prune.

use super::Client;
use crate::error::Result;
use crate::model::{GenerationInfo, PrepareRequest, RollbackReport, Running, VenvProcess};
use crate::protocol::{Request, Response};

/// A generation opened on the target ([`Client::prepare`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The new generation's id.
    pub generation: String,
    /// What was done first to an interrupted generation, if there was one.
    pub recovered: Option<String>,
    /// What the target could not check (free space it does not know).
    pub warnings: Vec<String>,
    /// The venv's file system and the durability barrier chosen for it.
    pub durability: Option<crate::model::Durability>,
    /// The processes that run from the venv (allowed to: `allow_running`).
    pub running: Vec<VenvProcess>,
}

/// A generation committed on the target ([`Client::commit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The generation's id.
    pub generation: String,
    /// Bytes its backup holds on the target (0 without one).
    pub backup_bytes: u64,
    /// Those of [`Prepared::running`] that still run: with the old files.
    pub running: Vec<VenvProcess>,
}

/// A venv's generations ([`Client::history`]).
#[derive(Debug, Clone)]
pub struct History {
    pub generations: Vec<GenerationInfo>,
    /// What was done first to an interrupted generation, if there was one.
    pub recovered: Option<String>,
}

/// The generations [`Client::prune`] removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pruned {
    pub removed: Vec<String>,
    /// What was done first to an interrupted generation, if there was one.
    pub recovered: Option<String>,
}

impl Client {
    /// Finish an interrupted generation: roll it back, or with `resume`
    /// complete it. Returns what was done, if there was one.
    pub fn recover(
        &mut self,
        venv: &str,
        resume: bool,
        allow_running: bool,
    ) -> Result<Option<String>> {
        let req = Request::Recover {
            venv: venv.to_string(),
            resume,
            allow_running,
        };
        answer!(self, &req, "a recovery", Response::Recovered { outcome } => outcome)
    }

    /// Open a new generation on the target.
    pub fn prepare(&mut self, req: PrepareRequest) -> Result<Prepared> {
        let req = Request::Prepare(Box::new(req));
        answer!(self, &req, "a prepare", Response::Prepared {
            generation,
            recovered,
            warnings,
            durability,
            running,
        } => Prepared {
            generation,
            recovered,
            warnings,
            durability,
            running,
        })
    }

    /// Switch the staged generation into place; returns the paths changed.
    pub fn switch(&mut self) -> Result<u64> {
        answer!(self, &Request::Switch, "a switch", Response::Switched { changed } => changed)
    }

    /// [`Client::switch`], looking at `stop` at each progress frame: once it
    /// says stop (Ctrl-C), `Abort` is sent, and the target stops the switch
    /// and undoes it (or undoes it whole if it had finished). Returns
    /// `None` then: the generation is gone and the venv is as before.
    pub fn switch_unless(&mut self, stop: &dyn Fn() -> bool) -> Result<Option<u64>> {
        self.send(&Request::Switch)?;
        let mut aborted = false;
        let answer = loop {
            match self.recv() {
                Ok(Response::Progress(_)) if !aborted && stop() => {
                    self.send(&Request::Abort)?;
                    aborted = true;
                }
                Ok(Response::Progress(_)) => {}
                Ok(Response::Switched { changed }) if !aborted && !stop() => {
                    return Ok(Some(changed));
                }
                // Stopped and undone, or switched before the `Abort` came.
                Ok(Response::Switched { .. }) => break Ok(()),
                Err(e) if aborted && !self.lost => break Err(e),
                Err(e) => return Err(e),
                Ok(other) => return Err(self.unexpected("a switch", &other)),
            }
        };
        if !aborted {
            self.send(&Request::Abort)?;
        }
        // The answer to the `Abort`: the target undid and discarded the generation.
        match self.recv() {
            Ok(Response::Aborted) => Ok(None),
            Ok(other) => Err(self.unexpected("an abort", &other)),
            Err(e) => Err(answer.err().unwrap_or(e)),
        }
    }

    /// Mark the switched generation complete.
    pub fn commit(&mut self, keep_backup: bool, keep: Option<usize>) -> Result<Committed> {
        let req = Request::Commit { keep_backup, keep };
        answer!(self, &req, "a commit", Response::Committed {
            generation,
            backup_bytes,
            running,
        } => Committed {
            generation,
            backup_bytes,
            running,
        })
    }

    /// Roll back generations down to and including `to` (default: the newest).
    /// With `force`, also over changes made since the apply; with
    /// `allow_running`, also while processes run from the venv (else the
    /// target refuses, kind `Refused`).
    pub fn rollback(
        &mut self,
        venv: &str,
        to: Option<String>,
        force: bool,
        allow_running: bool,
    ) -> Result<RollbackReport> {
        let req = Request::Rollback {
            venv: venv.to_string(),
            to,
            force,
            allow_running,
        };
        answer!(self, &req, "a rollback", Response::RolledBack(r) => r)
    }

    /// The processes that run from the venv ([`crate::running`]).
    pub fn running(&mut self, venv: &str) -> Result<Running> {
        let req = Request::Running {
            venv: venv.to_string(),
        };
        answer!(self, &req, "a list of processes", Response::Running(r) => r)
    }

    /// The venv's generations, oldest first.
    pub fn history(&mut self, venv: &str) -> Result<History> {
        let req = Request::History {
            venv: venv.to_string(),
        };
        answer!(self, &req, "a history", Response::History {
            generations,
            recovered,
        } => History {
            generations,
            recovered,
        })
    }

    /// Remove all but the newest `keep` generations.
    pub fn prune(&mut self, venv: &str, keep: usize) -> Result<Pruned> {
        let req = Request::Prune {
            venv: venv.to_string(),
            keep,
        };
        answer!(self, &req, "a prune", Response::Pruned { removed, recovered } => Pruned { removed, recovered })
    }
}
