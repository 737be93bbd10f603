//! Remote datasets (`s3://`, `http(s)://`): the bytes served are those of the same dataset on
//! local disk, through HTTP range reads (nginx) and the S3 API (moto), in stream and
//! documents mode, through the view and through a real mount.

use std::path::Path;

use serde_json::Value;
use shufflefs::plan::StepKey;
use shufflefs::view::{Mode, View, ViewConfig};

use crate::common::proxy;
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

/// Every step file of epoch 0 through the mount at `mnt` equals `view`'s (`label` names the
/// case in failures), and so does its fingerprint; returns the mount's `info.json`.
fn assert_mount_serves(mnt: &Path, view: &View, label: &str) -> Value {
    let plan = view.plan();
    for rank in 0..plan.ranks() {
        for step in 0..plan.steps_per_epoch() {
            let key = StepKey {
                epoch: 0,
                rank,
                step,
            };
            let got = std::fs::read(step_path(mnt, 0, rank, step, "npy")).unwrap();
            assert_eq!(got, view.render_step_npy(key).unwrap(), "{label} {key:?}");
        }
    }
    let info: Value =
        serde_json::from_slice(&std::fs::read(mnt.join("info.json")).unwrap()).unwrap();
    assert_eq!(
        info["fingerprint"].as_str(),
        Some(view.fingerprint()),
        "{label}"
    );
    info
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
    // The manifest and one listing of the prefix, fetched together, pin every file: no HEAD
    // per shard.
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(data.path().join("manifest.json")).unwrap()).unwrap();
    assert!(manifest["shards"].as_array().unwrap().len() >= 3);
    let stats: Value =
        serde_json::from_slice(&std::fs::read(mnt.path().join("stats.json")).unwrap()).unwrap();
    assert_eq!(stats["remote"]["requests"].as_u64(), Some(2), "{stats}");
    let info = assert_mount_serves(mnt.path(), &local, "s3");
    assert_eq!(info["dataset"].as_str(), Some("s3://train/sets/ds"));
    unmount(mnt.path());
}

/// The positional dataset `data` over HTTP through a fault proxy in front of nginx: the proxy,
/// the server (kept alive) and the dataset's URL through the proxy.
fn behind_proxy(data: &Data) -> Option<(proxy::FaultProxy, Nginx, String)> {
    let root = Path::new("/");
    let nginx = Nginx::start(root)?;
    let p = proxy::FaultProxy::start(nginx.addr);
    let url = url_of(&p.url(), root, &data.path());
    Some((p, nginx, url))
}

#[test]
fn http_reads_survive_resets_throttling_and_truncated_bodies() {
    use proxy::Fault::*;
    let data = Data::positional(40_000, 4096 * 4);
    let Some((p, _nginx, url)) = behind_proxy(&data) else {
        return;
    };
    let cfg = config(65, 64, 8, 2, 21, 1);
    let local = View::open(&data.path(), &cfg).unwrap();
    // The opens (HEADs) pass; then ranged reads meet every kind of transient fault.
    let faults = [
        Reset, SlowDown, Truncate, Status500, SlowDown, SlowDown, Reset, Truncate, SlowDown,
    ];
    p.set(std::time::Duration::ZERO, &faults, true);
    let remote = View::open(Path::new(&url), &cfg).unwrap();
    assert_same_steps(&local, &remote);
    assert_eq!(
        p.faults(),
        faults.len() as u64,
        "every fault was met and retried"
    );
    let fs = shufflefs::ShuffleFs::new(View::open(Path::new(&url), &cfg).unwrap()).unwrap();
    let stats: Value = serde_json::from_slice(&read_path(&fs, "/stats.json").unwrap()).unwrap();
    // A reset met on a reused keep-alive connection may be retried by the HTTP client below
    // the store's own retries (uncounted; seen once in CI): at most the two resets.
    let resets = faults.iter().filter(|f| matches!(f, Reset)).count() as u64;
    assert!(
        stats["remote"]["retries"].as_u64() >= Some(faults.len() as u64 - resets),
        "{stats}"
    );
    // With latency on every request, the rows of a step are fetched at once, not in turn.
    p.set(std::time::Duration::from_millis(30), &[], true);
    let key = StepKey {
        epoch: 0,
        rank: 1,
        step: 3,
    };
    assert_eq!(
        remote.render_step_npy(key).unwrap(),
        local.render_step_npy(key).unwrap()
    );
    assert!(
        p.max_in_flight() >= 4,
        "8 rows in flight together, saw at most {}",
        p.max_in_flight()
    );
}

