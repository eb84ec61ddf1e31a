//! A small static file server for `cargo xtask web`: std only, GET and HEAD, one thread per
//! connection, files streamed from disk. It sends the headers a WebGPU page wants (the right
//! MIME types, `application/wasm` above all, no caching, cross-origin isolation) and nothing
//! outside its root.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bind 127.0.0.1:`port`; when that port is taken, any free port.
pub fn bind(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind(("127.0.0.1", port)).or_else(|e| {
        eprintln!("xtask: port {port} is not free ({e}); picking another");
        TcpListener::bind(("127.0.0.1", 0))
    })
}

/// Serve `root` on `listener` until the process ends.
pub fn serve(listener: TcpListener, root: PathBuf) -> ! {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                let root = root.clone();
                std::thread::spawn(move || {
                    let _ = handle(stream, &root);
                });
            }
            Err(e) => eprintln!("xtask: accept failed: {e}"),
        }
    }
}

/// The Content-Type for a file name, by its extension.
pub fn mime_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "wasm" => "application/wasm",
        "css" => "text/css; charset=utf-8",
        "json" | "map" => "application/json",
        "txt" | "md" => "text/plain; charset=utf-8",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        "ico" => "image/x-icon",
        "jpg" | "jpeg" => "image/jpeg",
        "webp" => "image/webp",
        "woff2" => "font/woff2",
        _ => "application/octet-stream", // gguf, bin, safetensors and the rest
    }
}

/// The file under `root` that the request target names, or None when it leaves the root or is
/// not a plain relative path: the query and fragment are dropped, %XX is decoded, `..`,
/// backslashes, NUL and drive-like segments are refused. `/` and directories mean their
/// index.html.
pub fn resolve(root: &Path, target: &str) -> Option<PathBuf> {
    let path = target.split(['?', '#']).next().unwrap_or("");
    if !path.starts_with('/') {
        return None;
    }
    let decoded = percent_decode(path)?;
    let mut out = root.to_path_buf();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => continue,
            ".." => return None,
            s if s.contains(['\\', '\0', ':']) => return None,
            s => out.push(s),
        }
    }
    if decoded.ends_with('/') || out.is_dir() {
        out.push("index.html");
    }
    Some(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn handle(stream: TcpStream, root: &Path) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut stream = stream;
    // Keep-alive: answer requests on this connection until the client closes it.
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line)? == 0 {
            return Ok(());
        }
        let mut header = String::new();
        let mut close = false;
        loop {
            header.clear();
            if reader.read_line(&mut header)? == 0 {
                return Ok(());
            }
            let line = header.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("connection")
                && value.trim().eq_ignore_ascii_case("close")
            {
                close = true;
            }
        }
        let mut parts = request_line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let head = method == "HEAD";
        let status = if method != "GET" && !head {
            respond_text(&mut stream, "405 Method Not Allowed", "only GET and HEAD\n", head)?;
            "405"
        } else {
            match resolve(root, target).and_then(|p| std::fs::File::open(&p).ok().map(|f| (p, f))) {
                Some((path, file)) if file.metadata().is_ok_and(|m| m.is_file()) => {
                    let len = file.metadata()?.len();
                    write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {len}\r\n",
                        mime_type(&path.to_string_lossy())
                    )?;
                    common_headers(&mut stream)?;
                    if !head {
                        std::io::copy(&mut file.take(len), &mut stream)?;
                    }
                    "200"
                }
                _ => {
                    respond_text(&mut stream, "404 Not Found", "not found\n", head)?;
                    "404"
                }
            }
        };
        stream.flush()?;
        if status != "200" {
            eprintln!("xtask: {method} {target} -> {status}");
        }
        if close {
            return Ok(());
        }
    }
}

fn common_headers(stream: &mut TcpStream) -> std::io::Result<()> {
    write!(
        stream,
        "Cache-Control: no-cache\r\n\
         Cross-Origin-Opener-Policy: same-origin\r\n\
         Cross-Origin-Embedder-Policy: require-corp\r\n\
         X-Content-Type-Options: nosniff\r\n\r\n"
    )
}

