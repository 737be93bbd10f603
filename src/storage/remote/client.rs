//! The HTTP side of remote reads: errors as shufflefs reports them (sanitized: no URL query,
//! userinfo, response body or credential ever reaches a message), and the connector that
//! counts every attempt (so retries are exact in `stats.json`) and remembers, per request,
//! the last status, S3 error code and transport error kind.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService, ReqwestConnector,
};

use super::stats;

/// Errors, each mapped to EIO by the FUSE side; messages name the object, never credentials
/// or signed URLs.
#[derive(Clone, Debug)]
pub(crate) enum StorageError {
    /// The deadline passed before every range arrived (in-flight requests were cancelled).
    Deadline { name: String, after: Duration },
    /// The object's ETag/version differs from the one pinned at open (412, or a mismatching
    /// ETag/Content-Range in a response).
    Replaced { name: String },
    /// The object is gone (404).
    Missing { name: String },
    /// Access refused (401/403).
    Denied { name: String },
    /// The response had fewer bytes than asked (truncated body that retries could not repair).
    Short { name: String, want: u64, got: u64 },
    /// Anything else after retries: an HTTP status and the store's error code, or a transport
    /// error class.
    Remote { name: String, what: String },
    /// A range outside the pinned object size.
    OutOfRange {
        name: String,
        offset: u64,
        len: u64,
        size: u64,
    },
}

impl StorageError {
    /// The object (its URL) the error is about.
    pub(crate) fn name(&self) -> &str {
        match self {
            StorageError::Deadline { name, .. }
            | StorageError::Replaced { name }
            | StorageError::Missing { name }
            | StorageError::Denied { name }
            | StorageError::Short { name, .. }
            | StorageError::Remote { name, .. }
            | StorageError::OutOfRange { name, .. } => name,
        }
    }
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageError::Deadline { name, after } => {
                write!(f, "{name}: read not complete within {after:?}")
            }
            StorageError::Replaced { name } => write!(
                f,
                "{name} changed since it was opened (ETag/version differs): refusing to mix old and new bytes; remount to serve the new object"
            ),
            StorageError::Missing { name } => write!(f, "{name}: object not found"),
            StorageError::Denied { name } if name.starts_with("http") => write!(
                f,
                "{name}: the server refused it (HTTP 401/403); no credentials are sent over \
                 HTTP(S): a private bucket is read as s3://BUCKET/KEY"
            ),
            StorageError::Denied { name } => write!(
                f,
                "{name}: access denied (check the credentials and the bucket policy)"
            ),
            StorageError::Short { name, want, got } => {
                write!(f, "{name}: response had {got} of {want} bytes")
            }
            StorageError::Remote { name, what } => write!(f, "{name}: {what}"),
            StorageError::OutOfRange {
                name,
                offset,
                len,
                size,
            } => {
                write!(
                    f,
                    "{name}: range {offset}+{len} is beyond the object's {size} bytes"
                )
            }
        }
    }
}

impl std::error::Error for StorageError {}

impl From<StorageError> for io::Error {
    fn from(e: StorageError) -> io::Error {
        io::Error::other(e) // raw errno EIO at the FUSE boundary
    }
}

/// What one logical request saw, filled by [`CountingService`] through the request's
/// extensions (object_store copies `GetOptions::extensions` into every attempt): attempts, the
/// last HTTP status, the S3 error code of the last error body, the last transport error kind.
#[derive(Clone, Default, Debug)]
pub(super) struct Probe(Arc<std::sync::Mutex<ProbeState>>);

#[derive(Default, Debug, Clone)]
pub(super) struct ProbeState {
    pub attempts: u32,
    pub last_status: Option<u16>,
    pub last_code: Option<String>,
    pub last_transport: Option<String>,
}