#[test]
fn a_stalled_read_fails_by_its_deadline_and_a_replaced_object_is_refused() {
    let data = Data::positional(40_000, 4096 * 4);
    let Some((p, _nginx, url)) = behind_proxy(&data) else {
        return;
    };
    if !fuse_available() {
        return;
    }
    let cfg = config(65, 64, 8, 2, 21, 1);
    let local = View::open(&data.path(), &cfg).unwrap();
    let mnt = MountDir::new();
    let log = data.dir.path().join("mount.log");
    shufflefs_ok(&[
        "mount",
        &url,
        s(mnt.path()),
        "--window",
        "65",
        "--stride",
        "64",
        "--batch-size",
        "8",
        "--ranks",
        "2",
        "--seed",
        "21",
        "--read-timeout",
        "2",
        "--cache-size",
        "0",
        "--log-file",
        s(&log),
    ]);
    let read = |step: u64| std::fs::read(step_path(mnt.path(), 0, 0, step, "npy"));
    let want = |step: u64| {
        local
            .render_step_npy(StepKey {
                epoch: 0,
                rank: 0,
                step,
            })
            .unwrap()
    };
    assert_eq!(read(0).unwrap(), want(0));
    // Every request stalls: the read fails with EIO at its deadline (2 s), not later.
    p.always(Some(proxy::Fault::Stall));
    let started = std::time::Instant::now();
    let e = read(1).unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(
        took < std::time::Duration::from_secs(3 + 5),
        "EIO after {took:?}"
    );
    // Once the store answers again, the same step is served exactly.
    p.always(None);
    assert_eq!(read(1).unwrap(), want(1));
    // The object changes on the server (nginx's ETag is mtime and size): refused, not mixed.
    let shard = shard_paths(&data.path())[0].clone();
    let f = std::fs::File::options().write(true).open(&shard).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(60))
        .unwrap();
    drop(f);
    let refused = (0..local.plan().steps_per_epoch())
        .filter(|&st| read(st).is_err_and(|e| e.raw_os_error() == Some(libc::EIO)))
        .count();
    assert!(refused > 0, "a step that reads the replaced shard fails");
    // stats.json counts it all.
    let stats: Value =
        serde_json::from_slice(&std::fs::read(mnt.path().join("stats.json")).unwrap()).unwrap();
    let r = &stats["remote"];
    assert!(r["deadline_exceeded"].as_u64() >= Some(1), "{stats}");
    assert!(r["replaced"].as_u64() >= Some(1), "{stats}");
    assert!(r["requests"].as_u64() > Some(2), "{stats}");
    assert!(r["bytes"].as_u64() > Some(0), "{stats}");
    assert!(r["latency_ms_p50"].as_f64().is_some() && r["latency_ms_p99"].as_f64().is_some());
    unmount(mnt.path());
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("changed since it was opened") && log.contains("shard"),
        "the log names the object: {log}"
    );
}

