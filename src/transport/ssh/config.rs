//! Where a target leads: `[user@]host[:port]` or an alias parsed
//! ([`parse_target`]) and resolved through the text of ~/.ssh/config
//! ([`resolve`]: `HostName`, `User`, `Port`, `IdentityFile`,
//! `UserKnownHostsFile`, `HostKeyAlias`, `IdentityAgent`, with `~` and the
//! %-tokens expanded, and how the host is reached: directly, through
//! `ProxyJump` hops or a `ProxyCommand`, see [`Proxy`]), and the parts of
//! the local environment the transport reads ([`LocalUser`], [`LocalEnv`]).

use std::io;
use std::path::{Path, PathBuf};

use ssh2_config::{HostParams, ParseRule, SshConfig};

use super::Who;
use crate::err;
use crate::error::Result;

/// Identity files tried when ~/.ssh/config names none.
const DEFAULT_IDENTITIES: &[&str] = &["id_ed25519", "id_ecdsa", "id_rsa"];
/// Known-hosts files read (never written) besides the user's.
const GLOBAL_KNOWN_HOSTS: &[&str] = &["/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2"];

/// `[user@]host[:port]` as written in the manifest; `host` may be an alias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

/// Split `[user@]host[:port]`. IPv6 addresses go in brackets when a port
/// follows (`[::1]:2222`); a bare address with several colons has no port.
pub fn parse_target(s: &str) -> std::result::Result<Target, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("it is empty".into());
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("it contains whitespace".into());
    }
    let (user, rest) = match s.rsplit_once('@') {
        Some((u, r)) => {
            if u.is_empty() {
                return Err("the user before `@` is empty".into());
            }
            (Some(u.to_string()), r)
        }
        None => (None, s),
    };
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let (h, after) = inner
            .split_once(']')
            .ok_or_else(|| "`[` without a closing `]`".to_string())?;
        let port = match after {
            "" => None,
            p => Some(parse_port(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("unexpected `{p}` after `]`"))?,
            )?),
        };
        (h.to_string(), port)
    } else if rest.matches(':').count() == 1 {
        let (h, p) = rest.split_once(':').expect("one colon");
        (h.to_string(), Some(parse_port(p)?))
    } else {
        (rest.to_string(), None)
    };
    if host.is_empty() {
        return Err("the host name is empty".into());
    }
    if host.starts_with('-') {
        return Err(format!("the host name `{host}` starts with `-`"));
    }
    Ok(Target { user, host, port })
}

fn parse_port(p: &str) -> std::result::Result<u16, String> {
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("`{p}` is not a port number (1-65535)")),
        Ok(n) => Ok(n),
    }
}

/// The local account: default ssh user, and where ~ points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalUser {
    pub name: String,
    pub home: PathBuf,
}

impl LocalUser {
    /// `$USER`/`$HOME`, else this uid's entry in /etc/passwd, else root and /root.
    pub fn current() -> LocalUser {
        let entry = passwd_entry();
        let name = std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .or_else(|| entry.as_ref().map(|e| e.0.clone()))
            .unwrap_or_else(|| "root".into());
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)
            .or_else(|| entry.map(|e| e.1))
            .unwrap_or_else(|| PathBuf::from("/root"));
        LocalUser { name, home }
    }
}

fn passwd_entry() -> Option<(String, PathBuf)> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() }.to_string();
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 7 && f[2] == uid).then(|| (f[0].to_string(), PathBuf::from(f[5])))
    })
}

/// Which ssh-agent to ask (`IdentityAgent` in ~/.ssh/config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSocket {
    /// `$SSH_AUTH_SOCK`, if set.
    FromEnv,
    /// `IdentityAgent none`.
    Disabled,
    Path(PathBuf),
}

