//! Loopback servers for the remote-storage tests: nginx serving a directory (HTTP Range, ETag,
//! If-Match), moto's S3 server, and [`servers`]'s fault proxy. Each is a child process or
//! thread of the test, on a port the kernel chose, stopped when dropped; nothing listens
//! beyond 127.0.0.1. `scripts/test.sh` installs nginx and moto (`SHUFFLEFS_NGINX`,
//! `SHUFFLEFS_MOTO_PY`) and sets `SHUFFLEFS_REQUIRE_REMOTE=1`, so in CI a missing server fails
//! the test instead of skipping it.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Whether the remote servers must be there (CI), else tests without them skip.
fn required() -> bool {
    std::env::var_os("SHUFFLEFS_REQUIRE_REMOTE").is_some_and(|v| v == "1")
}

/// Skips (`None`, with a message) or fails when `what` is missing.
fn missing<T>(what: &str) -> Option<T> {
    assert!(
        !required(),
        "SHUFFLEFS_REQUIRE_REMOTE=1 but {what} is not available"
    );
    eprintln!("skipped: {what} is not available");
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `port` accepts connections (at most `limit`).
fn wait_port(port: u16, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A child process killed when dropped.
struct Server {
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nginx serving a directory on 127.0.0.1.
pub struct Nginx {
    _server: Server,
    _dir: TempDir,
    pub addr: SocketAddr,
    /// Over TLS: the PEM file of the private authority that signed its certificate.
    pub ca: Option<PathBuf>,
}

/// Runs openssl with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A private certificate authority (`ca.pem`) and a certificate for 127.0.0.1 it signed
/// (`server.pem`, `server.key`), in `dir`.
fn private_ca(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=shufflefs test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    ]);
    openssl(dir, &ca);
    let mut req = vec!["req"];
    req.extend(ec);
    req.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    openssl(dir, &req);
    std::fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext",
        ],
    );
}

impl Nginx {
    /// Serves `root` (`None` when nginx is not installed and not required).
    pub fn start(root: &Path) -> Option<Nginx> {
        Nginx::start_with(root, false)
    }

    /// Serves `root` over HTTPS with a certificate from a private authority ([`Nginx::ca`]).
    pub fn start_tls(root: &Path) -> Option<Nginx> {
        Nginx::start_with(root, true)
    }

    fn start_with(root: &Path, tls: bool) -> Option<Nginx> {
        let bin = std::env::var_os("SHUFFLEFS_NGINX")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/sbin/nginx"));
        if !bin.exists() {
            return missing("nginx");
        }
        let dir = tempfile::tempdir().unwrap();
        let (ssl, ca) = if tls {
            private_ca(dir.path());
            let d = dir.path().display();
            (
                format!(
                    " ssl;\n    ssl_certificate {d}/server.pem;\n    ssl_certificate_key {d}/server.key"
                ),
                Some(dir.path().join("ca.pem")),
            )
        } else {
            (String::new(), None)
        };
        for _ in 0..3 {
            let port = free_port();
            let user = if nix::unistd::geteuid().is_root() {
                "user root root;"
            } else {
                ""
            };
            let d = dir.path().display();
            let conf = format!(
                "{user}\nworker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\n\
                 error_log {d}/error.log warn;\nevents {{ worker_connections 256; }}\n\
                 http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n\
                 proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n\
                 uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  sendfile on;\n\
                 keepalive_requests 100000;\n  default_type application/octet-stream;\n\
                 server {{\n    listen 127.0.0.1:{port}{ssl};\n    root {};\n    location / {{ }}\n  }}\n}}\n",
                root.display()
            );
            std::fs::write(dir.path().join("nginx.conf"), conf).unwrap();
            let child = Command::new(&bin)
                .arg("-p")
                .arg(dir.path())
                .arg("-c")
                .arg(dir.path().join("nginx.conf"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut server = Server { child };
            if wait_port(port, Duration::from_secs(10))
                && server.child.try_wait().unwrap().is_none()
            {
                return Some(Nginx {
                    _server: server,
                    _dir: dir,
                    addr: SocketAddr::from(([127, 0, 0, 1], port)),
                    ca,
                });
            }
            let _ = server.child.kill();
        }
        panic!("nginx did not start ({})", dir.path().display());
    }

    /// `http://127.0.0.1:PORT` (`https://` over TLS).
    pub fn url(&self) -> String {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }
}

/// moto's S3 server on 127.0.0.1 (any credentials accepted).
pub struct Moto {
    _server: Server,
    pub addr: SocketAddr,
    python: String,
}

impl Moto {
    /// Starts it (`None` when moto is not installed and not required).
    pub fn start() -> Option<Moto> {
        let python = std::env::var("SHUFFLEFS_MOTO_PY").unwrap_or_else(|_| "python3".to_string());
        let has = Command::new(&python)
            .args(["-c", "import moto.server, flask, flask_cors, boto3"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !has {
            return missing("moto (python3 -m moto.server)");
        }
        for _ in 0..3 {
            let port = free_port();
            let child = Command::new(&python)
                .args([
                    "-m",
                    "moto.server",
                    "-H",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut server = Server { child };
            if wait_port(port, Duration::from_secs(60))
                && server.child.try_wait().unwrap().is_none()
            {
                return Some(Moto {
                    _server: server,
                    addr: SocketAddr::from(([127, 0, 0, 1], port)),
                    python,
                });
            }
            let _ = server.child.kill();
        }
        panic!("moto did not start");
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Creates `bucket` (if needed) and uploads `dir`'s files under `prefix`, with boto3
    /// (`scripts/s3_upload.py`).
    pub fn upload(&self, bucket: &str, dir: &Path, prefix: &str) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/s3_upload.py");
        let o = Command::new(&self.python)
            .arg(script)
            .arg(self.url())
            .arg(bucket)
            .arg(dir)
            .arg(prefix)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "upload: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// The environment of a shufflefs process that reads this server: fake keys, the
    /// endpoint, and an instance-metadata endpoint that refuses (a missing key never reaches
    /// for 169.254.169.254).
    pub fn env(&self, endpoint: &str) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_METADATA_ENDPOINT", "http://127.0.0.1:9"),
            ("AWS_CONFIG_FILE", "/nonexistent"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}
