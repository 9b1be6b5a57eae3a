//! Cost profiles on disk: versioned JSON files, one per (adapter, CPU, shader set) in the
//! platform cache directory; a file given by `TANDEM_PROFILE` or the caller holds one profile per
//! (adapter, CPU), so the adapters of one machine (or two thread counts) sharing it keep each
//! their own. Loading checks version and keys, and anything wrong means a warning and
//! recalibration, never a panic.
//!
//! Sits between the cost model (`cost/mod.rs`) and the file system; `load_or_calibrate` is the
//! entry point sessions and the CLI use.

use super::calibrate::{calibrate_on_threads, CalibrationOptions};
use super::keys::{cpu_kernels_hash, profile_stem, shader_hash, AdapterKey, CpuKey};
use super::{CostModel, CurveShape, Entry, EntryKey, Links, Roofline, Sample};
use crate::gpu::Gpu;
use crate::plan::Device;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tandem_ops::DType;

/// Version of the profile format; a file of another version is recalibrated.
/// 3: GPU MatMul/Gemm samples count padded flops (`costs::gpu_padding`).
/// 4: `Conv/winograd` CPU entries (Winograd-eligible convs left `Conv/kxk`); CPU samples are
/// the least of their repetitions, not the median; samples carry their output rows.
/// 5: `Gemm/dot` CPU entries (transposed-B products of 2..64 rows, left in `Gemm`).
/// 6: Gemm weights stored with padded rows (`tandem::layout`); `Gemm/dot` up to 31 rows then.
/// 7: CPU samples time at least 200 us of calls (short ones read up to 2x slow after GPU work).
/// 8: links carry `dispatch`, the per-dispatch cost GPU timestamps miss.
/// 9: a file holds a list of profiles, one per (adapter, CPU).
pub const PROFILE_VERSION: u32 = 9;

/// Environment variable naming a profile file (overridden by an explicit path).
pub const PROFILE_ENV: &str = "TANDEM_PROFILE";

/// Why a saved profile cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("no profile at {0}")]
    Missing(PathBuf),
    #[error("cannot read or write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("profile {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("profile {path} has format version {found}, this build writes {want}")]
    Version {
        path: PathBuf,
        found: u64,
        want: u32,
    },
    #[error("profile {path} was measured for {what}")]
    Mismatch { path: PathBuf, what: String },
}

#[derive(Serialize, Deserialize)]
struct EntryFile {
    op: String,
    dtype: String,
    device: String,
    calibration: Vec<Sample>,
    observed: Vec<Sample>,
    /// The curve shape cross-validation chose for these samples, where it was chosen: a
    /// session that loads the profile refits with it instead of choosing again, which took
    /// 2.2 s of an `auto` session's load once runs had filled the entries (docs/bench.md,
    /// "Rows in slices"). Absent in files written before it: chosen when first fitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shape: Option<CurveShape>,
}

/// One (adapter, CPU)'s profile within a [`ProfileFile`].
#[derive(Serialize, Deserialize)]
struct Profile {
    adapter: Option<AdapterKey>,
    cpu: CpuKey,
    shader_hash: String,
    cpu_kernels_hash: String,
    cpu_prior: Roofline,
    gpu_prior: Roofline,
    links: Links,
    gpu_timestamps: bool,
    entries: Vec<EntryFile>,
}

#[derive(Serialize, Deserialize)]
struct ProfileFile {
    version: u32,
    profiles: Vec<Profile>,
}

/// How a profile's keys read in an error: "llvmpipe (…) on Vulkan, AMD EPYC (…), 2 threads".
fn describe(adapter: Option<&AdapterKey>, cpu: &CpuKey) -> String {
    let adapter = adapter.map_or("no GPU".to_string(), |a| {
        format!("{} on {}", a.name, a.backend)
    });
    format!(
        "{adapter}, {} ({}), {} threads",
        cpu.model, cpu.simd, cpu.threads
    )
}

