//! The `torsh-backend` binary, run as a user runs it.

use std::process::{Command, Output};

use serde_json::Value;

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_torsh-backend"));
    cmd.args(args).env_remove("TORSH_REQUIRE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("the torsh-backend binary runs")
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn devices_lists_every_backend_kind_with_a_reason_when_unavailable() {
    let out = run(&["devices", "--json"], &[]);
    assert!(out.status.success());
    let doc = json(&out);
    let backends = doc["backends"].as_array().expect("a backends array");
    let names: Vec<&str> = backends
        .iter()
        .filter_map(|b| b["backend"].as_str())
        .collect();
    for kind in ["cuda", "rocm", "metal", "webgpu", "cpu", "reference"] {
        assert!(names.contains(&kind), "{kind} missing from {names:?}");
    }
    for b in backends {
        if b["available"].as_bool() == Some(true) {
            let device = &b["devices"][0];
            assert!(
                device["name"].as_str().is_some_and(|n| !n.is_empty()),
                "{b}"
            );
            assert!(device["memory_bytes"].as_u64().is_some(), "{b}");
        } else {
            assert!(b["reason"].as_str().is_some_and(|r| !r.is_empty()), "{b}");
        }
    }
    let cpu = backends.iter().find(|b| b["backend"] == "cpu").unwrap();
    assert_eq!(cpu["available"], true);
    assert!(doc["auto"].as_str().is_some());

    let table = run(&["devices"], &[]);
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("cpu") && text.contains("Backend::auto() picks"),
        "{text}"
    );
}

