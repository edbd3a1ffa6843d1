//! The GPU check: will the venv's CUDA code run on this machine? Two
//! rules, each from a published source (docs/preflight.md#gpu cites them):
//!
//! - **The driver** ([`driver_problems`]): a CUDA runtime of major 12
//!   needs an NVIDIA driver ≥ 525.60.13, of major 13 ≥ 580.65.06 (NVIDIA's
//!   minor version compatibility: a 13.2 runtime runs on a 580 driver). The
//!   runtimes a venv loads are read from the distributions' `version.py`
//!   (`cuda = '13.0'`), the `nvidia-cuda-runtime` wheels and the
//!   `libcudart.so.N` needs of the shared objects.
//! - **The kernels** ([`judge`], [`kernel_findings`]): a shared object with a
//!   `.nv_fatbin` runs on a GPU of compute capability X.Y when it has SASS
//!   for `sm_XZ` with Z ≤ Y (`sm_XYa` only on exactly X.Y, `sm_XZf` within
//!   the family), or PTX for an older or equal target that the driver can
//!   JIT (a driver JITs PTX only of the ISA versions of its own toolkit
//!   and older: [`TOOLKITS`]). Only code built for several architectures
//!   is judged ([`multi_arch`]). A package that ships one build per
//!   architecture and picks one at import ([`LOADERS`]: sgl-kernel's
//!   `sm90/` and `sm100/`) is judged by the build its loader picks.
//!
//! Everything here is pure: the facts come from `inventory::machine`
//! (the host) and `elf::fatbin` (the objects).

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Check, Dist, Driver, GpuArch, GpuCode, GpuKind, Machine, Problem};

pub use crate::model::{MAJOR_DRIVERS, TOOLKITS, cuda_ceiling, driver_older as older, version_key};

/// Packages that ship one build per GPU architecture in sibling folders
/// and load one at import: the package folder, and the folder its loader
/// picks for compute capability `(major, minor)`. sgl-kernel's
/// `sgl_kernel/load_utils.py`: exactly 9.0 loads `sm90/`, every other
/// GPU `sm100/`. Objects under such folders of a package not listed here
/// are not judged (which build loads is not known).
pub const LOADERS: [(&str, fn((u32, u32)) -> &'static str); 1] =
    [(
        "sgl_kernel",
        |cc| {
            if cc == (9, 0) { "sm90" } else { "sm100" }
        },
    )];

/// The toolkit that introduced PTX ISA `isa` (the oldest with it).
pub fn ptx_toolkit(isa: (u16, u16)) -> Option<((u32, u32), &'static str)> {
    TOOLKITS
        .iter()
        .find(|(_, i, _)| *i >= isa)
        .map(|(tk, _, ga)| (*tk, *ga))
}

/// The driver that counts for the CUDA runtime: the kernel module's, or a
/// newer cuda-compat libcuda's (one in a `compat` folder).
pub fn effective_driver(m: &Machine) -> Option<&str> {
    let module = m.driver.version()?;
    match m.libcuda.as_deref() {
        Some(lib) if m.libcuda_compat && older(module, lib) => Some(lib),
        _ => Some(module),
    }
}

/// How a shared object's GPU code meets a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// SASS for it.
    Sass(GpuArch),
    /// Only PTX, which the driver JIT-compiles (or whose driver is unknown).
    Jit(GpuArch),
    /// Only PTX, of an ISA newer than the driver's toolkit.
    PtxTooNew {
        arch: GpuArch,
        toolkit: (u32, u32),
        needs: &'static str,
    },
    /// Nothing that runs on it.
    NoKernel,
}

/// Does `code` run on a GPU of compute capability `cc` with this driver?
pub fn judge(code: &GpuCode, cc: (u32, u32), driver: Option<&str>) -> Verdict {
    let sm = cc.0 * 10 + cc.1;
    if let Some(a) = code.cubins.iter().rev().find(|a| a.sass_runs(sm)) {
        return Verdict::Sass(*a);
    }
    let Some(a) = code.ptx.iter().rev().find(|a| a.ptx_runs(sm)) else {
        return Verdict::NoKernel;
    };
    match (code.ptx_isa.and_then(ptx_toolkit), driver) {
        (Some((toolkit, needs)), Some(d)) if older(d, needs) => Verdict::PtxTooNew {
            arch: *a,
            toolkit,
            needs,
        },
        _ => Verdict::Jit(*a),
    }
}

/// Is the object at `rel` (relative to site-packages) a build its
/// package's loader does not pick for compute capability `cc`? Objects
/// under a per-architecture folder (`smNN`) of a package not in
/// [`LOADERS`] count as not picked: which one loads is not known.
pub fn not_loaded_on(rel: &str, cc: (u32, u32)) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    parts.windows(2).any(|w| {
        let arch_dir = w[1].len() > 2
            && w[1].starts_with("sm")
            && w[1][2..].chars().all(|c| c.is_ascii_digit());
        if !arch_dir || !rel.ends_with(".so") && !rel.contains(".so.") {
            return false;
        }
        match LOADERS.iter().find(|(pkg, _)| *pkg == w[0]) {
            Some((_, pick)) => pick(cc) != w[1],
            None => true,
        }
    })
}

