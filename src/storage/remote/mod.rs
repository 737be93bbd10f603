//! Remote storage: datasets and shards at `s3://BUCKET/KEY` (any S3-compatible endpoint) or
//! `http(s)://HOST/PATH` (any server with Range support), read through `object_store` on a
//! tokio runtime that lives here and nowhere else: the rest of shufflefs sees [`ReadAt`].
//!
//! - [`RemoteObject`] is one object pinned at open by a HEAD, or on S3 by the listing fetched
//!   with the manifest ([`read_small_listing`]): size, ETag and (S3) version id.
//!   Every GET carries `If-Match: ETAG` (and the version id), so an object replaced after the
//!   open answers 412 -> [`StorageError::Replaced`] (`EIO`): old and new bytes are never
//!   mixed; each response's `Content-Range` and ETag are checked too.
//! - [`read_many`] fetches many ranges of many objects at once: adjacent ranges of an object
//!   are coalesced (at most `max_request` bytes), every request runs concurrently (bounded by
//!   one semaphore for the process), and bytes go from the body stream straight into the
//!   callers' buffers. Every buffer is filled exactly or the call fails; when the deadline
//!   passes the requests still in flight are dropped (their connections closed) and the call
//!   fails with [`StorageError::Deadline`].
//! - Retries (backoff with jitter on timeouts, resets, 5xx, 429 and 503 SlowDown) are
//!   object_store's; each attempt is counted by `client.rs`'s connector ([`stats`]).
//! - Errors never carry a URL query, userinfo, response body or credential: object_store's
//!   errors and builders are never formatted (`client.rs` keeps only the status, the S3 error
//!   code and the transport error kind).
//! - A tokio runtime does not survive `fork` (the mount daemon forks after opening the
//!   dataset): [`quiesce`] stops it first, and the next read builds it again; a process that
//!   finds one its parent built (a fork elsewhere) builds its own and leaks the parent's.
//!
//! S3 settings come from the environment as object_store reads it (`AWS_*`: keys, region,
//! `AWS_ENDPOINT_URL`, web identity, container credentials, instance metadata) and from the
//! AWS config and credentials files as the AWS CLI reads them (`aws.rs`: profiles, region,
//! `endpoint_url`, addressing style, static keys).

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::try_join_all;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt,
    RetryConfig,
};
use tokio::sync::Semaphore;

use super::ReadAt;

pub(crate) mod ahead;
mod aws;
mod client;
pub(crate) mod stats;

pub(crate) use client::StorageError;
use client::{CountingConnector, Probe, sanitize};
use stats::Stats;

/// How remote reads behave (the mount's flags; [`configure`] sets them for the process).
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// A read (all the ranges of one call) that has not completed within this fails (`EIO`).
    pub read_timeout: Duration,
    /// Concurrent HTTP requests of the whole process.
    pub max_inflight: usize,
    /// Upper bound of one coalesced request.
    pub max_request: u64,
    /// One attempt (connect, headers and body) must finish within this; then it is retried.
    pub attempt_timeout: Duration,
    /// Connecting must finish within this; then it is retried.
    pub connect_timeout: Duration,
    /// Most retries of one request (the read deadline bounds them too).
    pub max_retries: usize,
    /// Tokio worker threads.
    pub workers: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            read_timeout: Duration::from_secs(60),
            max_inflight: 64,
            max_request: 8 << 20,
            attempt_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            max_retries: 20,
            workers: 2,
        }
    }
}

impl Config {
    fn client_options(&self) -> ClientOptions {
        ClientOptions::new()
            .with_timeout(self.attempt_timeout)
            .with_connect_timeout(self.connect_timeout)
            .with_pool_max_idle_per_host(self.max_inflight)
            .with_pool_idle_timeout(Duration::from_secs(60))
    }

    fn retry(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: self.max_retries,
            retry_timeout: self.read_timeout,
        }
    }
}

/// The process's configuration, runtime and stores.
struct Process {
    config: Config,
    /// The runtime and the stores of the process that built them (see the module docs).
    built: Option<Built>,
}

struct Built {
    pid: u32,
    rt: Arc<tokio::runtime::Runtime>,
    /// By store base (`s3://BUCKET/`, `https://HOST[:PORT]/`).
    stores: HashMap<String, Arc<dyn ObjectStore>>,
    semaphore: Arc<Semaphore>,
}

