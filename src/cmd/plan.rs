//! `shufflefs plan DATASET_DIR --window .. --batch-size .. --epoch E --rank R --step S`:
//! the step's S.json, byte for byte what the mount serves, without mounting; with `--info`,
//! the mount's info.json. Accepts every mount option (and a mount point), so a mount command
//! line can be pasted as it is: none changes a byte; `--expect-fingerprint` is checked and
//! `--max-listing` is reported in info.json.

use std::io::Write;

use crate::cli::PlanArgs;
use crate::error::{Error, Result};
use crate::shuffle::plan::StepKey;
use crate::view::{View, ViewConfig};

/// Runs `plan`.
pub(crate) fn run(args: PlanArgs) -> Result<()> {
    let config = ViewConfig {
        max_listing: args.mount.max_listing,
        ..ViewConfig::from(&args.plan)
    };
    let view = match (&args.plan.config, &args.dataset_dir) {
        (Some(path), None) => super::mount::open_mixture(
            path,
            &args.plan,
            &args.mount,
            crate::storage::fdpool::DEFAULT_MAX_OPEN,
        )?,
        (None, Some(dir)) => View::open(dir, &config)?,
        _ => {
            return Err(Error::invalid(
                "give DATASET_DIR or --config RUN.toml, not both",
            ));
        }
    };
    if let Some(expected) = &args.mount.expect_fingerprint {
        view.check_fingerprint(expected, args.mount.resume_step.unwrap_or(0))?;
    }
    if args.info {
        let _ = std::io::stdout().write_all(view.info_json());
        return Ok(());
    }
    let plan = view.plan();
    let (Some(epoch), Some(rank), Some(step)) = (args.epoch, args.rank, args.step) else {
        return Err(Error::invalid(
            "--epoch, --rank and --step are needed without --info",
        ));
    };
    let key = StepKey { epoch, rank, step };
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