/// `sm_75, sm_80, …, sm_120`: the targets, shortened past eight.
pub fn arch_list(archs: &[GpuArch]) -> String {
    let names: Vec<String> = archs.iter().map(|a| a.to_string()).collect();
    if names.len() <= 8 {
        names.join(", ")
    } else {
        format!(
            "{}, … {}",
            names[..4].join(", "),
            names[names.len() - 2..].join(", ")
        )
    }
}

/// `8 × NVIDIA H100 80GB HBM3 (sm_90)`.
pub fn gpu_label(g: &GpuKind) -> String {
    let sm = g.sm().map(|s| format!(" ({s})")).unwrap_or_default();
    format!("{} × {}{sm}", g.count, g.name)
}

/// Is `code` built for several architectures (two SM numbers or more,
/// SASS and PTX together)? Only such builds are judged: code for one
/// architecture alone is either a helper beside kernels kept elsewhere
/// (the CUDA 13 wheels' `libcufft.so.12` has one container, `sm_75` SASS
/// only, and runs on every GPU) or a build its package selects for that
/// GPU (FlashAttention-3's `sm_90a`), and judging it would be a false
/// alarm.
pub fn multi_arch(code: &GpuCode) -> bool {
    let mut sms: Vec<u32> = code.cubins.iter().chain(&code.ptx).map(|a| a.sm).collect();
    sms.sort_unstable();
    sms.dedup();
    sms.len() >= 2
}

/// One kernel finding: what the report says, and its grouping key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFinding {
    pub reason: String,
    pub cause: String,
}

/// The kernel findings of one object's GPU code on this machine, one per
/// GPU kind it does not run on. A machine without a known compute
/// capability gives none.
pub fn kernel_findings(rel: &str, code: &GpuCode, machine: &Machine) -> Vec<KernelFinding> {
    let driver = effective_driver(machine);
    let mut out = Vec::new();
    if !multi_arch(code) {
        return out;
    }
    // A reading that stopped early says nothing of the GPUs it was not
    // read for (the agent reads again for those).
    let told = |cc| code.tells_about(cc);
    for g in &machine.gpus {
        let Some(cc) = g.capability else { continue };
        if not_loaded_on(rel, cc) || !told(cc) {
            continue;
        }
        let has = |code: &GpuCode| {
            let ptx = if code.ptx.is_empty() {
                "no PTX".to_string()
            } else {
                format!("PTX for {}", arch_list(&code.ptx))
            };
            format!("kernels for {} and {ptx}", arch_list(&code.cubins))
        };
        match judge(code, cc, driver) {
            Verdict::Sass(_) | Verdict::Jit(_) => {}
            Verdict::NoKernel => out.push(KernelFinding {
                reason: format!("{}: {rel} has {}", gpu_label(g), has(code)),
                cause: format!("no kernel for {}", gpu_label(g)),
            }),
            Verdict::PtxTooNew {
                arch,
                toolkit,
                needs,
            } => out.push(KernelFinding {
                reason: format!(
                    "{}: {rel} runs there only as PTX ({arch}, made by CUDA {}.{}), which driver {} cannot compile: it needs ≥ {needs}",
                    gpu_label(g),
                    toolkit.0,
                    toolkit.1,
                    driver.unwrap_or("?"),
                ),
                cause: format!("PTX too new for driver {} on {}", driver.unwrap_or("?"), gpu_label(g)),
            }),
        }
    }
    out
}

