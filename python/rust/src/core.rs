//! The only file of the extension that names the shufflefs library's API: open a dataset
//! through a plan, and read the bytes the mount would serve. When the library's modules move,
//! this file is the one to update.
//!
//! Plan options are parsed by the mount's own clap definitions (`shufflefs::cli::PlanOptions`),
//! so `Dataset(path, window=.., batch_size=..)` accepts exactly the mount's plan flags, with
//! the same defaults and the same checks.

use std::path::Path;

use clap::Parser;
use shufflefs::cli::PlanOptions;
use shufflefs::plan::StepKey;
use shufflefs::view::{DEFAULT_MAX_LISTING, OpenOptions, View, ViewConfig};

/// An error of the core, sorted for Python: bad arguments or an I/O / dataset problem.
pub enum CoreError {
    /// Bad plan options or a step outside the plan (Python `ValueError`).
    Invalid(String),
    /// The dataset could not be opened or read (Python `OSError`).
    Io(String),
}

impl From<shufflefs::Error> for CoreError {
    fn from(e: shufflefs::Error) -> CoreError {
        match e {
            shufflefs::Error::InvalidInput(m) => CoreError::Invalid(m),
            other => CoreError::Io(other.to_string()),
        }
    }
}

/// The plan flags of `shufflefs mount`, parsed from `--flag value` arguments.
#[derive(Parser)]
#[command(name = "shufflefs.Dataset", no_binary_name = true)]
struct Flags {
    #[command(flatten)]
    plan: PlanOptions,
}

/// A dataset seen through a plan.
pub struct Core {
    view: View,
}

impl Core {
    /// Opens the dataset at `dir` with the plan given as mount flags (`["--window", "9", ..]`).
    pub fn open(dir: &Path, flags: &[String]) -> Result<Core, CoreError> {
        let flags = Flags::try_parse_from(flags).map_err(|e| CoreError::Invalid(e.to_string()))?;
        if let Some(path) = &flags.plan.config {
            return Core::open_config(path, &flags.plan);
        }
        let config = ViewConfig::from(&flags.plan);
        Ok(Core {
            view: View::open(dir, &config)?,
        })
    }

    /// The plan of the run configuration at `path` (`--config`; `--plan NAME` chooses one of
    /// several `[[plan]]` tables), as `shufflefs mount --config` serves it.
    fn open_config(path: &Path, plan: &PlanOptions) -> Result<Core, CoreError> {
        if plan.window.is_some() || plan.batch_size.is_some() || plan.stride.is_some() {
            return Err(CoreError::Invalid(
                "config: the run configuration defines the plan; give window, batch_size and \
                 stride there, not as keywords"
                    .into(),
            ));
        }
        let (views, _) = View::open_config(
            path,
            plan.plan.as_deref(),
            &OpenOptions::default(),
            DEFAULT_MAX_LISTING,
        )?;
        Ok(Core {
            view: View::one_plan(views, path, "plan=NAME")?,
        })
    }

    /// The bytes of `info.json`.
    pub fn info_json(&self) -> &[u8] {
        self.view.info_json()
    }

    /// Size of the `.npy` header of every step file.
    pub fn header_bytes(&self) -> u64 {
        self.view.info().npy_header_bytes
    }

    /// Size of the data (rows) of a step file of the plan's batch size.
    pub fn data_bytes(&self) -> u64 {
        self.view.step_npy_len() - self.header_bytes()
    }

    /// Size of the data (rows) of step `key`'s file, and of its header (a schedule may change
    /// the batch size: then both vary).
    fn layout_at(&self, key: StepKey) -> (u64, u64) {
        let row = self.data_bytes() / self.view.plan().batch_size().max(1);
        let data = row * self.view.step_batch(key);
        (data, self.view.step_npy_len_at(key) - data)
    }

    fn key(&self, epoch: u64, rank: u64, step: u64) -> Result<StepKey, CoreError> {
        let key = StepKey { epoch, rank, step };
        let plan = self.view.plan();
        if !plan.contains(key) {
            return Err(CoreError::Invalid(format!(
                "no such step: epoch {epoch} rank {rank} step {step} (this plan has epochs \
                 0..{}, ranks 0..{}, steps 0..{})",
                plan.epochs(),
                plan.ranks(),
                plan.steps_per_epoch()
            )));
        }
        Ok(key)
    }

    /// The rows of `S.npy` (the file without its header) into `out`, which must be exactly
    /// [`Core::data_bytes`] long.
    pub fn read_step(
        &self,
        epoch: u64,
        rank: u64,
        step: u64,
        out: &mut [u8],
    ) -> Result<(), CoreError> {
        let key = self.key(epoch, rank, step)?;
        let (data, header) = self.layout_at(key);
        if out.len() as u64 != data {
            return Err(CoreError::Invalid(format!(
                "the buffer is {} bytes; the rows of step {epoch}/{rank}/{step} are {data} bytes",
                out.len()
            )));
        }
        let n = self.view.read_step_npy(key, header, out)?;
        if n != out.len() {
            return Err(CoreError::Io(format!(
                "step {epoch}/{rank}/{step}: assembled {n} of {} bytes",
                out.len()
            )));
        }
        Ok(())
    }

    /// The bytes of `S.json`.
    pub fn step_json(&self, epoch: u64, rank: u64, step: u64) -> Result<Vec<u8>, CoreError> {
        let key = self.key(epoch, rank, step)?;
        Ok(self.view.step_json(key)?)
    }
}
