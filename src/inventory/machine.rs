//! This host's NVIDIA driver and GPUs ([`Machine`]), read without loading
//! any GPU library into the agent: the kernel module's version from
//! `/proc/driver/nvidia/version` (or `/sys/module/nvidia/version`), the
//! user-space `libcuda.so.1`'s from the ld.so cache (a cuda-compat one
//! when it lies in a `compat` folder; any other that differs from the
//! module is a mismatch, noted), and the GPUs from
//! `nvidia-smi --query-gpu` (bounded in time; a driver whose `nvidia-smi`
//! rejects `compute_cap` is asked again without it and its GPUs are known
//! by name). No driver is a fact ([`Driver::None`]); what cannot be read
//! is unknown and said in [`Machine::notes`], never guessed.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::model::{Driver, GpuKind, Machine};

/// How long `nvidia-smi` may take (it can stall on a GPU in a bad state).
const NVIDIA_SMI_TIMEOUT: Duration = Duration::from_secs(15);

/// Folders `nvidia-smi` is looked for in after `PATH` (an agent started
/// over SSH has a short `PATH`).
const NVIDIA_SMI_DIRS: [&str; 4] = [
    "/usr/bin",
    "/usr/local/nvidia/bin",
    "/usr/local/bin",
    "/opt/nvidia/bin",
];

/// The compute capability of GPUs known by name, for drivers whose
/// `nvidia-smi` does not report it (R470 and older): those drivers end
/// with Ampere.
const KNOWN_GPUS: [(&str, (u32, u32)); 14] = [
    ("K80", (3, 7)),
    ("M40", (5, 2)),
    ("M60", (5, 2)),
    ("P100", (6, 0)),
    ("P40", (6, 1)),
    ("P4", (6, 1)),
    ("V100", (7, 0)),
    ("T4", (7, 5)),
    ("A100", (8, 0)),
    ("A30", (8, 0)),
    ("A40", (8, 6)),
    ("A10", (8, 6)),
    ("A16", (8, 6)),
    ("A2", (8, 6)),
];

/// Read this host's machine facts.
pub fn machine() -> Machine {
    let mut m = Machine::default();
    m.driver = driver(&mut m.notes);
    if let Driver::Loaded(module) = &m.driver
        && let Some((version, path)) = libcuda_version().filter(|(v, _)| v != module)
    {
        m.libcuda_compat = path.components().any(|c| c.as_os_str() == "compat");
        if !m.libcuda_compat {
            m.notes.push(format!(
                "libcuda.so.1 is {version} ({}), the kernel module {module}: CUDA fails with a driver/library version mismatch until they agree (reload the module or reboot)",
                path.display()
            ));
        }
        m.libcuda = Some(version);
    }
    if !matches!(m.driver, Driver::None) {
        match find_nvidia_smi() {
            Some(smi) => m.gpus = gpus(&smi, &mut m.notes),
            None if matches!(m.driver, Driver::Loaded(_)) => m
                .notes
                .push("nvidia-smi not found: the GPUs are unknown".into()),
            None => {}
        }
    }
    m
}

fn driver(notes: &mut Vec<String>) -> Driver {
    let proc = read_fact(Path::new("/proc/driver/nvidia/version"));
    let sys = read_fact(Path::new("/sys/module/nvidia/version"));
    if let Ok(Some(text)) = &proc
        && let Some(v) = module_version(text)
    {
        return Driver::Loaded(v);
    }
    if let Ok(Some(text)) = &sys
        && let Some(v) = text
            .split_whitespace()
            .next()
            .filter(|v| looks_like_version(v))
    {
        return Driver::Loaded(v.to_string());
    }
    match (proc, sys) {
        (Ok(None), Ok(None)) => Driver::None,
        (p, s) => {
            let why = [p.err(), s.err()].into_iter().flatten().collect::<Vec<_>>();
            notes.push(if why.is_empty() {
                "the NVIDIA driver's version could not be parsed".to_string()
            } else {
                format!(
                    "the NVIDIA driver's version cannot be read: {}",
                    why.join("; ")
                )
            });
            Driver::Unknown
        }
    }
}

/// A file's text; `Ok(None)` if it does not exist.
fn read_fact(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(
            String::from_utf8_lossy(&b[..b.len().min(4096)]).into_owned(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn looks_like_version(v: &str) -> bool {
    v.split('.').count() >= 2
        && v.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The version in `/proc/driver/nvidia/version`'s first line: `NVRM
/// version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release
/// Build ...` or `NVRM version: NVIDIA UNIX x86_64 Kernel Module
/// 570.172.08  Tue ...`.
pub fn module_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version"))?;
    let after = line.split_once("Kernel Module").map_or(line, |(_, a)| a);
    after
        .split_whitespace()
        .find(|t| looks_like_version(t))
        .map(String::from)
}

/// The version of the `libcuda.so.1` the ld.so cache names, from the
/// name of the file it resolves to (`libcuda.so.580.65.06`), and that file.
fn libcuda_version() -> Option<(String, PathBuf)> {
    let out = ["/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|l| {
            Command::new(l)
                .arg("-p")
                .stderr(Stdio::null())
                .output()
                .ok()
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    // `\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1`
    let path = text.lines().find_map(|l| {
        let (name, rest) = l.trim().split_once(" (")?;
        let (flags, path) = rest.split_once(") => ")?;
        (name == "libcuda.so.1" && flags.contains("x86-64")).then(|| path.trim().to_string())
    })?;
    let real = std::fs::canonicalize(path).ok()?;
    let name = real.file_name()?.to_str()?;
    let version = name
        .strip_prefix("libcuda.so.")
        .filter(|v| looks_like_version(v))?
        .to_string();
    Some((version, real))
}

fn find_nvidia_smi() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(NVIDIA_SMI_DIRS.iter().map(PathBuf::from))
        .map(|d| d.join("nvidia-smi"))
        .find(|p| p.is_file())
}

/// Run `smi` with `args`, bounded by [`NVIDIA_SMI_TIMEOUT`]: its stdout, or
/// why it failed (its own words).
fn run_bounded(smi: &Path, args: &[&str]) -> Result<String, String> {
    let mut child = Command::new(smi)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{} cannot be run: {e}", smi.display()))?;
    let mut stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.by_ref().take(1 << 20).read_to_string(&mut out);
        out
    });
    let err_reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stderr.by_ref().take(1 << 16).read_to_string(&mut out);
        out
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() < NVIDIA_SMI_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(5))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "nvidia-smi did not answer within {} s",
                    NVIDIA_SMI_TIMEOUT.as_secs()
                ));
            }
        }
    };
    let out = reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    if status.success() {
        Ok(out)
    } else {
        let said = if err.trim().is_empty() { out } else { err };
        Err(format!("nvidia-smi failed ({status}): {}", said.trim()))
    }
}