fn process() -> std::sync::MutexGuard<'static, Process> {
    static PROCESS: OnceLock<Mutex<Process>> = OnceLock::new();
    PROCESS
        .get_or_init(|| {
            Mutex::new(Process {
                config: Config::default(),
                built: None,
            })
        })
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The counters of every remote read of the process (`stats.json`'s `remote`).
pub(crate) fn stats() -> &'static Stats {
    static STATS: OnceLock<Stats> = OnceLock::new();
    STATS.get_or_init(Stats::default)
}

/// Sets how remote reads behave from now on (before the first remote open).
pub(crate) fn configure(config: Config) {
    let mut p = process();
    p.config = config;
}

/// Stops the runtime and its threads (and drops every client) before the process forks: the
/// next remote read, in either process, builds them again. Pinned objects stay valid.
pub(crate) fn quiesce() {
    let built = process().built.take();
    if let Some(built) = built {
        if built.pid != std::process::id() {
            std::mem::forget(built);
            return;
        }
        let Built { rt, stores, .. } = built;
        drop(stores);
        match Arc::try_unwrap(rt) {
            Ok(rt) => rt.shutdown_timeout(Duration::from_secs(5)),
            Err(rt) => std::mem::forget(rt),
        }
    }
}

/// The current configuration.
fn config() -> Config {
    process().config.clone()
}

/// Whether `path` names a remote object or prefix (`s3://`, `http://`, `https://`).
pub(crate) fn is_remote(path: &Path) -> bool {
    path.to_str().is_some_and(|s| {
        s.starts_with("s3://") || s.starts_with("http://") || s.starts_with("https://")
    })
}

/// A remote location: the store's base (`s3://BUCKET/` or `http(s)://HOST[:PORT]/`) and the
/// key inside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Location {
    base: String,
    key: String,
}

impl Location {
    /// Parses an `s3://BUCKET/KEY` or `http(s)://HOST[:PORT]/PATH` URL. URLs with userinfo,
    /// a query or a fragment are refused: their secrets would reach messages and `info.json`.
    pub(crate) fn parse(url: &str) -> std::result::Result<Location, String> {
        let (scheme, rest) = url
            .split_once("://")
            .filter(|(s, _)| matches!(*s, "s3" | "http" | "https"))
            .ok_or_else(|| format!("{}: not an s3:// or http(s):// URL", redact_url(url)))?;
        if rest.contains(['?', '#']) || rest.split('/').next().unwrap_or("").contains('@') {
            return Err(format!(
                "{}: a dataset URL may not carry user information, a query or a fragment \
                 (credentials belong in the environment or the AWS files)",
                redact_url(url)
            ));
        }
        let (host, key) = rest.split_once('/').unwrap_or((rest, ""));
        if host.is_empty() {
            return Err(format!(
                "{url}: no {}",
                if scheme == "s3" { "bucket" } else { "host" }
            ));
        }
        let key = key.trim_matches('/');
        if key.split('/').any(|seg| seg == "." || seg == "..") || key.contains("//") {
            return Err(format!(
                "{url}: '.', '..' and empty path segments are not allowed"
            ));
        }
        if ObjectPath::parse(key).is_err() {
            return Err(format!(
                "{url}: the key has characters an object path may not hold"
            ));
        }
        Ok(Location {
            base: format!("{scheme}://{host}/"),
            key: key.to_string(),
        })
    }

    /// The location of `name` (a relative path with `/`) inside this one.
    pub(crate) fn join(&self, name: &str) -> std::result::Result<Location, String> {
        let joined = if self.key.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.key)
        };
        Location::parse(&format!("{}{joined}", self.base))
    }

    /// The URL (no secrets: [`Location::parse`] refused them).
    pub(crate) fn url(&self) -> String {
        format!("{}{}", self.base, self.key)
    }

    /// The key as the store's path, as it is (validated by [`Location::parse`]: no
    /// re-encoding, so a key read from a listing names the same object).
    fn object_path(&self) -> ObjectPath {
        ObjectPath::parse(&self.key).unwrap_or_else(|_| ObjectPath::from(self.key.as_str()))
    }

    /// As a path (how datasets name their files).
    pub(crate) fn path(&self) -> PathBuf {
        PathBuf::from(self.url())
    }
}

