//! `shufflefs verify DATASET_DIR [--write-checksums] [--json]`.

use std::io::IsTerminal;

use crate::cli::VerifyArgs;
use crate::error::{Error, Result};
use crate::verify::{VerifyOptions, verify};

/// Runs `verify`.
pub(crate) fn run(args: VerifyArgs) -> Result<()> {
    let bar = (!args.no_progress && !args.json && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("verify {bar:40} {pos}/{len} shards {elapsed}")
                .expect("template"),
        );
        bar
    });
    let options = VerifyOptions {
        write_checksums: args.write_checksums,
    };
    let report = verify(&args.dataset_dir, options, |done, total| {
        if let Some(bar) = &bar {
            bar.set_length(total);
            bar.set_position(done);
        }
    })?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if args.json {
        say!("{}", serde_json::to_string_pretty(&report).expect("json"));
    } else {
        for p in &report.problems {
            say!("FAIL {}: {}", p.path.display(), p.message);
        }
        say!(
            "{}: {} shards, {} bytes read, {} blocks checked, {} problem(s){}",
            args.dataset_dir.display(),
            report.shards,
            report.bytes_read,
            report.blocks_checked,
            report.problems.len(),
            if report.checksums_written > 0 {
                format!(", {} checksum file(s) written", report.checksums_written)
            } else {
                String::new()
            }
        );
    }
    if report.problems.is_empty() {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{} failed verification ({} problem(s) above){}",
            args.dataset_dir.display(),
            report.problems.len(),
            if args.write_checksums {
                "; no checksum file was written"
            } else {
                ""
            }
        )))
    }
}
