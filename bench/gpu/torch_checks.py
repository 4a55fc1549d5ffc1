"""tally's PyTorch checks for a GPU machine (issue 11), one per process:

    python3 bench/gpu/torch_checks.py CHECK        # CHECK: contexts, last_error, graph, conv, train, ipc
    python3 bench/gpu/torch_checks.py train --native
    python3 bench/gpu/torch_checks.py graph --async  # the graph check on backend:async
    python3 bench/gpu/torch_checks.py ipc --expandable  # base_alloc refuses expandable memory
    python3 bench/gpu/torch_checks.py empty-cache       # what empty_cache gives back (20 MiB cells)

Each prints exactly one line, ``PASS name: figures``, ``FAIL name: why`` or
``SKIP name: why``, and exits 0 (PASS, SKIP) or 1 (FAIL). bench/gpu/run_all.sh
runs them all. tally is installed (``tally.install()``) before any CUDA use,
except for ``train --native``, PyTorch's own allocator for comparison.
"""

import ctypes
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

MiB = 1 << 20


def say(status, name, text):
    print(f"{status} {name}: {text}", flush=True)
    return 0 if status in ("PASS", "SKIP") else 1


def start(native=False):
    import torch

    if not torch.cuda.is_available():
        return torch, None
    if native:
        return torch, None
    import tally

    tally.install()
    return torch, tally


def cuda_last_error():
    """cudaPeekAtLastError() of the CUDA runtime PyTorch loaded (the same
    library instance, found in this process's memory map)."""
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libcudart" in line and "/" in line})
    if not paths:
        return None
    rt = ctypes.CDLL(paths[0])
    return rt.cudaPeekAtLastError()


def check_contexts():
    """Tally's work on device 0 creates no context on any other device."""
    torch, tally = start()
    n = torch.cuda.device_count()
    if n < 2:
        return say("SKIP", "contexts", f"{n} visible device: needs two or more")
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda:0")
    side = torch.cuda.Stream(device=0)
    with torch.cuda.stream(side):
        y = x * 2
    y.record_stream(torch.cuda.current_stream(0))
    del x, y
    torch.cuda.synchronize(0)
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(0.9, 0)
    tally.memory_stats(0)
    others = [i for i in range(1, n) if torch._C._cuda_hasPrimaryContext(i)]
    if others:
        return say("FAIL", "contexts", f"primary context created on device(s) {others} (only device 0 was used)")
    return say("PASS", "contexts", f"no primary context on devices 1..{n - 1} after alloc, streams, "
               "record_stream, empty_cache, memory_fraction on device 0")


def check_last_error():
    """A failing tally operation leaves no CUDA error behind for PyTorch."""
    torch, tally = start()
    if tally is None:
        return say("SKIP", "last_error", "no CUDA device")
    kind = "none"
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    except RuntimeError as e:
        kind = type(e).__name__
    before = cuda_last_error()
    y = torch.ones(1 << 20, device="cuda") * 3  # a kernel launch, checked by PyTorch
    torch.cuda.synchronize()
    after = cuda_last_error()
    if kind == "none":
        return say("FAIL", "last_error", "allocating 1 PiB did not raise")
    if before not in (0, None) or after not in (0, None):
        return say("FAIL", "last_error", f"cudaPeekAtLastError = {before} after the OOM, {after} after a kernel")
    return say("PASS", "last_error", f"OOM raised {kind}; cudaPeekAtLastError = {before} after it, kernel "
               f"launch and synchronize clean (sum {float(y.sum()):.0f})")