/// Drops userinfo, query and fragment from a URL (for messages about URLs refused).
pub(crate) fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, String::new()));
    let host = host.rsplit_once('@').map(|(_, h)| h).unwrap_or(host);
    format!("{scheme}://{host}{path}")
}

/// Installs ring as rustls's crypto provider (reqwest refuses to build a client without one).
fn init_crypto() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// What a request needs: the runtime, the process's request semaphore and a store.
type Client = (
    Arc<tokio::runtime::Runtime>,
    Arc<Semaphore>,
    Arc<dyn ObjectStore>,
);

/// A coalesced request: the object, the byte range fetched and the buffers it fills.
type Group<'a> = (&'a RemoteObject, Range<u64>, Vec<(u64, &'a mut [u8])>);

/// The runtime, semaphore and store for `base` in this process (built on first use, and again
/// after a fork).
fn store_for(base: &str) -> std::result::Result<Client, StorageError> {
    let mut p = process();
    let pid = std::process::id();
    if p.built.as_ref().is_some_and(|b| b.pid != pid) {
        // Built by the parent before the fork: its threads are gone here. Dropping the
        // runtime would wait for them forever; leak it.
        std::mem::forget(p.built.take());
    }
    let config = p.config.clone();
    if p.built.is_none() {
        init_crypto();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.workers.max(1))
            .thread_name("shufflefs-remote")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| StorageError::Remote {
                name: base.to_string(),
                what: format!("cannot start the I/O runtime: {e}"),
            })?;
        p.built = Some(Built {
            pid,
            rt: Arc::new(rt),
            stores: HashMap::new(),
            semaphore: Arc::new(Semaphore::new(config.max_inflight.max(1))),
        });
    }
    let built = p.built.as_mut().expect("built above");
    if let Some(store) = built.stores.get(base) {
        return Ok((built.rt.clone(), built.semaphore.clone(), store.clone()));
    }
    // reqwest's client registers with the runtime it is built in.
    let store = {
        let _guard = built.rt.enter();
        build_store(base, &config)?
    };
    built.stores.insert(base.to_string(), store.clone());
    Ok((built.rt.clone(), built.semaphore.clone(), store))
}

/// Builds the client of `base`.
fn build_store(
    base: &str,
    config: &Config,
) -> std::result::Result<Arc<dyn ObjectStore>, StorageError> {
    let connector = CountingConnector;
    let fail = |what: String| StorageError::Remote {
        name: base.to_string(),
        what,
    };
    if let Some(bucket) = base.strip_prefix("s3://") {
        let bucket = bucket.trim_end_matches('/');
        let resolved = aws::resolve_from_process().map_err(fail)?;
        // from_env reads AWS_* (keys, region, endpoint, web identity, container and instance
        // credentials); the files fill what it leaves unset. Client options are set first:
        // with_client_options after from_env would drop AWS_ALLOW_HTTP.
        let mut options =
            with_ca_bundle(config.client_options(), resolved.ca_bundle.as_deref()).map_err(fail)?;
        let mut builder = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(config.retry())
            .with_http_connector(connector);
        if let Some(region) = &resolved.region {
            builder = builder.with_region(region);
        }
        if let Some(endpoint) = &resolved.endpoint {
            builder = builder.with_endpoint(endpoint);
            if endpoint.starts_with("http://") {
                options = options.with_allow_http(true);
            }
        }
        if let Some(virtual_hosted) = resolved.virtual_hosted {
            builder = builder.with_virtual_hosted_style_request(virtual_hosted);
        }
        if let Some((id, secret, token)) = &resolved.keys {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
            if let Some(token) = token {
                builder = builder.with_token(token);
            }
        }
        let store = builder
            .with_client_options(options)
            .build()
            .map_err(|e| sanitize(base, &e, None))?;
        return Ok(Arc::new(store));
    }
    let bundle = std::env::var_os("AWS_CA_BUNDLE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let options = with_ca_bundle(config.client_options(), bundle.as_deref())
        .map_err(fail)?
        .with_allow_http(base.starts_with("http://"));
    let store = object_store::http::HttpBuilder::new()
        .with_url(base.trim_end_matches('/'))
        .with_client_options(options)
        .with_retry(config.retry())
        .with_http_connector(connector)
        .build()
        .map_err(|e| sanitize(base, &e, None))?;
    Ok(Arc::new(store))
}

/// `options` trusting, besides the system's authorities, those of the PEM file `bundle`
/// (`AWS_CA_BUNDLE`, or `ca_bundle` in the AWS profile: a store behind a private CA).
fn with_ca_bundle(
    options: ClientOptions,
    bundle: Option<&Path>,
) -> std::result::Result<ClientOptions, String> {
    let Some(path) = bundle else {
        return Ok(options);
    };
    if !path.is_absolute() {
        return Err(format!(
            "the CA bundle {} (AWS_CA_BUNDLE or ca_bundle) must be an absolute path (the mount \
             daemon runs from /)",
            path.display()
        ));
    }
    let pem = std::fs::read(path).map_err(|e| {
        format!(
            "cannot read the CA bundle {} (AWS_CA_BUNDLE or ca_bundle): {e}",
            path.display()
        )
    })?;
    let certs = object_store::Certificate::from_pem_bundle(&pem)
        .ok()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            format!(
                "{} (AWS_CA_BUNDLE or ca_bundle) holds no PEM certificate",
                path.display()
            )
        })?;
    Ok(certs
        .into_iter()
        .fold(options, |o, c| o.with_root_certificate(c)))
}

