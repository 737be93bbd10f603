//! Inode numbers: computed, never stored.
//!
//! Each kind of node owns a contiguous range of inode numbers, in the order of the list in
//! [`Inodes`] below (the only list of the kinds besides `tree::Node`), and a node's number is
//! its range's start plus its index inside the kind (mixed radix over epoch, rank and step).
//! Nothing grows with the number of files read, `forget` is a no-op, and the same
//! configuration gives the same numbers on every mount. [`Inodes::new`] is also the check that
//! a configuration's files can be numbered at all (`View::new` calls it, so `plan` and `bench`
//! refuse exactly what `mount` refuses).

use crate::error::{Error, Result};
use crate::shuffle::plan::StepKey;
use crate::tree::{Node, Shape};

/// The root directory's inode number (fixed by FUSE).
pub const ROOT_INO: u64 = 1;

/// The numbering of one configuration.
#[derive(Clone, Debug)]
pub(crate) struct Inodes {
    shape: Shape,
    /// `starts[k]` is the first inode of kind `k`; `starts[KINDS]` one past the last inode.
    starts: [u64; KINDS + 1],
}

/// Declares the kinds of node in inode order, one line each: the node's pattern, how many of
/// the kind there are, the node's index inside the kind, and the node of index `i`.
macro_rules! kinds {
    ($s:ident; $($pattern:pat => $count:expr, $index:expr, |$i:ident| $node:expr;)+) => {
        /// Number of kinds of node.
        const KINDS: usize = [$(stringify!($pattern)),+].len();

        impl Inodes {
            /// How many nodes of kind `k` the tree holds (`None`: more than 2^64).
            fn count(&self, k: usize) -> Option<u64> {
                let $s = &self.shape;
                let mut n = 0;
                $(
                    if k == n {
                        return $count;
                    }
                    n += 1;
                )+
                unreachable!("kind {k} of {n}")
            }

            /// The kind of `node` and its index inside the kind.
            fn locate(&self, node: Node) -> (usize, u64) {
                let $s = &self.shape;
                let mut k = 0;
                $(
                    #[allow(unused_variables)]
                    if let $pattern = node {
                        return (k, $index);
                    }
                    k += 1;
                )+
                unreachable!("{node:?} is in no kind of {k}")
            }

            /// The node of index `index` inside kind `k`.
            fn node_at(&self, k: usize, index: u64) -> Node {
                let $s = &self.shape;
                let mut n = 0;
                $(
                    if k == n {
                        let $i = index;
                        return $node;
                    }
                    n += 1;
                )+
                unreachable!("kind {k} of {n}")
            }
        }
    };
}

kinds! { s;
    Node::Root => Some(1), 0, |_i| Node::Root;
    Node::Info => Some(1), 0, |_i| Node::Info;
    Node::Stats => Some(1), 0, |_i| Node::Stats;
    Node::EpochList => Some(1), 0, |_i| Node::EpochList;
    Node::ObservationList => Some(1), 0, |_i| Node::ObservationList;
    Node::Lookup => Some(1), 0, |_i| Node::Lookup;
    Node::LookupEpochList => Some(1), 0, |_i| Node::LookupEpochList;
    Node::Epoch(e) => Some(s.epochs), e, |i| Node::Epoch(i);
    Node::RankList(e) => Some(s.epochs), e, |i| Node::RankList(i);
    Node::LookupEpoch(e) => Some(s.epochs), e, |i| Node::LookupEpoch(i);
    Node::LookupObservationList(e) => Some(s.epochs), e, |i| Node::LookupObservationList(i);
    Node::Rank(e, r) => s.epochs.checked_mul(s.ranks), e * s.ranks + r,
        |i| Node::Rank(i / s.ranks, i % s.ranks);
    Node::StepList(e, r) => s.epochs.checked_mul(s.ranks), e * s.ranks + r,
        |i| Node::StepList(i / s.ranks, i % s.ranks);
    Node::StepNpy(k) => step_count(s), step_index(s, k), |i| Node::StepNpy(step_key(s, i));
    Node::StepJson(k) => step_count(s), step_index(s, k), |i| Node::StepJson(step_key(s, i));
    Node::ObservationNpy(o) => Some(s.observations), o, |i| Node::ObservationNpy(i);
    Node::ObservationJson(o) => Some(s.observations), o, |i| Node::ObservationJson(i);
    Node::LookupJson(e, o) => s.epochs.checked_mul(s.observations), e * s.observations + o,
        |i| Node::LookupJson(i / s.observations, i % s.observations);
    Node::StepPos(k) => mask_count(s), step_index(s, k), |i| Node::StepPos(step_key(s, i));
    Node::StepDocLens(k) => mask_count(s), step_index(s, k),
        |i| Node::StepDocLens(step_key(s, i));
    Node::Val => Some(u64::from(s.val_steps > 0)), 0, |_i| Node::Val;
    Node::ValRankList => Some(u64::from(s.val_steps > 0)), 0, |_i| Node::ValRankList;
    Node::ValRank(r) => Some(if s.val_steps > 0 { s.ranks } else { 0 }), r, |i| Node::ValRank(i);
    Node::ValStepList(r) => Some(if s.val_steps > 0 { s.ranks } else { 0 }), r,
        |i| Node::ValStepList(i);
    Node::ValStepNpy(r, st) => s.ranks.checked_mul(s.val_steps), r * s.val_steps + st,
        |i| Node::ValStepNpy(i / s.val_steps, i % s.val_steps);
    Node::ValStepJson(r, st) => s.ranks.checked_mul(s.val_steps), r * s.val_steps + st,
        |i| Node::ValStepJson(i / s.val_steps, i % s.val_steps);
}