#[test]
fn credentials_never_reach_logs_errors_or_the_tree() {
    let data = Data::positional(20_000, 4096 * 2);
    let Some(moto) = Moto::start() else {
        return;
    };
    moto.upload("secret", &data.path(), "ds");
    let p = proxy::FaultProxy::start(moto.addr);
    const SECRET: &str = "Sekr1tAccessKeyValue0000";
    const TOKEN: &str = "T0kenSessionValue9999";
    let env = |cmd: &mut std::process::Command| {
        cmd.envs(moto.env(&p.url()))
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("AWS_SESSION_TOKEN", TOKEN)
            .env("RUST_LOG", "debug");
    };
    let clean = |what: &str, text: &str| {
        assert!(
            !text.contains(SECRET) && !text.contains(TOKEN),
            "{what} leaks a credential: {text}"
        );
    };
    // The store answers 403 echoing the signed request (session token included): the error
    // says access is denied and nothing else.
    p.always(Some(proxy::Fault::Echo403));
    let mut cmd = command(&[
        "plan",
        "s3://secret/ds",
        "--window",
        "9",
        "--batch-size",
        "2",
        "--info",
    ]);
    env(&mut cmd);
    let o = cmd.output().unwrap();
    assert!(!o.status.success());
    clean("an error", &stderr(&o));
    assert!(stderr(&o).contains("access denied"), "{}", stderr(&o));
    p.always(None);
    if !fuse_available() {
        return;
    }
    let mnt = MountDir::new();
    let log = data.dir.path().join("mount.log");
    let mut cmd = command(&[
        "mount",
        "s3://secret/ds",
        s(mnt.path()),
        "--window",
        "9",
        "--batch-size",
        "2",
        "--cache-size",
        "0",
        "--log-file",
        s(&log),
    ]);
    env(&mut cmd);
    let o = cmd.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    clean("mount's output", &stderr(&o));
    p.always(Some(proxy::Fault::Echo403));
    assert!(std::fs::read(step_path(mnt.path(), 0, 0, 1, "npy")).is_err());
    p.always(None);
    for file in ["info.json", "stats.json", "epoch/0/rank/0/step/2.json"] {
        let text = std::fs::read_to_string(mnt.path().join(file)).unwrap();
        clean(file, &text);
    }
    unmount(mnt.path());
    clean("the log", &std::fs::read_to_string(&log).unwrap());
}

#[test]
fn a_mixture_source_may_be_remote_and_a_dataset_opens_its_objects_together() {
    let dir = tempfile::tempdir().unwrap();
    crate::mixture::sources(dir.path());
    let root = Path::new("/");
    let Some(nginx) = Nginx::start(root) else {
        return;
    };
    let p = proxy::FaultProxy::start(nginx.addr);
    let head = "window = 17\nbatch_size = 4\nranks = 2\nseed = 9\nsteps_per_epoch = 30\n";
    let source = |name: &str, path: &str, w: &str| {
        format!("[[source]]\nname = \"{name}\"\npath = \"{path}\"\nweight = {w}\n")
    };
    let b_url = url_of(&p.url(), root, &dir.path().join("b"));
    let local = format!(
        "{head}{}{}",
        source("a", "a", "0.6"),
        source("b", "b", "0.4")
    );
    let remote = format!(
        "{head}{}{}",
        source("a", "a", "0.6"),
        source("b", &b_url, "0.4")
    );
    std::fs::write(dir.path().join("local.toml"), local).unwrap();
    std::fs::write(dir.path().join("remote.toml"), remote).unwrap();
    let open = |name: &str| {
        let c = shufflefs::runconfig::RunConfig::read(&dir.path().join(name)).unwrap();
        View::mixture_for_tests(&c, 64).unwrap()
    };
    // The remote source's shards and checksum files are opened in one round of requests.
    p.set(std::time::Duration::from_millis(30), &[], false);
    let (a, b) = (open("local.toml"), open("remote.toml"));
    assert!(
        p.max_in_flight() >= 2,
        "opens in parallel: {}",
        p.max_in_flight()
    );
    p.set(std::time::Duration::ZERO, &[], false);
    assert_same_steps(&a, &b);
}

