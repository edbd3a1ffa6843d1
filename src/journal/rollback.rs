//! Finishing and rolling back: [`State::recover`] finishes an interrupted
//! generation (rolls it back, or resumes its switch when asked and its
//! files were all staged; one that never switched is simply dropped), and
//! [`State::rollback`] undoes complete generations newest first, down to
//! the one asked for, stopping before one that cannot be undone (applied
//! without a backup, or damaged), and refusing, unless forced, when their
//! files or distributions changed since the apply (see `guard.rs`).

use super::format::{Generation, Record};
use super::{GENERATIONS, State, fs_err};
use crate::err;
use crate::error::{Error, Result};
use crate::inventory::Counters;
use crate::model::{RollbackReport, Status};

/// What there is to recover.
enum ToRecover {
    /// Nothing: every generation finished.
    Nothing,
    /// An unfinished generation (boxed: it is large).
    Unfinished(Box<Generation>),
    /// A damaged generation that never switched, dropped just now.
    Dropped { id: String, message: String },
}

impl State {
    /// The unfinished generation, if any (at most one: the lock serializes).
    /// A damaged one whose journal says it finished is passed over; one that
    /// was interrupted is an error saying what to do.
    pub fn unfinished(&self) -> Result<Option<Generation>> {
        for id in self.generation_ids().into_iter().rev() {
            match self.load(&id) {
                Ok(g) if matches!(g.status(), Status::Complete | Status::RolledBack) => {}
                Ok(g) => return Ok(Some(g)),
                Err(e) => match self.journal_status(&id) {
                    Some(Status::Complete | Status::RolledBack) => {}
                    _ => return Err(e),
                },
            }
        }
        Ok(None)
    }

    /// The newest generation to recover: an unfinished one, or a damaged
    /// one whose journal says it never switched (dropped here, saying so).
    /// A damaged one that was interrupted mid-switch is an error.
    fn to_recover(&self) -> Result<ToRecover> {
        for id in self.generation_ids().into_iter().rev() {
            match self.load(&id) {
                Ok(g) if matches!(g.status(), Status::Complete | Status::RolledBack) => {}
                Ok(g) => return Ok(ToRecover::Unfinished(Box::new(g))),
                Err(e) => match self.journal_status(&id) {
                    Some(Status::Complete | Status::RolledBack) => {}
                    Some(Status::Prepared | Status::Staged) => {
                        self.fs
                            .remove_all(&format!("{GENERATIONS}/{id}"))
                            .map_err(|e| fs_err("remove", &self.gen_dir(&id), &e))?;
                        return Ok(ToRecover::Dropped {
                            id: id.clone(),
                            message: format!(
                                "discarded the interrupted generation {id} (nothing had been switched; its state was damaged: {})",
                                e.message
                            ),
                        });
                    }
                    _ => return Err(e),
                },
            }
        }
        Ok(ToRecover::Nothing)
    }

    /// Finish an interrupted generation: roll it back, or resume the switch
    /// when its files were all staged. Returns its id and what was done.
    pub fn recover(&self, resume: bool, counters: &Counters) -> Result<Option<(String, String)>> {
        self.remove_leftovers();
        let mut g = match self.to_recover()? {
            ToRecover::Unfinished(g) => *g,
            ToRecover::Nothing => return Ok(None),
            ToRecover::Dropped { id, message } => return Ok(Some((id, message))),
        };
        let id = g.meta.id.clone();
        let status = g.status();
        let rolling_back = g.records.contains(&Record::RollbackBegin);
        if resume && !rolling_back {
            if matches!(status, Status::Prepared) {
                return Err(err!(
                    kind = Conflict,
                    hint = "run `overlay apply` without --resume: the interrupted generation is discarded, then applied anew",
                    "Generation {id} was interrupted while its files were still streaming; it cannot be resumed"
                ));
            }
            if matches!(status, Status::Staged | Status::Switching) {
                self.switch(&mut g)?;
            }
            self.check(&mut g, counters)?;
            self.commit(&mut g, None)?;
            return Ok(Some((
                id.clone(),
                format!("resumed and completed the interrupted generation {id}"),
            )));
        }
        if matches!(status, Status::Prepared | Status::Staged) {
            // Nothing in the venv changed: drop the generation entirely.
            self.discard(g)?;
            return Ok(Some((
                id.clone(),
                format!("discarded the interrupted generation {id} (nothing had been switched)"),
            )));
        }
        let undone = self.undo(&mut g)?;
        let n = self.finish_undo(&g, &undone, counters)?;
        let what = if rolling_back {
            "finished the interrupted rollback of"
        } else {
            "rolled back the interrupted generation"
        };
        Ok(Some((
            id,
            format!(
                "{what} {}; {n} paths match the listing from before it",
                g.meta.id
            ),
        )))
    }