/// Mask files (`S.pos.npy`, `S.doclens.npy`) of every epoch and rank: one per step with masks.
fn mask_count(s: &Shape) -> Option<u64> {
    if s.masks { step_count(s) } else { Some(0) }
}

/// Step files of every epoch and rank.
fn step_count(s: &Shape) -> Option<u64> {
    s.epochs.checked_mul(s.ranks)?.checked_mul(s.steps)
}

/// The index of step `k` in (epoch, rank, step) order.
fn step_index(s: &Shape, k: StepKey) -> u64 {
    (k.epoch * s.ranks + k.rank) * s.steps + k.step
}

/// The step of index `i` in (epoch, rank, step) order.
fn step_key(s: &Shape, i: u64) -> StepKey {
    let (er, step) = (i / s.steps, i % s.steps);
    StepKey {
        epoch: er / s.ranks,
        rank: er % s.ranks,
        step,
    }
}

impl Inodes {
    /// The numbering of a tree of this shape, or an error when its files cannot all be
    /// numbered with 64-bit inodes.
    pub(crate) fn new(shape: Shape) -> Result<Inodes> {
        let mut inodes = Inodes {
            shape,
            starts: [0; KINDS + 1],
        };
        inodes.starts[0] = ROOT_INO;
        for k in 0..KINDS {
            let next = inodes
                .count(k)
                .and_then(|n| inodes.starts[k].checked_add(n));
            inodes.starts[k + 1] = next.ok_or_else(|| {
                let Shape {
                    epochs,
                    ranks,
                    steps,
                    ..
                } = shape;
                Error::invalid(format!(
                    "{epochs} epochs x {ranks} ranks x {steps} steps is too many files to \
                     number; lower --epochs"
                ))
            })?;
        }
        Ok(inodes)
    }

    /// The inode number of `node`.
    pub(crate) fn ino(&self, node: Node) -> u64 {
        let (k, index) = self.locate(node);
        self.starts[k] + index
    }

    /// How many inodes the tree has (numbered from [`ROOT_INO`]).
    pub(crate) fn len(&self) -> u64 {
        self.starts[KINDS] - ROOT_INO
    }