#[test]
fn a_remote_manifest_may_name_only_objects_under_its_prefix() {
    let data = Data::positional(5_000, 4096);
    let root = Path::new("/");
    let Some(nginx) = Nginx::start(root) else {
        return;
    };
    let manifest = data.path().join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let first = manifest_shard_path(&text);
    for hostile in [
        "/etc/passwd",
        "../other/x.bin",
        "s3://elsewhere/x.bin",
        "http://169.254.169.254/latest",
    ] {
        std::fs::write(&manifest, text.replacen(&first, hostile, 1)).unwrap();
        let url = url_of(&nginx.url(), root, &data.path());
        let e = View::open(Path::new(&url), &config(9, 9, 1, 1, 0, 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("manifest.json"), "{hostile}: {e}");
    }
}

/// The path of the first shard in a manifest's text.
fn manifest_shard_path(text: &str) -> String {
    let v: Value = serde_json::from_str(text).unwrap();
    v["shards"][0]["path"].as_str().unwrap().to_string()
}

#[test]
fn a_local_manifest_names_remote_objects_only_for_the_user_whose_credentials_fetch_them() {
    let data = Data::positional(5_000, 4096);
    let root = Path::new("/");
    let Some(nginx) = Nginx::start(root) else {
        return;
    };
    // An in-place dataset of the shard files, then each named by its URL instead (the
    // content samples still match: accepted).
    let copy = data.dir.path().join("copy");
    let shards = shard_paths(&data.path());
    let mut args = vec![
        "pack",
        s(&copy),
        "--in-place",
        "--dtype",
        "u32",
        "--no-progress",
    ];
    args.extend(shards.iter().map(|p| s(p)));
    shufflefs_ok(&args);
    let mut text = std::fs::read_to_string(copy.join("manifest.json")).unwrap();
    for shard in &shards {
        text = text.replace(s(shard), &url_of(&nginx.url(), root, shard));
    }
    std::fs::write(copy.join("manifest.json"), text).unwrap();
    let cfg = config(9, 9, 2, 1, 4, 1);
    let want = View::open(&data.path(), &cfg).unwrap();
    let got = View::open(&copy, &cfg).unwrap();
    let key = StepKey {
        epoch: 0,
        rank: 0,
        step: 5,
    };
    assert_eq!(
        got.render_step_npy(key).unwrap(),
        want.render_step_npy(key).unwrap()
    );
    // Another user's manifest naming the same URL: our credentials would fetch it for them.
    let Some((_, uid, gid)) = other_user() else {
        return;
    };
    chown(&copy.join("manifest.json"), uid, gid);
    let e = View::open(&copy, &cfg).unwrap_err().to_string();
    assert!(e.contains("belongs to another user"), "{e}");
}

#[test]
fn a_documents_step_looks_up_its_rows_documents_together() {
    let corpus = Corpus::new(3000, 2048);
    let root = Path::new("/");
    let Some(nginx) = Nginx::start(root) else {
        return;
    };
    let p = proxy::FaultProxy::start(nginx.addr);
    let cfg = documents(config(9, 9, 8, 2, 5, 1));
    let local = View::open(&corpus.ds, &cfg).unwrap();
    let remote = View::open(Path::new(&url_of(&p.url(), root, &corpus.ds)), &cfg).unwrap();
    // Each row's document is found through reads that depend on each other (a fence, then
    // its record): the rows' reads of each kind go out together.
    p.set(std::time::Duration::from_millis(30), &[], false);
    for step in [0, 7] {
        let key = StepKey {
            epoch: 0,
            rank: 1,
            step,
        };
        // S.json reads only the documents (no token ranges).
        p.counters
            .max_in_flight
            .store(0, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            json_without_files(&remote.step_json(key).unwrap()),
            json_without_files(&local.step_json(key).unwrap())
        );
        assert!(
            p.max_in_flight() >= 4,
            "at most {} in flight",
            p.max_in_flight()
        );
        assert_eq!(
            remote.render_step_npy(key).unwrap(),
            local.render_step_npy(key).unwrap()
        );
    }
}

/// `pack --in-place` of token files as the real tools wrote them (tests/fixtures/formats),
/// local and remote (`(fixture dir, files, flags)`).
const TOKEN_FILES: &[(&str, &[&str], &[&str])] = &[
    (
        "llmc_gpt2",
        &[
            "fineweb_train_000001.bin",
            "fineweb_train_000002.bin",
            "fineweb_train_000003.bin",
        ],
        &["--doc-start", "50256"],
    ),
    (
        "olmo_dolma2",
        &["part-0-00000.npy", "part-0-00001.npy", "part-0-00002.npy"],
        &["--dtype", "u32", "--doc-sep", "100257"],
    ),
    (
        "megatron_files",
        &["corpus_text_document_00.bin", "corpus_text_document_01.bin"],
        &[],
    ),
];

fn fixture_dir(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/formats")
        .join(name)
}

/// `shufflefs pack DIR --in-place FLAGS INPUTS` with `env`.
fn pack_in_place(dir: &Path, inputs: &[String], flags: &[&str], env: &[(String, String)]) {
    let mut args = vec!["pack", s(dir), "--in-place", "--no-progress"];
    args.extend_from_slice(flags);
    args.extend(inputs.iter().map(String::as_str));
    let mut cmd = command(&args);
    cmd.envs(env.iter().cloned());
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "pack {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The manifest of `dir` names every shard by a URL starting with `prefix`, and `dir` holds
/// no token file: only the manifest and the compact document index.
fn assert_references(dir: &Path, prefix: &str) {
    let m = manifest(dir);
    for shard in m["shards"].as_array().unwrap() {
        let path = shard["path"].as_str().unwrap();
        assert!(path.starts_with(prefix), "{path}");
    }
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(name == "manifest.json" || name.ends_with(".docs"), "{name}");
    }
}

#[test]
fn pack_in_place_over_http_token_files_serves_the_bytes_of_the_local_files() {
    let root = Path::new("/");
    let Some(nginx) = Nginx::start(root) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    for (name, files, flags) in TOKEN_FILES {
        let src = fixture_dir(name);
        let local_inputs: Vec<String> = files.iter().map(|f| s(&src.join(f)).to_string()).collect();
        let remote_inputs: Vec<String> = files
            .iter()
            .map(|f| url_of(&nginx.url(), root, &src.join(f)))
            .collect();
        let (local, remote) = (
            tmp.path().join(name),
            tmp.path().join(format!("{name}-http")),
        );
        pack_in_place(&local, &local_inputs, flags, &[]);
        pack_in_place(&remote, &remote_inputs, flags, &[]);
        assert_references(&remote, &nginx.url());
        for cfg in [
            config(17, 16, 3, 2, 5, 1),
            documents(config(9, 9, 3, 2, 5, 1)),
        ] {
            let a = View::open(&local, &cfg).unwrap();
            let b = View::open(&remote, &cfg).unwrap();
            assert_same_steps(&a, &b);
        }
    }
    // An HTTP server cannot list: a glob is refused saying so.
    let glob = format!(
        "{}/*.bin",
        url_of(&nginx.url(), root, &fixture_dir("nanogpt"))
    );
    let o = command(&[
        "pack",
        s(&tmp.path().join("glob")),
        "--in-place",
        "--dtype",
        "u16",
        &glob,
    ])
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("cannot list"), "{err}");
    // A presigned URL (a query) is refused without repeating its signature.
    let signed = format!(
        "{}?X-Amz-Signature=SECRETSIG",
        url_of(
            &nginx.url(),
            root,
            &fixture_dir("nanogpt").join("train.bin")
        )
    );
    let o = command(&["pack", s(&tmp.path().join("signed")), "--in-place", &signed])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("query") && !err.contains("SECRETSIG"),
        "{err}"
    );
    // A copy of a remote input is refused, pointing at --in-place.
    let o = command(&[
        "pack",
        s(&tmp.path().join("copy")),
        "--dtype",
        "u16",
        &url_of(
            &nginx.url(),
            root,
            &fixture_dir("nanogpt").join("train.bin"),
        ),
    ])
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--in-place"), "{err}");
}