impl Probe {
    pub(crate) fn get(&self) -> ProbeState {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Maps an object_store error to a sanitized error. The Display of object_store errors carries
/// the request URL and the response body; neither is used. What is kept: the error variant, the
/// HTTP status and S3 error code of the last attempt (from the probe), the transport error kind.
pub(super) fn sanitize(name: &str, e: &object_store::Error, probe: Option<&Probe>) -> StorageError {
    use object_store::Error as E;
    let name = name.to_string();
    match e {
        E::Precondition { .. } | E::NotModified { .. } => StorageError::Replaced { name },
        E::NotFound { .. } => StorageError::Missing { name },
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => StorageError::Denied { name },
        other => {
            // Causes' text, to classify (never echoed: it may hold a URL).
            let mut chain = String::new();
            let mut src: Option<&(dyn std::error::Error + 'static)> = Some(other);
            while let Some(s) = src {
                chain.push_str(&s.to_string());
                chain.push('\n');
                src = s.source();
            }
            let has = |t: &str| chain.contains(t);
            if has("AccessDenied")
                || has("InvalidAccessKeyId")
                || has("SignatureDoesNotMatch")
                || has("403 Forbidden")
            {
                return StorageError::Denied { name };
            }
            // The last resort of the credential chain is the instance metadata service: when
            // it fails, nothing earlier gave credentials.
            if chain.to_ascii_lowercase().contains("credential")
                || has("/latest/api/token")
                || has("/latest/meta-data")
            {
                return StorageError::Remote {
                    name,
                    what: "no credentials found: none in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, \
                           AWS_PROFILE or the AWS files, no web identity or container \
                           credentials, and no instance metadata service answered"
                        .into(),
                };
            }
            let st = probe.map(|p| p.get()).unwrap_or_default();
            let mut what = match (st.last_status, &st.last_code, &st.last_transport) {
                (Some(s), Some(code), _) if s >= 400 => format!("HTTP {s} {code}"),
                (Some(s), None, _) if s >= 400 => format!("HTTP {s}"),
                (_, _, Some(kind)) => format!("transport error ({kind})"),
                _ => "request failed".to_string(),
            };
            let mut src: Option<&(dyn std::error::Error + 'static)> = Some(other);
            while let Some(s) = src {
                if let Some(h) = s.downcast_ref::<HttpError>() {
                    what = format!("transport error ({:?})", h.kind());
                    break;
                }
                src = s.source();
            }
            // The certificate's verdict, from the probe or (HEADs and listings carry none)
            // from the error's causes.
            let mut untrusted = st
                .last_transport
                .clone()
                .filter(|t| t.starts_with(UNTRUSTED));
            let mut src: Option<&(dyn std::error::Error + 'static)> = Some(other);
            while let (None, Some(s)) = (&untrusted, src) {
                let text = s.to_string();
                if let Some(at) = text.find(UNTRUSTED) {
                    // The verdict's one word, nothing that follows it.
                    let verdict = text[at + UNTRUSTED.len()..]
                        .trim_start_matches([':', ' '])
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .next()
                        .unwrap_or("");
                    untrusted = Some(format!("{UNTRUSTED}: {verdict}"));
                }
                src = s.source();
            }
            if let Some(t) = untrusted {
                what = format!("{t}: {}", certificate_advice(&t));
            }
            // Listings carry no probe: their S3 error code is in the causes' text.
            if what == "request failed" && has("NoSuchBucket") {
                what = "no such bucket".into();
            }
            if what == "request failed" {
                let msg = other.to_string();
                if msg.contains("Requested")
                    || msg.contains("non-partial")
                    || msg.contains("Content-Range")
                {
                    what = "unexpected Content-Range (object changed, or a proxy ignored Range)"
                        .into();
                }
            }
            if st.attempts > 1 {
                what.push_str(&format!(" after {} attempts", st.attempts));
            }
            StorageError::Remote { name, what }
        }
    }
}

/// `<Code>SlowDown</Code>` -> "SlowDown" (alphanumeric only: nothing else of the body escapes).
fn s3_code(body: &str) -> Option<String> {
    let start = body.find("<Code>")? + 6;
    let end = start + body[start..].find("</Code>")?;
    let code = &body[start..end];
    (code.len() <= 64 && code.chars().all(|c| c.is_ascii_alphanumeric() || c == '.'))
        .then(|| code.to_string())
}

/// Counts every HTTP attempt (so retries are exact) and its status and latency to headers.
#[derive(Debug)]
pub(super) struct CountingConnector;

/// How a transport error that is a TLS certificate the client does not trust starts.
const UNTRUSTED: &str = "TLS certificate not trusted";

/// The TLS verification failure in `e`'s chain of causes, if it is one (rustls's words, which
/// carry no secret).
fn untrusted_certificate(e: &HttpError) -> Option<String> {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(rustls::Error::InvalidCertificate(why)) = s.downcast_ref::<rustls::Error>() {
            return Some(format!("{why:?}"));
        }
        // An io::Error's source() skips the error it wraps: step into it.
        src = match s.downcast_ref::<io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => s.source(),
        };
    }
    None
}

/// What to do about the certificate verdict `t` (rustls's `CertificateError` name).
fn certificate_advice(t: &str) -> &'static str {
    if t.contains("NotValidForName") {
        "the certificate does not name this host (a bucket whose name has dots needs \
         path-style addressing: s3 = addressing_style = path in the AWS profile)"
    } else if t.contains("Expired") || t.contains("NotValidYet") {
        "the certificate is outside its validity period (check the server's certificate and \
         this node's clock)"
    } else if t.contains("UnknownIssuer") || t.contains("BadSignature") {
        "a store behind a private certificate authority needs that authority's PEM bundle in \
         AWS_CA_BUNDLE (for S3 also ca_bundle in the AWS profile)"
    } else {
        "check the server's certificate"
    }
}

#[derive(Debug)]
struct CountingService {
    inner: HttpClient,
}

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(CountingService { inner }))
    }
}