def check_graph(async_backend=False):
    """torch.cuda.graph capture of a small model under tally (the default
    backend, or backend:async), replayed 100 times: each replay's output
    equals the eager model's on the same input."""
    name = "graph-async" if async_backend else "graph"
    if async_backend:
        conf = os.environ.get("TALLY_CONF", "")
        os.environ["TALLY_CONF"] = (conf + "," if conf else "") + "backend:async"
    torch, tally = start()
    if tally is None:
        return say("SKIP", name, "no CUDA device")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).cuda()
    static_in = torch.randn(64, 512, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            static_out = model(static_in)
    except Exception as e:  # tally refusing allocation inside a capture says so
        return say("FAIL", name, f"capture failed: {type(e).__name__}: {str(e).splitlines()[0]}")
    worst = 0.0
    replays = 100
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(replays):
            static_in.copy_(torch.randn(64, 512, device="cuda"))
            graph.replay()
            worst = max(worst, float((static_out - model(static_in)).abs().max()))
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1000 / replays
    backend = tally.backend()
    if worst > 1e-3:
        return say("FAIL", name, f"replay differs from eager by {worst:g} (backend {backend!r})")
    return say("PASS", name, f"backend {backend!r}: captured and replayed {replays} times, "
               f"max |replay - eager| = {worst:.2g}, {ms:.2f} ms per replay+eager; "
               f"tally reserved {tally.memory_reserved() / MiB:.0f} MiB")


def check_conv():
    """Near the memory limit a convolution falls back to a smaller cuDNN
    workspace instead of raising (needs the c10::OutOfMemoryError shim)."""
    torch, tally = start()
    if tally is None:
        return say("SKIP", "conv", "no CUDA device")
    from tally import _oom_shim

    kind, detail = _oom_shim.state() or ("?", "install() did not run")
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
        oom_type = "nothing"
    except torch.cuda.OutOfMemoryError:
        oom_type = "torch.cuda.OutOfMemoryError"
    except RuntimeError as e:
        oom_type = type(e).__name__
    torch.backends.cudnn.benchmark = False
    conv = torch.nn.Conv2d(256, 256, 3, padding=1).cuda().half()
    x = torch.randn(32, 256, 128, 128, device="cuda", dtype=torch.half)
    with torch.no_grad():
        conv(x)  # unconstrained: cuDNN's preferred algorithm and its workspace
        torch.cuda.synchronize()
        base = tally.memory_allocated()
        tally.reset_peak_memory_stats()
        out = conv(x)
        torch.cuda.synchronize()
        workspace = tally.max_memory_allocated() - base - out.numel() * 2
        del out
        torch.cuda.synchronize()
        tally.empty_cache()
        if workspace < 16 * MiB:
            return say("SKIP", "conv", f"the convolution needs only {workspace / MiB:.1f} MiB of workspace here; "
                       f"OOM type {oom_type} ({kind})")
        total = torch.cuda.mem_get_info()[1]
        cap = base + x.numel() * 2 + 4 * MiB  # room for the output, not for the workspace
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total))
        try:
            conv(x)
            torch.cuda.synchronize()
        except RuntimeError as e:
            return say("FAIL", "conv", f"raised {type(e).__name__} near the limit instead of falling back "
                       f"(OOM type {oom_type}; shim: {kind}, {detail}): {str(e).splitlines()[0][:120]}")
    if oom_type != "torch.cuda.OutOfMemoryError":
        return say("FAIL", "conv", f"an OOM raised {oom_type}, not torch.cuda.OutOfMemoryError ({kind}: {detail})")
    return say("PASS", "conv", f"preferred workspace {workspace / MiB:.0f} MiB; with {4} MiB to spare the conv "
               f"ran on a smaller one; OOM type {oom_type}")


def check_train(native):
    """A small training loop: steps/s and peak reserved."""
    torch, tally = start(native)
    name = "train-native" if native else "train-tally"
    if not torch.cuda.is_available():
        return say("SKIP", name, "no CUDA device")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, norm_first=True)
    model = torch.nn.Sequential(torch.nn.Embedding(8192, 512), torch.nn.TransformerEncoder(layer, 4),
                                torch.nn.Linear(512, 8192)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    steps = int(os.environ.get("TALLY_TRAIN_STEPS", "150"))
    t0 = None
    for step in range(steps + 10):
        if step == 10:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        tokens = torch.randint(0, 8192, (16, 256), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens)
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, 8192), tokens.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    rate = steps / (time.perf_counter() - t0)
    peak = torch.cuda.max_memory_reserved() if native else tally.max_memory_reserved()
    return say("PASS", name, f"{rate:.1f} steps/s, peak reserved {peak / MiB:.0f} MiB, loss {float(loss):.3f}")


def _ipc_child(conn):
    """The receiving process of the ipc check: sums the tensor it was sent
    (opened through CUDA IPC), adds one to it and sends the sum back."""
    import torch

    t = conn.recv()
    total = float(t.sum())
    t.add_(1)
    torch.cuda.synchronize()
    conn.send(total)
    del t
    conn.recv()  # the parent has read the change: the handle may close


