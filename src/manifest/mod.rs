//! The manifest (`overlay.toml`): which hosts exist, where their venvs are,
//! which groups of hosts have a name of their own (`[groups.NAME]`), and
//! which package sets to overlay. Parsing is strict: unknown keys are
//! errors, and every error names the file, line and column.
//!
//! - `raw`: the TOML as serde reads it, with spans;
//! - `check`: each table checked into the model below, errors at
//!   `file:line:col`.

mod check;
mod raw;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::Spanned;

use self::check::{Locator, normalize_glob};
use self::raw::RawManifest;
use crate::err;
use crate::error::Result;
use crate::model::{Endpoint, RouteSetting, Set};

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
    /// `[apply] trust`: the allowed_signers file a bundle must be signed
    /// by (relative to the manifest's folder), unless `--trust` names one.
    pub trust: Option<PathBuf>,
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
        let trust = raw.apply.as_ref().and_then(|a| a.trust.as_ref()).map(|t| {
            let dir = path.parent().unwrap_or(Path::new("."));
            dir.join(t)
        });
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
            trust,
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
    use crate::model::{SshDest, normalize_name};

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
        let m = parse("[apply]\ntrust = \"keys/allowed_signers\"\n").unwrap();
        assert_eq!(
            m.trust.as_deref(),
            Some(Path::new("keys/allowed_signers")),
            "beside the manifest m.toml"
        );
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