/// The CUDA runtime majors a distribution loads: its `version.py`'s
/// `cuda`, the major of an `nvidia-cuda-runtime` wheel, and the
/// `libcudart.so.N` needs of its shared objects (`cudart`, by file).
pub fn runtime_majors<'a>(
    dists: &[&'a Dist],
    cudart: &BTreeMap<String, BTreeSet<u32>>,
) -> BTreeMap<&'a str, (&'a Dist, BTreeSet<u32>)> {
    let mut out: BTreeMap<&str, (&Dist, BTreeSet<u32>)> = BTreeMap::new();
    let major = |v: &str| v.split('.').next().and_then(|m| m.parse::<u32>().ok());
    for d in dists {
        let mut majors = BTreeSet::new();
        if let Some(m) = d.cuda.as_deref().and_then(major) {
            majors.insert(m);
        }
        if d.normalized == "nvidia-cuda-runtime"
            || d.normalized.starts_with("nvidia-cuda-runtime-cu")
        {
            majors.extend(major(&d.version));
        }
        for f in &d.files {
            if let Some(m) = cudart.get(f) {
                majors.extend(m);
            }
        }
        if !majors.is_empty() {
            out.insert(d.name.as_str(), (*d, majors));
        }
    }
    out
}

/// The driver problems of the distributions `after` on `machine` (named
/// `host` in the reasons): each that loads a CUDA runtime the driver is too
/// old for. `before`: the majors each distribution of the venv loaded as
/// it was (by name): the same distribution needing the same major is a
/// pre-existing problem (`None` for a venv judged as it stands).
pub fn driver_problems(
    after: &[&Dist],
    cudart: &BTreeMap<String, BTreeSet<u32>>,
    machine: &Machine,
    host: &str,
    before: Option<&BTreeMap<String, BTreeSet<u32>>>,
) -> Vec<Problem> {
    let Some(driver) = effective_driver(machine) else {
        return Vec::new();
    };
    let has = match cuda_ceiling(driver) {
        Some((a, b)) => format!("{driver} (CUDA ≤ {a}.{b})"),
        None => format!("{driver} (older than any CUDA 11)"),
    };
    let compat = match (&machine.driver, &machine.libcuda) {
        (Driver::Loaded(m), Some(l)) if l == driver => {
            format!(" through cuda-compat over kernel module {m}")
        }
        _ => String::new(),
    };
    let mut out = Vec::new();
    for (name, (dist, majors)) in runtime_majors(after, cudart) {
        for m in majors {
            let Some((_, needs)) = MAJOR_DRIVERS.iter().find(|(major, _)| *major == m) else {
                continue;
            };
            if !older(driver, needs) {
                continue;
            }
            let build = dist.build.as_deref().unwrap_or(&dist.version);
            let already = before.is_some_and(|b| b.get(name).is_some_and(|had| had.contains(&m)));
            out.push(Problem {
                check: Check::Gpu,
                dist: Some(name.to_string()),
                file: None,
                reason: format!(
                    "{build} needs an NVIDIA driver ≥ {needs} (CUDA {m}); {host} has {has}{compat}{}",
                    if already { " (already so before the overlay)" } else { "" }
                ),
                preexisting: already,
                optional: false,
                cause: Some(format!("needs an NVIDIA driver ≥ {needs}; {host} has {driver}")),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ArchVariant;
    use crate::model::ArchVariant::*;

    fn arch(sm: u32, variant: ArchVariant) -> GpuArch {
        GpuArch { sm, variant }
    }

    fn code(cubins: &[GpuArch], ptx: &[GpuArch], isa: Option<(u16, u16)>) -> GpuCode {
        GpuCode {
            cubins: cubins.to_vec(),
            ptx: ptx.to_vec(),
            ptx_isa: isa,
            containers: 1,
            complete: true,
        }
    }

    /// torch 2.15.0+cu132's libtorch_cuda.so (the real wheel's list).
    fn torch_cu132() -> GpuCode {
        let plain = [75, 80, 86, 89, 90, 100, 120].map(|s| arch(s, Plain));
        let mut c = plain.to_vec();
        c.extend([
            arch(90, Arch),
            arch(100, Arch),
            arch(103, Family),
            arch(120, Arch),
            arch(121, Arch),
        ]);
        c.sort();
        code(&c, &[], None)
    }

    #[test]
    fn sass_runs_on_its_major_with_a_newer_minor_and_arch_targets_only_on_their_own() {
        let t = torch_cu132();
        assert_eq!(judge(&t, (9, 0), None), Verdict::Sass(arch(90, Arch)));
        assert_eq!(judge(&t, (8, 6), None), Verdict::Sass(arch(86, Plain)));
        assert_eq!(judge(&t, (8, 7), None), Verdict::Sass(arch(86, Plain)));
        assert_eq!(judge(&t, (7, 0), None), Verdict::NoKernel);
        assert_eq!(judge(&t, (6, 0), None), Verdict::NoKernel);
        // a-only: exactly 9.0.
        let a_only = code(&[arch(90, Arch)], &[], None);
        assert_eq!(judge(&a_only, (9, 0), None), Verdict::Sass(arch(90, Arch)));
        assert_eq!(judge(&a_only, (10, 0), None), Verdict::NoKernel);
        assert_eq!(judge(&a_only, (8, 0), None), Verdict::NoKernel);
        // f: within the family.
        let f = code(&[arch(100, Family)], &[], None);
        assert!(matches!(judge(&f, (10, 3), None), Verdict::Sass(_)));
        assert_eq!(judge(&f, (12, 0), None), Verdict::NoKernel);
    }

    #[test]
    fn ptx_covers_newer_gpus_when_the_driver_knows_its_isa() {
        // SASS for 8.0, PTX for 8.0 made by CUDA 12.8 (ISA 8.7).
        let c = code(&[arch(80, Plain)], &[arch(80, Plain)], Some((8, 7)));
        assert_eq!(
            judge(&c, (9, 0), Some("570.172.08")),
            Verdict::Jit(arch(80, Plain))
        );
        assert_eq!(
            judge(&c, (9, 0), Some("560.35.03")),
            Verdict::PtxTooNew {
                arch: arch(80, Plain),
                toolkit: (12, 8),
                needs: "570.26"
            }
        );
        // No PTX old enough for the GPU: nothing.
        assert_eq!(judge(&c, (7, 0), Some("570.172.08")), Verdict::NoKernel);
        // Unknown driver: assumed able (no guess made against it).
        assert_eq!(judge(&c, (9, 0), None), Verdict::Jit(arch(80, Plain)));
    }

    #[test]
    fn driver_versions_compare_as_numbers_and_name_their_cuda() {
        assert!(older("570.26", "570.172.08"));
        assert!(older("570.172.08", "580.65.06"));
        assert!(!older("580.159.04", "580.65.06"));
        assert_eq!(cuda_ceiling("570.172.08"), Some((12, 8)));
        assert_eq!(cuda_ceiling("580.159.04"), Some((13, 0)));
        assert_eq!(cuda_ceiling("525.60.13"), Some((12, 0)));
        assert_eq!(cuda_ceiling("440.33.01"), None);
        assert_eq!(ptx_toolkit((8, 7)), Some(((12, 8), "570.26")));
        assert_eq!(ptx_toolkit((8, 5)), Some(((12, 5), "555.42.02")));
        assert_eq!(ptx_toolkit((9, 9)), None);
    }

    #[test]
    fn a_cuda_compat_libcuda_newer_than_the_module_counts() {
        let m = Machine {
            driver: Driver::Loaded("570.172.08".into()),
            libcuda: Some("580.65.06".into()),
            libcuda_compat: true,
            ..Default::default()
        };
        assert_eq!(effective_driver(&m), Some("580.65.06"));
        let older = Machine {
            libcuda: Some("560.1".into()),
            ..m.clone()
        };
        assert_eq!(effective_driver(&older), Some("570.172.08"));
        // A libcuda outside a compat folder that differs from the module
        // (an upgrade not yet loaded): the module counts.
        let mismatch = Machine {
            libcuda_compat: false,
            ..m
        };
        assert_eq!(effective_driver(&mismatch), Some("570.172.08"));
    }

    #[test]
    fn sgl_kernel_is_judged_by_the_build_its_loader_picks() {
        assert!(!not_loaded_on("sgl_kernel/sm90/common_ops.abi3.so", (9, 0)));
        assert!(not_loaded_on("sgl_kernel/sm100/common_ops.abi3.so", (9, 0)));
        assert!(not_loaded_on("sgl_kernel/sm90/common_ops.abi3.so", (10, 0)));
        assert!(!not_loaded_on(
            "sgl_kernel/sm100/common_ops.abi3.so",
            (8, 0)
        ));
        // Another package's per-architecture folders: not judged.
        assert!(not_loaded_on("other/sm80/x.so", (8, 0)));
        // Not a folder of builds.
        assert!(!not_loaded_on("torch/lib/libtorch_cuda.so", (9, 0)));
        assert!(!not_loaded_on("smart/lib/x.so", (9, 0)));
    }

    fn h100s(n: u32, cc: (u32, u32), name: &str) -> GpuKind {
        GpuKind {
            name: name.into(),
            capability: Some(cc),
            memory_mib: None,
            count: n,
        }
    }

    #[test]
    fn code_for_one_architecture_is_not_judged() {
        // The CUDA 13 wheels' libcufft.so.12: one container, sm_75 SASS only.
        let cufft = code(&[arch(75, Plain)], &[], None);
        let m = Machine {
            driver: Driver::Loaded("580.159.04".into()),
            gpus: vec![h100s(1, (9, 0), "NVIDIA H100 80GB HBM3")],
            ..Default::default()
        };
        assert!(!multi_arch(&cufft));
        assert!(kernel_findings("nvidia/cu13/lib/libcufft.so.12", &cufft, &m).is_empty());
        assert!(multi_arch(&code(
            &[arch(80, Plain)],
            &[arch(90, Plain)],
            None
        )));
    }

    #[test]
    fn kernel_findings_name_the_gpus_the_library_and_its_targets_per_kind() {
        let m = Machine {
            driver: Driver::Loaded("580.65.06".into()),
            gpus: vec![
                h100s(4, (9, 0), "NVIDIA H100"),
                h100s(4, (7, 0), "Tesla V100-SXM2-32GB"),
            ],
            ..Default::default()
        };
        let f = kernel_findings("torch/lib/libtorch_cuda.so", &torch_cu132(), &m);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].cause, "no kernel for 4 × Tesla V100-SXM2-32GB (sm_70)");
        assert!(
            f[0].reason.starts_with(
                "4 × Tesla V100-SXM2-32GB (sm_70): torch/lib/libtorch_cuda.so has kernels for sm_75, sm_80"
            ),
            "{}",
            f[0].reason
        );
        assert!(f[0].reason.ends_with("and no PTX"), "{}", f[0].reason);
    }

    fn dist(name: &str, version: &str, cuda: Option<&str>) -> Dist {
        Dist {
            cuda: cuda.map(String::from),
            ..Dist::for_test(name, version)
        }
    }

    #[test]
    fn a_cuda_13_stack_on_driver_570_is_a_problem_naming_580() {
        let torch = Dist {
            build: Some("2.11.0+cu130".into()),
            ..dist("torch", "2.11.0", Some("13.0"))
        };
        let rt = dist("nvidia-cuda-runtime", "13.0.96", None);
        let m = Machine {
            driver: Driver::Loaded("570.172.08".into()),
            ..Default::default()
        };
        let p = driver_problems(&[&torch, &rt], &BTreeMap::new(), &m, "ct200", None);
        assert_eq!(p.len(), 2, "{p:?}");
        let t = p
            .iter()
            .find(|p| p.dist.as_deref() == Some("torch"))
            .unwrap();
        assert_eq!(
            t.reason,
            "2.11.0+cu130 needs an NVIDIA driver ≥ 580.65.06 (CUDA 13); ct200 has 570.172.08 (CUDA ≤ 12.8)"
        );
        // A 13.2 runtime on a 580 driver is fine (minor version compatibility).
        let m = Machine {
            driver: Driver::Loaded("580.65.06".into()),
            ..Default::default()
        };
        let rt = dist("nvidia-cuda-runtime", "13.2.51", None);
        assert!(driver_problems(&[&torch, &rt], &BTreeMap::new(), &m, "h", None).is_empty());
        // No driver, or an unknown one: no problem.
        for driver in [Driver::None, Driver::Unknown] {
            let m = Machine {
                driver,
                ..Default::default()
            };
            assert!(driver_problems(&[&torch], &BTreeMap::new(), &m, "h", None).is_empty());
        }
    }
}
