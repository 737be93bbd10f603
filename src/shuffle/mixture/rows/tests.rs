use super::super::tests::weights;
use super::*;

#[test]
fn quarantined_observations_are_never_drawn_and_the_rest_is_unchanged() {
    for (len, val, bad) in [
        (50u64, 0u64, vec![3u64, 7, 8, 20, 49, 0, 31]),
        (40, 5, vec![1, 2]),
    ] {
        let plain = SourceOrder::new("s", len, val, 11, 3).unwrap();
        let held: Vec<u64> = (0..val).map(|i| plain.val_observation(i)).collect();
        let bad: Vec<u64> = bad.into_iter().filter(|o| !held.contains(o)).collect();
        let q = plain.clone().with_quarantine("s", &bad).unwrap();
        let m = q.epoch_len();
        assert_eq!(m, plain.train_len() - bad.len() as u64);
        for e in 0..6 {
            let drawn: Vec<u64> = (e * m..(e + 1) * m).map(|j| q.observation(j)).collect();
            let set: std::collections::HashSet<u64> = drawn.iter().copied().collect();
            assert_eq!(set.len() as u64, m, "epoch {e}: no repeat");
            assert!(
                bad.iter().all(|b| !set.contains(b)),
                "epoch {e}: a quarantined draw"
            );
            assert!(
                held.iter().all(|h| !set.contains(h)),
                "epoch {e}: a held-out draw"
            );
        }
        // Before the first wrap, a draw that held no quarantined observation is unchanged.
        for j in 0..m {
            let before = plain.observation(j);
            if !bad.contains(&before) {
                assert_eq!(q.observation(j), before, "draw {j}");
            }
        }
    }
    let plain = SourceOrder::new("s", 10, 2, 1, 1).unwrap();
    let held = plain.val_observation(0);
    assert!(plain.clone().with_quarantine("s", &[held]).is_err());
    assert!(plain.clone().with_quarantine("s", &[10]).is_err());
    assert!(
        plain
            .with_quarantine("s", &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
            .is_err()
    );
}

fn mixture(ws: &[f64], lens: &[u64], g: u64, seed: u64) -> Mixture {
    let specs = (0..ws.len())
        .map(|i| SourceSpec {
            name: format!("s{i}"),
            len: lens[i],
            val: 0,
        })
        .collect();
    Mixture::new(specs, Schedule::new(weights(ws), g).unwrap(), seed, 0).unwrap()
}

#[test]
fn slots_hold_each_draw_once() {
    let m = mixture(&[0.6, 0.3, 0.1], &[1000, 500, 50], 48, 7);
    let mut next = [0u64; 3];
    for step in 0..200 {
        let b = m.batch(step);
        let mut rows: Vec<Row> = (0..48).map(|s| b.slot(s)).collect();
        rows.sort_by_key(|r| (r.source, r.draw));
        for r in rows {
            assert_eq!(
                r.draw, next[r.source],
                "step {step}: draws continue in order"
            );
            next[r.source] += 1;
            assert_eq!(r.observation, m.order(r.source).observation(r.draw));
        }
        assert_eq!(next.to_vec(), m.counter().state_at(step + 1).drawn);
    }
}

#[test]
fn no_repeats_within_a_source_epoch_and_upsampling_wraps() {
    let o = SourceOrder::new("code", 97, 0, 42, 0).unwrap();
    let epoch = |e: u64| -> Vec<u64> { (e * 97..(e + 1) * 97).map(|j| o.observation(j)).collect() };
    let (e0, e1, e2) = (epoch(0), epoch(1), epoch(2));
    for e in [&e0, &e1, &e2] {
        let mut s = e.clone();
        s.sort_unstable();
        assert_eq!(
            s,
            (0..97).collect::<Vec<_>>(),
            "each source epoch is a permutation"
        );
    }
    assert_ne!(e0, e1, "a fresh permutation per source epoch");
    assert_ne!(e1, e2);
    // in a mixture the small source (weight 1/2, 40 observations) is upsampled: every
    // run of 40 consecutive draws is one source epoch, all distinct
    let m = mixture(&[0.5, 0.5], &[40, 1_000_000], 16, 3);
    let mut small = Vec::new();
    for step in 0..40 {
        let b = m.batch(step);
        let mut rows: Vec<Row> = (0..16)
            .map(|s| b.slot(s))
            .filter(|r| r.source == 0)
            .collect();
        rows.sort_by_key(|r| r.draw);
        small.extend(rows.iter().map(|r| r.observation));
    }
    assert!(small.len() >= 8 * 40 - 1);
    for chunk in small.chunks_exact(40) {
        let mut c = chunk.to_vec();
        c.sort_unstable();
        assert_eq!(c, (0..40).collect::<Vec<_>>());
    }
    // the large source is never used up: no observation twice
    let mut big: Vec<u64> = (0..40)
        .flat_map(|step| {
            let b = m.batch(step);
            (0..16)
                .map(move |s| b.slot(s))
                .filter(|r| r.source == 1)
                .map(|r| r.observation)
                .collect::<Vec<_>>()
        })
        .collect();
    let n = big.len();
    big.sort_unstable();
    big.dedup();
    assert_eq!(big.len(), n);
}

#[test]
fn slot_shuffle_spreads_sources_over_ranks() {
    let (ranks, batch) = (8u64, 16u64);
    let m = mixture(
        &[0.5, 0.3, 0.2],
        &[1 << 20, 1 << 20, 1 << 20],
        ranks * batch,
        11,
    );
    let mut per_rank = vec![[0u64; 3]; ranks as usize];
    let mut single_source_batches = 0;
    for step in 0..300 {
        let b = m.batch(step);
        for r in 0..ranks {
            let mut c = [0u64; 3];
            for j in 0..batch {
                c[b.rank_row(r, ranks, j).source] += 1;
            }
            single_source_batches += usize::from(c.contains(&batch));
            for i in 0..3 {
                per_rank[r as usize][i] += c[i];
            }
        }
    }
    assert_eq!(single_source_batches, 0);
    for c in per_rank {
        let total = (300 * batch) as f64;
        for (i, w) in [0.5, 0.3, 0.2].iter().enumerate() {
            let share = c[i] as f64 / total;
            assert!((share - w).abs() < 0.03, "rank share {share} vs {w}");
        }
    }
}

#[test]
fn elastic_ranks_see_the_same_global_step() {
    let m = mixture(&[0.7, 0.3], &[5000, 5000], 32, 5);
    let b = m.batch(9);
    for (ranks, batch) in [(1u64, 32u64), (4, 8), (8, 4), (32, 1)] {
        let mut rows: Vec<Row> = (0..ranks)
            .flat_map(|r| (0..batch).map(move |j| (r, j)))
            .map(|(r, j)| b.rank_row(r, ranks, j))
            .collect();
        rows.sort_by_key(|r| (r.source, r.draw));
        let mut all: Vec<Row> = (0..32).map(|s| b.slot(s)).collect();
        all.sort_by_key(|r| (r.source, r.draw));
        assert_eq!(rows, all);
        assert_eq!(b.rank_row(3 % ranks, ranks, 0), b.slot(3 % ranks));
    }
}

#[test]
fn held_out_split_is_disjoint_and_stable() {
    let a = SourceOrder::new("web", 1000, 10, 1, 99).unwrap();
    let val: Vec<u64> = (0..10).map(|i| a.val_observation(i)).collect();
    assert!(val.iter().all(|&v| a.is_val(v)));
    assert_eq!((0..1000).filter(|&o| a.is_val(o)).count(), 10);
    for j in 0..3 * 990 {
        assert!(!a.is_val(a.observation(j)), "draw {j} is held out");
    }
    let mut e0: Vec<u64> = (0..990).map(|j| a.observation(j)).collect();
    e0.sort_unstable();
    e0.dedup();
    assert_eq!(e0.len(), 990);
    // another run seed: another training order, the same held-out set
    let b = SourceOrder::new("web", 1000, 10, 2, 99).unwrap();
    assert_eq!(
        val,
        (0..10).map(|i| b.val_observation(i)).collect::<Vec<_>>()
    );
    // another split seed: another held-out set
    let c = SourceOrder::new("web", 1000, 10, 1, 100).unwrap();
    assert_ne!(
        val,
        (0..10).map(|i| c.val_observation(i)).collect::<Vec<_>>()
    );
    assert!(SourceOrder::new("web", 10, 10, 1, 1).is_err());
}

#[test]
fn source_order_in_the_config_does_not_matter() {
    let specs = |order: &[usize]| -> Vec<SourceSpec> {
        order
            .iter()
            .map(|&i| SourceSpec {
                name: ["web", "code", "math"][i].into(),
                len: 300 + i as u64,
                val: i as u64,
            })
            .collect()
    };
    let third = Weight::from_f64(1.0 / 3.0).unwrap();
    let build = |order: &[usize]| {
        let s = specs(order);
        let rank = name_ranks(&s.iter().map(|s| &s.name).collect::<Vec<_>>());
        let w = normalize(&[third; 3], &rank).unwrap();
        Mixture::new(s, Schedule::new(w, 10).unwrap(), 4, 5).unwrap()
    };
    let (a, b) = (build(&[0, 1, 2]), build(&[2, 0, 1]));
    for step in 0..50 {
        let (ba, bb) = (a.batch(step), b.batch(step));
        for s in 0..10 {
            let (ra, rb) = (ba.slot(s), bb.slot(s));
            assert_eq!(a.sources()[ra.source].name, b.sources()[rb.source].name);
            assert_eq!((ra.draw, ra.observation), (rb.draw, rb.observation));
        }
    }
}

#[test]
fn canonical_text_covers_entries_up_to_the_step() {
    let w = weights(&[0.5, 0.5]);
    let mut s = Schedule::new(w.clone(), 8).unwrap();
    s.change(100, Some(weights(&[0.25, 0.75])), None).unwrap();
    let specs = vec![
        SourceSpec {
            name: "a".into(),
            len: 10,
            val: 0,
        },
        SourceSpec {
            name: "b,c".into(),
            len: 20,
            val: 1,
        },
    ];
    let m = Mixture::new(specs.clone(), s.clone(), 1, 2).unwrap();
    let early = Mixture::new(specs, Schedule::new(w, 8).unwrap(), 1, 2).unwrap();
    assert_eq!(m.canonical_text(99), early.canonical_text(99));
    assert_ne!(m.canonical_text(100), early.canonical_text(100));
    assert_eq!(
        m.canonical_text(100),
        "mixture=mixture-v1\nmixture_seed=1\nsplit_seed=2\nsource=10,0,a\nsource=20,1,b,c\n\
         segment=0,8,2147483648,2147483648\nsegment=100,8,1073741824,3221225472\n"
    );
}

#[test]
fn mixture_rejects_bad_sources() {
    let s = || Schedule::new(weights(&[0.5, 0.5]), 8).unwrap();
    let spec = |name: &str, len| SourceSpec {
        name: name.into(),
        len,
        val: 0,
    };
    assert!(Mixture::new(vec![spec("a", 1), spec("a", 1)], s(), 0, 0).is_err());
    assert!(Mixture::new(vec![spec("a", 1), spec("", 1)], s(), 0, 0).is_err());
    assert!(Mixture::new(vec![spec("a", 1), spec("b", 0)], s(), 0, 0).is_err());
    assert!(Mixture::new(vec![spec("a", 1)], s(), 0, 0).is_err());
    assert!(Mixture::new(vec![spec("a", 1), spec("b\nc", 1)], s(), 0, 0).is_err());
}

/// `cargo test --release --lib mixture::tests::bench -- --ignored --nocapture`
#[test]
#[ignore]
fn bench() {
    use std::time::Instant;
    let w = weights(&[0.3, 0.25, 0.2, 0.1, 0.1, 0.049, 0.001]);
    let mut s = Schedule::new(w, 1024).unwrap();
    s.change(
        300_000,
        Some(weights(&[0.2, 0.2, 0.2, 0.2, 0.1, 0.09, 0.01])),
        Some(2048),
    )
    .unwrap();
    let c = Counter::new(s.clone(), (0..7).collect()).unwrap();
    let t = Instant::now();
    let state = c.state_at_uncached(1_000_000);
    let cold = t.elapsed();
    let t = Instant::now();
    let mut cur = c.cursor(0);
    let mut sum = 0u64;
    for _ in 0..1_000_000 {
        sum += cur.advance()[6];
    }
    let in_order = t.elapsed();
    assert_eq!(cur.state(), &state);
    let t = Instant::now();
    let _ = c.counts(999_999);
    let filling = t.elapsed();
    let t = Instant::now();
    for x in (0..1000u64).map(|i| mix(i) % 1_000_000) {
        let _ = c.counts(x);
    }
    let warm = t.elapsed() / 1000;
    let m = Mixture::new(
        (0..7)
            .map(|i| SourceSpec {
                name: format!("s{i}"),
                len: 1 << 30,
                val: 0,
            })
            .collect(),
        s,
        1,
        0,
    )
    .unwrap();
    let b = m.batch(123_456);
    let t = Instant::now();
    let mut acc = 0u64;
    for slot in 0..1024 {
        acc ^= b.slot(slot).observation;
    }
    let slots = t.elapsed();
    println!(
        "K=7, G=1024/2048: in order {:.1} ns/step; cold jump to step 1,000,000 {:.1} ms; \
         first random access (fills checkpoints) {:.1} ms; warm random access {:.1} us; \
         1024 slots with observations {:.1} us (sum {sum}, {acc})",
        in_order.as_nanos() as f64 / 1e6,
        cold.as_secs_f64() * 1e3,
        filling.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e6,
        slots.as_secs_f64() * 1e6,
    );
}
