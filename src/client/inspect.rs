//! The requests that read a host without changing it: scan and stat a
//! venv, the ELF facts and the preflight, `doctor` and the RECORD check,
//! and `[verify]`.

use super::Client;
use crate::err;
use crate::error::Result;
use crate::model::{
    ElfInfo, Entry, HashMode, PreflightReport, PreflightRequest, Progress, ScanReport, Set,
    ShebangRewrite, VerifyReport, VerifyRequest,
};
use crate::protocol::{Request, Response};

impl Client {
    /// Scan the venv.
    pub fn scan(&mut self, venv: &str, file_globs: &[String]) -> Result<ScanReport> {
        self.scan_with(venv, file_globs, false)
    }

    /// [`Client::scan`]; with `machine_later`, without the host's machine
    /// facts, which are read meanwhile: ask for them with
    /// [`Client::machine`].
    pub fn scan_with(
        &mut self,
        venv: &str,
        file_globs: &[String],
        machine_later: bool,
    ) -> Result<ScanReport> {
        self.send(&Request::Scan {
            venv: venv.to_string(),
            file_globs: file_globs.to_vec(),
            machine_later,
        })?;
        match self.recv()? {
            Response::Scan(r) => Ok(r),
            other => Err(self.unexpected("a scan", &other)),
        }
    }

    /// The host's machine facts, read since a scan with `machine_later`.
    pub fn machine(&mut self) -> Result<crate::model::Machine> {
        answer!(self, &Request::Machine, "the machine's facts", Response::Machine(m) => m)
    }

    /// Stat and hash paths, reporting progress.
    pub fn stat(
        &mut self,
        venv: &str,
        paths: Vec<String>,
        hash: HashMode,
        shebang: Option<ShebangRewrite>,
        pycache: bool,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<Entry>> {
        let req = Request::Stat {
            venv: venv.to_string(),
            paths,
            hash,
            shebang,
            pycache,
        };
        self.send(&req)?;
        let Request::Stat { paths, .. } = req else {
            unreachable!()
        };
        self.stat_answer(paths, on_progress)
    }

    /// Stat the members of `sets` on this host (found in the scan it
    /// answered) and `extra` paths: the answer is for `order`, which is
    /// [`crate::plan::stat_order`] of the same, as the controller computed it.
    #[allow(clippy::too_many_arguments)]
    pub fn stat_members(
        &mut self,
        venv: &str,
        sets: &[Set],
        globs: &[String],
        extra: Vec<String>,
        order: Vec<String>,
        check: u64,
        hash: HashMode,
        shebang: Option<ShebangRewrite>,
        pycache: bool,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<Entry>> {
        self.send(&Request::StatMembers {
            venv: venv.to_string(),
            sets: sets.to_vec(),
            globs: globs.to_vec(),
            extra,
            count: order.len() as u64,
            check,
            hash,
            shebang,
            pycache,
        })?;
        self.stat_answer(order, on_progress)
    }

    /// Read a stat's answer: one entry for each of `paths`, in order.
    fn stat_answer(
        &mut self,
        paths: Vec<String>,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<Entry>> {
        loop {
            match self.recv()? {
                Response::Progress(p) => on_progress(p),
                Response::Stat { entries } => {
                    if entries.len() != paths.len() {
                        return Err(err!(
                            kind = Protocol,
                            "The agent on {} answered a stat of {} paths with {} entries",
                            self.host,
                            paths.len(),
                            entries.len()
                        ));
                    }
                    return paths
                        .into_iter()
                        .zip(entries)
                        .map(|(p, e)| {
                            e.into_entry(p).ok_or_else(|| {
                                err!(
                                    kind = Protocol,
                                    "The agent on {} sent a stat entry of an unknown kind",
                                    self.host
                                )
                            })
                        })
                        .collect();
                }
                other => return Err(self.unexpected("a stat", &other)),
            }
        }
    }

    /// Start listing the target's shared objects in the background, for
    /// the [`Client::preflight`] that follows: GPU code for `gpus`, of
    /// the objects `gpu_paths` names (site-packages relative; `None`: all).
    pub fn prefetch_preflight(
        &mut self,
        venv: &str,
        gpus: Option<Vec<(u32, u32)>>,
        gpu_paths: Option<Vec<String>>,
    ) -> Result<()> {
        let req = Request::PrefetchPreflight {
            venv: venv.to_string(),
            gpus,
            gpu_paths,
        };
        answer!(self, &req, "a preflight prefetch", Response::Prefetching => ())
    }

    /// Start reading the ELF facts of `paths` (site-packages relative) on the
    /// source in the background, for the [`Client::elf_info`] that follows.
    pub fn prefetch_elf(
        &mut self,
        venv: &str,
        paths: Vec<String>,
        gpus: Option<Vec<(u32, u32)>>,
    ) -> Result<()> {
        let req = Request::PrefetchElf {
            venv: venv.to_string(),
            paths,
            gpus,
        };
        answer!(self, &req, "an ELF facts prefetch", Response::Prefetching => ())
    }

    /// ELF facts of `paths` (site-packages relative), one per path.
    pub fn elf_info(
        &mut self,
        venv: &str,
        paths: Vec<String>,
        gpus: Option<Vec<(u32, u32)>>,
    ) -> Result<Vec<Option<ElfInfo>>> {
        let req = Request::ElfInfo {
            venv: venv.to_string(),
            paths,
            gpus,
        };
        answer!(self, &req, "a request for ELF facts", Response::ElfInfo { infos } => infos)
    }

    /// Predict on the target what fails to load after the overlay.
    pub fn preflight(&mut self, req: PreflightRequest) -> Result<PreflightReport> {
        let req = Request::Preflight(Box::new(req));
        answer!(self, &req, "a preflight", Response::Preflight(r) => r)
    }

    /// Check the venv as it stands (`overlay doctor`).
    /// `on_progress` sees the hashing as it goes.
    pub fn doctor(
        &mut self,
        req: crate::model::DoctorRequest,
        on_progress: &mut dyn FnMut(Progress),
    ) -> Result<crate::model::DoctorReport> {
        let req = Request::Doctor(Box::new(req));
        match self.call(&req, on_progress)? {
            Response::Doctor(r) => Ok(r),
            other => Err(self.unexpected("a doctor", &other)),
        }
    }

    /// Check some distributions' files against their own RECORD.
    pub fn record_check(
        &mut self,
        req: crate::model::RecordCheckRequest,
    ) -> Result<Vec<crate::model::Finding>> {
        let req = Request::RecordCheck(Box::new(req));
        answer!(self, &req, "a RECORD check", Response::RecordChecked { findings } => findings)
    }

    /// Run the `[verify]` check in the venv.
    pub fn verify(&mut self, req: VerifyRequest) -> Result<VerifyReport> {
        let req = Request::Verify(Box::new(req));
        answer!(self, &req, "a verify", Response::Verified(r) => r)
    }
}
