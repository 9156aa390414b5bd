//! A real `nectar serve` child process for integration tests, and a minimal HTTP/1.1 client.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// A running server; killed when dropped.
pub struct Server {
    child: Child,
    /// `host:port`.
    pub addr: String,
    /// Every stderr line so far (the log).
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `nectar serve --port 0 ARGS` (stderr piped, so not a terminal) and waits until
    /// the model is ready.
    pub fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nectar"))
            .args(["serve", "--port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nectar serve starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line.clone());
                let _ = tx.send(line);
            }
        });
        let mut server = Server {
            child,
            addr: String::new(),
            log,
        };
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(180))
                .expect("the server neither became ready nor exited");
            if let Some(rest) = line.split("listening on http://").nth(1) {
                server.addr = rest.split_whitespace().next().unwrap().to_owned();
            }
            if line.contains("nectar serve: model") && line.contains(" ready") {
                break;
            }
            assert!(!line.contains("failed"), "server: {line}");
        }
        assert!(!server.addr.is_empty(), "the server printed its address");
        server
    }

    /// Sends SIGTERM (what a service manager sends) and waits for the process to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child's pid; it has not been waited for, so the pid is
        // still ours.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        self.child.wait().unwrap()
    }

    /// `METHOD path` with an optional bearer key and JSON body: (status, body).
    pub fn http(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> (u16, Vec<u8>) {
        let mut s = TcpStream::connect(&self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.addr
        );
        if let Some(k) = key {
            req += &format!("Authorization: Bearer {k}\r\n");
        }
        let body = body.unwrap_or("");
        if !body.is_empty() {
            req += &format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                body.len()
            );
        }
        req += "\r\n";
        req += body;
        s.write_all(req.as_bytes()).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an HTTP response");
        let head = String::from_utf8_lossy(&raw[..split]).to_string();
        let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
        let mut body = raw[split + 4..].to_vec();
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            body = dechunk(&body);
        }
        (status, body)
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let n = usize::from_str_radix(String::from_utf8_lossy(&b[..end]).trim(), 16).unwrap_or(0);
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[end + 2..end + 2 + n]);
        b = &b[end + 4 + n..];
    }
}