fn gpus(smi: &Path, notes: &mut Vec<String>) -> Vec<GpuKind> {
    let full = [
        "--query-gpu=name,compute_cap,memory.total",
        "--format=csv,noheader,nounits",
    ];
    match run_bounded(smi, &full) {
        Ok(out) => return parse_gpus(&out, true),
        Err(why) if why.contains("compute_cap") => {}
        Err(why) => {
            notes.push(format!("{why}: the GPUs are unknown"));
            return Vec::new();
        }
    }
    let by_name = [
        "--query-gpu=name,memory.total",
        "--format=csv,noheader,nounits",
    ];
    match run_bounded(smi, &by_name) {
        Ok(out) => {
            notes.push(
                "this driver's nvidia-smi does not report compute capability: it was taken from the GPUs' names"
                    .into(),
            );
            parse_gpus(&out, false)
        }
        Err(why) => {
            notes.push(format!("{why}: the GPUs are unknown"));
            Vec::new()
        }
    }
}

/// GPU kinds from `nvidia-smi --format=csv,noheader,nounits` lines of
/// `name, compute_cap, memory.total` (or `name, memory.total` when
/// `with_cap` is false), counted per kind in the order first seen.
pub fn parse_gpus(out: &str, with_cap: bool) -> Vec<GpuKind> {
    let mut kinds: Vec<GpuKind> = Vec::new();
    let mut index: BTreeMap<(String, Option<(u32, u32)>, Option<u64>), usize> = BTreeMap::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let name = fields[0].to_string();
        let (cap, mem) = if with_cap {
            (fields.get(1).and_then(|c| parse_cap(c)), fields.get(2))
        } else {
            (known_capability(&name), fields.get(1))
        };
        let memory_mib = mem.and_then(|m| m.parse::<u64>().ok());
        let key = (name.clone(), cap, memory_mib);
        match index.get(&key) {
            Some(&i) => kinds[i].count += 1,
            None => {
                index.insert(key, kinds.len());
                kinds.push(GpuKind {
                    name,
                    capability: cap,
                    memory_mib,
                    count: 1,
                });
            }
        }
    }
    kinds
}

fn parse_cap(c: &str) -> Option<(u32, u32)> {
    let (a, b) = c.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The compute capability of a GPU known by name ([`KNOWN_GPUS`]).
fn known_capability(name: &str) -> Option<(u32, u32)> {
    let words: Vec<&str> = name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    KNOWN_GPUS
        .iter()
        .find(|(model, _)| words.iter().any(|w| w.eq_ignore_ascii_case(model)))
        .map(|(_, cc)| *cc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_module_version_is_read_from_both_forms_of_the_proc_file() {
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)  Thu Jul 31 2025\nGCC version:  gcc version 12.2.0\n";
        assert_eq!(module_version(open).as_deref(), Some("580.159.04"));
        let prop = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Tue Jul  8 18:26:53 UTC 2025\n";
        assert_eq!(module_version(prop).as_deref(), Some("570.172.08"));
        let old = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.256.02  Thu May  2 14:37:44 UTC 2024\n";
        assert_eq!(module_version(old).as_deref(), Some("470.256.02"));
        assert_eq!(module_version("garbage"), None);
    }

    #[test]
    fn gpus_are_counted_per_kind() {
        let out = "NVIDIA H100 80GB HBM3, 9.0, 81559\nNVIDIA H100 80GB HBM3, 9.0, 81559\nTesla V100-SXM2-32GB, 7.0, 32768\n";
        let g = parse_gpus(out, true);
        assert_eq!(g.len(), 2);
        assert_eq!(
            (g[0].count, g[0].capability, g[0].memory_mib),
            (2, Some((9, 0)), Some(81559))
        );
        assert_eq!(g[1].name, "Tesla V100-SXM2-32GB");
        // An old driver: no compute_cap column, the name tells.
        let g = parse_gpus(
            "Tesla V100-SXM2-32GB, 32768\nSome Future GPU, 1000\n",
            false,
        );
        assert_eq!(g[0].capability, Some((7, 0)));
        assert_eq!(g[1].capability, None);
        // A field nvidia-smi cannot read.
        let g = parse_gpus("NVIDIA A100-SXM4-80GB, [N/A], [N/A]\n", true);
        assert_eq!((g[0].capability, g[0].memory_mib), (None, None));
    }
}
