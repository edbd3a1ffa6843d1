//! The manifest (`overlay.toml`): which hosts exist, where their venvs are,
//! which groups of hosts have a name of their own (`[groups.NAME]`), and
//! which package sets to overlay. Parsing is strict: unknown keys are
//! errors, and every error names the file, line and column.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::err;
use crate::error::{Error, Result};
use crate::model::{Endpoint, RouteSetting, Set, SshDest, normalize_name};

/// A parsed, validated manifest.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub path: PathBuf,
    pub hosts: BTreeMap<String, Host>,
    /// `[groups.NAME] hosts = [...]`: each group's hosts, in the manifest's
    /// order, each a key of `hosts` (checked when parsed).
    pub groups: BTreeMap<String, Vec<String>>,
    /// Sets in the order the manifest lists them.
    pub sets: Vec<Set>,
    pub verify: Option<Verify>,
    pub preflight: Preflight,
    /// `[apply] route`: the route into every host that sets none of its own.
    pub route: RouteSetting,
    /// Each set's `from`, by set name: sets not named here come from the
    /// source's venv.
    pub from: BTreeMap<String, SetFrom>,
}

/// A set's `from = "..."`: the folder, laid out like site-packages, its
/// files come from instead of the source host's venv (docs/manifest.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetFrom {
    /// `file:line:col` of the value, for messages.
    pub at: String,
    /// The value as written.
    pub value: String,
    /// The manifest host the folder is on (`from = "host:/path"`), or
    /// `None` for this machine.
    pub host: Option<String>,
    /// The folder: absolute (a relative one is joined to the manifest's
    /// directory).
    pub path: String,
}

/// `[preflight]`: how `plan` treats predicted breakage.
#[derive(Debug, Clone, Default)]
pub struct Preflight {
    /// Predicted problems are errors, not warnings.
    pub strict: bool,
    /// More distributions (globs) that must agree on the CUDA major.
    pub cuda_family: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Host {
    pub name: String,
    pub endpoint: Endpoint,
    /// Absolute path of the venv on that host.
    pub venv: String,
    /// `direct_ssh`: how another host's own `ssh` reaches this one, for
    /// `apply --direct` (default: the `ssh` value).
    pub direct_ssh: Option<String>,
    /// `sudo`: the user the agent runs as through `sudo -n` (`true` is
    /// `"root"`); `None` runs it as the login user (docs/sudo.md).
    pub sudo: Option<String>,
    /// How `apply` streams into this host without `--relay` or `--direct`:
    /// its own `route`, else `[apply] route`, else the relay.
    pub route: RouteSetting,
}

#[derive(Debug, Clone, Default)]
pub struct Verify {
    pub env: BTreeMap<String, String>,
    pub python: Option<String>,
    /// `timeout`: seconds the check may run (at least 1), if given.
    pub timeout: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    #[serde(default)]
    hosts: BTreeMap<String, Spanned<RawHost>>,
    #[serde(default)]
    sets: BTreeMap<Spanned<String>, Spanned<RawSet>>,
    #[serde(default)]
    groups: BTreeMap<Spanned<String>, Spanned<RawGroup>>,
    verify: Option<RawVerify>,
    preflight: Option<RawPreflight>,
    apply: Option<RawApply>,
}

/// `[apply]`: defaults of `overlay apply` for every plan of this manifest.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApply {
    route: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPreflight {
    #[serde(default)]
    strict: bool,
    #[serde(default)]
    cuda_family: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    ssh: Option<Spanned<String>>,
    venv: Spanned<String>,
    direct_ssh: Option<Spanned<String>>,
    /// `sudo = true | false | "user"`, checked in [`Locator::host`].
    sudo: Option<Spanned<toml::Value>>,
    proxy_jump: Option<Spanned<String>>,
    route: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSet {
    #[serde(default)]
    dists: Vec<Spanned<String>>,
    #[serde(default)]
    files: Vec<Spanned<String>>,
    from: Option<Spanned<String>>,
}

/// `[groups.NAME]`: a name for several hosts, usable wherever a host is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    hosts: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVerify {
    #[serde(default)]
    env: BTreeMap<String, String>,
    python: Option<String>,
    timeout: Option<Spanned<u64>>,
}

/// Line and column (1-based) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// The manifest's text, to turn a span of it into an error that names the
/// file, line and column.
struct Locator<'t> {
    path: &'t Path,
    text: &'t str,
}