/// The profiles of `path` in this build's format; none where the file is missing, unreadable,
/// corrupt or of another version (saving then starts the file afresh).
fn read_profiles(path: &Path) -> Vec<Profile> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<ProfileFile>(&t).ok())
        .filter(|f| f.version == PROFILE_VERSION)
        .map_or_else(Vec::new, |f| f.profiles)
}

impl Profile {
    /// Whether this profile of `path`'s was measured with the current shaders (where it has an
    /// adapter) and CPU kernels.
    fn check_current(&self, path: &Path) -> Result<(), ProfileError> {
        let mismatch = |what: String| ProfileError::Mismatch {
            path: path.to_path_buf(),
            what,
        };
        if self.adapter.is_some() && self.shader_hash != shader_hash() {
            return Err(mismatch(format!(
                "shaders {}, not the current {}",
                self.shader_hash,
                shader_hash()
            )));
        }
        if self.cpu_kernels_hash != cpu_kernels_hash() {
            return Err(mismatch(format!(
                "CPU kernels {}, not the current {}",
                self.cpu_kernels_hash,
                cpu_kernels_hash()
            )));
        }
        Ok(())
    }

    /// The cost model of this profile of `path`'s, checked to be measured with the current
    /// shaders and CPU kernels, its samples positive times.
    fn into_model(self, path: &Path) -> Result<CostModel, ProfileError> {
        self.check_current(path)?;
        let model = CostModel {
            cpu_prior: self.cpu_prior,
            gpu_prior: self.gpu_prior,
            links: self.links,
            gpu_timestamps: self.gpu_timestamps,
            shaders: self.shader_hash,
            cpu_kernels: self.cpu_kernels_hash,
            ..CostModel::unmeasured(self.adapter, self.cpu)
        };
        model.set_entries(parse_entries(self.entries, path)?);
        Ok(model)
    }
}

/// A stored profile's entries (each stale, to be fitted), its samples checked to be positive
/// times.
fn parse_entries(
    stored: Vec<EntryFile>,
    path: &Path,
) -> Result<BTreeMap<EntryKey, Entry>, ProfileError> {
    let corrupt = |reason: String| ProfileError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let mut entries = BTreeMap::new();
    for e in stored {
        let (Some(dtype), Some(device)) = (parse_dtype(&e.dtype), parse_device(&e.device)) else {
            return Err(corrupt(format!("entry {} {} {}", e.op, e.dtype, e.device)));
        };
        let good = |s: &Sample| {
            let finite = s.seconds.is_finite() && s.flops.is_finite() && s.bytes.is_finite();
            finite && s.seconds > 0.0 && s.flops >= 0.0 && s.bytes >= 0.0
        };
        if e.calibration.iter().chain(&e.observed).any(|s| !good(s)) {
            return Err(corrupt(format!(
                "entry {}: a sample is not a positive time",
                e.op
            )));
        }
        let entry = Entry {
            calibration: e.calibration,
            observed: VecDeque::from(e.observed),
            spill: e.shape,
            ..Entry::default()
        };
        entries.insert(
            EntryKey {
                op: e.op,
                dtype,
                device,
            },
            entry,
        );
    }
    Ok(entries)
}

fn parse_dtype(s: &str) -> Option<DType> {
    Some(match s {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "f64" => DType::F64,
        "i64" => DType::I64,
        "i32" => DType::I32,
        "i8" => DType::I8,
        "u8" => DType::U8,
        "bool" => DType::Bool,
        _ => return None,
    })
}

fn parse_device(s: &str) -> Option<Device> {
    match s {
        "cpu" => Some(Device::Cpu),
        "gpu" => Some(Device::Gpu),
        _ => None,
    }
}

/// The platform cache directory: `$XDG_CACHE_HOME` or `~/.cache` on Linux and other Unix,
/// `~/Library/Caches` on macOS, `%LOCALAPPDATA%` on Windows.
pub fn cache_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if cfg!(windows) {
        return env("LOCALAPPDATA");
    }
    if cfg!(target_os = "macos") {
        return env("HOME").map(|h| h.join("Library/Caches"));
    }
    env("XDG_CACHE_HOME").or_else(|| env("HOME").map(|h| h.join(".cache")))
}

