#!/usr/bin/env bash
# tally under PyTorch on a real GPU, in one command (a few minutes at most):
#
#   bash bench/gpu/torch_check.sh            # on a machine with a GPU and PyTorch
#   bash bench/gpu/torch_check.sh --compile-only   # anywhere: byte-compile the Python parts
#
# Builds tally, then trains a small transformer (torch.nn, random tokens, a
# few hundred steps, stages load / train / eval, tags) twice in separate
# processes: under PyTorch's own caching allocator and under tally (through
# `python -m tally run`). Prints steps/s and peak reserved memory of both,
# tally's memory summary and stage report, and checks, under tally:
#   - memory_summary equals PyTorch's own rendering of the same statistics;
#   - an enormous allocation raises a RuntimeError that Python catches, and
#     the process carries on;
#   - torch.cuda.empty_cache(), set_per_process_memory_fraction() and
#     Tensor.record_stream() reach tally (its statistics change);
#   - a deliberately leaked tensor is found at exit (leak report and the JSON
#     report written at exit), and exit after Python's teardown is clean.
# Exits non-zero when any check fails.
#
# Environment: TALLY_LIB (use this libtally.so instead of building),
# TALLY_CHECK_STEPS (training steps, default 300), TALLY_CHECK_DIR (where to
# put the scripts, logs and reports; default a new temporary folder),
# PYTHON (default python3).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python3}
STEPS=${TALLY_CHECK_STEPS:-300}
COMPILE_ONLY=0
[ "${1:-}" = "--compile-only" ] && COMPILE_ONLY=1
WORK=${TALLY_CHECK_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/tally-torch-check.XXXXXX")}
mkdir -p "$WORK"

# ---------------------------------------------------------------------------
# The workload: one training run, native or under tally, results as JSON.
cat >"$WORK/workload.py" <<'PYEOF'
"""A small transformer language model trained on random tokens, with tally's
stages and tags when run under tally, plus tally's PyTorch checks."""

import argparse
import contextlib
import ctypes
import json
import sys
import time
import traceback

import torch
import torch.nn as nn

MiB = 1 << 20


class TinyLM(nn.Module):
    def __init__(self, vocab=8192, dim=512, heads=8, layers=6, seq=256):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens):
        n = tokens.shape[1]
        h = self.emb(tokens) + self.pos[:n]
        return self.head(self.enc(h, mask=self.mask[:n, :n], is_causal=True))


def train(args, stage, tag):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    vocab, seq, batch = 8192, 256, 32
    with stage("load"), tag("weights"):
        model = TinyLM(vocab=vocab, seq=seq).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    loss_fn = nn.CrossEntropyLoss()

    def step():
        x = torch.randint(0, vocab, (batch, seq), device=dev)
        y = torch.randint(0, vocab, (batch, seq), device=dev)
        with tag("activations"), torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        with tag("optimizer"):
            opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    warmup = 20
    with stage("train"):
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    with stage("eval"), tag("eval"), torch.no_grad():
        model.eval()
        x = torch.randint(0, vocab, (batch, seq), device=dev)
        eval_loss = loss_fn(model(x).flatten(0, 1), x.flatten()).item()
    return model, opt, {"steps": args.steps, "seconds": elapsed, "steps_per_s": args.steps / elapsed,
                        "final_loss": float(loss.item()), "eval_loss": eval_loss}


