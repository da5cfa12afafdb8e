#!/usr/bin/env bash
# Runs the CUDA checks on a GPU machine from prebuilt binaries, for docs/gpu-runs.md.
#
# Build on the development machine (no GPU or CUDA needed there), then carry `gpu-bin/` to the GPU machine
# (keep `gpu-bin/` in .git/info/exclude):
#   scripts/gpu-run.sh build            # cargo test --no-run + release CLI and torsh-fuzz, copies the executables
#                                       # into gpu-bin/
#                                       # and packs them into gpu-pack/bin.tar.zst (keep gpu-pack/ excluded too)
#   scripts/gpu-run.sh run [OUT_DIR] [PART...]
#                                       # on the GPU machine: finds the CUDA libraries, then runs each PART (default:
#                                       # all, in this order): `tests` (every test binary with
#                                       # TORSH_REQUIRE=cuda,nvrtc,cudnn,webgpu), `cuda` (`parity` and `bench` on CUDA,
#                                       # JSON, release build), `webgpu` (the same on WebGPU over the Vulkan
#                                       # driver) and `fuzz` (the reliability suite on CUDA and WebGPU for
#                                       # FUZZ_SECONDS, default 120). Parts let one command stay within a device
#                                       # call's time limit.
set -euo pipefail
cd "$(dirname "$0")/.."

build() {
    rm -rf gpu-bin && mkdir -p gpu-bin
    # Without debug info and stripped, so the binaries fit the device tool's carry limit (64 MiB).
    export CARGO_PROFILE_TEST_DEBUG=false CARGO_PROFILE_DEV_DEBUG=false
    cargo test --workspace --no-run --message-format=json 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])' |
        while read -r exe; do
            # fixtures (reference only, reads files by build path), cli (needs the cargo layout) and
            # ci (torsh-fuzz by its build path; the `fuzz` part runs it) do not belong there.
            case "$(basename "$exe")" in fixtures-* | cli-* | ci-*) continue ;; esac
            cp "$exe" gpu-bin/
        done
    cargo build --release -p torsh-cli -p torsh-fuzz
    cp target/release/torsh-backend gpu-bin/torsh-backend-cli
    cp target/release/torsh-fuzz gpu-bin/torsh-fuzz
    strip gpu-bin/*
    du -sh gpu-bin && ls -la gpu-bin
    # One archive small enough to carry to a machine that accepts at most 64 MiB: the test binaries
    # share most of their code, which zstd's long-range matching finds across files (about 45 MB
    # against gzip's 99 MB). The zstd binary and the one library it may miss travel with it.
    mkdir -p gpu-pack && rm -f gpu-pack/bin.tar.gz
    tar cf - gpu-bin | zstd -q -f -T0 -12 --long=30 -o gpu-pack/bin.tar.zst
    cp "$(command -v zstd)" gpu-pack/zstd
    cp "$(ldd "$(command -v zstd)" | awk '/liblz4/ {print $3}')" gpu-pack/ 2>/dev/null || true
    du -sh gpu-pack
}

# Unpacks gpu-pack/bin.tar.zst into gpu-bin/ (with the system's zstd, or the one carried along).
unpack() {
    [ -d gpu-bin ] && return 0
    local z
    z="$(command -v zstd || echo gpu-pack/zstd)"
    LD_LIBRARY_PATH="$PWD/gpu-pack:${LD_LIBRARY_PATH:-}" "$z" -d -q --long=30 -c gpu-pack/bin.tar.zst | tar xf -
}

# Adds the folder of the first file matching each library name to LD_LIBRARY_PATH.
find_libraries() {
    local dirs=()
    for lib in libcuda.so.1 libnvrtc.so libcublas.so libcublasLt.so libcudnn.so; do
        local hit
        hit="$(find / -xdev \( -name "$lib" -o -name "$lib.*" \) -not -path '/proc/*' 2>/dev/null | head -n 1 || true)"
        if [ -n "$hit" ]; then dirs+=("$(dirname "$hit")"); else echo "warning: $lib not found" >&2; fi
    done
    local joined
    joined="$(printf '%s:' "${dirs[@]}")"
    export LD_LIBRARY_PATH="${joined}${LD_LIBRARY_PATH:-}"
}

run() {
    local out="${1:-${OUT:-gpu-out}}"
    shift || true
    local parts=("$@")
    [ ${#parts[@]} -gt 0 ] || parts=(tests cuda webgpu fuzz)
    mkdir -p "$out"
    unpack
    find_libraries
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" | tee "$out/env.txt"
    { nvidia-smi || true; } > "$out/nvidia-smi.txt" 2>&1
    { vulkaninfo --summary || true; } > "$out/vulkaninfo.txt" 2>&1
    git rev-parse HEAD > "$out/commit.txt" 2>/dev/null || true
    export TORSH_REQUIRE=cuda,nvrtc,cudnn,webgpu RUST_BACKTRACE=1
    export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/xdg-gpu-run}"
    mkdir -p -m 700 "$XDG_RUNTIME_DIR"
    local status=0
    gpu-bin/torsh-backend-cli devices > "$out/devices.txt" 2>&1 || status=1
    for part in "${parts[@]}"; do
        case "$part" in
            tests)
                for exe in gpu-bin/*; do
                    case "$(basename "$exe")" in torsh-backend-cli | torsh-fuzz) continue ;; esac
                    echo "== $(basename "$exe")" | tee -a "$out/tests.txt"
                    "$exe" --test-threads=4 >> "$out/tests.txt" 2>&1 || { status=1; echo "FAILED: $exe" | tee -a "$out/tests.txt"; }
                done
                grep -E "^test result|FAILED|panicked" "$out/tests.txt" || true
                ;;
            cuda | webgpu)
                gpu-bin/torsh-backend-cli parity --backend "$part" --json > "$out/parity-$part.json" 2> "$out/parity-$part.err" || status=1
                TORSH_COMMIT="$(cat "$out/commit.txt" 2>/dev/null || true)" \
                    gpu-bin/torsh-backend-cli bench --backend "$part" --json "$out/bench-$part.json" > "$out/bench-$part.txt" 2>&1 || status=1
                ;;
            fuzz)
                gpu-bin/torsh-fuzz --seconds "${FUZZ_SECONDS:-120}" --backends cuda,webgpu \
                    > "$out/fuzz.txt" 2>&1 || status=1
                tail -n 20 "$out/fuzz.txt"
                ;;
            *) echo "unknown part $part (tests, cuda, webgpu, fuzz)" >&2; status=2 ;;
        esac
    done
    return $status
}

case "${1:-}" in
    build) build ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 build | run [OUT_DIR]" >&2; exit 2 ;;
esac