fn respond_text(stream: &mut TcpStream, status: &str, body: &str, head: bool) -> std::io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n",
        body.len()
    )?;
    common_headers(stream)?;
    if !head {
        stream.write_all(body.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mime_types_by_extension() {
        assert_eq!(mime_type("index.html"), "text/html; charset=utf-8");
        assert_eq!(mime_type("pkg/weft_web.js"), "text/javascript; charset=utf-8");
        assert_eq!(mime_type("a/b.MJS"), "text/javascript; charset=utf-8");
        assert_eq!(mime_type("pkg/weft_web_bg.wasm"), "application/wasm");
        assert_eq!(mime_type("style.css"), "text/css; charset=utf-8");
        assert_eq!(mime_type("x.json"), "application/json");
        assert_eq!(mime_type("models/SmolLM2-135M-Instruct.Q4_1.gguf"), "application/octet-stream");
        assert_eq!(mime_type("w.bin"), "application/octet-stream");
        assert_eq!(mime_type("logo.png"), "image/png");
        assert_eq!(mime_type("logo.svg"), "image/svg+xml");
        assert_eq!(mime_type("favicon.ico"), "image/x-icon");
        assert_eq!(mime_type("README"), "application/octet-stream");
    }

    #[test]
    fn paths_stay_inside_the_root() {
        let dir = std::env::temp_dir().join(format!("xtask-serve-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("pkg")).unwrap();
        let root = dir.as_path();
        assert_eq!(resolve(root, "/"), Some(root.join("index.html")));
        assert_eq!(resolve(root, "/index.html?model=/x.gguf&p0=a#top"), Some(root.join("index.html")));
        assert_eq!(resolve(root, "/pkg/weft_web.js"), Some(root.join("pkg").join("weft_web.js")));
        assert_eq!(resolve(root, "/pkg"), Some(root.join("pkg").join("index.html")));
        assert_eq!(resolve(root, "/a%20b.txt"), Some(root.join("a b.txt")));
        assert_eq!(resolve(root, "/./style.css"), Some(root.join("style.css")));
        for bad in [
            "/../etc/passwd",
            "/pkg/../../x",
            "/%2e%2e/etc/passwd",
            "/a/%2E%2E/%2e%2e/b",
            "/..%2fx",
            "/a\\..\\b",
            "/c:/x",
            "/a%00b",
            "/%zz",
            "relative",
            "",
            "http://x/y",
        ] {
            assert_eq!(resolve(root, bad), None, "{bad:?} must be refused");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn serves_files_with_headers_and_refuses_the_rest() {
        let dir = std::env::temp_dir().join(format!("xtask-serve-http-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("pkg")).unwrap();
        std::fs::write(dir.join("pkg").join("m.wasm"), b"\0asm\x01\0\0\0").unwrap();
        std::fs::write(dir.join("index.html"), b"<!doctype html>hi").unwrap();
        let listener = bind(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let root = dir.clone();
        std::thread::spawn(move || serve(listener, root));
        let get = |request: &str| {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(request.as_bytes()).unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).unwrap();
            String::from_utf8_lossy(&out).into_owned()
        };
        let wasm = get("GET /pkg/m.wasm HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert!(wasm.starts_with("HTTP/1.1 200 OK\r\n"), "{wasm}");
        assert!(wasm.contains("Content-Type: application/wasm\r\n"), "{wasm}");
        assert!(wasm.contains("Content-Length: 8\r\n"), "{wasm}");
        assert!(wasm.contains("Cross-Origin-Embedder-Policy: require-corp\r\n"), "{wasm}");
        assert!(wasm.contains("Cache-Control: no-cache\r\n"), "{wasm}");
        assert!(wasm.ends_with("\r\n\r\n\0asm\x01\0\0\0"), "{wasm}");
        let index = get("HEAD / HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(
            index.starts_with("HTTP/1.1 200 OK\r\n")
                && index.contains("Content-Length: 17\r\n")
                && index.ends_with("\r\n\r\n"),
            "{index}"
        );
        assert!(get("GET /../Cargo.toml HTTP/1.1\r\nConnection: close\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get("GET /missing.js HTTP/1.1\r\nConnection: close\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get("POST / HTTP/1.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").starts_with("HTTP/1.1 405"));
        // Two requests on one kept-alive connection.
        let both = get("GET /index.html HTTP/1.1\r\n\r\nGET /index.html HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert_eq!(both.matches("HTTP/1.1 200 OK").count(), 2, "{both}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