def check_ipc(expandable=False):
    """A tensor in tally's memory sent to another process (torch.multiprocessing,
    CUDA IPC through base_alloc): from the default segments it arrives and the
    other process's write comes back; from expandable segments base_alloc
    refuses it with tally's reason, since cudaIpcGetMemHandle takes cudaMalloc
    memory only."""
    name = "ipc-expandable" if expandable else "ipc"
    if expandable:
        os.environ["TALLY_CONF"] = ",".join(filter(None, [os.environ.get("TALLY_CONF", ""), "expandable_segments:true"]))
    torch, tally = start()
    if tally is None:
        return say("SKIP", name, "no CUDA device")
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    p = ctx.Process(target=_ipc_child, args=(theirs,))
    p.start()
    x = torch.ones(1 << 20, device="cuda")  # 4 MiB: a large-pool block
    try:
        mine.send(x)  # pickled here: base_alloc runs in this thread
    except Exception as e:
        p.kill()
        from tally._lib import last_error

        if expandable and "cannot share" in last_error():
            return say("PASS", name, f"refused by base_alloc: {last_error()[:90]}")
        return say("FAIL", name, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if expandable:
        p.kill()
        return say("FAIL", name, "a tensor of expandable segments was sent: base_alloc did not refuse it")
    total = mine.recv()
    torch.cuda.synchronize()
    changed = float(x.sum())
    mine.send(None)
    p.join(30)
    n = x.numel()
    if total != n or changed != 2 * n:
        return say("FAIL", name, f"the other process saw {total:.0f} (want {n}), its write gave {changed:.0f} (want {2 * n})")
    return say("PASS", name, f"{n * 4 / MiB:.0f} MiB sent through CUDA IPC, read and written by another process")


def check_empty_cache():
    """What torch.cuda.empty_cache gives back to the driver under tally's
    expandable segments (docs/benchmarks.md, run Z): a 200 MiB tensor freed,
    a 4 MiB one placed at the start of its hole, then empty_cache. With one
    physical handle per map call (expandable_handle_grid_mb:0) the whole
    200 MiB stays mapped; with the default 20 MiB cells only the cell under
    the 4 MiB tensor does. Measured as the driver's free memory
    (torch.cuda.mem_get_info) and tally's reserved bytes."""
    name = "empty-cache"
    os.environ["TALLY_CONF"] = ",".join(filter(None, [os.environ.get("TALLY_CONF", ""), "expandable_segments:true"]))
    torch, tally = start()
    if tally is None:
        return say("SKIP", name, "no CUDA device")
    kept = {}
    for grid in (0, 20):
        tally.configure({"expandable_handle_grid_mb": grid})
        torch.cuda.synchronize()
        tally.empty_cache()
        free0 = torch.cuda.mem_get_info()[0]
        x = torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
        x_ptr = x.data_ptr()
        del x
        y = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        if y.data_ptr() != x_ptr:
            return say("FAIL", name, f"grid {grid}: the 4 MiB tensor is not at the freed block's start")
        torch.cuda.synchronize()
        tally.empty_cache()
        kept[grid] = (free0 - torch.cuda.mem_get_info()[0], tally.memory_reserved())
        del y
        tally.empty_cache()
    (drv0, res0), (drv20, res20) = kept[0], kept[20]
    text = (f"one handle per call keeps {drv0 / MiB:.0f} MiB of the driver's memory ({res0 / MiB:.0f} reserved), "
            f"20 MiB cells {drv20 / MiB:.0f} ({res20 / MiB:.0f} reserved)")
    if drv0 >= 190 * MiB and drv20 <= 24 * MiB and res20 <= 24 * MiB:
        return say("PASS", name, text)
    return say("FAIL", name, text + "; want at least 190 and at most 24")


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    name = argv[0]
    checks = {"contexts": check_contexts, "last_error": check_last_error,
              "graph": lambda: check_graph("--async" in argv[1:]),
              "conv": check_conv, "train": lambda: check_train("--native" in argv[1:]),
              "ipc": lambda: check_ipc("--expandable" in argv[1:]), "empty-cache": check_empty_cache}
    if name not in checks:
        print(f"unknown check {name}; one of {', '.join(checks)}")
        return 2
    try:
        import torch  # noqa: F401
    except ImportError:
        return say("SKIP", name, "PyTorch is not installed")
    try:
        return checks[name]()
    except Exception as e:
        traceback.print_exc()
        return say("FAIL", name, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
