//! `shufflefs plan DATASET_DIR --window .. --batch-size .. --epoch E --rank R --step S`:
//! the step's S.json, byte for byte what the mount serves, without mounting.

use std::io::Write;

use crate::cli::PlanArgs;
use crate::error::{Error, Result};
use crate::plan::StepKey;
use crate::view::{View, ViewConfig};

/// Runs `plan`.
pub fn run(args: PlanArgs) -> Result<()> {
    let view = View::open(&args.dataset_dir, &ViewConfig::from(&args.plan))?;
    let plan = view.plan();
    let key = StepKey {
        epoch: args.epoch,
        rank: args.rank,
        step: args.step,
    };
    if !plan.contains(key) {
        return Err(Error::invalid(format!(
            "no such step: epoch {} rank {} step {} (this plan has epochs 0..{}, ranks 0..{}, \
             steps 0..{})",
            key.epoch,
            key.rank,
            key.step,
            plan.epochs(),
            plan.ranks(),
            plan.steps_per_epoch()
        )));
    }
    let _ = std::io::stdout().write_all(&view.step_json(key)?);
    Ok(())
}