impl Locator<'_> {
    /// `msg` at `span`, as `file:line:col: msg`.
    fn at(&self, span: std::ops::Range<usize>, msg: String) -> Error {
        let (line, col) = line_col(self.text, span.start);
        err!(
            hint = "fix the manifest; its format is described in docs/manifest.md",
            "{}:{line}:{col}: {msg}",
            self.path.display()
        )
    }

    /// A `route` value (`what` names where it is, e.g. `host dst`).
    fn route(&self, what: &str, route: Spanned<String>) -> Result<RouteSetting> {
        RouteSetting::parse(route.get_ref()).ok_or_else(|| {
            self.at(
                route.span(),
                format!(
                    "{what}: route must be \"relay\" (through this machine) or \"direct\" (from the source with its own ssh), not {:?}",
                    route.get_ref()
                ),
            )
        })
    }

    /// Check one `[hosts.NAME]` table; `route` is `[apply] route`, which
    /// the host's own `route` overrides.
    fn host(&self, name: String, host: RawHost, route: RouteSetting) -> Result<Host> {
        let venv = host.venv.get_ref().trim_end_matches('/').to_string();
        if !venv.starts_with('/') {
            return Err(self.at(
                host.venv.span(),
                format!(
                    "host {name}: venv must be an absolute path, not {:?}",
                    host.venv.get_ref()
                ),
            ));
        }
        let proxy_jump = match host.proxy_jump {
            Some(j) => {
                if host.ssh.is_none() {
                    return Err(self.at(
                        j.span(),
                        format!("host {name}: proxy_jump needs an ssh destination (`ssh = \"...\"`) to jump to"),
                    ));
                }
                if let Err(why) = crate::model::jump_hops(j.get_ref()) {
                    return Err(self.at(
                        j.span(),
                        format!("host {name}: proxy_jump {:?} {why}", j.get_ref()),
                    ));
                }
                Some(j.into_inner())
            }
            None => None,
        };
        let endpoint = match host.ssh {
            Some(s) if s.get_ref().trim().is_empty() => {
                return Err(self.at(s.span(), format!("host {name}: ssh must not be empty")));
            }
            Some(s) => Endpoint::Ssh(SshDest {
                target: s.into_inner(),
                proxy_jump,
            }),
            None => Endpoint::Local,
        };
        let direct_ssh = match host.direct_ssh {
            Some(s) if s.get_ref().trim().is_empty() || s.get_ref().starts_with('-') => {
                return Err(self.at(
                    s.span(),
                    format!(
                        "host {name}: direct_ssh must be an ssh destination ([user@]host or an alias), not {:?}",
                        s.get_ref()
                    ),
                ));
            }
            Some(s) => Some(s.into_inner()),
            None => None,
        };
        let sudo = match host.sudo {
            None => None,
            Some(s) => {
                let span = s.span();
                match s.into_inner() {
                    toml::Value::Boolean(false) => None,
                    toml::Value::Boolean(true) => Some("root".to_string()),
                    toml::Value::String(u) if crate::model::valid_user_name(&u) => Some(u),
                    other => {
                        return Err(self.at(
                            span,
                            format!(
                                "host {name}: sudo must be true, false or a user name (letters, digits, `.`, `_`, `-`), not {other}"
                            ),
                        ));
                    }
                }
            }
        };
        let route = match host.route {
            Some(r) => self.route(&format!("host {name}"), r)?,
            None => route,
        };
        Ok(Host {
            name,
            endpoint,
            venv: if venv.is_empty() { "/".into() } else { venv },
            direct_ssh,
            sudo,
            route,
        })
    }

    /// Check a set's `from`: a folder here (relative to the manifest's
    /// directory) or `host:/path` on a manifest host.
    fn from(
        &self,
        name: &str,
        from: Spanned<String>,
        hosts: &BTreeMap<String, Host>,
    ) -> Result<SetFrom> {
        let span = from.span();
        let value = from.into_inner();
        let (line, col) = line_col(self.text, span.start);
        let at = format!("{}:{line}:{col}", self.path.display());
        if value.trim().is_empty() || value.contains('\0') {
            return Err(self.at(
                span,
                format!(
                    "set {name}: from must name a folder (\"./snapshots/x\" or \"host:/path\")"
                ),
            ));
        }
        if let Some((host, path)) = value.split_once(':')
            && !host.is_empty()
            && !host.contains('/')
            && path.starts_with('/')
        {
            if !hosts.contains_key(host) {
                let known: Vec<&str> = hosts.keys().map(String::as_str).collect();
                return Err(self.at(
                    span,
                    format!(
                        "set {name}: from {value:?} names host {host:?}, which has no [hosts.{host}] (known: {})",
                        if known.is_empty() { "none".to_string() } else { known.join(", ") }
                    ),
                ));
            }
            return Ok(SetFrom {
                at,
                host: Some(host.to_string()),
                path: path.trim_end_matches('/').to_string(),
                value,
            });
        }
        let p = Path::new(&value);
        let path = if p.is_absolute() {
            p.to_path_buf()
        } else {
            let dir = self.path.parent().unwrap_or(Path::new(""));
            let dir = if dir.is_absolute() {
                dir.to_path_buf()
            } else {
                std::env::current_dir().unwrap_or_default().join(dir)
            };
            dir.join(p)
        };
        // `./` parts say nothing; `..` is left for the OS to resolve.
        let path: PathBuf = path
            .components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .collect();
        let Some(path) = path.to_str() else {
            return Err(self.at(span, format!("set {name}: from {value:?} is not UTF-8")));
        };
        Ok(SetFrom {
            at,
            host: None,
            path: path.trim_end_matches('/').to_string(),
            value,
        })
    }

    /// Check one `[groups.NAME]` table: its name is not a host's, it lists
    /// at least one host, and each host it lists is a `[hosts.*]` table.
    /// Its hosts, each once, in the order listed.
    fn group(
        &self,
        name: Spanned<String>,
        group: Spanned<RawGroup>,
        hosts: &BTreeMap<String, Host>,
    ) -> Result<(String, Vec<String>)> {
        let (name_span, name) = (name.span(), name.into_inner());
        if hosts.contains_key(&name) {
            return Err(self.at(
                name_span,
                format!("group {name} has the name of a host ([hosts.{name}]): rename one of them"),
            ));
        }
        let group_span = group.span();
        let group = group.into_inner();
        if group.hosts.is_empty() {
            return Err(self.at(
                group_span,
                format!("group {name} lists no hosts: give it `hosts = [\"a\", \"b\"]`"),
            ));
        }
        let mut members: Vec<String> = Vec::new();
        for h in group.hosts {
            let (span, h) = (h.span(), h.into_inner());
            if !hosts.contains_key(&h) {
                let known: Vec<&str> = hosts.keys().map(String::as_str).collect();
                return Err(self.at(
                    span,
                    format!(
                        "group {name}: unknown host {h:?} (hosts: {})",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            }
            if !members.contains(&h) {
                members.push(h);
            }
        }
        Ok((name, members))
    }

    /// Check one `[sets.NAME]` table: it names something, its distribution
    /// patterns are names or globs (kept normalized), its file globs are valid.
    fn set(&self, name: String, set: Spanned<RawSet>) -> Result<Set> {
        let set_span = set.span();
        let set = set.into_inner();
        if set.dists.is_empty() && set.files.is_empty() {
            return Err(self.at(
                set_span,
                format!("set {name} names nothing: give it `dists = [...]` or `files = [...]`"),
            ));
        }
        let mut dists = Vec::new();
        for d in &set.dists {
            let pattern = d.get_ref().trim();
            if pattern.is_empty()
                || !pattern.chars().all(|c| {
                    c.is_ascii_alphanumeric()
                        || matches!(c, '-' | '_' | '.' | '*' | '?' | '[' | ']')
                })
            {
                return Err(self.at(
                    d.span(),
                    format!("set {name}: {pattern:?} is not a distribution name or glob"),
                ));
            }
            if let Err(e) = globset::Glob::new(&normalize_glob(pattern)) {
                return Err(self.at(d.span(), format!("set {name}: bad glob {pattern:?}: {e}")));
            }
            dists.push(normalize_glob(pattern));
        }
        let mut files = Vec::new();
        for f in &set.files {
            let pattern = f.get_ref();
            if let Some(why) = bad_file_glob(pattern) {
                return Err(self.at(f.span(), format!("set {name}: file glob {pattern:?} {why}")));
            }
            if let Err(e) = globset::Glob::new(pattern) {
                return Err(self.at(f.span(), format!("set {name}: bad glob {pattern:?}: {e}")));
            }
            files.push(pattern.clone());
        }
        Ok(Set { name, dists, files })
    }
}

impl Manifest {
    /// Read and validate the manifest at `path`.
    pub fn load(path: &Path) -> Result<Manifest> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            err!(
                hint = "pass --manifest FILE, or create overlay.toml (see docs/manifest.md)",
                "Failed to read manifest {}: {}",
                path.display(),
                crate::error::io_cause(&e)
            )
        })?;
        Manifest::parse(path, &text)
    }

    /// Parse manifest text; `path` is only used in messages.
    pub fn parse(path: &Path, text: &str) -> Result<Manifest> {
        let loc = Locator { path, text };
        let raw: RawManifest = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().to_string();
            match e.span() {
                Some(span) => loc.at(span, msg),
                None => err!("{}: {msg}", path.display()),
            }
        })?;
        let route = match raw.apply.and_then(|a| a.route) {
            Some(r) => loc.route("[apply]", r)?,
            None => RouteSetting::Relay,
        };
        let mut hosts = BTreeMap::new();
        for (name, host) in raw.hosts {
            let host = loc.host(name, host.into_inner(), route)?;
            hosts.insert(host.name.clone(), host);
        }
        let mut groups = BTreeMap::new();
        for (name, group) in raw.groups {
            let (name, members) = loc.group(name, group, &hosts)?;
            groups.insert(name, members);
        }
        let mut sets: Vec<(usize, Set)> = Vec::new();
        let mut from = BTreeMap::new();
        for (name, mut set) in raw.sets {
            if let Some(f) = set.get_mut().from.take() {
                from.insert(name.get_ref().clone(), loc.from(name.get_ref(), f, &hosts)?);
            }
            sets.push((name.span().start, loc.set(name.into_inner(), set)?));
        }
        sets.sort_by_key(|(pos, _)| *pos);
        let verify = match raw.verify {
            Some(v) => Some(Verify {
                timeout: match v.timeout {
                    Some(t) if *t.get_ref() == 0 => {
                        return Err(loc.at(
                            t.span(),
                            "[verify] timeout must be at least 1 (seconds)".to_string(),
                        ));
                    }
                    t => t.map(Spanned::into_inner),
                },
                env: v.env,
                python: v.python,
            }),
            None => None,
        };
        let preflight = raw
            .preflight
            .map_or_else(Preflight::default, |p| Preflight {
                strict: p.strict,
                cuda_family: p.cuda_family.iter().map(|g| normalize_glob(g)).collect(),
            });
        Ok(Manifest {
            path: path.to_path_buf(),
            hosts,
            groups,
            sets: sets.into_iter().map(|(_, s)| s).collect(),
            verify,
            preflight,
            route,
            from,
        })
    }

    /// The hosts `names` stand for, each a host or a `[groups.NAME]`: in
    /// the order named (a group's in its own order), each host once.
    pub fn expand_hosts(&self, names: &[String]) -> Result<Vec<&Host>> {
        let mut out: Vec<&Host> = Vec::new();
        for name in names {
            let members: Vec<&str> = match self.groups.get(name) {
                Some(g) => g.iter().map(String::as_str).collect(),
                None => vec![name.as_str()],
            };
            for m in members {
                let h = self.host(m)?;
                if !out.iter().any(|o| o.name == h.name) {
                    out.push(h);
                }
            }
        }
        Ok(out)
    }

    /// Whether `name` is a `[groups.NAME]`.
    pub fn is_group(&self, name: &str) -> bool {
        self.groups.contains_key(name)
    }

    /// Look up a host by its manifest name.
    pub fn host(&self, name: &str) -> Result<&Host> {
        self.hosts.get(name).ok_or_else(|| {
            let known: Vec<&str> = self.hosts.keys().map(String::as_str).collect();
            err!(
                hint = if known.is_empty() {
                    format!("add a [hosts.{name}] table to {}", self.path.display())
                } else if self.groups.is_empty() {
                    format!(
                        "known hosts in {}: {}",
                        self.path.display(),
                        known.join(", ")
                    )
                } else {
                    let groups: Vec<&str> = self.groups.keys().map(String::as_str).collect();
                    format!(
                        "known hosts in {}: {}; groups: {}",
                        self.path.display(),
                        known.join(", "),
                        groups.join(", ")
                    )
                },
                "Unknown host {name:?}: {} has no [hosts.{name}]",
                self.path.display()
            )
        })
    }
}

