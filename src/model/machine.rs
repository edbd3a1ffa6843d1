//! The machine a venv runs on, as far as its GPU code cares: the NVIDIA
//! driver ([`Driver`]), the GPUs ([`GpuKind`]), read by the agent
//! (`inventory::machine`) and judged by the preflight (`preflight::gpu`);
//! and the GPU code of one shared object ([`GpuCode`]), read from its
//! `.nv_fatbin` section (`preflight::elf::fatbin`).

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

/// What overlay knows of a host's NVIDIA driver and GPUs. Every fact is
/// read, never guessed: what could not be read is `Unknown` or `None`
/// with a note saying why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    pub driver: Driver,
    /// The user-space `libcuda.so.1`'s version (from the ld.so cache's
    /// target name, `libcuda.so.580.65.06`), when it differs from the
    /// kernel module's: a cuda-compat install.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libcuda: Option<String>,
    /// That libcuda lies in a `compat` folder (the cuda-compat package's
    /// `/usr/local/cuda-X.Y/compat/`): forward compatibility, which counts
    /// instead of the module. Any other libcuda that differs from the
    /// module is a driver/library mismatch, noted, and the module counts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub libcuda_compat: bool,
    /// The GPUs, one entry per kind (name and compute capability).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuKind>,
    /// What could not be read, and how the facts were read when that
    /// matters (`nvidia-smi` too old to report compute capability).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The NVIDIA kernel module.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "version")]
pub enum Driver {
    /// Not read (an older agent, a bundle's source).
    #[default]
    Unknown,
    /// No NVIDIA kernel module is loaded: no `/proc/driver/nvidia` and
    /// no `/sys/module/nvidia`.
    None,
    /// The module's version, e.g. `580.159.04`.
    Loaded(String),
}

impl Driver {
    pub fn version(&self) -> Option<&str> {
        match self {
            Driver::Loaded(v) => Some(v),
            _ => None,
        }
    }
}

/// GPUs of one kind on a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuKind {
    pub name: String,
    /// Compute capability `(major, minor)`, e.g. `(9, 0)`; `None` when
    /// neither `nvidia-smi` nor the known names tell it.
    pub capability: Option<(u32, u32)>,
    /// Memory of one GPU, MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    pub count: u32,
}

impl GpuKind {
    /// `sm_90` for compute capability 9.0.
    pub fn sm(&self) -> Option<String> {
        self.capability.map(|(a, b)| format!("sm_{}", a * 10 + b))
    }
}

impl Machine {
    /// The compute capabilities of its GPUs that are known, each once: what
    /// GPU code is read for ([`GpuCode::complete`]).
    pub fn capabilities(&self) -> Vec<(u32, u32)> {
        let mut ccs: Vec<(u32, u32)> = self.gpus.iter().filter_map(|g| g.capability).collect();
        ccs.sort_unstable();
        ccs.dedup();
        ccs
    }

    /// Facts worth a line in the plan: a driver, or GPUs.
    pub fn has_nvidia(&self) -> bool {
        matches!(self.driver, Driver::Loaded(_)) || !self.gpus.is_empty()
    }
}

/// How a fatbin entry is built for its `sm` number: for that exact
/// compute capability and newer minors of its major (`Plain`), for exactly
/// it (`Arch`, the `a` suffix: `sm_90a`), or for its family (`Family`,
/// `f`: `sm_100f` runs on 10.0 and 10.3).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ArchVariant {
    #[default]
    Plain,
    Arch,
    Family,
}

/// One target of GPU code: `sm_90a` is `{ sm: 90, variant: Arch }`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct GpuArch {
    pub sm: u32,
    #[serde(default, skip_serializing_if = "is_plain")]
    pub variant: ArchVariant,
}

fn is_plain(v: &ArchVariant) -> bool {
    *v == ArchVariant::Plain
}

impl GpuArch {
    /// Does SASS for this target run on a GPU of SM number `sm` (`90` for
    /// 9.0)? Its own major with an older or equal minor; an `a` target
    /// only on exactly its own.
    pub fn sass_runs(&self, sm: u32) -> bool {
        match self.variant {
            ArchVariant::Arch => self.sm == sm,
            ArchVariant::Plain | ArchVariant::Family => {
                self.sm / 10 == sm / 10 && self.sm % 10 <= sm % 10
            }
        }
    }

    /// Does PTX for this target JIT-compile for `sm`? Any newer GPU for a
    /// plain target; within the family for `f`, exactly its own for `a`.
    pub fn ptx_runs(&self, sm: u32) -> bool {
        match self.variant {
            ArchVariant::Arch => self.sm == sm,
            ArchVariant::Family => self.sm / 10 == sm / 10 && self.sm % 10 <= sm % 10,
            ArchVariant::Plain => self.sm <= sm,
        }
    }
}

impl GpuCode {
    /// Does some of its SASS run on a GPU of compute capability `cc`?
    /// (PTX alone does not settle it: the driver must know its ISA.)
    pub fn sass_runs_on(&self, cc: (u32, u32)) -> bool {
        let sm = cc.0 * 10 + cc.1;
        self.cubins.iter().any(|a| a.sass_runs(sm))
    }

    /// Does this reading tell about a GPU of compute capability `cc`: it
    /// read every container, or SASS it read runs there already?
    pub fn tells_about(&self, cc: (u32, u32)) -> bool {
        self.complete || self.sass_runs_on(cc)
    }
}