    /// The node of inode `ino`, if it exists.
    pub(crate) fn node(&self, ino: u64) -> Option<Node> {
        if ino < self.starts[0] || ino >= self.starts[KINDS] {
            return None;
        }
        let k = self.starts.partition_point(|&s| s <= ino) - 1;
        Some(self.node_at(k, ino - self.starts[k]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inodes(epochs: u64, ranks: u64, steps: u64, observations: u64) -> Result<Inodes> {
        Inodes::new(Shape {
            epochs,
            ranks,
            steps,
            observations,
            masks: false,
            val_steps: 0,
        })
    }

    #[test]
    fn held_out_files_round_trip() {
        let shape = Shape {
            epochs: 2,
            ranks: 3,
            steps: 4,
            observations: 0,
            masks: false,
            val_steps: 5,
        };
        let inodes = Inodes::new(shape).unwrap();
        for node in [
            Node::Val,
            Node::ValRankList,
            Node::ValRank(2),
            Node::ValStepList(1),
            Node::ValStepNpy(2, 4),
            Node::ValStepJson(0, 3),
        ] {
            assert_eq!(inodes.node(inodes.ino(node)), Some(node), "{node:?}");
        }
    }

    #[test]
    fn mask_files_are_numbered_after_every_other_kind() {
        let shape = Shape {
            epochs: 2,
            ranks: 3,
            steps: 4,
            observations: 5,
            masks: true,
            val_steps: 0,
        };
        let with = Inodes::new(shape).unwrap();
        let without = inodes(2, 3, 4, 5).unwrap();
        let key = StepKey {
            epoch: 1,
            rank: 2,
            step: 3,
        };
        // The other kinds keep their numbers; the masks come last, densely.
        assert_eq!(
            with.ino(Node::StepJson(key)),
            without.ino(Node::StepJson(key))
        );
        let (pos, lens) = (
            with.ino(Node::StepPos(key)),
            with.ino(Node::StepDocLens(key)),
        );
        assert_eq!(with.node(pos), Some(Node::StepPos(key)));
        assert_eq!(with.node(lens), Some(Node::StepDocLens(key)));
        assert_eq!(lens, with.starts[KINDS] - 1);
        assert_eq!(without.node(pos), None);
    }

    #[test]
    fn inode_numbering_round_trips() {
        let inodes = inodes(3, 4, 5, 7).unwrap();
        let mut all = vec![
            Node::Root,
            Node::Info,
            Node::Stats,
            Node::EpochList,
            Node::ObservationList,
            Node::Lookup,
            Node::LookupEpochList,
        ];
        for o in 0..7 {
            all.push(Node::ObservationNpy(o));
            all.push(Node::ObservationJson(o));
        }
        for e in 0..3 {
            all.push(Node::Epoch(e));
            all.push(Node::RankList(e));
            all.push(Node::LookupEpoch(e));
            all.push(Node::LookupObservationList(e));
            for o in 0..7 {
                all.push(Node::LookupJson(e, o));
            }
            for r in 0..4 {
                all.push(Node::Rank(e, r));
                all.push(Node::StepList(e, r));
                for step in 0..5 {
                    let k = StepKey {
                        epoch: e,
                        rank: r,
                        step,
                    };
                    all.push(Node::StepNpy(k));
                    all.push(Node::StepJson(k));
                }
            }
        }
        let mut inos: Vec<u64> = all.iter().map(|&n| inodes.ino(n)).collect();
        for (&n, &ino) in all.iter().zip(&inos) {
            assert_eq!(inodes.node(ino), Some(n));
        }
        assert_eq!(inodes.ino(Node::Root), ROOT_INO);
        inos.sort_unstable();
        inos.dedup();
        assert_eq!(inos.len(), all.len(), "no collisions");
        assert_eq!(*inos.first().unwrap(), 1);
        assert_eq!(*inos.last().unwrap(), all.len() as u64, "dense numbering");
        assert_eq!(inodes.node(0), None);
        assert_eq!(inodes.node(all.len() as u64 + 1), None);
        assert_eq!(inodes.node(u64::MAX), None);
        // The order of the kinds is part of the numbering (stable across versions).
        assert_eq!(inodes.ino(Node::LookupEpochList), 7);
        assert_eq!(inodes.ino(Node::Epoch(0)), 8);
        assert_eq!(inodes.ino(Node::LookupJson(2, 6)), all.len() as u64);
    }

    #[test]
    fn inode_space_overflow_is_refused() {
        assert!(inodes(u64::MAX, 2, 1, 1).is_err());
        assert!(inodes(1 << 20, 1 << 20, 1 << 23, 1).is_err());
        assert!(inodes(2, 1, 1, u64::MAX / 2).is_err());
        assert!(inodes(100, 1024, 1 << 40, 1 << 50).is_ok());
    }
}