#[async_trait]
impl HttpService for CountingService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        stats().attempts.fetch_add(1, Relaxed);
        let probe = req.extensions().get::<Probe>().cloned();
        if let Some(p) = &probe {
            p.0.lock().unwrap_or_else(|p| p.into_inner()).attempts += 1;
        }
        let t0 = Instant::now();
        let r = self.inner.execute(req).await;
        stats().attempt_latency.record(t0.elapsed());
        match r {
            Ok(mut resp) => {
                let status = resp.status().as_u16();
                if status == 503 {
                    stats().status_503.fetch_add(1, Relaxed);
                }
                if status >= 500 {
                    stats().status_5xx.fetch_add(1, Relaxed);
                }
                let mut code = None;
                if status >= 400 {
                    // Error bodies are small XML; read it to keep only the <Code>, then hand
                    // object_store an identical body.
                    let body = std::mem::replace(
                        resp.body_mut(),
                        HttpResponseBody::from(bytes::Bytes::new()),
                    );
                    let b = body.bytes().await.unwrap_or_default();
                    code = s3_code(&String::from_utf8_lossy(&b));
                    *resp.body_mut() = b.into();
                }
                if let Some(p) = &probe {
                    let mut st = p.0.lock().unwrap_or_else(|p| p.into_inner());
                    st.last_status = Some(status);
                    st.last_code = code;
                }
                Ok(resp)
            }
            Err(e) => {
                stats().transport_errors.fetch_add(1, Relaxed);
                // An untrusted certificate stays untrusted: not retried (Unknown is final).
                let untrusted = untrusted_certificate(&e);
                if let Some(p) = &probe {
                    p.0.lock().unwrap_or_else(|p| p.into_inner()).last_transport =
                        Some(match &untrusted {
                            Some(why) => format!("{UNTRUSTED}: {why}"),
                            None => format!("{:?}", e.kind()),
                        });
                }
                match untrusted {
                    Some(why) => Err(HttpError::new(
                        HttpErrorKind::Unknown,
                        io::Error::other(format!("{UNTRUSTED}: {why}")),
                    )),
                    None => Err(e),
                }
            }
        }
    }
}