#[test]
fn parity_reports_every_op_and_dtype_and_passes() {
    let out = run(
        &["parity", "--json", "--op", "softmax", "--op", "matmul"],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc = json(&out);
    let rows = doc["results"].as_array().unwrap();
    assert!(!rows.is_empty());
    for dtype in ["f32", "f64", "f16", "bf16"] {
        assert!(rows
            .iter()
            .any(|r| r["op"] == "softmax" && r["dtype"] == dtype && r["status"] == "ok"));
    }
    assert_eq!(doc["failed"], 0);
    assert!(doc["against"]
        .as_str()
        .unwrap()
        .contains("reference backend"));
    let devices = doc["devices"].as_array().unwrap();
    assert!(devices
        .iter()
        .any(|d| d.as_str().unwrap().starts_with("cpu: ")));
    let table = run(&["parity", "--op", "gemv"], &[]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("gemv") && text.contains("0 failed"), "{text}");
    assert!(text.starts_with("Each backend's answers are compared with the reference"));
}

#[test]
fn parity_fails_on_a_required_backend_that_is_missing_and_on_bad_arguments() {
    let missing = run(&["parity", "--op", "softmax"], &[("TORSH_REQUIRE", "cuda")]);
    let cuda_available = json(&run(&["devices", "--json"], &[]))["backends"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["backend"] == "cuda" && b["available"] == true);
    if !cuda_available {
        assert!(!missing.status.success());
        assert!(String::from_utf8_lossy(&missing.stderr).contains("cuda"));
    }
    assert_eq!(
        run(&["parity", "--backend", "nonsense"], &[]).status.code(),
        Some(2)
    );
    assert_eq!(
        run(&["parity", "--op", "nonsense"], &[]).status.code(),
        Some(2)
    );
    assert!(
        !run(&["parity", "--backend", "metal", "--op", "softmax"], &[])
            .status
            .success()
            || cfg!(target_vendor = "apple")
    );
}

#[test]
fn bench_measures_every_section_on_the_reference_and_writes_json() {
    let path = std::env::temp_dir().join(format!("torsh-bench-{}.json", std::process::id()));
    let out = run(
        &[
            "bench",
            "--backend",
            "reference",
            "--quick",
            "--json",
            path.to_str().unwrap(),
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "GEMM",
        "Memory-bound",
        "Attention",
        "Conv2d",
        "Fused Adam",
        "median",
        "GFLOP/s",
        "GB/s",
        "peers: none yet on this backend",
        "0 failed",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    let written = std::fs::read(&path).expect("the JSON file is written");
    std::fs::remove_file(&path).ok();
    let doc: Value = serde_json::from_slice(&written).expect("the JSON file parses");
    assert_eq!(doc["backend"], "reference");
    assert!(doc["device"]["name"].as_str().is_some());
    assert!(doc["ceiling"]["copy_gbps"]
        .as_f64()
        .is_some_and(|g| g > 0.0));
    let rows = doc["results"].as_array().expect("a results array");
    for op in [
        "matmul",
        "memcpy",
        "copy",
        "add",
        "mul",
        "exp",
        "gelu",
        "erf",
        "tanh",
        "sigmoid",
        "softmax",
        "layer_norm",
        "sum",
        "max",
        "cast",
        "fill",
        "attention",
        "conv2d",
        "adam",
    ] {
        assert!(rows.iter().any(|r| r["op"] == op), "{op} missing");
    }
    for dtype in ["f32", "f64", "f16", "bf16"] {
        assert!(rows
            .iter()
            .any(|r| r["op"] == "matmul" && r["dtype"] == dtype));
    }
    for r in rows {
        assert!(r["error"].is_null(), "{r}");
        let (min, median, max) = (
            r["min_s"].as_f64().unwrap(),
            r["median_s"].as_f64().unwrap(),
            r["max_s"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= median && median <= max, "{r}");
        assert!(r["throughput"].as_f64().is_some_and(|t| t > 0.0), "{r}");
        assert!(r["peer"].is_null(), "{r}");
        if r["section"] == "memory" {
            assert!(r["bytes"].as_f64().is_some_and(|b| b > 0.0), "{r}");
            assert!(
                r["fraction_of_ceiling"].as_f64().is_some_and(|f| f > 0.0),
                "{r}"
            );
        } else {
            assert!(
                r["flops"].as_f64().is_some_and(|f| f > 0.0) || r["op"] == "adam",
                "{r}"
            );
        }
    }
}

#[test]
fn bench_selects_ops_and_rejects_bad_arguments() {
    let out = run(
        &["bench", "--backend", "cpu", "--quick", "--op", "matmul"],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("bench on cpu") && text.contains("GEMM"),
        "{text}"
    );
    assert!(text.contains("matmul") && text.contains("bf16"), "{text}");
    assert!(
        !text.contains("softmax") && !text.contains("Attention"),
        "{text}"
    );
    // At --quick sizes the ratios to peers are marked as indicative, never printed bare.
    let ratios: Vec<&str> = text
        .split_whitespace()
        .filter(|w| {
            w.ends_with('x')
                && w.trim_start_matches('~')
                    .trim_end_matches('x')
                    .parse::<f64>()
                    .is_ok()
        })
        .collect();
    assert!(!ratios.is_empty(), "{text}");
    assert!(
        ratios.iter().all(|w| w.starts_with('~')),
        "{ratios:?}\n{text}"
    );
    assert!(text.contains("indicative only"), "{text}");
    for bad in [
        &["bench", "--op", "nonsense", "--quick"][..],
        &["bench", "--backend", "nonsense", "--quick"],
        &["bench", "--repeats", "0", "--quick"],
        &["bench", "--backend", "cpu", "--threads", "0", "--quick"],
        &[
            "bench",
            "--backend",
            "reference",
            "--threads",
            "2",
            "--quick",
        ],
        &["bench", "--backend", "cpu", "--binding-mib", "4", "--quick"],
        &["bench", "--binding-mib", "0", "--quick"],
    ] {
        assert_eq!(run(bad, &[]).status.code(), Some(2), "{bad:?}");
    }
    assert!(
        !run(&["bench", "--backend", "metal", "--quick"], &[])
            .status
            .success()
            || cfg!(target_vendor = "apple")
    );
}

#[test]
fn bench_on_the_cpu_runs_the_gemm_peers_at_each_thread_count_and_draws_a_chart() {
    let stem = std::env::temp_dir().join(format!("torsh-bench-cpu-{}", std::process::id()));
    let (json_path, svg_path) = (stem.with_extension("json"), stem.with_extension("svg"));
    let out = run(
        &[
            "bench",
            "--backend",
            "cpu",
            "--quick",
            "--threads",
            "1,2",
            "--json",
            json_path.to_str().unwrap(),
            "--plot",
            svg_path.to_str().unwrap(),
        ],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "threads: 1, 2",
        "ceilings at 1 thread(s): FMA peak",
        "ceilings at 2 thread(s)",
        "copy",
        "gemm crate",
        "matrixmultiply",
        "OpenBLAS",
        "ours/best",
        "of peak",
        "of copy",
        "0 failed",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    let doc: Value = serde_json::from_slice(&std::fs::read(&json_path).expect("the JSON file"))
        .expect("the JSON file parses");
    let svg = std::fs::read_to_string(&svg_path).expect("the chart is written");
    std::fs::remove_file(&json_path).ok();
    std::fs::remove_file(&svg_path).ok();

    assert_eq!(doc["threads"], serde_json::json!([1, 2]));
    let ceilings = doc["ceilings"].as_array().expect("a ceilings array");
    assert_eq!(ceilings.len(), 2);
    for (c, threads) in ceilings.iter().zip([1, 2]) {
        assert_eq!(c["threads"], threads);
        assert!(c["copy_gbps"].as_f64().is_some_and(|g| g > 0.0), "{c}");
        if std::is_x86_feature_detected!("fma") {
            assert!(c["fma_f32_gflops"].as_f64().is_some_and(|g| g > 0.0), "{c}");
            assert!(c["fma_f64_gflops"].as_f64().is_some_and(|g| g > 0.0), "{c}");
        }
    }
    let rows = doc["results"].as_array().expect("a results array");
    for threads in [1, 2] {
        let at: Vec<&Value> = rows.iter().filter(|r| r["threads"] == threads).collect();
        assert!(at.iter().any(|r| r["section"] == "conv2d"), "{threads}");
        for r in &at {
            assert!(r["error"].is_null(), "{r}");
            let expected = match (r["section"].as_str(), r["dtype"].as_str()) {
                (Some("memory" | "optimizer"), _) => "copy",
                (_, Some("f64")) => "fma_f64",
                _ => "fma_f32",
            };
            if r["ceiling"].is_string() {
                assert_eq!(r["ceiling"], expected, "{r}");
                assert!(r["fraction_of_ceiling"].as_f64().is_some_and(|f| f > 0.0));
            } else {
                // Only a compute row of a CPU without vector FMA has no ceiling.
                assert_ne!(expected, "copy", "{r}");
            }
        }
        for r in at.iter().filter(|r| r["op"] == "matmul") {
            let peer = |key: &str| {
                r["peers"]
                    .as_array()
                    .and_then(|p| p.iter().find(|p| p["key"] == key))
                    .cloned()
            };
            let dtype = r["dtype"].as_str().unwrap();
            let status = |key| peer(key).map(|p| p["status"].as_str().unwrap().to_string());
            // The scalar baseline runs at every quick size.
            assert_eq!(status("scalar").as_deref(), Some("measured"), "{r}");
            assert_eq!(peer("scalar").unwrap()["baseline"], true);
            if matches!(dtype, "f32" | "f64" | "f16") {
                assert_eq!(status("gemm").as_deref(), Some("measured"), "{r}");
                assert!(
                    r["ours_over_best_peer"].as_f64().is_some_and(|x| x > 0.0),
                    "{r}"
                );
            }
            if matches!(dtype, "f32" | "f64") {
                assert_eq!(status("matrixmultiply").as_deref(), Some("measured"), "{r}");
                // OpenBLAS is measured where installed, and reported missing elsewhere.
                let blas = status("OpenBLAS").expect("an OpenBLAS entry");
                assert!(blas == "measured" || blas == "not_found", "{r}");
            }
        }
    }
    assert!(svg.starts_with("<?xml") && svg.trim_end().ends_with("</svg>"));
    for needle in [
        "<svg",
        "ours",
        "matrixmultiply",
        "GFLOP/s",
        "GB/s",
        "2 thread(s)",
    ] {
        assert!(svg.contains(needle), "{needle} missing from the chart");
    }
}

/// The onnxruntime peer's protocol, driven against a stand-in script: a prepared case is timed by
/// the peer's own clock and becomes the best peer, a failing case and a peer that dies are errors
/// of that row only, and uncovered cases are skipped with the peer's reason.
#[test]
fn bench_on_the_cpu_times_the_onnxruntime_peer_in_its_co_process() {
    let fake = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/fake_onnxruntime_peer.py"
    );
    let path = std::env::temp_dir().join(format!("torsh-bench-ort-{}.json", std::process::id()));
    let mut args = vec!["bench", "--backend", "cpu", "--quick", "--threads", "1"];
    for op in ["exp", "tanh", "gelu_backward", "dropout"] {
        args.extend(["--op", op]);
    }
    args.extend(["--json", path.to_str().unwrap()]);
    let out = run(&args, &[("TORSH_BENCH_ONNXRUNTIME", fake)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("onnxruntime 0.0-fake"), "{text}");
    assert!(text.contains("interleaved"), "{text}");
    let doc: Value = serde_json::from_slice(&std::fs::read(&path).expect("the JSON file"))
        .expect("the JSON file parses");
    std::fs::remove_file(&path).ok();
    let rows = doc["results"].as_array().expect("a results array");
    let peer_of = |op: &str| {
        let row = rows
            .iter()
            .find(|r| r["op"] == op && r["dtype"] == "f32")
            .unwrap_or_else(|| panic!("no {op} row"));
        assert!(row["error"].is_null(), "ours failed: {row}");
        let peer = row["peers"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["key"] == "onnxruntime"))
            .unwrap_or_else(|| panic!("no onnxruntime entry: {row}"))
            .clone();
        (row.clone(), peer)
    };
    let (exp, peer) = peer_of("exp");
    assert_eq!(peer["status"], "measured", "{exp}");
    assert!(
        (peer["median_s"].as_f64().unwrap() - 1e-3).abs() < 1e-12,
        "{peer}"
    );
    assert_eq!(exp["best_peer"], "onnxruntime");
    let ratio = exp["ours_over_best_peer"].as_f64().unwrap();
    let expected = 1e-3 / exp["median_s"].as_f64().unwrap();
    assert!((ratio - expected).abs() <= 1e-9 * expected, "{exp}");

    let (_, tanh) = peer_of("tanh");
    assert_eq!(tanh["status"], "failed");
    assert!(
        tanh["error"].as_str().unwrap().contains("fake failure"),
        "{tanh}"
    );
    let (_, backward) = peer_of("gelu_backward");
    assert_eq!(backward["status"], "skipped");
    assert!(backward["error"]
        .as_str()
        .unwrap()
        .contains("fake: no gelu_backward"));
    let (_, died) = peer_of("dropout");
    assert_eq!(died["status"], "failed");
    let why = died["error"].as_str().unwrap();
    assert!(
        why.contains("exited") && why.contains("exiting on purpose"),
        "{why}"
    );

    // A peer that stops answering is stopped after the timeout: its row is an error, and the
    // run ends.
    let started = std::time::Instant::now();
    let hung = run(
        &[
            "bench",
            "--backend",
            "cpu",
            "--quick",
            "--threads",
            "1",
            "--op",
            "exp",
            "--json",
            path.to_str().unwrap(),
        ],
        &[
            ("TORSH_BENCH_ONNXRUNTIME", fake),
            ("TORSH_BENCH_ONNXRUNTIME_TIMEOUT_S", "1"),
            ("FAKE_PEER_HANG", "1"),
        ],
    );
    assert!(
        hung.status.success(),
        "{}",
        String::from_utf8_lossy(&hung.stderr)
    );
    assert!(
        started.elapsed().as_secs() < 60,
        "the timeout ended the wait"
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&path).expect("the JSON file"))
        .expect("the JSON file parses");
    std::fs::remove_file(&path).ok();
    let exp = doc["results"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["op"] == "exp" && r["dtype"] == "f32"))
        .expect("an exp row");
    let peer = exp["peers"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["key"] == "onnxruntime"))
        .expect("an onnxruntime entry");
    assert_eq!(peer["status"], "failed", "{peer}");
    assert!(
        peer["error"]
            .as_str()
            .unwrap()
            .contains("did not answer within"),
        "{peer}"
    );

    // Turned off, the peer is named as missing and no row has it.
    let off = run(
        &[
            "bench",
            "--backend",
            "cpu",
            "--quick",
            "--threads",
            "1",
            "--op",
            "exp",
        ],
        &[("TORSH_BENCH_ONNXRUNTIME", "off")],
    );
    let text = String::from_utf8_lossy(&off.stdout);
    assert!(off.status.success(), "{text}");
    assert!(text.contains("onnxruntime not here: turned off"), "{text}");
}

#[test]
fn bench_on_webgpu_with_lowered_bindings_measures_the_column_sum_in_two_passes() {
    let required =
        std::env::var("TORSH_REQUIRE").is_ok_and(|v| v.split(',').any(|k| k == "webgpu"));
    let file = std::env::temp_dir().join(format!("torsh-cli-binding-{}.json", std::process::id()));
    let path = file.to_str().unwrap();
    let args = [
        "bench",
        "--backend",
        "webgpu",
        "--op",
        "sum",
        "--binding-mib",
        "1",
        "--repeats",
        "1",
        "--json",
        path,
    ];
    let out = run(&args, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() && !required {
        eprintln!(
            "skipped: no WebGPU adapter here ({})",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return;
    }
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("lowered to 1 MiB"), "{text}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let _ = std::fs::remove_file(&file);
    assert_eq!(doc["binding_mib"], 1);
    let rows = doc["results"].as_array().unwrap();
    let columns: Vec<&Value> = rows
        .iter()
        .filter(|r| r["op"] == "sum" && r["variant"] == "columns")
        .collect();
    assert!(!columns.is_empty(), "{doc}");
    for r in columns {
        // The tensor is larger than the 1 MiB binding: its column sum ran in two passes.
        assert!(r["bytes"].as_f64().unwrap() > (1 << 20) as f64, "{r}");
        assert!(r["error"].is_null(), "{r}");
        assert!(r["median_s"].as_f64().unwrap() > 0.0, "{r}");
    }
}
