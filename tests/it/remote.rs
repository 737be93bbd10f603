//! Remote datasets (`s3://`, `http(s)://`): the bytes served are those of the same dataset on
//! local disk, through HTTP range reads (nginx) and the S3 API (moto), in stream and
//! documents mode, through the view and through a real mount.

use std::path::Path;

use serde_json::Value;
use shufflefs::plan::StepKey;
use shufflefs::view::{Mode, View, ViewConfig};

use crate::common::*;

/// S.json without `files` (local paths there, URLs here).
fn json_without_files(bytes: &[u8]) -> Value {
    let mut v: Value = serde_json::from_slice(bytes).unwrap();
    v.as_object_mut().unwrap().remove("files");
    v
}

/// Every step file and S.json of `a` equals `b`'s.
fn assert_same_steps(a: &View, b: &View) {
    let plan = a.plan();
    assert_eq!(a.fingerprint(), b.fingerprint(), "same data, same plan");
    for epoch in 0..plan.epochs() {
        for rank in 0..plan.ranks() {
            for step in 0..plan.steps_per_epoch() {
                let key = StepKey { epoch, rank, step };
                assert_eq!(
                    a.render_step_npy(key).unwrap(),
                    b.render_step_npy(key).unwrap(),
                    "{key:?}"
                );
                assert_eq!(
                    json_without_files(&a.step_json(key).unwrap()),
                    json_without_files(&b.step_json(key).unwrap()),
                    "{key:?}"
                );
            }
        }
    }
}

fn documents(config: ViewConfig) -> ViewConfig {
    ViewConfig {
        mode: Mode::Documents,
        stride: None,
        pad_id: Some(7),
        ..config
    }
}

/// The URL of dataset `ds` under the server root `root` at `base`.
fn url_of(base: &str, root: &Path, ds: &Path) -> String {
    format!("{base}/{}", ds.strip_prefix(root).unwrap().display())
}

#[test]
fn http_datasets_serve_the_bytes_of_local_disk() {
    let data = Data::positional(50_000, 4096 * 4);
    let corpus = Corpus::new(600, 1024);
    let root = Path::new("/");
    let Some(nginx) = Nginx::start(root) else {
        return;
    };
    let stream_cfg = config(33, 31, 4, 3, 11, 2);
    let local = View::open(&data.path(), &stream_cfg).unwrap();
    let url = url_of(&nginx.url(), root, &data.path());
    let remote = View::open(Path::new(&url), &stream_cfg).unwrap();
    assert_same_steps(&local, &remote);
    // Documents mode: the document files are fetched the same way.
    let doc_cfg = documents(config(9, 9, 3, 2, 5, 1));
    let local = View::open(&corpus.ds, &doc_cfg).unwrap();
    let url = url_of(&nginx.url(), root, &corpus.ds);
    let remote = View::open(Path::new(&url), &doc_cfg).unwrap();
    assert_same_steps(&local, &remote);
    let info: Value = serde_json::from_slice(remote.info_json()).unwrap();
    assert_eq!(info["dataset"].as_str(), Some(url.as_str()));
}

#[test]
fn s3_datasets_mount_and_serve_the_bytes_of_local_disk() {
    let data = Data::positional(30_000, 4096 * 3);
    let Some(moto) = Moto::start() else {
        return;
    };
    moto.upload("train", &data.path(), "sets/ds");
    let cfg = config(17, 17, 2, 2, 3, 1);
    let local = View::open(&data.path(), &cfg).unwrap();
    if !fuse_available() {
        return;
    }
    let mnt = MountDir::new();
    let mut cmd = command(&[
        "mount",
        "s3://train/sets/ds",
        s(mnt.path()),
        "--window",
        "17",
        "--batch-size",
        "2",
        "--ranks",
        "2",
        "--seed",
        "3",
    ]);
    cmd.envs(moto.env(&moto.url()));
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "mount: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let plan = local.plan();
    for rank in 0..2 {
        for step in 0..plan.steps_per_epoch() {
            let key = StepKey {
                epoch: 0,
                rank,
                step,
            };
            let got = std::fs::read(step_path(mnt.path(), 0, rank, step, "npy")).unwrap();
            assert_eq!(got, local.render_step_npy(key).unwrap(), "{key:?}");
        }
    }
    let info: Value =
        serde_json::from_slice(&std::fs::read(mnt.path().join("info.json")).unwrap()).unwrap();
    assert_eq!(info["fingerprint"].as_str(), Some(local.fingerprint()));
    assert_eq!(info["dataset"].as_str(), Some("s3://train/sets/ds"));
    unmount(mnt.path());
}