def tally_checks(result):
    """The checks that only make sense under tally. Each records True/False."""
    import tally

    checks = result["checks"]
    lib = tally.library()

    def stats():
        return tally.memory_stats(0)

    # memory_summary: tally's text against PyTorch's own renderer fed the
    # same statistics (torch.cuda.memory.memory_summary is Python over
    # memory_stats, which cannot answer for a pluggable allocator itself).
    mem = torch.cuda.memory
    original_stats = mem.memory_stats
    mem.memory_stats = tally.memory_stats
    try:
        for abbreviated in (False, True):
            ours = tally.memory_summary(0, abbreviated=abbreviated)
            theirs = mem.memory_summary(0, abbreviated=abbreviated)
            same = ours == theirs
            checks[f"summary_matches_torch{'_abbreviated' if abbreviated else ''}"] = same
            if not same:
                for a, b in zip(ours.splitlines(), theirs.splitlines()):
                    if a != b:
                        print(f"summary differs:\n  tally: {a}\n  torch: {b}", file=sys.stderr)
                        break
    finally:
        mem.memory_stats = original_stats

    # OOM: a catchable RuntimeError, not a NULL tensor; the process goes on.
    ooms = stats()["num_ooms"]
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
        checks["oom_raises"] = False
    except RuntimeError as e:
        text = str(e)
        print(f"caught as expected: {type(e).__name__}: {text[:160]}...", file=sys.stderr)
        checks["oom_raises"] = "out of memory" in text
    checks["oom_counted"] = stats()["num_ooms"] == ooms + 1
    after_oom = torch.ones(MiB, device="cuda")
    checks["alloc_after_oom"] = float(after_oom.sum().item()) == MiB
    del after_oom

    # torch.cuda.empty_cache() -> tally_torch_empty_cache.
    scratch = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del scratch
    reserved = tally.memory_reserved(0)
    torch.cuda.empty_cache()
    checks["empty_cache_reaches_tally"] = tally.memory_reserved(0) < reserved

    # Tensor.record_stream -> tally_torch_record_stream: the freed block stays
    # active (waiting on the side stream's event) instead of being reused.
    side = torch.cuda.Stream()
    x = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(side):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(200_000_000)  # keeps the side stream busy
        x.add_(1)
    x.record_stream(side)
    s = stats()
    pending_before = s["active.all.current"] - s["allocation.all.current"]
    del x
    s = stats()
    checks["record_stream_reaches_tally"] = s["active.all.current"] - s["allocation.all.current"] == pending_before + 1
    side.synchronize()
    torch.cuda.empty_cache()
    s = stats()
    checks["record_stream_completes"] = s["active.all.current"] == s["allocation.all.current"]

    # set_per_process_memory_fraction -> tally_torch_memory_fraction.
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.25, 0)
    try:
        torch.empty(int(total * 0.4), dtype=torch.uint8, device="cuda")
        checks["memory_fraction_reaches_tally"] = False
    except RuntimeError:
        checks["memory_fraction_reaches_tally"] = True
    torch.cuda.set_per_process_memory_fraction(1.0, 0)

    # patch_torch: torch.cuda's own statistics functions answer from tally.
    tally.patch_torch()
    checks["patch_torch"] = (torch.cuda.memory_allocated() == tally.memory_allocated(0)
                             and torch.cuda.memory_stats()["num_ooms"] >= 1)

    # A deliberate leak: the extra reference keeps the tensor alive through
    # Python's teardown, so tally's exit report must name it.
    with tally.tag("deliberate-leak"):
        leak = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(leak))
    checks["leak_visible_now"] = any(g["tag"] == "deliberate-leak" for g in tally.leaks())

    print(tally.memory_summary(0), file=sys.stderr)
    print(tally.ledger_text(), file=sys.stderr)
    checks["tally_check"] = lib.tally_check() == 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("native", "tally"), required=True)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()

    result = {"mode": args.mode, "checks": {}, "error": None}
    if args.mode == "tally":
        import tally

        tally.install()  # already done by `python -m tally run`: returns the same allocator
        stage, tag = tally.stage, tally.tag
        result["backend"] = tally.backend()
        result["checks"]["backend_is_cuda"] = result["backend"] == "cuda"
    else:
        stage = tag = lambda name: contextlib.nullcontext()
    try:
        model, opt, timing = train(args, stage, tag)
        result.update(timing)
        if args.mode == "tally":
            import tally

            result["peak_reserved"] = tally.max_memory_reserved(0)
            result["peak_allocated"] = tally.max_memory_allocated(0)
        else:
            result["peak_reserved"] = torch.cuda.max_memory_reserved(0)
            result["peak_allocated"] = torch.cuda.max_memory_allocated(0)
        del model, opt
        if args.mode == "tally":
            tally_checks(result)
    except Exception:
        result["error"] = traceback.format_exc()
        print(result["error"], file=sys.stderr)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    return 1 if result["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
PYEOF

# ---------------------------------------------------------------------------
# The verdict: both runs side by side, then every check.
cat >"$WORK/verdict.py" <<'PYEOF'
"""Compare the native and tally runs and check tally's findings."""

import json
import os
import sys

work = sys.argv[1]
failures = []


def load(name):
    path = os.path.join(work, name)
    if not os.path.exists(path):
        failures.append(f"{name} was not written")
        return {}
    with open(path) as f:
        return json.load(f)


native, ours = load("native.json"), load("tally.json")
GiB = float(1 << 30)
print(f"{'allocator':<10} {'steps/s':>9} {'peak reserved':>15} {'peak allocated':>15}  loss")
for name, r in (("native", native), ("tally", ours)):
    if "steps_per_s" in r:
        print(f"{name:<10} {r['steps_per_s']:9.2f} {r['peak_reserved'] / GiB:11.3f} GiB "
              f"{r['peak_allocated'] / GiB:11.3f} GiB  {r['final_loss']:.3f}")
    if r.get("error"):
        failures.append(f"{name} run failed: {r['error'].strip().splitlines()[-1]}")
if "steps_per_s" in native and "steps_per_s" in ours:
    print(f"tally / native: speed {ours['steps_per_s'] / native['steps_per_s']:.3f}, "
          f"peak reserved {ours['peak_reserved'] / max(native['peak_reserved'], 1):.3f}")

for name, ok in ours.get("checks", {}).items():
    print(f"  {'ok  ' if ok else 'FAIL'} {name}")
    if not ok:
        failures.append(name)

report = load("report.json")
leaks = [g for g in report.get("leaks", []) if g.get("tag") == "deliberate-leak"]
print(f"  {'ok  ' if leaks else 'FAIL'} exit report names the deliberate leak"
      + (f" ({leaks[0]['bytes']} bytes, stage {leaks[0]['stage']}, device {leaks[0]['device']})" if leaks else ""))
if not leaks:
    failures.append("deliberate leak missing from the exit report")
with open(os.path.join(work, "tally.stderr")) as f:
    stderr = f.read()
found = "tag deliberate-leak" in stderr
print(f"  {'ok  ' if found else 'FAIL'} leak report printed at exit names the deliberate leak")
if not found:
    failures.append("leak report text")

if failures:
    print("torch_check: FAILED: " + "; ".join(failures))
    sys.exit(1)
print("torch_check: all checks passed")
PYEOF

if [ "$COMPILE_ONLY" = 1 ]; then
  "$PYTHON" -m py_compile "$WORK/workload.py" "$WORK/verdict.py"
  echo "torch_check: Python parts compile"
  [ -z "${TALLY_CHECK_DIR:-}" ] && rm -rf "$WORK"
  exit 0
fi

echo "== torch_check in $WORK"
"$PYTHON" -c 'import torch, sys; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda); sys.exit(0 if torch.cuda.is_available() else 1)' \
  || { echo "torch_check: needs PyTorch with a CUDA device"; exit 1; }

# ---------------------------------------------------------------------------
# Build. The setup stamp skips tools/setup.sh (apt-get), which cannot reach
# a package registry on a GPU machine; what make needs must already be there.
if [ -z "${TALLY_LIB:-}" ]; then
  BUILD="$ROOT/build"
  mkdir -p "$BUILD" && touch "$BUILD/.setup-ok"
  make -C "$ROOT" lib >"$WORK/make.log" 2>&1 || { tail -30 "$WORK/make.log"; echo "torch_check: make lib failed"; exit 1; }
  TALLY_LIB="$BUILD/lib/libtally.so"
  # Until the Makefile links lib/torch/torch_oom.cc into libtally.so, link a copy
  # that has it, so the OOM path is still checked (and say so).
  if ! "$PYTHON" -c "import ctypes,sys; sys.exit(0 if ctypes.CDLL('$TALLY_LIB').tally_torch_oom_raises() else 1)"; then
    echo "NOTE: $TALLY_LIB lacks lib/torch/torch_oom.cc (Makefile change not applied): checking a copy linked with it"
    g++ -std=c++17 -O2 -fPIC -fvisibility=hidden -c "$ROOT/lib/torch/torch_oom.cc" -o "$WORK/torch_oom.o"
    cuda_home=${CUDA_HOME:-/usr/local/cuda}
    cuda_libs=()
    [ -e "$cuda_home/lib64/libcudart.so" ] && cuda_libs=(-L"$cuda_home/lib64" -lcudart "-Wl,-rpath,$cuda_home/lib64")
    g++ -shared -o "$WORK/libtally.so" "$BUILD"/obj/*.o "$WORK/torch_oom.o" \
      -Wl,--version-script="$ROOT/lib/exports.map" -lpthread -ldl -lm "${cuda_libs[@]}"
    TALLY_LIB="$WORK/libtally.so"
  fi
fi
export TALLY_LIB
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -m tally info

# ---------------------------------------------------------------------------
echo "== native allocator: $STEPS steps"
env -u TALLY_CONF timeout 180 "$PYTHON" "$WORK/workload.py" --mode native --steps "$STEPS" --json "$WORK/native.json" \
  || echo "torch_check: the native run failed (status $?)"

echo "== tally: $STEPS steps under python -m tally run"
status=0
TALLY_CONF="backend:cuda,persistent_tags:weights|optimizer,leak_report:full,report_path:$WORK/report.json" \
  timeout 240 "$PYTHON" -m tally run --ledger "$WORK/workload.py" --mode tally --steps "$STEPS" --json "$WORK/tally.json" \
  2>"$WORK/tally.stderr" || status=$?
cat "$WORK/tally.stderr"
if [ "$status" -ne 0 ]; then
  echo "torch_check: the tally run exited with status $status (a crash at teardown shows here too)"
fi

echo "== verdict"
"$PYTHON" "$WORK/verdict.py" "$WORK" && [ "$status" -eq 0 ]
