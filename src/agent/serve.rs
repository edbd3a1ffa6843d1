//! The serve loop: read a request, dispatch it to its handler, write the
//! answer. What the requests of one connection share is in
//! `super::session`. The loop's rules are in the [module doc of the
//! agent](super).

use std::io::{Read, Write};

use super::handlers::{self, Members, Peer, Sending, StatHow};
use super::session::{Next, Session, permission_denied};
use crate::err;
use crate::error::{Error, Result};
use crate::journal::{Generation, State};
use crate::protocol::{Request, Response, read_frame, write_frame};

/// Serve requests until `Bye` or end of input.
pub fn serve(input: &mut dyn Read, output: &mut dyn Write) -> Result<()> {
    serve_with(input, output, None)
}

/// [`serve`], with `pending` saying (without reading it) whether the
/// controller sent something more or closed the input: a `Switch` stops
/// and undoes itself then (an `Abort` on Ctrl-C, or a dead controller).
pub fn serve_with(
    input: &mut dyn Read,
    output: &mut dyn Write,
    pending: Option<fn() -> bool>,
) -> Result<()> {
    let mut session = Session {
        pending,
        ..Session::default()
    };
    loop {
        let Some(req) = read_frame::<Request>(input)? else {
            return Ok(());
        };
        match session.dispatch(req, input, output)? {
            Next::Answer(response) => {
                send(output, &response)?;
                if let Response::Scan(report) = response {
                    session.scan = Some(report);
                }
            }
            Next::Last(response) => {
                if let Some(r) = response {
                    send(output, &r)?;
                }
                return Ok(());
            }
            Next::Refuse(response, why) => {
                send(output, &response)?;
                return Err(why);
            }
        }
    }
}

impl Session {
    /// Pass one request to its handler. A handler's error becomes an error
    /// answer; only reading or writing the controller's pipe fails here.
    fn dispatch(
        &mut self,
        req: Request,
        input: &mut dyn Read,
        output: &mut dyn Write,
    ) -> Result<Next> {
        use handlers as h;
        // One arm per request (unformatted: rustfmt would spread each
        // request's fields over a line apiece).
        #[rustfmt::skip]
        let answer = match req {
            Request::Hello { protocol } => return Ok(h::hello(protocol)),
            Request::Bye => return Ok(Next::Last(Some(Response::Bye))),
            Request::Receive {
                venv,
                generation,
                lane,
                shared,
            } => return h::receive(input, &venv, &generation, lane, shared.as_deref()),
            Request::OpenLanes { count } => h::open_lanes(self, count),
            Request::Stage { shared } => return Ok(h::stage(self, input, shared.as_deref())),
            Request::EndData { .. } => Err(err!(kind = Protocol, "EndData without Stage")),
            Request::Scan { venv, file_globs, machine_later } => h::scan(self, &venv, &file_globs, machine_later),
            Request::Machine => h::machine(self),
            Request::Stat { venv, paths, hash, shebang, pycache } =>
                h::stat(self, output, &venv, &paths, &StatHow { hash, shebang, pycache }),
            Request::StatMembers {
                venv, sets, globs, extra, count, check, hash, shebang, pycache,
            } =>
                h::stat_members(self, output, &Members { venv, sets, globs, extra, count, check },
                    &StatHow { hash, shebang, pycache }),
            Request::Send { venv, files, cuts, shebang, compression } =>
                h::send(self, output, &Sending { venv, files, cuts, shebang, compression }),
            Request::SendDirect {
                venv, files, shebang, compression,
                ssh, proxy_jump, agent, target_venv, generation, connect_timeout_secs, lane,
            } =>
                h::send_direct(output, &Sending { venv, files, cuts: Vec::new(), shebang, compression },
                    &Peer { ssh, proxy_jump, agent, target_venv, generation, connect_timeout_secs, lane }),
            Request::StagedDirect { hashes, written } => h::staged_direct(self, &hashes, &written),
            Request::StageLocal { source_venv, shebang } =>
                h::stage_local(self, output, &source_venv, shebang.as_ref()),
            Request::Prepare(req) => h::prepare(self, output, &req),
            Request::Switch => h::switch(self, output),
            Request::Commit { keep_backup, keep } => h::commit(self, keep_backup, keep),
            Request::Abort => h::abort(self),
            Request::Rollback { venv, to, force, allow_running } => {
                h::rollback(self, output, &venv, to.as_deref(), force, allow_running)
            }
            Request::Running { venv } => h::running(self, &venv),
            Request::History { venv } => h::history(self, &venv),
            Request::Prune { venv, keep } => h::prune(self, &venv, keep),
            Request::Recover {
                venv,
                resume,
                allow_running,
            } => h::recover(self, output, &venv, resume, allow_running),
            Request::Verify(req) => h::verify(&req),
            Request::ElfInfo { venv, paths, gpus } => {
                crate::preflight::elf::fatbin::read_for(gpus);
                crate::preflight::elf::fatbin::read_code_of(None);
                h::elf_info(self, output, &venv, &paths)
            }
            Request::PrefetchElf { venv, paths, gpus } => {
                crate::preflight::elf::fatbin::read_for(gpus);
                crate::preflight::elf::fatbin::read_code_of(None);
                h::prefetch_elf(self, venv, paths)
            }
            Request::PrefetchPreflight { venv, gpus, gpu_paths } => {
                crate::preflight::elf::fatbin::read_for(gpus);
                h::prefetch_running(self, &venv);
                h::prefetch_preflight(self, venv, gpu_paths.as_deref())
            }
            Request::Preflight(req) => h::preflight(self, output, &req),
            Request::Doctor(req) => {
                crate::preflight::elf::fatbin::read_code_of(None);
                h::doctor(output, &req)
            }
            Request::RecordCheck(req) => h::record_check(self, output, &req),
        };
        Ok(Next::Answer(
            answer.unwrap_or_else(|e| Response::Error(explain_denied(e))),
        ))
    }