/// Runs `fut` on the runtime until it completes or `deadline` passes (`None`).
fn run_until<F: std::future::Future>(
    rt: &tokio::runtime::Runtime,
    deadline: Instant,
    fut: F,
) -> Option<F::Output> {
    rt.block_on(async move { tokio::time::timeout_at(deadline.into(), fut).await.ok() })
}

/// `etag` as a strong ETag in its quoted form (some stores list ETags without the quotes
/// their HEAD and GET send); `None` for a weak or missing one, which never matches If-Match.
fn strong_etag(etag: Option<String>) -> Option<String> {
    let t = etag?;
    let t = t.trim();
    if t.is_empty() || t.starts_with("W/") {
        return None;
    }
    Some(format!("\"{}\"", t.trim_matches('"')))
}

/// One object pinned at open (see the module docs).
#[derive(Clone)]
pub(crate) struct RemoteObject {
    location: Location,
    path: ObjectPath,
    size: u64,
    etag: Option<String>,
    version: Option<String>,
    /// Last modification, in nanoseconds since the epoch (0: unknown).
    mtime_ns: u64,
}

impl std::fmt::Debug for RemoteObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteObject")
            .field("url", &self.location.url())
            .field("size", &self.size)
            .finish()
    }
}

impl RemoteObject {
    /// Opens (HEADs) the object at `location` and pins it.
    pub(crate) fn open(location: &Location) -> std::result::Result<RemoteObject, StorageError> {
        RemoteObject::open_many(std::slice::from_ref(location))
            .pop()
            .expect("one location, one result")
    }

    /// Opens every location at once (one round trip for all, not one each).
    pub(crate) fn open_many(
        locations: &[Location],
    ) -> Vec<std::result::Result<RemoteObject, StorageError>> {
        let timeout = config().read_timeout;
        let deadline = Instant::now() + timeout;
        let mut clients = Vec::with_capacity(locations.len());
        for l in locations {
            match store_for(&l.base) {
                Ok(c) => clients.push(c),
                Err(e) => return locations.iter().map(|_| Err(e.clone())).collect(),
            }
        }
        let Some((rt, semaphore, _)) = clients.first().cloned() else {
            return Vec::new();
        };
        let heads = locations.iter().zip(&clients).map(|(l, (_, _, store))| {
            let path = l.object_path();
            let semaphore = semaphore.clone();
            async move {
                let _permit = semaphore.acquire().await;
                stats().requests.fetch_add(1, Relaxed);
                store.head(&path).await
            }
        });
        let Some(metas) = run_until(&rt, deadline, futures::future::join_all(heads)) else {
            stats().deadline_exceeded.fetch_add(1, Relaxed);
            return locations
                .iter()
                .map(|l| {
                    Err(StorageError::Deadline {
                        name: l.url(),
                        after: timeout,
                    })
                })
                .collect();
        };
        locations
            .iter()
            .zip(metas)
            .map(|(l, meta)| {
                let meta = meta.map_err(|e| {
                    stats().errors.fetch_add(1, Relaxed);
                    sanitize(&l.url(), &e, None)
                })?;
                Ok(RemoteObject::pinned(l.clone(), meta))
            })
            .collect()
    }