/// Normalize a distribution glob the way names are normalized, keeping glob
/// characters: `Nvidia_*` becomes `nvidia-*`.
fn normalize_glob(pattern: &str) -> String {
    let mut out = String::new();
    let mut word = String::new();
    for c in pattern.chars() {
        if matches!(c, '*' | '?' | '[' | ']') {
            out.push_str(&normalize_keep_edges(&word));
            word.clear();
            out.push(c);
        } else {
            word.push(c);
        }
    }
    out.push_str(&normalize_keep_edges(&word));
    out
}

/// Normalize a fragment but keep a single leading/trailing separator, which
/// matters inside a glob (`nvidia-*`).
fn normalize_keep_edges(word: &str) -> String {
    let lead = word.starts_with(['-', '_', '.']);
    let trail = word.ends_with(['-', '_', '.']) && word.len() > 1;
    let mut s = normalize_name(word);
    if lead && !s.is_empty() {
        s.insert(0, '-');
    } else if lead {
        return "-".into();
    }
    if trail {
        s.push('-');
    }
    s
}

/// Why a file glob is not allowed, if it isn't.
fn bad_file_glob(pattern: &str) -> Option<&'static str> {
    if pattern.is_empty() {
        return Some("is empty");
    }
    if pattern.starts_with('/') {
        return Some("is absolute; file globs are relative to site-packages");
    }
    if pattern.split('/').any(|c| c == "..") {
        return Some("escapes site-packages with `..`; name files inside it");
    }
    if pattern.split('/').any(|c| c == "__pycache__") {
        return Some("names __pycache__, which overlay never copies");
    }
    None
}

