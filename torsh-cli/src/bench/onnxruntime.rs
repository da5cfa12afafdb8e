//! onnxruntime as a peer of the CPU cases outside GEMM, run in the same pass as ours.
//!
//! The peer is `benches/onnxruntime_peer.py --serve`, started once per run as a co-process that
//! answers JSON lines on its stdin and stdout: `{"prepare": ROW, "threads": N, "target_s": T}` builds
//! the ONNX graph of a case (the fastest of several where onnxruntime has several, as for attention)
//! and `{"batch": K}` times K back-to-back runs of it. Because each batch is one request, the bench
//! interleaves onnxruntime's repeats with ours (see `measure_interleaved`), so that both are measured
//! in the same minutes of a shared machine.
//!
//! Environment: `PYTHON` (default `python3`) runs the script; `TORSH_BENCH_ONNXRUNTIME` names another
//! script speaking the same protocol, or `off` to run without this peer;
//! `TORSH_BENCH_ONNXRUNTIME_TIMEOUT_S` bounds the wait for one answer (default [`TIMEOUT_S`]): a peer
//! that does not answer in time is killed, and its cases from then on are errors. Without Python,
//! the script or onnxruntime, the peer is "not found" with the reason, and the run goes on without
//! it.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::cases::Case;
use super::peers::PeerError;

/// The script, as the source tree holds it.
const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../benches/onnxruntime_peer.py"
);

/// How much of the co-process's stderr is kept for error messages.
const STDERR_KEPT: usize = 4096;

/// Seconds the bench waits for one answer by default: preparing the largest case (three attention
/// graphs at S2048, each measured briefly) takes a few seconds; a batch lasts about a repeat.
pub const TIMEOUT_S: f64 = 120.0;

/// The co-process, started and ready.
pub struct OnnxRuntime {
    /// The process.
    child: Child,
    /// Its stdin: one request per line.
    stdin: ChildStdin,
    /// Its stdout, one answer per line, read by a thread (so that a wait can time out); the
    /// channel closes when stdout does.
    answers: Receiver<std::io::Result<String>>,
    /// The longest wait for one answer.
    timeout: Duration,
    /// The tail of its stderr, collected by a thread.
    stderr: Arc<Mutex<String>>,
    /// `onnxruntime X.Y.Z (onnx ..., numpy ...)`, from its first line.
    pub name: String,
}

