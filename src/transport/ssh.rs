//! (placeholder until the SSH transport lands)
pub fn start_agent(host: &str, _target: &str, _opts: &super::ConnectOptions) -> crate::error::Result<super::AgentPipe> {
    Err(crate::err!("ssh transport to {host} is not built yet"))
}