/// Does the normalized distribution `name` match any of the set's globs?
pub fn matches_any(globs: &[String], name: &str) -> bool {
    globs.iter().any(|g| {
        globset::GlobBuilder::new(g)
            .literal_separator(true)
            .build()
            .map(|g| g.compile_matcher().is_match(name))
            .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Manifest> {
        Manifest::parse(Path::new("m.toml"), text)
    }

    #[test]
    fn pep503() {
        assert_eq!(normalize_name("Nvidia_CUBLAS.cu13"), "nvidia-cublas-cu13");
        assert_eq!(normalize_name("sgl-kernel"), "sgl-kernel");
        assert_eq!(normalize_name("a__-b"), "a-b");
        assert_eq!(normalize_glob("Nvidia_*"), "nvidia-*");
        assert_eq!(normalize_glob("sgl_kernel"), "sgl-kernel");
        assert!(matches_any(&["nvidia-*".into()], "nvidia-cublas"));
        assert!(!matches_any(&["nvidia-*".into()], "torch"));
    }

    #[test]
    fn parses_example() {
        let m = parse(
            r#"
[hosts.ct129]
ssh = "ct129"
venv = "/root/venv/"
[hosts.local]
venv = "/opt/v"
[sets.torch]
dists = ["torch"]
[sets.nvidia]
dists = ["Nvidia_*", "cuda-*"]
[sets.patches]
files = ["sglang/srt/speculative/ddtree_*.py"]
"#,
        )
        .unwrap();
        assert_eq!(m.hosts["ct129"].venv, "/root/venv");
        assert_eq!(
            m.hosts["ct129"].endpoint,
            Endpoint::Ssh(SshDest::new("ct129"))
        );
        assert_eq!(m.hosts["local"].endpoint, Endpoint::Local);
        let names: Vec<_> = m.sets.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["torch", "nvidia", "patches"],
            "manifest order is kept"
        );
        assert_eq!(m.sets[1].dists, ["nvidia-*", "cuda-*"]);
    }

    #[test]
    fn unknown_key_has_line_and_column() {
        let e = parse("[hosts.a]\nvenv = \"/v\"\nsssh = \"x\"\n").unwrap_err();
        assert!(e.message.starts_with("m.toml:3:1:"), "{}", e.message);
        assert!(e.message.contains("sssh"), "{}", e.message);
        assert!(e.hint.is_some());
    }

    #[test]
    fn proxy_jump() {
        let m = parse("[hosts.a]\nssh = \"gpu7\"\nproxy_jump = \"me@b1:2222,b2\"\nvenv = \"/v\"\n\n[sets.s]\ndists = [\"x\"]\n").unwrap();
        assert_eq!(
            m.hosts["a"].endpoint,
            Endpoint::Ssh(SshDest {
                target: "gpu7".into(),
                proxy_jump: Some("me@b1:2222,b2".into())
            })
        );
        let e = parse("[hosts.a]\nproxy_jump = \"b\"\nvenv = \"/v\"\n").unwrap_err();
        assert!(e.message.starts_with("m.toml:2:14:"), "{}", e.message);
        assert!(
            e.message.contains("needs an ssh destination"),
            "{}",
            e.message
        );
        let e =
            parse("[hosts.a]\nssh = \"h\"\nproxy_jump = \"b1,,b2\"\nvenv = \"/v\"\n").unwrap_err();
        assert!(e.message.contains("empty hop"), "{}", e.message);
    }

    #[test]
    fn rejects_escaping_globs_and_relative_venv() {
        let e = parse("[sets.x]\nfiles = [\"../../../../etc/passwd\"]\n").unwrap_err();
        assert!(e.message.starts_with("m.toml:2:10:"), "{}", e.message);
        assert!(e.message.contains("escapes"), "{}", e.message);
        let e = parse("[sets.x]\nfiles = [\"/etc/*\"]\n").unwrap_err();
        assert!(e.message.contains("absolute"), "{}", e.message);
        let e = parse("[hosts.a]\nvenv = \"venv\"\n").unwrap_err();
        assert!(e.message.starts_with("m.toml:2:8:"), "{}", e.message);
        let e = parse("[sets.x]\n").unwrap_err();
        assert!(e.message.contains("names nothing"), "{}", e.message);
        let e = parse("[sets.x]\ndists = [\"torch; rm -rf\"]\n").unwrap_err();
        assert!(
            e.message.contains("not a distribution name"),
            "{}",
            e.message
        );
    }

    #[test]
    fn verify_timeout() {
        let m = parse("[verify]\npython = \"1\"\ntimeout = 3\n").unwrap();
        assert_eq!(m.verify.unwrap().timeout, Some(3));
        let m = parse("[verify]\npython = \"1\"\n").unwrap();
        assert_eq!(m.verify.unwrap().timeout, None);
        let e = parse("[verify]\ntimeout = 0\n").unwrap_err();
        assert!(e.message.starts_with("m.toml:2:11:"), "{}", e.message);
        let e = parse("[verify]\ntimeout = -5\n").unwrap_err();
        assert!(e.message.starts_with("m.toml:2:"), "{}", e.message);
        let e = parse("[verify]\ntimeout = \"3m\"\n").unwrap_err();
        assert!(e.message.starts_with("m.toml:2:"), "{}", e.message);
    }

    #[test]
    fn sudo_values() {
        let host = |v: &str| {
            parse(&format!(
                "[hosts.a]\nssh = \"a\"\nvenv = \"/v\"\nsudo = {v}\n"
            ))
        };
        assert_eq!(
            host("true").unwrap().hosts["a"].sudo.as_deref(),
            Some("root")
        );
        assert_eq!(host("false").unwrap().hosts["a"].sudo, None);
        assert_eq!(
            host("\"svc\"").unwrap().hosts["a"].sudo.as_deref(),
            Some("svc")
        );
        assert_eq!(
            parse("[hosts.a]\nvenv = \"/v\"\n").unwrap().hosts["a"].sudo,
            None
        );
        for bad in ["\"a b\"", "\"-u\"", "\"\"", "\"x;rm\"", "1", "[\"root\"]"] {
            let e = host(bad).unwrap_err();
            assert!(e.message.starts_with("m.toml:4:8:"), "{bad}: {}", e.message);
            assert!(e.message.contains("sudo"), "{bad}: {}", e.message);
        }
    }

    #[test]
    fn route_values() {
        let m = parse("[hosts.a]\nvenv = \"/v\"\n").unwrap();
        assert_eq!(m.hosts["a"].route, RouteSetting::Relay, "the default");
        let m = parse(
            "[apply]\nroute = \"direct\"\n[hosts.a]\nvenv = \"/v\"\n[hosts.b]\nvenv = \"/v\"\nroute = \"relay\"\n",
        )
        .unwrap();
        assert_eq!(m.route, RouteSetting::Direct);
        assert_eq!(m.hosts["a"].route, RouteSetting::Direct, "from [apply]");
        assert_eq!(m.hosts["b"].route, RouteSetting::Relay, "its own");
        let e = parse("[hosts.a]\nvenv = \"/v\"\nroute = \"fast\"\n").unwrap_err();
        assert!(e.message.starts_with("m.toml:3:9:"), "{}", e.message);
        assert!(e.message.contains("host a: route must be"), "{}", e.message);
        let e = parse("[apply]\nroute = \"Direct\"\n").unwrap_err();
        assert!(e.message.starts_with("m.toml:2:9:"), "{}", e.message);
        assert!(e.message.contains("[apply]"), "{}", e.message);
        let e = parse("[apply]\nroute = true\n").unwrap_err();
        assert!(e.message.starts_with("m.toml:2:"), "{}", e.message);
        let e = parse("[apply]\nroutes = \"direct\"\n").unwrap_err();
        assert!(e.message.starts_with("m.toml:2:1:"), "{}", e.message);
    }

    #[test]
    fn set_from_a_folder_or_a_host() {
        let m = Manifest::parse(
            Path::new("/etc/ov/m.toml"),
            "[hosts.a]\nssh = \"a\"\nvenv = \"/v\"\n[sets.p]\nfrom = \"./snap/x/\"\nfiles = [\"x/*.py\"]\n[sets.q]\nfrom = \"a:/srv/snap\"\ndists = [\"y\"]\n[sets.r]\ndists = [\"z\"]\n",
        )
        .unwrap();
        let p = &m.from["p"];
        assert_eq!(
            (p.host.as_deref(), p.path.as_str()),
            (None, "/etc/ov/snap/x")
        );
        assert_eq!(p.at, "/etc/ov/m.toml:5:8");
        let q = &m.from["q"];
        assert_eq!(
            (q.host.as_deref(), q.path.as_str()),
            (Some("a"), "/srv/snap")
        );
        assert!(!m.from.contains_key("r"));
        let e = parse("[sets.p]\nfrom = \"b:/srv\"\nfiles = [\"x\"]\n").unwrap_err();
        assert!(e.message.starts_with("m.toml:2:8:"), "{}", e.message);
        assert!(e.message.contains("host \"b\""), "{}", e.message);
        let e = parse("[sets.p]\nfrom = \" \"\nfiles = [\"x\"]\n").unwrap_err();
        assert!(e.message.contains("must name a folder"), "{}", e.message);
        let e = parse("[sets.p]\nfrom = \"./s\"\n").unwrap_err();
        assert!(e.message.contains("names nothing"), "{}", e.message);
        let m = parse("[sets.p]\nfrom = \"/abs/s\"\nfiles = [\"x\"]\n").unwrap();
        assert_eq!(m.from["p"].path, "/abs/s");
    }

    #[test]
    fn unknown_host_lists_known() {
        let m = parse("[hosts.a]\nvenv = \"/v\"\n").unwrap();
        let e = m.host("b").unwrap_err();
        assert!(e.hint.unwrap().contains("a"));
    }

    #[test]
    fn groups_expand_and_are_checked() {
        let hosts =
            "[hosts.a]\nvenv = \"/v\"\n[hosts.b]\nvenv = \"/v\"\n[hosts.c]\nvenv = \"/v\"\n";
        let m = parse(&format!(
            "{hosts}[groups.gpu]\nhosts = [\"b\", \"a\", \"b\"]\n"
        ))
        .unwrap();
        assert_eq!(m.groups["gpu"], ["b", "a"]);
        let names = |v: &[&str]| {
            let v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
            m.expand_hosts(&v)
                .unwrap()
                .iter()
                .map(|h| h.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&["c", "gpu", "a"]), ["c", "b", "a"]);
        let e = m.expand_hosts(&["nope".to_string()]).unwrap_err();
        assert!(e.hint.as_deref().unwrap().contains("groups: gpu"), "{e:?}");

        let e = parse(&format!("{hosts}[groups.gpu]\nhosts = [\"a\", \"zz\"]\n")).unwrap_err();
        assert!(
            e.message.contains(":8:") && e.message.contains("unknown host \"zz\""),
            "{}",
            e.message
        );
        let e = parse(&format!("{hosts}[groups.a]\nhosts = [\"b\"]\n")).unwrap_err();
        assert!(
            e.message.contains(":7:") && e.message.contains("name of a host"),
            "{}",
            e.message
        );
        let e = parse(&format!("{hosts}[groups.g]\nhosts = []\n")).unwrap_err();
        assert!(e.message.contains("lists no hosts"), "{}", e.message);
    }
}
