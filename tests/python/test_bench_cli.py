"""`smla bench` and `smla info` options on the CPU backend (the CUDA path shares the option parsing).

SMLA_BIN names the binary (ctest sets it); otherwise build/bin/smla under the repo root.
"""

import json
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SMLA_BIN = os.environ.get("SMLA_BIN") or str(REPO / "build" / "bin" / "smla")

if not os.environ.get("SMLA_BIN") and not os.path.exists(SMLA_BIN):
    pytest.skip(f"smla binary not found at {SMLA_BIN}; build it or set SMLA_BIN", allow_module_level=True)


def bench(*args):
    return subprocess.run([SMLA_BIN, "bench", "--backend", "cpu", *args], capture_output=True, text=True, timeout=120)


def test_e4m3_q_runs_and_is_labelled(tmp_path):
    out = tmp_path / "b.json"
    r = bench("--format", "fp8_e4m3", "--q", "e4m3", "--heads", "2", "--T", "1,3", "--topk", "16", "--reps", "1",
              "--json", str(out))
    assert r.returncode == 0, r.stderr
    recs = json.loads(out.read_text())
    recs = recs["cases"]
    assert [x["format"] for x in recs] == ["fp8_e4m3+q_e4m3"] * 2
    assert [x["T"] for x in recs] == [1, 3]
    assert "--q e4m3" in r.stdout


def test_e4m3_q_needs_the_fp8_e4m3_cache():
    r = bench("--format", "bf16", "--q", "e4m3", "--heads", "2", "--T", "1", "--topk", "16")
    assert r.returncode != 0
    assert "--q e4m3 needs --format fp8_e4m3" in r.stderr