/// Everything needed to reach one host, after ~/.ssh/config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// What the manifest named (alias or host name), lowercased as ssh does.
    pub alias: String,
    /// The name or address to connect to (`HostName`, else the alias).
    pub hostname: String,
    pub port: u16,
    pub user: String,
    /// `IdentityFile`s (~ and %-tokens expanded), else the default key files.
    pub identity_files: Vec<PathBuf>,
    /// Whether `identity_files` came from the config (missing ones are then reported).
    pub identity_files_configured: bool,
    /// `UserKnownHostsFile`, else ~/.ssh/known_hosts and ~/.ssh/known_hosts2.
    /// New keys go to the first one.
    pub known_hosts_files: Vec<PathBuf>,
    /// `HostKeyAlias`: the name to look up in known_hosts instead of `hostname`.
    pub host_key_alias: Option<String>,
    pub agent: AgentSocket,
    /// How the host's SSH port is reached.
    pub proxy: Proxy,
}

/// How the host's SSH port is reached (`ProxyJump`, `ProxyCommand`, or the
/// manifest's `proxy_jump`, which wins over both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proxy {
    /// A TCP connection from here.
    Direct,
    /// Through these jump hosts, first hop first (ssh's `-J` syntax: each
    /// `[user@]host[:port]` or an alias, itself resolved through ~/.ssh/config).
    Jump(Vec<String>),
    /// The standard input and output of this command, run with `sh -c`
    /// (ssh's %-tokens already expanded, as ssh does before it runs it).
    Command(String),
}

impl Resolved {
    /// The name under which known_hosts stores this host: `host` for port 22,
    /// `[host]:port` otherwise (as OpenSSH writes it).
    pub fn known_hosts_name(&self) -> String {
        let h = self
            .host_key_alias
            .as_deref()
            .unwrap_or(&self.hostname)
            .to_ascii_lowercase();
        if self.port == 22 {
            h
        } else {
            format!("[{h}]:{}", self.port)
        }
    }
}

/// Resolve `target` through the text of an ssh config file (`""` when there
/// is none). `Include`s are read relative to `local.home`/.ssh. A pure
/// function of its inputs otherwise; the error is the bare cause.
pub fn resolve(
    target: &str,
    config: &str,
    local: &LocalUser,
) -> std::result::Result<Resolved, String> {
    let t = parse_target(target)?;
    let alias = t.host.to_ascii_lowercase();
    let cfg = SshConfig::default()
        .home_dir(&local.home)
        .parse(
            &mut config.as_bytes(),
            ParseRule::ALLOW_UNKNOWN_FIELDS | ParseRule::ALLOW_UNSUPPORTED_FIELDS,
        )
        .map_err(|e| format!("~/.ssh/config cannot be parsed: {e}"))?;
    let p = cfg.query(&alias);

    let hostname = match &p.host_name {
        Some(h) => percent_host(h, &alias),
        None => alias.clone(),
    };
    let user = t
        .user
        .clone()
        .or_else(|| p.user.clone())
        .unwrap_or_else(|| local.name.clone());
    let port = t.port.or(p.port).unwrap_or(22);
    let tokens = Tokens {
        home: &local.home,
        local_user: &local.name,
        hostname: &hostname,
        remote_user: &user,
        port,
        alias: &alias,
    };

    let ssh_dir = local.home.join(".ssh");
    let identities = identity_files(&p, &tokens, &ssh_dir);
    let known_hosts_files = match field(&p, "userknownhostsfile") {
        Some(v) => v
            .iter()
            .filter(|f| !f.eq_ignore_ascii_case("none"))
            .map(|f| tokens.expand_path(f))
            .collect(),
        None => vec![ssh_dir.join("known_hosts"), ssh_dir.join("known_hosts2")],
    };
    let host_key_alias = field(&p, "hostkeyalias").map(|v| v[0].clone());
    let agent = match field(&p, "identityagent").map(|v| v[0].clone()) {
        None => AgentSocket::FromEnv,
        Some(a) if a.eq_ignore_ascii_case("none") => AgentSocket::Disabled,
        Some(a) if a == "SSH_AUTH_SOCK" || a == "$SSH_AUTH_SOCK" => AgentSocket::FromEnv,
        Some(a) => AgentSocket::Path(tokens.expand_path(&a)),
    };

    let proxy = proxy_of(&p, &tokens)?;

    Ok(Resolved {
        proxy,
        alias,
        hostname,
        port,
        user,
        identity_files: identities.files,
        identity_files_configured: identities.configured,
        known_hosts_files,
        host_key_alias,
        agent,
    })
}