impl std::fmt::Display for GpuArch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let suffix = match self.variant {
            ArchVariant::Plain => "",
            ArchVariant::Arch => "a",
            ArchVariant::Family => "f",
        };
        write!(f, "sm_{}{suffix}", self.sm)
    }
}

/// The GPU code of one shared object: the targets of its `.nv_fatbin`
/// entries, SASS (`cubins`) and PTX (`ptx`, JIT-compiled by the driver
/// for the same or newer GPUs), sorted and deduplicated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuCode {
    pub cubins: Vec<GpuArch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ptx: Vec<GpuArch>,
    /// The newest PTX ISA version of its PTX entries `(major, minor)`:
    /// the driver must know it to JIT them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx_isa: Option<(u16, u16)>,
    /// Fatbin containers read.
    pub containers: u32,
    /// Every container was read. A reading for some GPUs stops once what
    /// it read runs on all of them (a healthy server reads one container
    /// of each library); it then says only that ([`GpuCode::tells_about`]).
    #[serde(default)]
    pub complete: bool,
}

/// The oldest driver of each CUDA major under minor version
/// compatibility (docs.nvidia.com/deploy/cuda-compatibility, "Minor
/// Version Compatibility").
pub const MAJOR_DRIVERS: [(u32, &str); 3] =
    [(11, "450.80.02"), (12, "525.60.13"), (13, "580.65.06")];

/// Each toolkit `(major, minor)`, the PTX ISA version it introduced, and
/// its GA driver on Linux x86-64 (CUDA release notes, table 3; PTX ISA
/// release notes). A driver JITs PTX of its own toolkit's ISA and older.
pub const TOOLKITS: [((u32, u32), (u16, u16), &str); 21] = [
    ((11, 0), (7, 0), "450.36.06"),
    ((11, 1), (7, 1), "455.23.04"),
    ((11, 2), (7, 2), "460.27.03"),
    ((11, 3), (7, 3), "465.19.01"),
    ((11, 4), (7, 4), "470.42.01"),
    ((11, 5), (7, 5), "495.29.05"),
    ((11, 6), (7, 6), "510.39.01"),
    ((11, 7), (7, 7), "515.43.04"),
    ((11, 8), (7, 8), "520.61.05"),
    ((12, 0), (8, 0), "525.60.13"),
    ((12, 1), (8, 1), "530.30.02"),
    ((12, 2), (8, 2), "535.54.03"),
    ((12, 3), (8, 3), "545.23.06"),
    ((12, 4), (8, 4), "550.54.14"),
    ((12, 5), (8, 5), "555.42.02"),
    ((12, 6), (8, 5), "560.28.03"),
    ((12, 8), (8, 7), "570.26"),
    ((12, 9), (8, 8), "575.51.03"),
    ((13, 0), (9, 0), "580.65.06"),
    ((13, 1), (9, 1), "590.44.01"),
    ((13, 2), (9, 2), "595.45.04"),
];

/// A dotted version as numbers, for comparing drivers (`570.26` <
/// `570.172.08`). `None` if it is not one.
pub fn version_key(v: &str) -> Option<Vec<u32>> {
    let parts: Option<Vec<u32>> = v.trim().split('.').map(|p| p.parse().ok()).collect();
    parts.filter(|p| !p.is_empty())
}

/// Is driver version `a` older than `b`? (False when either is no version.)
pub fn driver_older(a: &str, b: &str) -> bool {
    matches!(
        version_key(a).zip(version_key(b)).map(|(a, b)| a.cmp(&b)),
        Some(Ordering::Less)
    )
}

/// The newest toolkit whose GA driver `driver` is, e.g. `(12, 8)` for
/// 570.172.08: "CUDA ≤ 12.8".
pub fn cuda_ceiling(driver: &str) -> Option<(u32, u32)> {
    TOOLKITS
        .iter()
        .rev()
        .find(|(_, _, ga)| !driver_older(driver, ga))
        .map(|(tk, _, _)| *tk)
}

impl Machine {
    /// The plan's and doctor's line for this machine: `NVIDIA driver
    /// 580.159.04 (CUDA ≤ 13.0), 8 × NVIDIA H100 80GB HBM3 (sm_90, 80 GiB)`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match &self.driver {
            Driver::Unknown => parts.push("NVIDIA driver unknown".to_string()),
            Driver::None => parts.push("no NVIDIA driver".to_string()),
            Driver::Loaded(v) => {
                let cuda = cuda_ceiling(v)
                    .map(|(a, b)| format!(" (CUDA ≤ {a}.{b})"))
                    .unwrap_or_default();
                let compat = match (&self.libcuda, self.libcuda_compat) {
                    (Some(l), true) => format!(", cuda-compat libcuda {l}"),
                    (Some(l), false) => format!(", libcuda {l}"),
                    (None, _) => String::new(),
                };
                parts.push(format!("NVIDIA driver {v}{cuda}{compat}"));
            }
        }
        for g in &self.gpus {
            let mut about: Vec<String> = g.sm().into_iter().collect();
            if let Some(m) = g.memory_mib {
                about.push(format!("{} GiB", (m + 512) / 1024));
            }
            let about = if about.is_empty() {
                String::new()
            } else {
                format!(" ({})", about.join(", "))
            };
            parts.push(format!("{} × {}{about}", g.count, g.name));
        }
        parts.join(", ")
    }
}