#[test]
fn pack_in_place_over_s3_globs_mounts_the_bytes_of_the_local_files() {
    let Some(moto) = Moto::start() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let env = moto.env(&moto.url());
    for (name, files, flags) in TOKEN_FILES {
        let src = fixture_dir(name);
        moto.upload("tokens", &src, name);
        let local_inputs: Vec<String> = files.iter().map(|f| s(&src.join(f)).to_string()).collect();
        let local = tmp.path().join(name);
        let remote = tmp.path().join(format!("{name}-s3"));
        pack_in_place(&local, &local_inputs, flags, &[]);
        // The glob matches exactly the files named locally (companions go with their .bin).
        let pattern = match *name {
            "llmc_gpt2" => "fineweb_train_*.bin",
            "olmo_dolma2" => "part-0-*.npy",
            _ => "corpus_text_document_*",
        };
        pack_in_place(
            &remote,
            &[format!("s3://tokens/{name}/{pattern}")],
            flags,
            &env,
        );
        assert_references(&remote, &format!("s3://tokens/{name}/"));
        let a = View::open(&local, &config(17, 16, 3, 2, 5, 1)).unwrap();
        if !fuse_available() {
            return;
        }
        let mnt = MountDir::new();
        let mut cmd = command(&[
            "mount",
            s(&remote),
            s(mnt.path()),
            "--window",
            "17",
            "--stride",
            "16",
            "--batch-size",
            "3",
            "--ranks",
            "2",
            "--seed",
            "5",
        ]);
        cmd.envs(env.iter().cloned());
        let o = cmd.output().unwrap();
        assert!(
            o.status.success(),
            "mount: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_mount_serves(mnt.path(), &a, name);
        unmount(mnt.path());
        // Each shard records its object's ETag; an object replaced by one of the same size
        // (another ETag, other sampled bytes) is refused at mount, naming it.
        let m = manifest(&remote);
        let first = &m["shards"][0];
        assert!(
            first["etag"].as_str().is_some_and(|e| e.starts_with('"')),
            "{first}"
        );
        let file = first["path"].as_str().unwrap().rsplit('/').next().unwrap();
        let changed = tmp.path().join(format!("{name}-changed"));
        std::fs::create_dir(&changed).unwrap();
        let mut bytes = std::fs::read(src.join(file)).unwrap();
        let at = first["offset"].as_u64().unwrap_or(0) as usize + 2;
        bytes[at] ^= 0x55;
        std::fs::write(changed.join(file), bytes).unwrap();
        moto.upload("tokens", &changed, name);
        let mut cmd = command(&["inspect", s(&remote)]);
        cmd.envs(env.iter().cloned());
        let o = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(file), "{name}: {err}");
    }
}