    /// The venv's journal state, opened (and locked) on first use.
    pub(super) fn state(&mut self, venv: &str) -> Result<&State> {
        if self
            .state
            .as_ref()
            .is_none_or(|s| s.venv.root != std::path::Path::new(venv))
        {
            self.state = Some(State::open(venv)?);
        }
        Ok(self.state.as_ref().expect("just set"))
    }

    /// The state and the generation `Prepare` opened.
    pub(super) fn opened(&mut self) -> Result<(&State, &mut Generation)> {
        match (&self.state, &mut self.generation) {
            (Some(s), Some(g)) => Ok((s, g)),
            _ => Err(err!(
                kind = Protocol,
                "no generation is open: send Prepare first"
            )),
        }
    }

    /// Delete the open generation after a failed or abandoned stage (best
    /// effort: the next run recovers whatever is left).
    pub(super) fn discard_open(&mut self) {
        if let (Some(g), Some(s)) = (self.generation.take(), &self.state) {
            let _ = s.discard(g);
        }
    }
}

/// A file operation refused to an agent that does not run as root gets
/// the hint that says who it runs as and how to run it as root: the
/// manifest's `sudo` (docs/sudo.md). The controller adds the host's name.
fn explain_denied(e: Error) -> Error {
    let uid = rustix::process::geteuid().as_raw();
    if uid == 0 || !permission_denied(&e) {
        return e;
    }
    let who = match std::env::var("USER") {
        Ok(u) if !u.is_empty() && crate::model::valid_user_name(&u) => format!("{u} (uid {uid})"),
        _ => format!("uid {uid}"),
    };
    e.hint(format!(
        "the agent runs as {who} there, which may not do this: add `sudo = true` to this host's [hosts] table in the manifest to run it as root through sudo (docs/sudo.md), or log in as the venv's owner"
    ))
}

fn send(out: &mut dyn Write, r: &Response) -> Result<()> {
    write_frame(out, r).map_err(|e| {
        err!(
            kind = Connection,
            "agent: cannot write to the controller: {e}"
        )
    })
}
