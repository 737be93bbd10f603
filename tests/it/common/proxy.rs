//! A fault-injecting HTTP/1.1 proxy on 127.0.0.1 for the remote-storage tests, std threads
//! only. Each client connection gets its own upstream connection (keep-alive passed through);
//! each request first waits the plan's latency, then takes the next queued fault, if any:
//! `Reset` (RST, no answer), `SlowDown` (503 with S3's SlowDown body, connection kept),
//! `Status500`, `Truncate` (the upstream's headers with the full Content-Length, half the
//! body, then close), `Stall` (no answer until the proxy is dropped or 30 s pass), or `Echo403`
//! (403 whose body echoes the request's headers, as AWS's SignatureDoesNotMatch echoes the
//! canonical request, session token included). It counts requests, faults and the most
//! requests in flight at once.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the proxy does to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Reset,
    SlowDown,
    Status500,
    Truncate,
    Stall,
    Echo403,
}

/// The faults to come.
#[derive(Default, Debug)]
pub struct Plan {
    pub latency: Duration,
    pub queue: VecDeque<Fault>,
    /// This fault for every request once the queue is empty.
    pub always: Option<Fault>,
    /// Faults hit only requests with a Range header (the HEADs of an open pass).
    pub only_ranged: bool,
}

/// The proxy's counters.
#[derive(Default, Debug)]
pub struct Counters {
    pub requests: AtomicU64,
    pub faults: AtomicU64,
    pub in_flight: AtomicU64,
    pub max_in_flight: AtomicU64,
}

