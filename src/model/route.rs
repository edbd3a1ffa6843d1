//! The route the manifest allows for streams into a host (`route =
//! "relay" | "direct"`, per host or under `[apply]`), recorded in the plan
//! so that `apply` works from the plan file alone.

use serde::{Deserialize, Serialize};

/// How `apply` sends the files when neither `--relay` nor `--direct` is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteSetting {
    /// Through the controller (the default): only the controller needs to
    /// reach both hosts.
    #[default]
    Relay,
    /// From the source straight to the target with the source's own `ssh`,
    /// falling back to the relay when the source cannot reach the target.
    Direct,
}

impl RouteSetting {
    /// The manifest's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteSetting::Relay => "relay",
            RouteSetting::Direct => "direct",
        }
    }

    /// The manifest's word, if it is one.
    pub fn parse(s: &str) -> Option<RouteSetting> {
        match s {
            "relay" => Some(RouteSetting::Relay),
            "direct" => Some(RouteSetting::Direct),
            _ => None,
        }
    }

    /// For `skip_serializing_if`: the default says nothing.
    pub fn is_relay(&self) -> bool {
        *self == RouteSetting::Relay
    }
}