/// A config option that `ssh2_config` keeps as text (not one it parses).
fn field(p: &HostParams, name: &str) -> Option<Vec<String>> {
    p.unsupported_fields
        .get(name)
        .or_else(|| p.ignored_fields.get(name))
        .cloned()
        .filter(|v| !v.is_empty())
}

/// The host's `ProxyJump` or `ProxyCommand` (`none` for either is no
/// proxy). When the config sets both, `ProxyJump` is used (ssh uses the one
/// that comes first in the file, which the parsed config no longer tells).
fn proxy_of(p: &HostParams, tokens: &Tokens<'_>) -> std::result::Result<Proxy, String> {
    if let Some(jump) = p.proxy_jump.as_ref().filter(|j| !j.is_empty())
        && !(jump.len() == 1 && jump[0].eq_ignore_ascii_case("none"))
    {
        let hops = crate::model::jump_hops(&jump.join(","))
            .map_err(|why| format!("~/.ssh/config's ProxyJump for {} {why}", tokens.alias))?;
        return Ok(Proxy::Jump(hops));
    }
    if let Some(cmd) = field(p, "proxycommand")
        && !(cmd.len() == 1 && cmd[0].eq_ignore_ascii_case("none"))
    {
        return Ok(Proxy::Command(tokens.expand(&cmd.join(" "))));
    }
    Ok(Proxy::Direct)
}

/// The key files to try, and whether the config named them.
struct Identities {
    files: Vec<PathBuf>,
    /// Missing files are reported only when the config named them.
    configured: bool,
}

/// `IdentityFile`s (expanded, `none` dropped), else the default key files.
fn identity_files(p: &HostParams, tokens: &Tokens<'_>, ssh_dir: &Path) -> Identities {
    match &p.identity_file {
        Some(files) if !files.is_empty() => Identities {
            files: files
                .iter()
                .filter(|f| f.as_os_str() != "none")
                .map(|f| tokens.expand_path(&f.to_string_lossy()))
                .collect(),
            configured: true,
        },
        _ => Identities {
            files: DEFAULT_IDENTITIES.iter().map(|n| ssh_dir.join(n)).collect(),
            configured: false,
        },
    }
}

/// `%h` and `%%` in HostName.
fn percent_host(s: &str, alias: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('h') => out.push_str(alias),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The ssh_config %-tokens overlay expands in file names.
struct Tokens<'a> {
    home: &'a Path,
    local_user: &'a str,
    hostname: &'a str,
    remote_user: &'a str,
    port: u16,
    alias: &'a str,
}

impl Tokens<'_> {
    fn expand_path(&self, s: &str) -> PathBuf {
        let s = if s == "~" {
            self.home.display().to_string()
        } else if let Some(rest) = s.strip_prefix("~/") {
            format!("{}/{rest}", self.home.display())
        } else {
            s.to_string()
        };
        PathBuf::from(self.expand(&s))
    }

    /// `%d %u %h %r %p %n %%` expanded; other `%x` kept as they are.
    fn expand(&self, s: &str) -> String {
        let mut out = String::new();
        let mut it = s.chars();
        while let Some(c) = it.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            match it.next() {
                Some('d') => out.push_str(&self.home.display().to_string()),
                Some('u') => out.push_str(self.local_user),
                Some('h') => out.push_str(self.hostname),
                Some('r') => out.push_str(self.remote_user),
                Some('p') => out.push_str(&self.port.to_string()),
                Some('n') => out.push_str(self.alias),
                Some('%') => out.push('%'),
                Some(o) => {
                    out.push('%');
                    out.push(o);
                }
                None => out.push('%'),
            }
        }
        out
    }
}

/// The parts of the local environment the transport reads; tests build their own.
#[derive(Debug, Clone)]
pub(crate) struct LocalEnv {
    pub user: LocalUser,
    /// ~/.ssh/config (need not exist).
    pub config_path: PathBuf,
    /// `$SSH_AUTH_SOCK`.
    pub agent_sock: Option<PathBuf>,
    pub agent_binary: PathBuf,
    pub global_known_hosts: Vec<PathBuf>,
}

