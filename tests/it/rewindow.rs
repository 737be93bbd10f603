//! `--rewindow`: epoch `e`'s windows start at `phase(e)` (docs/SEMANTICS.md section 3), so a
//! token sits at another position of its window each epoch; within an epoch every token is in
//! at most one row (stride = window), and every epoch has the same number of steps.

use std::collections::HashSet;

use serde_json::Value;
use shufflefs::feistel::mix;
use shufflefs::plan::StepKey;
use shufflefs::view::ViewConfig;

use crate::common::*;

#[test]
fn each_epoch_starts_its_windows_at_its_own_phase() {
    // Positional u32 tokens: a token's value is its record number.
    let data = Data::positional(50_000, 64 << 10);
    let (window, stride) = (129, 129);
    let cfg = ViewConfig {
        rewindow: true,
        ..config(window, stride, 4, 3, 17, 6)
    };
    let view = data.view(&cfg);
    let plain = data.view(&config(window, stride, 4, 3, 17, 6));
    assert_ne!(view.fingerprint(), plain.fingerprint());
    let info: Value = serde_json::from_slice(view.info_json()).unwrap();
    assert_eq!(info["rewindow"], true);
    // The worst phase leaves room for one window less at most.
    let n = view.plan().n_observations();
    assert!(n + 1 >= plain.plan().n_observations() && n <= plain.plan().n_observations());
    assert_eq!(
        n,
        (50_000 - (stride - 1) - window) / stride + 1,
        "the documented count"
    );
    let plan = view.plan();
    let mut phases = HashSet::new();
    for epoch in 0..plan.epochs() {
        let mut seen = HashSet::new();
        let mut phase = None;
        for step in 0..plan.steps_per_epoch() {
            for rank in 0..plan.ranks() {
                let key = StepKey { epoch, rank, step };
                let npy = view.render_step_npy(key).unwrap();
                let json: Value = serde_json::from_slice(&view.step_json(key).unwrap()).unwrap();
                let rows = plan.batch_size() as usize;
                let values: Vec<u32> = npy[npy.len() - rows * window as usize * 4..]
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                    .collect();
                for (r, row) in values.chunks(window as usize).enumerate() {
                    let start = u64::from(row[0]);
                    assert_eq!(json["token_starts"][r].as_u64(), Some(start));
                    let obs = json["observations"][r].as_u64().unwrap();
                    let p = start - obs * stride;
                    assert!(p < stride);
                    assert_eq!(*phase.get_or_insert(p), p, "one phase per epoch");
                    // The documented formula (docs/SEMANTICS.md section 3), "rewindow" in ASCII.
                    let documented = mix(mix(17 ^ 0x7265_7769_6e64_6f77) ^ epoch) % stride;
                    assert_eq!(p, documented, "epoch {epoch}: the documented phase");
                    for (k, &t) in row.iter().enumerate() {
                        assert_eq!(u64::from(t), start + k as u64, "a window of the stream");
                        assert!(seen.insert(t), "epoch {epoch}: token {t} twice");
                    }
                }
            }
        }
        phases.insert(phase.unwrap());
    }
    assert!(
        phases.len() >= 5,
        "the phases differ between epochs: {phases:?}"
    );
    // Rewindowed windows exist per epoch: no observation/ or lookup/ files.
    let fs = data.fs(&cfg);
    assert!(read_path(&fs, "/observation/0.npy").is_err());
}

#[test]
fn rewindow_is_for_stream_mode_only() {
    let data = Data::positional(10_000, 1 << 20);
    let cfg = ViewConfig {
        rewindow: true,
        mode: shufflefs::view::Mode::Documents,
        stride: None,
        ..config(10, 10, 2, 1, 1, 1)
    };
    let e = shufflefs::view::View::open(&data.path(), &cfg)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--rewindow only applies to --mode stream"),
        "{e}"
    );
}