/// Where the profile of these keys lives: `explicit`, else `$TANDEM_PROFILE`, else
/// `<cache dir>/tandem/profiles/<hash of the keys>.json`. `None` when no cache dir is known.
pub fn profile_path(
    explicit: Option<&Path>,
    adapter: Option<&AdapterKey>,
    cpu: &CpuKey,
) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os(PROFILE_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let stem = profile_stem(adapter, cpu, &shader_hash(), cpu_kernels_hash());
    cache_dir().map(|d| {
        d.join("tandem")
            .join("profiles")
            .join(format!("{stem}.json"))
    })
}

/// Make `path`'s directory, then take an exclusive lock on `<path>.lock`, held while the file
/// is read and rewritten, so that processes saving one profile file take turns; `Ok(None)`
/// where the platform or the file system has no locks (the save then goes on unguarded).
fn lock_beside(path: &Path) -> Result<Option<std::fs::File>, ProfileError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    }
    let file = (std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true))
    .open(path.with_extension("lock"));
    Ok(file.ok().filter(|f| f.lock().is_ok()))
}

impl CostModel {
    /// Write the profile (refitting stale entries first) into `path`, replacing the one of the
    /// same (adapter, CPU) and keeping the file's others, creating directories; atomic (a
    /// temporary file renamed over the old one), under the file's lock. For a new calibration:
    /// what the file held for this adapter and CPU is dropped ([`CostModel::save_learnt`]
    /// keeps it).
    pub fn save(&self, path: &Path) -> Result<(), ProfileError> {
        let _lock = lock_beside(path)?;
        self.write_profile(path, read_profiles(path))
    }

    /// [`CostModel::save`] for what runs taught: the run observations the file's profile of
    /// this adapter and CPU holds and this model does not (another process's runs, saved since
    /// this one loaded it) are taken in first, as older than its own, so two processes saving
    /// one profile keep both their lessons.
    pub fn save_learnt(&self, path: &Path) -> Result<(), ProfileError> {
        let _lock = lock_beside(path)?;
        let mut profiles = read_profiles(path);
        let mine = |p: &Profile| p.adapter == self.adapter && p.cpu == self.cpu;
        if let Some(i) = profiles.iter().position(mine) {
            // Replaced by this model's below, after its observations are taken in: only its
            // entries are read (no model is built, no curve fitted).
            let saved = profiles.swap_remove(i);
            let same_build = saved.shader_hash == self.shaders
                && saved.cpu_kernels_hash == self.cpu_kernels
                && saved.check_current(path).is_ok();
            if let (true, Ok(entries)) = (same_build, parse_entries(saved.entries, path)) {
                self.absorb_observed(entries);
            }
        }
        self.write_profile(path, profiles)
    }