    /// [`RemoteObject::open_many`] for the locations `listed` does not hold: those it holds
    /// are pinned as the listing saw them (no request).
    pub(crate) fn open_many_listed(
        locations: &[Location],
        listed: &Listing,
    ) -> Vec<std::result::Result<RemoteObject, StorageError>> {
        let known = |l: &Location| {
            (l.base == listed.base)
                .then(|| listed.objects.get(&l.object_path()))
                .flatten()
        };
        let unknown: Vec<Location> = locations
            .iter()
            .filter(|l| known(l).is_none())
            .cloned()
            .collect();
        let mut headed = RemoteObject::open_many(&unknown).into_iter();
        locations
            .iter()
            .map(|l| match known(l) {
                // Named as the manifest names it (the listing's key is the same object).
                Some(object) => Ok(RemoteObject {
                    location: l.clone(),
                    path: l.object_path(),
                    ..object.clone()
                }),
                None => headed.next().expect("one result per unknown location"),
            })
            .collect()
    }

    /// The object at `location` as `meta` (a HEAD's or a listing's) describes it.
    fn pinned(location: Location, meta: ObjectMeta) -> RemoteObject {
        let etag = strong_etag(meta.e_tag);
        RemoteObject {
            path: location.object_path(),
            location,
            size: meta.size,
            etag,
            version: meta.version,
            mtime_ns: meta
                .last_modified
                .timestamp_nanos_opt()
                .map_or(0, |n| n.max(0) as u64),
        }
    }

    /// The object's size when it was opened.
    pub(crate) fn len(&self) -> u64 {
        self.size
    }

    /// Last modification (nanoseconds since the epoch; 0 when the store does not say).
    pub(crate) fn mtime_ns(&self) -> u64 {
        self.mtime_ns
    }

    /// The object's URL.
    pub(crate) fn url(&self) -> String {
        self.location.url()
    }

    /// The strong ETag it was pinned by (quoted), if the store gave one.
    pub(crate) fn etag(&self) -> Option<&str> {
        self.etag.as_deref()
    }

    /// GETs `range` and copies it into `parts` (each `(offset, buf)` inside the range).
    async fn fetch(
        &self,
        store: &dyn ObjectStore,
        semaphore: &Semaphore,
        range: Range<u64>,
        parts: &mut [(u64, &mut [u8])],
    ) -> std::result::Result<(), StorageError> {
        let name = self.url();
        let _permit = semaphore
            .acquire()
            .await
            .map_err(|_| StorageError::Remote {
                name: name.clone(),
                what: "the I/O runtime is shutting down".into(),
            })?;
        let s = stats();
        let inflight = s.inflight.fetch_add(1, Relaxed) + 1;
        s.max_inflight.fetch_max(inflight, Relaxed);
        struct Leave;
        impl Drop for Leave {
            fn drop(&mut self) {
                stats().inflight.fetch_sub(1, Relaxed);
            }
        }
        let _leave = Leave;
        s.requests.fetch_add(1, Relaxed);
        let started = Instant::now();
        let probe = Probe::default();
        let mut options = GetOptions {
            range: Some(GetRange::Bounded(range.clone())),
            if_match: self.etag.clone(),
            version: self.version.clone(),
            ..Default::default()
        };
        options.extensions.insert(probe.clone());
        let response = store
            .get_opts(&self.path, options)
            .await
            .map_err(|e| sanitize(&name, &e, Some(&probe)))?;
        if response.range != range
            || (self.etag.is_some() && strong_etag(response.meta.e_tag.clone()) != self.etag)
        {
            return Err(StorageError::Replaced { name });
        }
        let mut body = response.into_stream();
        let mut pos = range.start;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| sanitize(&name, &e, Some(&probe)))?;
            let end = pos + chunk.len() as u64;
            if end > range.end {
                return Err(StorageError::Remote {
                    name,
                    what: "the response has more bytes than asked".into(),
                });
            }
            for (offset, buf) in parts.iter_mut() {
                let (start, stop) = ((*offset).max(pos), (*offset + buf.len() as u64).min(end));
                if start < stop {
                    buf[(start - *offset) as usize..(stop - *offset) as usize]
                        .copy_from_slice(&chunk[(start - pos) as usize..(stop - pos) as usize]);
                }
            }
            pos = end;
        }
        if pos != range.end {
            return Err(StorageError::Short {
                name,
                want: range.end - range.start,
                got: pos - range.start,
            });
        }
        s.bytes.fetch_add(range.end - range.start, Relaxed);
        s.latency.record(started.elapsed());
        Ok(())
    }
}