    /// Roll back the newest complete generations down to and including `to`.
    /// If their files or distributions changed since the apply, nothing is
    /// done and the report says so (`refused`, `later`), unless `force`.
    pub fn rollback(
        &self,
        to: Option<&str>,
        force: bool,
        counters: &Counters,
    ) -> Result<RollbackReport> {
        let mut report = RollbackReport::default();
        if let Some((id, msg)) = self.recover(false, counters)? {
            // An interrupted apply is what the user wants undone: stop there.
            report.generations.push(id);
            report.recovered = Some(msg);
            return Ok(report);
        }
        let mut gens = self.to_roll_back(to)?;
        let later = self.later_changes(&gens, counters)?;
        let forced = match later {
            Some((l, after)) if !l.is_empty() => {
                report.later = Some(l);
                if !force {
                    report.refused = true;
                    report.generations = gens.iter().map(|g| g.meta.id.clone()).collect();
                    return Ok(report);
                }
                Some(after)
            }
            _ => None,
        };
        for g in &mut gens {
            let undone = self.undo_with(g, forced.is_some())?;
            report.restored += undone.restored;
            report.removed += undone.removed;
            report.verified += self.finish_undo(g, &undone, counters)?;
            if !undone.edited.is_empty() {
                report.kept_edited.push(format!(
                    "{} (changed since the apply; kept in {})",
                    undone.edited.join(", "),
                    g.dir.join("undone").display()
                ));
            }
            report.generations.push(g.meta.id.clone());
        }
        if let Some(after) = forced {
            let r = self.reconcile(&gens, &after);
            report.displaced = r.displaced;
            report.displaced_to = r.to;
            report.inconsistent = r.problems;
        }
        Ok(report)
    }

    /// The complete generations to undo, newest first, down to and
    /// including `to` (default: the newest); an error when `to` is not one
    /// of them, or one on the way is damaged or kept no backup.
    fn to_roll_back(&self, to: Option<&str>) -> Result<Vec<Generation>> {
        // Complete generations, newest last; a damaged one (whose journal
        // says complete) is kept in the list so that rollback stops at it.
        let live: Vec<(String, Option<Error>)> =
            self.generation_ids()
                .into_iter()
                .filter_map(|id| match self.load(&id) {
                    Ok(g) => (g.status() == Status::Complete).then_some((id, None)),
                    Err(e) => (self.journal_status(&id) == Some(Status::Complete))
                        .then_some((id, Some(e))),
                })
                .collect();
        let Some(newest) = live.last().map(|(id, _)| id.clone()) else {
            return Err(err!(
                kind = Conflict,
                hint = "`overlay history HOST` lists generations",
                "Nothing to roll back in {}: no applied generation",
                self.root.display()
            ));
        };
        let to = to.map(str::to_string).unwrap_or(newest);
        if !live.iter().any(|(id, _)| id == &to) {
            return Err(err!(
                kind = Conflict,
                hint = "`overlay history HOST` lists generations that can be rolled back",
                "Generation {to} is not an applied generation in {}",
                self.root.display()
            ));
        }
        for (id, damaged) in live.iter().rev() {
            if let Some(e) = damaged {
                return Err(err!(
                    kind = Conflict,
                    "Generation {id} cannot be rolled back: {}",
                    e.message
                )
                .hint(format!(
                    "rollback stops before it; to give up on undoing it, move {} out of {}",
                    self.gen_dir(id).display(),
                    self.dir.display()
                )));
            }
            let g = self.load(id)?;
            if !g.meta.backup {
                return Err(err!(
                    kind = Conflict,
                    hint = "a generation applied with --no-backup (or by an older overlay without --backup) kept no old files and cannot be rolled back; to restore its files, plan from a host that has the old versions",
                    "Generation {id} was applied with --no-backup; rollback stops before it"
                ));
            }
            if id == &to {
                break;
            }
        }
        let mut gens: Vec<Generation> = Vec::new();
        for (id, _) in live.iter().rev() {
            gens.push(self.load(id)?);
            if id == &to {
                break;
            }
        }
        Ok(gens)
    }
}
