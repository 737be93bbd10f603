//! `--quarantine FILE` on a plain mount: the listed observations are never served, each row
//! that held one takes an observation the epoch would otherwise drop, every other row keeps
//! its bytes, and the list is part of the fingerprint.

use std::collections::HashSet;

use shufflefs::plan::StepKey;
use shufflefs::view::ViewConfig;

use crate::common::*;

#[test]
fn quarantined_observations_are_never_served_and_other_rows_keep_their_bytes() {
    let data = Data::positional(20_600, 64 << 10);
    // 20,600 tokens in windows of 64: 321 observations, 24 per global step, 13 steps, 9 dropped.
    let plain_cfg = config(64, 64, 6, 4, 3, 2);
    let plain = data.view(&plain_cfg);
    let key = |epoch, rank, step| StepKey { epoch, rank, step };
    let first: Vec<u64> = plain.step_info(key(0, 1, 2)).observations;
    let bad = [first[0], first[3], 7, 311];
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("bad.txt");
    let text: String = bad.iter().map(|o| format!("{o}  # bad\n")).collect();
    std::fs::write(&list, format!("# quarantined windows\n{text}")).unwrap();
    let cfg = ViewConfig {
        quarantine: Some(list.clone()),
        ..plain_cfg.clone()
    };
    let view = data.view(&cfg);
    assert_ne!(view.fingerprint(), plain.fingerprint());
    assert_eq!(
        view.plan().steps_per_epoch(),
        plain.plan().steps_per_epoch()
    );
    for epoch in 0..2 {
        let mut seen = HashSet::new();
        for step in 0..view.plan().steps_per_epoch() {
            for rank in 0..4 {
                let k = key(epoch, rank, step);
                let (a, b) = (
                    plain.step_info(k).observations,
                    view.step_info(k).observations,
                );
                let (npy_a, npy_b) = (
                    plain.render_step_npy(k).unwrap(),
                    view.render_step_npy(k).unwrap(),
                );
                let row =
                    |npy: &[u8], r: usize| npy[npy.len() - (6 - r) * 64 * 4..][..64 * 4].to_vec();
                for r in 0..6 {
                    assert!(!bad.contains(&b[r]), "{k:?}: quarantined {} served", b[r]);
                    assert!(seen.insert(b[r]), "{k:?}: {} twice", b[r]);
                    if !bad.contains(&a[r]) {
                        assert_eq!(a[r], b[r]);
                        assert_eq!(row(&npy_a, r), row(&npy_b, r), "{k:?} row {r}");
                    }
                }
            }
        }
    }
    let e = shufflefs::view::View::open(
        &data.path(),
        &ViewConfig {
            quarantine: Some(dir.path().join("missing.txt")),
            ..plain_cfg
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("missing.txt"), "{e}");
}