impl ReadAt for RemoteObject {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if offset >= self.size {
            return Ok(0);
        }
        let n = buf.len().min((self.size - offset) as usize);
        if let Some(done) = ahead::lookup(self, offset, &mut buf[..n]) {
            return done.map(|()| n);
        }
        read_many(&mut [(self, offset, &mut buf[..n])])?;
        Ok(n)
    }

    fn as_remote(&self) -> Option<&RemoteObject> {
        Some(self)
    }
}

/// The objects under a prefix as one listing saw them: the first [`LIST_PAGE`] keys (one
/// round trip), each pinned by its size and ETag as a HEAD would pin it.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    base: String,
    objects: HashMap<ObjectPath, RemoteObject>,
}

/// The most keys a listing takes: one page of S3's ListObjectsV2.
const LIST_PAGE: usize = 1000;

/// How long a mount waits for its listing after the manifest arrived (at least).
const LIST_GRACE: Duration = Duration::from_secs(1);

/// The whole object at `location` in one request (a manifest: at most `max` bytes, else an
/// error naming it), and on S3 the objects under `prefix` listed in the same round trip: a
/// mount then pins every file its manifest names without one HEAD each. A listing that
/// fails (no `s3:ListBucket` permission, a store that cannot list) is empty: the files are
/// then opened with a HEAD each.
pub(crate) fn read_small_listing(
    location: &Location,
    prefix: Option<&Location>,
    max: u64,
) -> (std::result::Result<Vec<u8>, StorageError>, Listing) {
    let name = location.url();
    let (rt, semaphore, store) = match store_for(&location.base) {
        Ok(c) => c,
        Err(e) => return (Err(e), Listing::default()),
    };
    let timeout = config().read_timeout;
    let path = location.object_path();
    let too_big = |size: u64| StorageError::Remote {
        name: name.clone(),
        what: format!("{size} bytes or more, more than the {max} a manifest may have"),
    };
    let get = async {
        let _permit = semaphore.acquire().await;
        stats().requests.fetch_add(1, Relaxed);
        let probe = Probe::default();
        let mut options = GetOptions::default();
        options.extensions.insert(probe.clone());
        let response = store
            .get_opts(&path, options)
            .await
            .map_err(|e| sanitize(&name, &e, Some(&probe)))?;
        if response.meta.size > max {
            return Err(too_big(response.meta.size));
        }
        let mut bytes = Vec::with_capacity(response.meta.size as usize);
        let mut body = response.into_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| sanitize(&name, &e, Some(&probe)))?;
            if (bytes.len() + chunk.len()) as u64 > max {
                return Err(too_big((bytes.len() + chunk.len()) as u64));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    };
    let prefix_store = prefix
        .filter(|p| p.base.starts_with("s3://"))
        .and_then(|p| store_for(&p.base).ok().map(|c| c.2));
    let list = async {
        let mut listing = Listing::default();
        let Some(prefix) = prefix.filter(|p| p.base.starts_with("s3://")) else {
            return listing;
        };
        let Some(store) = prefix_store else {
            return listing;
        };
        listing.base = prefix.base.clone();
        let _permit = semaphore.acquire().await;
        stats().requests.fetch_add(1, Relaxed);
        let under = prefix.object_path();
        let mut objects = store.list(Some(&under)).take(LIST_PAGE);
        while let Some(meta) = objects.next().await {
            match meta {
                // Only an entry with a strong ETag pins its object; the others get a HEAD
                // (which may also pin a version id).
                Ok(meta) if strong_etag(meta.e_tag.clone()).is_some() => {
                    let location = Location {
                        base: prefix.base.clone(),
                        key: meta.location.to_string(),
                    };
                    listing
                        .objects
                        .insert(meta.location.clone(), RemoteObject::pinned(location, meta));
                }
                Ok(_) => {}
                Err(e) => {
                    log::debug!(
                        "{}",
                        sanitize(&prefix.url(), &e, None).to_string()
                            + " (listing; each file is opened with a HEAD instead)"
                    );
                    listing.objects.clear();
                    break;
                }
            }
        }
        listing
    };
    // The listing only saves HEADs: once the manifest is in, it gets at most as long again
    // (at least LIST_GRACE) before the mount goes on without it.
    let both = async {
        let started = Instant::now();
        match futures::future::select(Box::pin(get), Box::pin(list)).await {
            futures::future::Either::Left((got, list)) => {
                if got.is_err() {
                    return (got, Listing::default());
                }
                let grace = LIST_GRACE.max(started.elapsed());
                let listing = tokio::time::timeout(grace, list).await.unwrap_or_default();
                (got, listing)
            }
            futures::future::Either::Right((listing, get)) => (get.await, listing),
        }
    };
    match run_until(&rt, Instant::now() + timeout, both) {
        Some((Ok(bytes), listing)) => {
            stats().bytes.fetch_add(bytes.len() as u64, Relaxed);
            (Ok(bytes), listing)
        }
        Some((Err(e), listing)) => {
            stats().errors.fetch_add(1, Relaxed);
            (Err(e), listing)
        }
        None => {
            stats().deadline_exceeded.fetch_add(1, Relaxed);
            let e = StorageError::Deadline {
                name,
                after: timeout,
            };
            (Err(e), Listing::default())
        }
    }
}