#[test]
fn https_behind_a_private_authority_needs_its_bundle() {
    let data = Data::positional(20_000, 4096 * 2);
    let root = Path::new("/");
    let Some(nginx) = Nginx::start_tls(root) else {
        return;
    };
    let url = url_of(&nginx.url(), root, &data.path());
    let verify = |bundle: Option<&Path>| {
        let mut cmd = command(&["verify", &url]);
        cmd.env_remove("AWS_CA_BUNDLE").env_remove("SSL_CERT_FILE");
        if let Some(b) = bundle {
            cmd.env("AWS_CA_BUNDLE", b);
        }
        cmd.output().unwrap()
    };
    // The system's authorities do not know it: refused, saying what to do.
    let o = verify(None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("AWS_CA_BUNDLE"), "{err}");
    // With its authority's bundle every byte checks out against the manifest's hashes.
    let o = verify(nginx.ca.as_deref());
    assert!(
        o.status.success(),
        "verify: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // A bundle that is not one is refused naming it.
    let bogus = data.path().join("manifest.json");
    let o = verify(Some(&bogus));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("no PEM certificate"),
        "{err}"
    );
}

#[test]
fn a_remote_in_place_object_replaced_after_pack_is_refused_by_its_etag() {
    let Some(moto) = Moto::start() else {
        return;
    };
    let env = moto.env(&moto.url());
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    // 1 MiB of u16 tokens: 16 pages of 4 KiB are sampled, most bytes are not.
    let tokens: Vec<u8> = (0..(1u32 << 19))
        .flat_map(|i| ((i % 50_000) as u16).to_le_bytes())
        .collect();
    std::fs::write(src.join("t.bin"), &tokens).unwrap();
    moto.upload("etag", &src, "tok");
    let ds = tmp.path().join("ds");
    pack_in_place(
        &ds,
        &["s3://etag/tok/t.bin".to_string()],
        &["--dtype", "u16"],
        &env,
    );
    let inspect = || {
        let mut cmd = command(&["inspect", s(&ds)]);
        cmd.envs(env.iter().cloned());
        cmd.output().unwrap()
    };
    assert!(inspect().status.success());
    // A byte no sample covers (between the first two sampled pages), re-uploaded: same size,
    // same samples, another ETag.
    let mut changed = tokens.clone();
    changed[8192 + 10] ^= 0x55;
    std::fs::write(src.join("t.bin"), &changed).unwrap();
    moto.upload("etag", &src, "tok");
    let o = inspect();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("t.bin") && err.contains("modified"),
        "{err}"
    );
}