    /// Write this model's profile into `profiles` (the file's, read under its lock) in place
    /// of the one of the same (adapter, CPU), and the list over `path`.
    fn write_profile(&self, path: &Path, mut profiles: Vec<Profile>) -> Result<(), ProfileError> {
        let io = |source| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        };
        self.refit();
        let entries = self
            .entries_snapshot()
            .into_iter()
            .map(|(k, e)| EntryFile {
                op: k.op,
                dtype: k.dtype.to_string(),
                device: k.device.to_string(),
                calibration: e.calibration,
                observed: e.observed.into_iter().collect(),
                shape: e.spill,
            })
            .collect();
        let profile = Profile {
            adapter: self.adapter.clone(),
            cpu: self.cpu.clone(),
            shader_hash: self.shaders.clone(),
            cpu_kernels_hash: self.cpu_kernels.clone(),
            cpu_prior: self.cpu_prior,
            gpu_prior: self.gpu_prior,
            links: self.links,
            gpu_timestamps: self.gpu_timestamps,
            entries,
        };
        let same = |p: &Profile| p.adapter == profile.adapter && p.cpu == profile.cpu;
        match profiles.iter_mut().find(|p| same(p)) {
            Some(p) => *p = profile,
            None => profiles.push(profile),
        }
        let file = ProfileFile {
            version: PROFILE_VERSION,
            profiles,
        };
        let text = serde_json::to_string_pretty(&file).expect("a profile serialises");
        // One temporary name per save, so sessions of one process saving at once do not write
        // into each other's file.
        static SAVES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Read the profile of `adapter` and `cpu` from `path` and check it was measured with the
    /// current shaders and CPU kernels. Every problem is an `Err`, never a panic.
    pub fn load(
        path: &Path,
        adapter: Option<&AdapterKey>,
        cpu: &CpuKey,
    ) -> Result<CostModel, ProfileError> {
        let p = || path.to_path_buf();
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ProfileError::Missing(p()))
            }
            Err(source) => return Err(ProfileError::Io { path: p(), source }),
        };
        let corrupt = |reason: String| ProfileError::Corrupt { path: p(), reason };
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
        let found = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
        if found != PROFILE_VERSION as u64 {
            return Err(ProfileError::Version {
                path: p(),
                found,
                want: PROFILE_VERSION,
            });
        }
        let file: ProfileFile =
            serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
        let mismatch = |what: String| ProfileError::Mismatch { path: p(), what };
        let held: Vec<String> = file
            .profiles
            .iter()
            .map(|f| describe(f.adapter.as_ref(), &f.cpu))
            .collect();
        let Some(file) = file
            .profiles
            .into_iter()
            .find(|f| &f.cpu == cpu && f.adapter.as_ref() == adapter)
        else {
            return Err(mismatch(format!(
                "{}, not {}",
                if held.is_empty() {
                    "nothing".to_string()
                } else {
                    held.join("; ")
                },
                describe(adapter, cpu)
            )));
        };
        file.into_model(path)
    }

    /// The cost model for `gpu` (None: CPU only) and `cpu_threads` kernel threads: the saved
    /// profile when it is valid, else a fresh calibration within `budget` (saved for next time),
    /// with the file it belongs to and a warning to show (why the profile was not used, a
    /// failed save, GPU measurement errors); never panics.
    pub fn load_or_calibrate(
        gpu: Option<&Gpu>,
        cpu_threads: usize,
        path: Option<&Path>,
        budget: Duration,
    ) -> LoadedProfile {
        let threads = if cpu_threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            cpu_threads
        };
        let adapter = gpu.map(|g| AdapterKey::from_desc(g.adapter()));
        let cpu = CpuKey::detect(threads);
        let file = profile_path(path, adapter.as_ref(), &cpu);
        let why = match &file {
            None => "no cache directory for the cost profile".to_string(),
            Some(f) => match CostModel::load(f, adapter.as_ref(), &cpu) {
                Ok(model) => {
                    return LoadedProfile {
                        model,
                        path: Some(f.clone()),
                        warning: None,
                    }
                }
                Err(e) => e.to_string(),
            },
        };
        let opts = CalibrationOptions {
            budget,
            ..Default::default()
        };
        let (model, report) = calibrate_on_threads(gpu, threads, &opts, &mut |_| {});
        let mut warning = format!("{why}: calibrated in {:.1} s", report.elapsed.as_secs_f64());
        if let Some(e) = &report.gpu_error {
            warning.push_str(&format!(" (GPU measurements failed: {e})"));
        }
        if let Some(f) = &file {
            match model.save(f) {
                Ok(()) => warning.push_str(&format!(", saved to {}", f.display())),
                Err(e) => warning.push_str(&format!(", not saved: {e}")),
            }
        }
        LoadedProfile {
            model,
            path: file,
            warning: Some(warning),
        }
    }
}

/// What [`CostModel::load_or_calibrate`] found or made.
pub struct LoadedProfile {
    pub model: CostModel,
    /// The profile's file, where what runs teach the model can be saved for the next process
    /// (`Session::save_cost_profile`); `None` where no cache directory is known.
    pub path: Option<PathBuf>,
    /// Why the saved profile was not used, a failed save, GPU measurement errors.
    pub warning: Option<String>,
}
