//! `shufflefs unmount MOUNTPOINT [--lazy]`

use crate::cli::UnmountArgs;
use crate::error::Result;
use crate::mount::unmount_path;

/// Runs `unmount`.
pub(crate) fn run(args: UnmountArgs) -> Result<()> {
    unmount_path(&args.mountpoint, args.lazy)?;
    say!("unmounted {}", args.mountpoint.display());
    Ok(())
}
