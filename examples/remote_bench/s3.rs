//! A minimal S3 server for benchmarks, std threads on 127.0.0.1: path-style `GET`/`HEAD
//! /BUCKET/KEY` with `Range` (one range), `ETag` and `If-Match`, and `GET
//! /BUCKET?list-type=2&prefix=P` (ListObjectsV2 of the files, one page). KEY is a file under `dir`, or a
//! virtual object `VIRTUAL_PREFIX*` of `virtual_size` bytes whose byte `i` is
//! [`virtual_byte`]`(i)` (a dataset of any size without disk). Any signature is accepted.
//! Unlike moto, a range costs its length, not the object's.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;

/// Keys of virtual objects start with this.
pub const VIRTUAL_PREFIX: &str = "virtual/";

/// Byte `i` of every virtual object.
pub fn virtual_byte(i: u64) -> u8 {
    let mut z = (i >> 3).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> ((i & 7) * 8)) as u8
}

/// The server's address (it runs until the process exits).
pub fn start(dir: PathBuf, virtual_size: u64) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let _ = serve(conn, &dir, virtual_size);
            });
        }
    });
    addr
}

fn head_lines(r: &mut impl BufRead) -> io::Result<Option<Vec<String>>> {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let line = line.trim_end().to_string();
        if line.is_empty() {
            if lines.is_empty() {
                continue;
            }
            return Ok(Some(lines));
        }
        lines.push(line);
    }
}

fn header<'a>(lines: &'a [String], name: &str) -> Option<&'a str> {
    lines[1..].iter().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

/// `bytes=a-b`, `bytes=a-`, `bytes=-n` against `size`.
fn parse_range(v: &str, size: u64) -> Option<std::ops::Range<u64>> {
    let (a, b) = v.trim().strip_prefix("bytes=")?.split_once('-')?;
    let (s, e) = match (a.trim(), b.trim()) {
        ("", n) => (size.saturating_sub(n.parse().ok()?), size),
        (a, "") => (a.parse().ok()?, size),
        (a, b) => (
            a.parse().ok()?,
            b.parse::<u64>().ok()?.saturating_add(1).min(size),
        ),
    };
    (s < e).then_some(s..e)
}

fn serve(conn: TcpStream, dir: &std::path::Path, virtual_size: u64) -> io::Result<()> {
    conn.set_nodelay(true)?;
    let mut r = BufReader::new(conn.try_clone()?);
    let mut w = io::BufWriter::with_capacity(256 << 10, conn);
    while let Some(lines) = head_lines(&mut r)? {
        if let Some(n) = header(&lines, "content-length").and_then(|v| v.parse().ok()) {
            io::copy(&mut (&mut r).take(n), &mut io::sink())?;
        }
        let mut first = lines[0].split(' ');
        let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
        let path = target
            .split('?')
            .next()
            .unwrap_or("")
            .trim_start_matches('/');
        let key = path.split_once('/').map_or("", |(_, k)| k);
        if let Some(prefix) = list_prefix(target).filter(|_| method == "GET" && key.is_empty()) {
            let body = list(dir, &prefix);
            write!(
                w,
                "HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )?;
            w.flush()?;
            continue;
        }
        // A file under `dir` (a manifest) first, else a virtual object.
        let file = (!key.contains(".."))
            .then(|| std::fs::File::open(dir.join(key)).ok())
            .flatten()
            .filter(|f| f.metadata().is_ok_and(|m| m.is_file()));
        let (size, etag) = match &file {
            Some(f) => (f.metadata()?.len(), "\"f\""),
            None if key.starts_with(VIRTUAL_PREFIX) => (virtual_size, "\"v\""),
            None => {
                let b = "<Error><Code>NoSuchKey</Code></Error>";
                write!(
                    w,
                    "HTTP/1.1 404 Not Found\r\nContent-Length: {}\r\n\r\n{b}",
                    b.len()
                )?;
                w.flush()?;
                continue;
            }
        };
        if header(&lines, "if-match").is_some_and(|m| m != etag && m != "*") {
            write!(
                w,
                "HTTP/1.1 412 Precondition Failed\r\nContent-Length: 0\r\n\r\n"
            )?;
            w.flush()?;
            continue;
        }
        let range = header(&lines, "range").and_then(|v| parse_range(v, size));
        let rng = range.clone().unwrap_or(0..size);
        let status = if range.is_some() {
            "206 Partial Content"
        } else {
            "200 OK"
        };
        write!(
            w,
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nETag: {etag}\r\n\
             Last-Modified: Thu, 01 Jan 2026 00:00:00 GMT\r\nAccept-Ranges: bytes\r\n",
            rng.end - rng.start
        )?;
        if range.is_some() {
            write!(
                w,
                "Content-Range: bytes {}-{}/{size}\r\n",
                rng.start,
                rng.end - 1
            )?;
        }
        write!(w, "\r\n")?;
        if method != "HEAD" {
            let mut buf = vec![0u8; 64 << 10];
            let mut pos = rng.start;
            while pos < rng.end {
                let n = ((rng.end - pos) as usize).min(buf.len());
                match &file {
                    Some(f) => std::os::unix::fs::FileExt::read_exact_at(f, &mut buf[..n], pos)?,
                    None => {
                        for (k, b) in buf[..n].iter_mut().enumerate() {
                            *b = virtual_byte(pos + k as u64);
                        }
                    }
                }
                w.write_all(&buf[..n])?;
                pos += n as u64;
            }
        }
        w.flush()?;
    }
    Ok(())
}

/// The `prefix` of a ListObjectsV2 request target (`/BUCKET?list-type=2&prefix=...`).
fn list_prefix(target: &str) -> Option<String> {
    let query = target.split_once('?')?.1;
    let mut list = false;
    let mut prefix = String::new();
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "list-type" => list = v == "2",
            "prefix" => prefix = percent_decode(v),
            _ => {}
        }
    }
    list.then_some(prefix)
}

fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(c) => {
                        out.push(c);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A ListObjectsV2 result: every file under `dir` whose key starts with `prefix`.
fn list(dir: &std::path::Path, prefix: &str) -> String {
    let mut keys = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let (Ok(rel), Ok(m)) = (p.strip_prefix(dir), e.metadata()) {
                let key = rel.to_string_lossy().into_owned();
                if key.starts_with(prefix) {
                    keys.push((key, m.len()));
                }
            }
        }
    }
    keys.sort();
    let mut xml = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult \
         xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>",
    );
    xml += &format!(
        "<Prefix>{prefix}</Prefix><KeyCount>{}</KeyCount><MaxKeys>1000</MaxKeys>\
         <IsTruncated>false</IsTruncated>",
        keys.len()
    );
    for (key, size) in keys {
        xml += &format!(
            "<Contents><Key>{key}</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>\
             <ETag>&quot;f&quot;</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass>\
             </Contents>"
        );
    }
    xml + "</ListBucketResult>"
}