impl OnnxRuntime {
    /// Starts the peer. `Err` says why it is not here (turned off, no Python, no onnxruntime, or a
    /// script that does not answer the protocol).
    pub fn start() -> Result<OnnxRuntime, String> {
        let script = match std::env::var("TORSH_BENCH_ONNXRUNTIME") {
            Ok(v) if v == "off" => return Err("turned off (TORSH_BENCH_ONNXRUNTIME=off)".into()),
            Ok(v) if !v.is_empty() => v,
            _ => SCRIPT.to_string(),
        };
        if !std::path::Path::new(&script).is_file() {
            return Err(format!("no script at {script}"));
        }
        let python = std::env::var("PYTHON")
            .ok()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "python3".into());
        let mut child = Command::new(&python)
            .arg(&script)
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("running {python}: {e}"))?;
        let (Some(stdin), Some(stdout), Some(mut err)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the co-process has no pipes".into());
        };
        let stderr = Arc::new(Mutex::new(String::new()));
        let tail = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            while let Ok(n @ 1..) = err.read(&mut buf) {
                if let Ok(mut s) = tail.lock() {
                    s.push_str(&String::from_utf8_lossy(&buf[..n]));
                    if s.len() > STDERR_KEPT {
                        let cut = s.len() - STDERR_KEPT;
                        let cut = (cut..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(0);
                        s.drain(..cut);
                    }
                }
            }
        });
        let (send, answers) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let timeout = std::env::var("TORSH_BENCH_ONNXRUNTIME_TIMEOUT_S")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(TIMEOUT_S);
        let mut peer = OnnxRuntime {
            child,
            stdin,
            answers,
            timeout: Duration::from_secs_f64(timeout),
            stderr,
            name: String::new(),
        };
        let hello = peer.answer()?;
        if hello["ready"] != json!(true) {
            return Err(format!("{script} did not say it is ready: {hello}"));
        }
        let version = |k: &str| hello[k].as_str().unwrap_or("?").to_string();
        peer.name = format!(
            "onnxruntime {} (onnx {}, numpy {}), CPUExecutionProvider, ORT_ENABLE_ALL, IO binding",
            version("onnxruntime"),
            version("onnx"),
            version("numpy")
        );
        Ok(peer)
    }

    /// Reads one answer line; `Err` when the process has gone, has not answered within the
    /// timeout (it is then killed) or the line is not JSON, with what it wrote on stderr.
    fn answer(&mut self) -> Result<Value, String> {
        let line = match self.answers.recv_timeout(self.timeout) {
            Ok(Ok(line)) => line,
            Err(RecvTimeoutError::Timeout) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(format!(
                    "the onnxruntime peer did not answer within {:?} and was stopped: {}",
                    self.timeout,
                    self.stderr_tail()
                ));
            }
            Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => {
                // Gone: wait for it, so that its stderr has been drained.
                let status = self.child.wait().map(|s| s.to_string());
                std::thread::sleep(Duration::from_millis(50));
                return Err(format!(
                    "the onnxruntime peer exited ({}): {}",
                    status.unwrap_or_else(|e| e.to_string()),
                    self.stderr_tail()
                ));
            }
        };
        serde_json::from_str(&line).map_err(|e| {
            format!(
                "the onnxruntime peer's answer is not JSON ({e}): {}",
                line.trim()
            )
        })
    }

    /// The last lines of the co-process's stderr, on one line.
    fn stderr_tail(&self) -> String {
        let text = self.stderr.lock().map(|s| s.clone()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let start = lines.len().saturating_sub(3);
        let tail = lines[start..].join(" | ");
        if tail.is_empty() {
            "nothing on stderr".into()
        } else {
            tail
        }
    }

    /// Sends one request and reads its answer.
    fn request(&mut self, request: Value) -> Result<Value, String> {
        writeln!(self.stdin, "{request}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("writing to the onnxruntime peer: {e}"))?;
        let answer = self.answer()?;
        match answer["error"].as_str() {
            Some(e) => Err(e.to_string()),
            None => Ok(answer),
        }
    }

    /// Prepares `case` at `threads` threads, `target` the minimum seconds of a repeat; returns the
    /// graph that will be timed. `Skipped` when onnxruntime has no counterpart of the case (the
    /// reason), `Failed` when building or running its graph failed.
    pub fn prepare(
        &mut self,
        case: &Case,
        threads: usize,
        target: f64,
    ) -> Result<String, PeerError> {
        let row = json!({
            "section": case.section().key(),
            "op": case.name(),
            "variant": case.variant(),
            "dtype": case.dtype.name(),
            "dims": case.dims_json(),
        });
        let answer = self
            .request(json!({"prepare": row, "threads": threads, "target_s": target}))
            .map_err(PeerError::Failed)?;
        if let Some(why) = answer["skip"].as_str() {
            return Err(PeerError::Skipped(why.to_string()));
        }
        answer["prepared"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| PeerError::Failed(format!("unexpected answer to prepare: {answer}")))
    }

    /// Seconds of `k` back-to-back runs of the prepared case.
    pub fn batch(&mut self, k: usize) -> Result<f64, String> {
        let answer = self.request(json!({ "batch": k }))?;
        answer["seconds"]
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .ok_or_else(|| format!("unexpected answer to batch: {answer}"))
    }
}

impl Drop for OnnxRuntime {
    fn drop(&mut self) {
        // The co-process holds nothing that needs a clean exit: killed and reaped.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