def test_info_names_the_kernel_of_a_cuda_build():
    def info(extra_env):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SMLA_SM90_")}
        env.update(extra_env)
        r = subprocess.run([SMLA_BIN, "info", "--heads", "16", "--format", "nvfp4_ds_mla"], capture_output=True,
                           text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout
    out = info({})
    if "CUDA backend: built" not in out:
        pytest.skip("CPU-only build: no CUDA kernel to name")
    kernels = [line for line in out.splitlines() if "kernel on an SM90 GPU" in line]
    # nvfp4_ds_mla at H <= 16: the swap-AB kernel (session 12)
    assert kernels == ["  kernel on an SM90 GPU: sm90/sparse_mla/nvfp4_ds_mla_d576/swapab"]


def test_info_names_the_fp8_score_variant_and_its_accuracy():
    def info(*args, rc=0):
        r = subprocess.run([SMLA_BIN, "info", "--heads", "64", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == rc, r.stderr
        return r.stdout
    out = info("--format", "fp8_ds_mla", "--q-dtype", "e4m3", "--score", "fp8")
    assert "scores=fp8" in out
    # The variant table is printed with each variant's accuracy, whatever the build.
    assert "h64.ws.q8  scores fp8   supports this problem" in out
    assert "1e-2" in out
    if "CUDA backend: built" in out:
        assert "  kernel on an SM90 GPU: sm90/sparse_mla/fp8_ds_mla_d576/h64.ws.q8" in out.splitlines()
    assert "scores=fp8 (auto)" not in out  # an explicit choice is not labelled auto
    # The default (auto) with an e4m3 q and an fp8 cache: fp8 scores, h64.ws.q8.
    for fmt in ["fp8_ds_mla", "fp8_e4m3"]:
        for extra in [(), ("--score", "auto")]:
            out = info("--format", fmt, "--q-dtype", "e4m3", *extra)
            assert "scores=fp8 (auto)" in out, out
            assert "CUDA variants (the first that supports the problem runs; on an SM90 GPU: h64.ws.q8):" in out, out
            assert "h64.ws.q8  scores fp8   supports this problem" in out
            assert "  cpu : runs with the float64 reference" in out
            if "CUDA backend: built" in out:
                assert f"  kernel on an SM90 GPU: sm90/sparse_mla/{fmt}_d576/h64.ws.q8" in out.splitlines()
    # ... bf16 scores on request: the q widened, h64.ws.
    out = info("--format", "fp8_ds_mla", "--q-dtype", "e4m3", "--score", "bf16")
    assert "scores=bf16" in out and "(auto)" not in out
    assert "on an SM90 GPU: h64.ws):" in out
    # ... and a bf16 q: auto is bf16 scores.
    out = info("--format", "fp8_ds_mla")
    assert "scores=bf16 (auto)" in out
    assert "on an SM90 GPU: h64.ws):" in out
    # fp8 scores with a bf16 q: refused by both backends, with the fix.
    out = info("--format", "fp8_ds_mla", "--score", "fp8", rc=1)  # nothing can run it: info exits 1
    assert "cpu : cannot run: score precision fp8 multiplies an e4m3 q with fp8 rows" in out
    assert "use score precision bf16" in out


def test_score_fp8_is_a_cuda_option():
    r = bench("--format", "fp8_ds_mla", "--q", "e4m3", "--score", "fp8", "--heads", "2", "--T", "1", "--topk", "16")
    assert r.returncode != 0
    assert "--score fp8 chooses a CUDA kernel" in r.stderr
    # auto (the default, also when named) and bf16 are fine on the CPU backend
    for extra in [(), ("--score", "auto"), ("--score", "bf16")]:
        r = bench("--format", "fp8_ds_mla", "--q", "e4m3", *extra, "--heads", "2", "--T", "1", "--topk", "16",
                  "--reps", "1")
        assert r.returncode == 0, r.stderr
    r = bench("--format", "fp8_ds_mla", "--score", "f8", "--heads", "2", "--T", "1", "--topk", "16")
    assert r.returncode != 0 and "use auto, bf16 or fp8" in r.stderr


def test_phases_need_the_phase_timer_build():
    build = subprocess.run([SMLA_BIN, "info"], capture_output=True, text=True, timeout=60).stdout
    if "CUDA backend: built" not in build:
        pytest.skip("CPU-only build")
    if "phase timer compiled in" in build:
        pytest.skip("a build configured with -DSMLA_PHASE_TIMER=ON: --phases runs (on a GPU)")
    # Without the option the stamps are compiled out and --phases says how to get them (before any
    # device is touched, so this holds on a machine without a GPU too).
    r = subprocess.run([SMLA_BIN, "bench", "--backend", "cuda", "--phases", "--heads", "2", "--T", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "-DSMLA_PHASE_TIMER=ON" in r.stderr, r.stderr


def test_json_says_which_cases_are_quoted_against_the_gather_limit(tmp_path):
    # Memory-bound cases (H <= 64, and every quantized cache) are the ones `smla bench` quotes
    # against the gather limit on a GPU; the CPU backend measures no ceiling, so nothing is quoted.
    quoted = {}
    for fmt in ("bf16", "fp8_ds_mla", "nvfp4_ds_mla"):
        out = tmp_path / f"{fmt}.json"
        r = bench("--format", fmt, "--heads", "128,64,16", "--T", "1", "--topk", "4", "--reps", "1", "--json", str(out))
        assert r.returncode == 0, r.stderr
        data = json.loads(out.read_text())
        assert data["gather_tbps"] == 0 and data["gather_row_bytes"] == 0
        for c in data["cases"]:
            quoted[(fmt, c["H"])] = c["memory_bound"]
            assert c["gather_ms"] == 0 and c["gather_fraction"] == 0, c
    assert quoted == {("bf16", 128): False, ("bf16", 64): True, ("bf16", 16): True,
                      ("fp8_ds_mla", 128): True, ("fp8_ds_mla", 64): True, ("fp8_ds_mla", 16): True,
                      ("nvfp4_ds_mla", 128): True, ("nvfp4_ds_mla", 64): True, ("nvfp4_ds_mla", 16): True}
