//! The manifest as TOML has it, before any check: serde's view of each
//! table, with spans kept (`Spanned`) so that `check` can name the file,
//! line and column of a bad value. Unknown keys are refused here.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawManifest {
    #[serde(default)]
    pub(super) hosts: BTreeMap<String, Spanned<RawHost>>,
    #[serde(default)]
    pub(super) sets: BTreeMap<Spanned<String>, Spanned<RawSet>>,
    #[serde(default)]
    pub(super) groups: BTreeMap<Spanned<String>, Spanned<RawGroup>>,
    pub(super) verify: Option<RawVerify>,
    pub(super) preflight: Option<RawPreflight>,
    pub(super) apply: Option<RawApply>,
}

/// `[apply]`: defaults of `overlay apply` for every plan of this manifest.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawApply {
    pub(super) route: Option<Spanned<String>>,
    /// The allowed_signers file bundles must be signed by (docs/pack.md).
    pub(super) trust: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPreflight {
    #[serde(default)]
    pub(super) strict: bool,
    #[serde(default)]
    pub(super) cuda_family: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHost {
    pub(super) ssh: Option<Spanned<String>>,
    pub(super) venv: Spanned<String>,
    pub(super) direct_ssh: Option<Spanned<String>>,
    /// `sudo = true | false | "user"`, checked in [`Locator::host`](super::check::Locator::host).
    pub(super) sudo: Option<Spanned<toml::Value>>,
    pub(super) proxy_jump: Option<Spanned<String>>,
    pub(super) route: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSet {
    #[serde(default)]
    pub(super) dists: Vec<Spanned<String>>,
    #[serde(default)]
    pub(super) files: Vec<Spanned<String>>,
    pub(super) from: Option<Spanned<String>>,
}

/// `[groups.NAME]`: a name for several hosts, usable wherever a host is.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGroup {
    pub(super) hosts: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVerify {
    #[serde(default)]
    pub(super) env: BTreeMap<String, String>,
    pub(super) python: Option<String>,
    pub(super) timeout: Option<Spanned<u64>>,
}