impl LocalEnv {
    pub(super) fn from_process() -> Result<LocalEnv> {
        let user = LocalUser::current();
        Ok(LocalEnv {
            config_path: user.home.join(".ssh").join("config"),
            agent_sock: std::env::var_os("SSH_AUTH_SOCK")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            agent_binary: super::agent_binary_path()?,
            global_known_hosts: GLOBAL_KNOWN_HOSTS.iter().map(PathBuf::from).collect(),
            user,
        })
    }
}

/// Read ~/.ssh/config (its text; empty when there is none).
pub(super) fn read_config(who: Who<'_>, env: &LocalEnv) -> Result<String> {
    match std::fs::read_to_string(&env.config_path) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(err!(
            kind = Usage,
            hint = "fix the permissions of that file, or move it away",
            "Failed to read {} for {who}: {}",
            env.config_path.display(),
            crate::error::io_cause(&e)
        )),
    }
}

/// Read ~/.ssh/config and resolve `who`'s target through it; `jump` (the
/// manifest's `proxy_jump`) replaces the proxy the config sets.
pub(super) fn resolve_target(who: Who<'_>, jump: Option<&str>, env: &LocalEnv) -> Result<Resolved> {
    let config = read_config(who, env)?;
    resolve_in(
        who,
        jump,
        &config,
        env,
        "write the host's ssh value as an alias from ~/.ssh/config or as [user@]host[:port]",
    )
}

