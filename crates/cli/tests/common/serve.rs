//! `snug serve` on a free loopback port for a test: started, waited for (`GET /ready`: the
//! model is loaded and the scheduler serves), and stopped when the [`Server`] drops (also when
//! the test fails).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `snug serve`.
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    /// Starts `snug serve MODEL --port P ARGS...` (the binary under test) and returns once it
    /// answers `GET /ready` with 200; fails with the server's stderr if it exits first.
    pub fn start(model: &Path, args: &[&str]) -> Server {
        Server::start_with_env(model, args, &[])
    }

    /// [`Server::start`] with `env` added to the server's environment.
    pub fn start_with_env(model: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut server = Server::spawn(model, args, env);
        server.wait_ready();
        server
    }

    /// [`Server::start_with_env`] without waiting: the process may not listen yet.
    pub fn spawn(model: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_snug"))
            .envs(env.iter().copied())
            .arg("serve")
            .arg(model)
            .args(["--port", &port.to_string()])
            // The prefix cache's disk tier persists across runs: off unless a test asks for it,
            // so every other test starts cold, as before.
            .args(if args.iter().any(|a| a.starts_with("--prefix-cache")) {
                &[][..]
            } else {
                &["--prefix-cache-disk", "0"][..]
            })
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("snug serve starts");
        Server { child, port }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Waits until `GET /ready` answers 200 (at most 120 s).
    pub fn wait_ready(&mut self) {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(120) {
            if let Ok(Some(status)) = self.child.try_wait() {
                let mut err = String::new();
                if let Some(e) = self.child.stderr.as_mut() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!("snug serve exited ({status}) before answering: {err}");
            }
            if let Ok((200, _)) = self.get("/ready") {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("snug serve was not ready within 120 s");
    }

    /// Sends the server SIGTERM.
    pub fn terminate(&self) {
        // SAFETY: kill(2) on the pid of a child this Server owns and has not reaped.
        let rc = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM) failed");
    }

    /// Waits up to `within` for the process to exit: its exit status and stderr, or `None`
    /// if it still runs.
    pub fn wait_exit(&mut self, within: Duration) -> Option<(std::process::ExitStatus, String)> {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if let Ok(Some(status)) = self.child.try_wait() {
                let mut err = String::new();
                if let Some(e) = self.child.stderr.as_mut() {
                    let _ = e.read_to_string(&mut err);
                }
                return Some((status, err));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// `GET path` over a fresh connection: the status and the body (HTTP/1.1, no keep-alive;
    /// a chunked body is returned as sent).
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        self.send("GET", path, None, None)
    }

    /// `METHOD path` with an optional bearer `key` and JSON `body`, like [`Server::get`].
    pub fn send(
        &self,
        method: &str,
        path: &str,
        key: Option<&str>,
        body: Option<&str>,
    ) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n",
            self.port
        );
        if let Some(k) = key {
            head += &format!("Authorization: Bearer {k}\r\n");
        }
        let body = body.unwrap_or("");
        if !body.is_empty() {
            head +=
                &format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len());
        }
        write!(s, "{head}\r\n{body}")?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        let status = resp.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
        Ok((status, body))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}