/// The proxy (stopped when dropped).
pub struct FaultProxy {
    pub addr: SocketAddr,
    pub plan: Arc<Mutex<Plan>>,
    pub counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    /// Forwards 127.0.0.1:(a free port) to `upstream`.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let plan = Arc::new(Mutex::new(Plan::default()));
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (p, c, s) = (plan.clone(), counters.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (p, c, s) = (p.clone(), c.clone(), s.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, upstream, &p, &c, &s);
                });
            }
        });
        FaultProxy {
            addr,
            plan,
            counters,
            stop,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sets the latency and queues `faults` (in order), after clearing the plan.
    pub fn set(&self, latency: Duration, faults: &[Fault], only_ranged: bool) {
        let mut p = self.plan.lock().unwrap();
        *p = Plan {
            latency,
            queue: faults.iter().copied().collect(),
            always: None,
            only_ranged,
        };
    }

    /// Every request from now on gets `fault` (`None`: none).
    pub fn always(&self, fault: Option<Fault>) {
        self.plan.lock().unwrap().always = fault;
    }

    pub fn faults(&self) -> u64 {
        self.counters.faults.load(Relaxed)
    }

    pub fn max_in_flight(&self) -> u64 {
        self.counters.max_in_flight.load(Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// A request or response head.
struct Head {
    first: String,
    headers: Vec<(String, String)>,
    raw: Vec<u8>,
}

impl Head {
    fn get(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn content_length(&self) -> Option<u64> {
        self.get("content-length")
            .and_then(|v| v.trim().parse().ok())
    }
}

/// Reads a head; `None` at a clean EOF.
fn read_head(r: &mut impl BufRead) -> io::Result<Option<Head>> {
    let mut raw = Vec::new();
    let mut lines = Vec::new();
    loop {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line)? == 0 {
            return if raw.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        raw.extend_from_slice(&line);
        let text = String::from_utf8_lossy(&line).trim_end().to_string();
        if text.is_empty() {
            if lines.is_empty() {
                continue;
            }
            break;
        }
        lines.push(text);
    }
    let first = lines.remove(0);
    let headers = lines
        .into_iter()
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    Ok(Some(Head {
        first,
        headers,
        raw,
    }))
}

/// Closes `conn` with a reset (SO_LINGER 0).
fn reset(conn: &TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket descriptor and a linger struct of the size passed.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::from_ref(&linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Counts a request in flight until dropped.
struct InFlight<'a>(&'a Counters);

impl<'a> InFlight<'a> {
    fn new(c: &'a Counters) -> Self {
        let n = c.in_flight.fetch_add(1, Relaxed) + 1;
        c.max_in_flight.fetch_max(n, Relaxed);
        InFlight(c)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Relaxed);
    }
}

fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    plan: &Mutex<Plan>,
    counters: &Counters,
    stop: &AtomicBool,
) -> io::Result<()> {
    client.set_nodelay(true)?;
    let mut cr = BufReader::new(client.try_clone()?);
    let mut cw = client.try_clone()?;
    let mut up: Option<(BufReader<TcpStream>, TcpStream)> = None;
    while let Some(req) = read_head(&mut cr)? {
        let mut body = Vec::new();
        if let Some(n) = req.content_length() {
            (&mut cr).take(n).read_to_end(&mut body)?;
        }
        counters.requests.fetch_add(1, Relaxed);
        let _in_flight = InFlight::new(counters);
        let (latency, fault) = {
            let mut p = plan.lock().unwrap();
            let eligible = !p.only_ranged || req.get("range").is_some();
            let fault = if eligible {
                p.queue.pop_front().or(p.always)
            } else {
                None
            };
            (p.latency, fault)
        };
        std::thread::sleep(latency);
        if fault.is_some() {
            counters.faults.fetch_add(1, Relaxed);
        }
        match fault {
            Some(Fault::Reset) => {
                reset(&client);
                return Ok(());
            }
            Some(Fault::SlowDown | Fault::Status500) => {
                let (code, text, code_name) = if fault == Some(Fault::SlowDown) {
                    (503, "Slow Down", "SlowDown")
                } else {
                    (500, "Internal Server Error", "InternalError")
                };
                let body = format!("<Error><Code>{code_name}</Code><Message>x</Message></Error>");
                write!(
                    cw,
                    "HTTP/1.1 {code} {text}\r\nContent-Type: application/xml\r\n\
                     Content-Length: {}\r\n\r\n{body}",
                    body.len()
                )?;
                continue;
            }
            Some(Fault::Echo403) => {
                let headers: String = req
                    .headers
                    .iter()
                    .map(|(k, v)| format!("{k}:{v}\n"))
                    .collect();
                let body = format!(
                    "<Error><Code>SignatureDoesNotMatch</Code><CanonicalRequest>{}\n{headers}\
                     </CanonicalRequest></Error>",
                    req.first
                );
                write!(
                    cw,
                    "HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n\
                     Content-Length: {}\r\n\r\n{body}",
                    body.len()
                )?;
                continue;
            }
            Some(Fault::Stall) => {
                let until = Instant::now() + Duration::from_secs(30);
                while Instant::now() < until && !stop.load(Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = client.shutdown(Shutdown::Both);
                return Ok(());
            }
            Some(Fault::Truncate) | None => {}
        }
        if up.is_none() {
            let s = TcpStream::connect(upstream)?;
            s.set_nodelay(true)?;
            up = Some((BufReader::new(s.try_clone()?), s));
        }
        let (ur, uw) = up.as_mut().unwrap();
        uw.write_all(&req.raw)?;
        uw.write_all(&body)?;
        let Some(resp) = read_head(ur)? else {
            return Ok(());
        };
        cw.write_all(&resp.raw)?;
        let status: u16 = resp
            .first
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let no_body = req.first.starts_with("HEAD ") || status == 204 || status == 304;
        if no_body {
            continue;
        }
        let Some(n) = resp.content_length() else {
            // Chunked or close-delimited: relay to the end and close (tests' servers send
            // Content-Length for objects).
            io::copy(ur, &mut cw)?;
            return Ok(());
        };
        if fault == Some(Fault::Truncate) {
            io::copy(&mut ur.take(n / 2), &mut cw)?;
            cw.flush()?;
            let _ = client.shutdown(Shutdown::Both);
            return Ok(());
        }
        io::copy(&mut ur.take(n), &mut cw)?;
    }
    Ok(())
}
