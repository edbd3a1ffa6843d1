//! Checking the raw manifest ([`raw`](super::raw)) table by table into
//! its model ([`Locator`]: hosts, groups, sets and their `from`, routes),
//! every error at `file:line:col` with a hint; and the normalization of
//! distribution globs and the rules for file globs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::Spanned;

use super::raw::{RawGroup, RawHost, RawSet};
use super::{Host, SetFrom};
use crate::err;
use crate::error::{Error, Result};
use crate::model::{Endpoint, RouteSetting, Set, SshDest, normalize_name};

/// Line and column (1-based) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// The manifest's text, to turn a span of it into an error that names the
/// file, line and column.
pub(super) struct Locator<'t> {
    pub(super) path: &'t Path,
    pub(super) text: &'t str,
}

impl Locator<'_> {
    /// `msg` at `span`, as `file:line:col: msg`.
    pub(super) fn at(&self, span: std::ops::Range<usize>, msg: String) -> Error {
        let (line, col) = line_col(self.text, span.start);
        err!(
            hint = "fix the manifest; its format is described in docs/manifest.md",
            "{}:{line}:{col}: {msg}",
            self.path.display()
        )
    }

    /// A `route` value (`what` names where it is, e.g. `host dst`).
    pub(super) fn route(&self, what: &str, route: Spanned<String>) -> Result<RouteSetting> {
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
    pub(super) fn host(&self, name: String, host: RawHost, route: RouteSetting) -> Result<Host> {
        let venv = host.venv.get_ref().trim_end_matches('/').to_string();
        // `bundle:/abs/file.ovl`: a bundle read in place, as a source only.
        let path = crate::model::bundle_of(&venv).unwrap_or(&venv);
        if !path.starts_with('/') {
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
    pub(super) fn from(
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
    pub(super) fn group(
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
    pub(super) fn set(&self, name: String, set: Spanned<RawSet>) -> Result<Set> {
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

/// Normalize a distribution glob the way names are normalized, keeping glob
/// characters: `Nvidia_*` becomes `nvidia-*`.
pub(super) fn normalize_glob(pattern: &str) -> String {
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