/// The objects directly under the "directory" `dir` (S3: a listing with delimiter `/`), in
/// key order. HTTP servers cannot list: an error saying to name each file.
pub(crate) fn list_dir(dir: &Location) -> std::result::Result<Vec<Location>, StorageError> {
    let name = dir.url();
    if !dir.base.starts_with("s3://") {
        return Err(StorageError::Remote {
            name,
            what: "an HTTP server cannot list its files: name each file (globs and \
                   directories need s3://)"
                .into(),
        });
    }
    let (rt, semaphore, store) = store_for(&dir.base)?;
    let timeout = config().read_timeout;
    let path = dir.object_path();
    let list = async {
        let _permit = semaphore.acquire().await;
        stats().requests.fetch_add(1, Relaxed);
        let prefix = (!dir.key.is_empty()).then_some(&path);
        store
            .list_with_delimiter(prefix)
            .await
            .map_err(|e| sanitize(&name, &e, None))
    };
    let listed = match run_until(&rt, Instant::now() + timeout, list) {
        Some(Ok(listed)) => listed,
        Some(Err(e)) => {
            stats().errors.fetch_add(1, Relaxed);
            return Err(e);
        }
        None => {
            stats().deadline_exceeded.fetch_add(1, Relaxed);
            return Err(StorageError::Deadline {
                name,
                after: timeout,
            });
        }
    };
    let mut out: Vec<Location> = listed
        .objects
        .into_iter()
        // A console's "folder" marker (`dir/`) is the directory itself, not a file in it.
        .filter(|meta| meta.location.as_ref() != dir.key.as_str())
        .map(|meta| Location {
            base: dir.base.clone(),
            key: meta.location.to_string(),
        })
        .collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

/// Fills `buf` with `object`'s bytes at `offset` in requests of at most `max_request` bytes,
/// all at once (a large sequential read: a scan, a download).
pub(crate) fn read_parallel(
    object: &RemoteObject,
    buf: &mut [u8],
    offset: u64,
) -> std::result::Result<(), StorageError> {
    let part = config().max_request.max(1 << 20) as usize;
    let mut reads: Vec<(&RemoteObject, u64, &mut [u8])> = buf
        .chunks_mut(part)
        .enumerate()
        .map(|(i, chunk)| (object, offset + (i * part) as u64, chunk))
        .collect();
    read_many(&mut reads)
}

/// Copies the whole of `object` into `out` (from its start), 64 MiB at a time
/// ([`read_parallel`]).
pub(crate) fn download(
    object: &RemoteObject,
    out: &mut impl io::Write,
) -> std::result::Result<(), StorageError> {
    const BATCH: u64 = 64 << 20;
    let mut buf = vec![0u8; BATCH.min(object.size) as usize];
    let mut at = 0u64;
    while at < object.size {
        let n = BATCH.min(object.size - at) as usize;
        read_parallel(object, &mut buf[..n], at)?;
        out.write_all(&buf[..n]).map_err(|e| StorageError::Remote {
            name: object.url(),
            what: format!("cannot write a local copy: {e}"),
        })?;
        at += n as u64;
    }
    Ok(())
}

/// Fills every `(object, offset, buf)` with the object's bytes at `offset`, all at once (see
/// the module docs), or fails naming an object; never partly.
pub(crate) fn read_many(
    reads: &mut [(&RemoteObject, u64, &mut [u8])],
) -> std::result::Result<(), StorageError> {
    let config = config();
    let started = Instant::now();
    let deadline = started + config.read_timeout;
    for (object, offset, buf) in reads.iter() {
        let len = buf.len() as u64;
        if offset.checked_add(len).is_none_or(|end| end > object.size) {
            return Err(StorageError::OutOfRange {
                name: object.url(),
                offset: *offset,
                len,
                size: object.size,
            });
        }
    }
    let Some(first) = reads.iter().find(|r| !r.2.is_empty()).map(|r| r.0) else {
        return Ok(());
    };
    let (rt, semaphore, _) = store_for(&first.location.base)?;
    // Group by object, then coalesce adjacent or overlapping ranges of each.
    let mut parts: Vec<(&RemoteObject, u64, &mut [u8])> = reads
        .iter_mut()
        .filter(|r| !r.2.is_empty())
        .map(|(o, off, buf)| (*o, *off, &mut **buf))
        .collect();
    // Same object together (by address), by offset inside it.
    parts.sort_by_key(|a| (std::ptr::from_ref(a.0).addr(), a.1));
    let mut groups: Vec<Group<'_>> = Vec::new();
    for (object, offset, buf) in parts {
        let end = offset + buf.len() as u64;
        if let Some((o, range, members)) = groups.last_mut()
            && std::ptr::eq(*o, object)
            && offset <= range.end
            && range.end.max(end) - range.start <= config.max_request
        {
            range.end = range.end.max(end);
            members.push((offset, buf));
            continue;
        }
        groups.push((object, offset..end, vec![(offset, buf)]));
    }
    let mut stores = Vec::with_capacity(groups.len());
    for (object, _, _) in &groups {
        stores.push(store_for(&object.location.base)?.2);
    }
    let fetches = groups
        .iter_mut()
        .zip(&stores)
        .map(|((object, range, members), store)| {
            object.fetch(store.as_ref(), &semaphore, range.clone(), members)
        });
    let all = try_join_all(fetches);
    let s = stats();
    match run_until(&rt, deadline, all) {
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) => {
            s.errors.fetch_add(1, Relaxed);
            if matches!(e, StorageError::Replaced { .. }) {
                s.replaced.fetch_add(1, Relaxed);
            }
            log::warn!("{e}");
            Err(e)
        }
        None => {
            s.deadline_exceeded.fetch_add(1, Relaxed);
            s.errors.fetch_add(1, Relaxed);
            let e = StorageError::Deadline {
                name: first.url(),
                after: started.elapsed(),
            };
            log::warn!("{e}");
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_join_and_refuse_secrets() {
        let l = Location::parse("s3://bucket/a/b/").unwrap();
        assert_eq!(l.url(), "s3://bucket/a/b");
        assert_eq!(l.join("c.bin").unwrap().url(), "s3://bucket/a/b/c.bin");
        let h = Location::parse("http://127.0.0.1:8080/data").unwrap();
        assert_eq!(h.base, "http://127.0.0.1:8080/");
        assert_eq!(h.join("x/y").unwrap().key, "data/x/y");
        for bad in [
            "https://user:pw@host/ds",
            "https://host/ds?X-Amz-Signature=abc",
            "https://host/ds#frag",
            "s3:///ds",
            "s3://b/a/../c",
            "ftp://host/x",
        ] {
            let e = Location::parse(bad).unwrap_err();
            assert!(!e.contains("pw") && !e.contains("abc"), "{e}");
        }
        assert!(Location::parse("s3://b/ds").unwrap().join("../x").is_err());
        assert_eq!(redact_url("https://u:p@h:1/a/b?tok=1"), "https://h:1/a/b");
    }

    #[test]
    fn etags_pin_in_their_quoted_form() {
        let e = |t: &str| strong_etag(Some(t.to_string()));
        assert_eq!(e("\"abc\"").as_deref(), Some("\"abc\""));
        // NetApp ONTAP lists ETags without quotes; its GETs send them quoted.
        assert_eq!(e("abc").as_deref(), Some("\"abc\""));
        assert_eq!(e("\"d41d-2\""), e("d41d-2"));
        assert_eq!(e("W/\"abc\""), None);
        assert_eq!(e(""), None);
        assert_eq!(strong_etag(None), None);
    }
}