/// [`resolve`] with the error worded for `who`; `jump` replaces the config's proxy.
pub(super) fn resolve_in(
    who: Who<'_>,
    jump: Option<&str>,
    config: &str,
    env: &LocalEnv,
    hint: &str,
) -> Result<Resolved> {
    let mut r = resolve(who.target, config, &env.user).map_err(|cause| {
        let hint = if cause.starts_with("~/.ssh/config") {
            "fix that entry of ~/.ssh/config"
        } else {
            hint
        };
        err!(
            kind = Usage,
            hint = hint,
            "Failed to resolve the ssh target of {who}: {cause}"
        )
    })?;
    if let Some(j) = jump {
        let hops = crate::model::jump_hops(j).map_err(|why| {
            err!(
                kind = Usage,
                hint = "write proxy_jump as ssh -J takes it: `user@jump:port,other`",
                "Failed to resolve the ssh target of {who}: proxy_jump {j:?} {why}"
            )
        })?;
        r.proxy = Proxy::Jump(hops);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local() -> LocalUser {
        LocalUser {
            name: "alice".into(),
            home: PathBuf::from("/home/alice"),
        }
    }

    #[test]
    fn parses_targets() {
        let t = |s: &str| parse_target(s).unwrap();
        assert_eq!(
            t("box"),
            Target {
                user: None,
                host: "box".into(),
                port: None
            }
        );
        assert_eq!(
            t("deploy@box.lan:2222"),
            Target {
                user: Some("deploy".into()),
                host: "box.lan".into(),
                port: Some(2222)
            }
        );
        assert_eq!(t("a@b@box").user.as_deref(), Some("a@b"));
        assert_eq!(
            t("[::1]:2200"),
            Target {
                user: None,
                host: "::1".into(),
                port: Some(2200)
            }
        );
        assert_eq!(t("root@[fe80::1]").host, "fe80::1");
        assert_eq!(t("fe80::1").port, None);
        assert_eq!(t("fe80::1").host, "fe80::1");
        for bad in [
            "",
            "  ",
            "@box",
            "box:",
            "box:x",
            "box:0",
            "box:70000",
            "[::1",
            "[::1]x",
            "-oProxyCommand=sh",
            "a b",
            "user@",
        ] {
            assert!(parse_target(bad).is_err(), "{bad:?} should be refused");
        }
    }

    const CONFIG: &str = "\
Host web
    HostName web.internal
    User deploy
    Port 2222
    IdentityFile ~/.ssh/web_key
    IdentityFile %d/.ssh/%r@%h
    UserKnownHostsFile ~/.ssh/kh_web /etc/kh_%n
    HostKeyAlias webalias
    IdentityAgent ~/.ssh/agent.sock

Host *.lan
    User lanuser
    HostName %h.example.org

Host jump
    ProxyJump bastion

Host pc
    ProxyCommand ssh -l %u -W %h:%p %x %%% hop

Host multi
    ProxyJump u@j1:2222,j2

Host nojump
    ProxyJump none

Host badjump
    ProxyJump a,,b

Host noagent
    IdentityAgent none
    UserKnownHostsFile none

Host *
    ForwardAgent no
    SomeOptionNobodyKnows yes
    Port 22
";

    #[test]
    fn resolves_through_a_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, CONFIG).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let l = local();

        let r = resolve("web", &text, &l).unwrap();
        assert_eq!(r.hostname, "web.internal");
        assert_eq!((r.user.as_str(), r.port), ("deploy", 2222));
        assert_eq!(
            r.identity_files,
            vec![
                PathBuf::from("/home/alice/.ssh/web_key"),
                PathBuf::from("/home/alice/.ssh/deploy@web.internal"),
            ]
        );
        assert!(r.identity_files_configured);
        assert_eq!(
            r.known_hosts_files,
            vec![
                PathBuf::from("/home/alice/.ssh/kh_web"),
                PathBuf::from("/etc/kh_web")
            ]
        );
        assert_eq!(r.host_key_alias.as_deref(), Some("webalias"));
        assert_eq!(r.known_hosts_name(), "[webalias]:2222");
        assert_eq!(
            r.agent,
            AgentSocket::Path("/home/alice/.ssh/agent.sock".into())
        );

        // The manifest's user and port win over the config's.
        let r = resolve("root@WEB:2200", &text, &l).unwrap();
        assert_eq!(
            (r.user.as_str(), r.port, r.hostname.as_str()),
            ("root", 2200, "web.internal")
        );

        let r = resolve("box.lan", &text, &l).unwrap();
        assert_eq!(
            (r.user.as_str(), r.hostname.as_str()),
            ("lanuser", "box.lan.example.org")
        );

        // Nothing configured: local user, port 22, default key files and known_hosts.
        let r = resolve("10.0.0.7", &text, &l).unwrap();
        assert_eq!(
            (r.user.as_str(), r.port, r.hostname.as_str()),
            ("alice", 22, "10.0.0.7")
        );
        assert!(!r.identity_files_configured);
        assert_eq!(
            r.identity_files[0],
            PathBuf::from("/home/alice/.ssh/id_ed25519")
        );
        assert_eq!(r.identity_files.len(), 3);
        assert_eq!(
            r.known_hosts_files[0],
            PathBuf::from("/home/alice/.ssh/known_hosts")
        );
        assert_eq!(r.known_hosts_name(), "10.0.0.7");
        assert_eq!(r.agent, AgentSocket::FromEnv);

        let r = resolve("noagent", &text, &l).unwrap();
        assert_eq!(r.agent, AgentSocket::Disabled);
        assert!(r.known_hosts_files.is_empty());

        assert_eq!(r.proxy, Proxy::Direct);

        // ProxyJump: the hops, first first; ProxyCommand: %-tokens expanded.
        let r = resolve("jump", &text, &l).unwrap();
        assert_eq!(r.proxy, Proxy::Jump(vec!["bastion".into()]));
        let r = resolve("pc", &text, &l).unwrap();
        assert_eq!(
            r.proxy,
            Proxy::Command("ssh -l alice -W pc:22 %x %% hop".into())
        );
        let r = resolve("multi", &text, &l).unwrap();
        assert_eq!(r.proxy, Proxy::Jump(vec!["u@j1:2222".into(), "j2".into()]));
        let r = resolve("nojump", &text, &l).unwrap();
        assert_eq!(r.proxy, Proxy::Direct);
        assert!(
            resolve("badjump", &text, &l)
                .unwrap_err()
                .contains("ProxyJump")
        );
        assert!(resolve("box:x", &text, &l).is_err());
        // No config at all.
        let r = resolve("u@h:2", "", &l).unwrap();
        assert_eq!(
            (r.user.as_str(), r.hostname.as_str(), r.port),
            ("u", "h", 2)
        );
        assert_eq!(r.known_hosts_name(), "[h]:2");
    }

    #[test]
    fn expands_percent_h_in_host_names() {
        assert_eq!(percent_host("%h.x%%", "a"), "a.x%");
    }
}
