"""tally.install() and tally.patch_torch() against a stand-in for PyTorch
that does what torch.cuda.memory's pluggable-allocator code does (open the
library with ctypes, take function addresses by name, call them through
those addresses), so the wiring is tested where PyTorch is absent. With a
CUDA PyTorch present, the real thing is exercised as well."""

import textwrap
import unittest

from . import support

FAKE_TORCH = textwrap.dedent(
    """\
    import ctypes, sys, types

    calls = []
    ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
    FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
    INIT = ctypes.CFUNCTYPE(None, ctypes.c_int)
    RESET = ctypes.CFUNCTYPE(None)
    FRACTION = ctypes.CFUNCTYPE(None, ctypes.c_double, ctypes.c_int)
    RECORD = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
    BASE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t))

    class Handle:
        # torch._C._CUDAPluggableAllocator: setters take function addresses.
        def __init__(self):
            self.hooks = {}
        def set_init_fn(self, a): self.hooks["init"] = INIT(a)
        def set_reset_fn(self, a): self.hooks["reset"] = RESET(a)
        def set_memory_fraction_fn(self, a): self.hooks["fraction"] = FRACTION(a)
        def set_record_stream_fn(self, a): self.hooks["record"] = RECORD(a)
        def set_base_alloc_fn(self, a): self.hooks["base"] = BASE(a)

    class CUDAPluggableAllocator:
        def __init__(self, path, alloc_name, free_name):
            lib = ctypes.CDLL(path)   # as torch does
            self.path = path
            self.alloc = ALLOC(ctypes.cast(getattr(lib, alloc_name), ctypes.c_void_p).value)
            self.free = FREE(ctypes.cast(getattr(lib, free_name), ctypes.c_void_p).value)
            self._handle = Handle()
            calls.append(("created", alloc_name, free_name))
        def allocator(self):
            return self._handle

    state = {"initialised": False, "current": None, "devices": 2}
    queued = []        # torch.cuda._lazy_call: run at lazy init
    cuda_queries = []  # calls that would initialise CUDA in a real torch

    def lazy_init():
        # As torch.cuda._lazy_init: CUDA init (which calls the allocator's init
        # hook with the device count), then the queued calls.
        state["initialised"] = True
        state["current"]._handle.hooks["init"](state["devices"])
        for fn in queued:
            fn()

    def device_count():
        cuda_queries.append("device_count")
        return state["devices"]

    def is_available():
        cuda_queries.append("is_available")
        return state["devices"] > 0

    def change_current_allocator(a):
        if state["initialised"]:
            raise RuntimeError("Can't swap an already initialized allocator")
        state["current"] = a
        calls.append(("changed",))

    def memory_stats(device=None): return "torch's"
    memory = types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator,
                                   change_current_allocator=change_current_allocator,
                                   memory_stats=memory_stats, memory_summary=lambda *a, **k: "torch's")
    cuda = types.SimpleNamespace(memory=memory, is_initialized=lambda: state["initialised"],
                                 current_device=lambda: 1, memory_stats=memory_stats,
                                 empty_cache=lambda: "torch's", _lazy_call=queued.append,
                                 device_count=device_count, is_available=is_available)
    # torch.accelerator (PyTorch 2.6+), with only some of its memory functions.
    accelerator = types.SimpleNamespace(memory_allocated=lambda device=None: "torch's",
                                        get_memory_info=lambda device=None: "torch's")
    torch = types.ModuleType("torch")
    torch.accelerator = accelerator
    torch.cuda = cuda
    torch.version = types.SimpleNamespace(cuda="13.0")
    torch._C = types.SimpleNamespace(_cuda_customAllocator=object())
    sys.modules["torch"] = torch
    """
)


class FakeTorchTest(unittest.TestCase):
    def run_with_fake_torch(self, body):
        r = support.run_python(["-c", FAKE_TORCH + textwrap.dedent(body)])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r

    def test_install_wires_allocator_and_hooks(self):
        r = self.run_with_fake_torch(
            """\
            import warnings
            import tally
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                a = tally.install("leak_exitcode:0")
            assert tally.installed()
            assert tally.install() is a                      # idempotent
            assert calls == [("created", "tally_torch_alloc", "tally_torch_free"), ("changed",)], calls
            assert state["current"] is a
            assert a.path == tally.library_path()
            assert set(a._handle.hooks) == {"init", "reset", "fraction", "record", "base"}
            raises = tally.library().tally_torch_oom_raises()
            assert any("torch_oom.cc" in str(x.message) for x in w) == (not raises), [str(x.message) for x in w]

            # What PyTorch does with them: allocate, hooks, free (with a wrong size).
            h = a._handle.hooks
            h["init"](2)
            p = a.alloc(1 << 20, 1, 0x99)
            assert p and tally.memory_allocated(1) == 1 << 20
            h["record"](p, 0x98)
            a.free(p, 5, 0, 0x99)
            assert tally.memory_allocated(1) == 0
            assert tally.memory_reserved(1) > 0
            h["reset"]()                                     # torch.cuda.empty_cache()
            assert tally.memory_reserved(1) == 0
            h["fraction"](0.5, 1)
            assert a.alloc(0, 0, None) is None
            # base_alloc: the segment of a block (a 2 MiB small-pool segment)
            q = a.alloc(1000, 0, None)
            size = ctypes.c_size_t(0)
            base = h["base"](q, ctypes.byref(size))
            assert size.value == 2 << 20 and base <= q < base + size.value, (base, q, size.value)
            a.free(q, 1000, 0, None)
            print("ok")
            """
        )
        self.assertIn("ok", r.stdout)
        self.assertIn("PyTorch passed 5 bytes", r.stderr)

    def test_install_announces_captures_only_with_the_graph_hooks(self):
        # With PyTorch's graph-pool hooks set, every capture reaches tally
        # first, so install() promises that (tally_graph_captures_announced);
        # without them (the fake Handle has none) it must not.
        for with_graph in (False, True):
            r = self.run_with_fake_torch(
                f"""\
                import warnings
                import tally
                if {with_graph}:
                    for name in ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool"):
                        setattr(Handle, name, lambda self, a, n=name: self.hooks.__setitem__(n, a))
                said = []
                tally.library().tally_graph_captures_announced = lambda: said.append(1)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tally.install()
                assert said == ([1] if {with_graph} else []), said
                print("ok")
                """
            )
            self.assertIn("ok", r.stdout)

    def test_install_refuses_after_cuda_init(self):
        r = self.run_with_fake_torch(
            """\
            import tally
            state["initialised"] = True
            try:
                tally.install()
            except RuntimeError as e:
                assert "before any CUDA use" in str(e), e
                print("refused")
            assert not tally.installed() and calls == []
            """
        )
        self.assertIn("refused", r.stdout)

    def test_install_rejects_a_cpu_only_torch(self):
        r = self.run_with_fake_torch(
            """\
            import tally
            torch.version.cuda = None
            try:
                tally.install()
            except tally.TallyError as e:
                assert "no CUDA support" in str(e), e
                print("rejected")
            """
        )
        self.assertIn("rejected", r.stdout)

    def test_install_does_not_start_tally_or_cuda(self):
        r = self.run_with_fake_torch(
            """\
            import tally
            lib = tally.library()
            a = tally.install()
            tally.patch_torch()
            tally.options()
            # Memory queries before anything is allocated answer as torch's do
            # before CUDA init, without starting anything.
            assert torch.cuda.memory_stats() == {} and tally.memory_allocated() == 0
            assert tally.max_memory_reserved(1) == 0
            tally.empty_cache(); tally.reset_peak_memory_stats()
            assert lib.tally_backend_started() == 0, "install() started tally's backend"
            assert cuda_queries == [], cuda_queries
            p = a.alloc(4096, 0, None)                      # the first allocation starts it
            assert p and lib.tally_backend_started() == 1
            assert tally.memory_stats(0)["allocation.all.current"] == 1
            a.free(p, 4096, 0, None)
            print("lazy")
            """
        )
        self.assertIn("lazy", r.stdout)

    def test_install_refuses_host_memory_for_a_real_gpu_at_cuda_init(self):
        r = self.run_with_fake_torch(
            """\
            import tally
            tally.install()                                  # no device query here
            assert cuda_queries == [] and tally.library().tally_backend_started() == 0
            try:
                lazy_init()                                  # PyTorch's lazy CUDA init: 2 devices
            except tally.TallyError as e:
                assert "host backend" in str(e), e
                print("refused")
            """
        )
        self.assertIn("refused", r.stdout)

    def test_host_backend_without_cuda_devices_is_fine(self):
        r = self.run_with_fake_torch(
            """\
            import tally
            state["devices"] = 0
            tally.install()
            lazy_init()
            assert tally.library().tally_backend_started() == 1   # the init hook started it
            print("fine")
            """
        )
        self.assertIn("fine", r.stdout)

    def test_patch_and_unpatch(self):
        r = self.run_with_fake_torch(
            """\
            import tally
            tally.patch_torch()
            assert torch.cuda.memory_stats is tally.memory_stats
            assert torch.cuda.memory.memory_stats is tally.memory_stats
            assert torch.cuda.memory.memory_summary is tally.memory_summary
            assert torch.cuda.empty_cache is tally.empty_cache
            assert not hasattr(torch.cuda, "memory_reserved")   # absent names stay absent
            assert torch.accelerator.memory_allocated is tally.memory_allocated
            assert torch.accelerator.get_memory_info is tally.mem_get_info
            assert not hasattr(torch.accelerator, "memory_stats")
            # device=None follows torch's current device once CUDA is initialised
            state["initialised"] = True
            assert tally.device_index(None) == 1
            assert torch.cuda.memory_stats() == {}              # tally not started yet, as torch before init
            p = tally.library().tally_malloc(4096, 1, None)
            assert torch.cuda.memory_stats()["allocation.all.current"] == 1
            tally.library().tally_free(p)
            tally.unpatch_torch()
            assert torch.cuda.memory_stats() == "torch's"
            assert torch.cuda.memory.memory_summary() == "torch's"
            assert torch.accelerator.get_memory_info() == "torch's"
            print("ok")
            """
        )
        self.assertIn("ok", r.stdout)

    def test_run_frees_cublas_workspaces_before_the_leak_report(self):
        # python -m tally run: what PyTorch keeps until exit (cuBLAS
        # workspaces) is let go, after a synchronise, before the report; not
        # while CUDA is uninitialised, and a RuntimeError there is not fatal.
        r = self.run_with_fake_torch(
            """
            from tally import _cli
            seen = []
            torch.cuda.synchronize = lambda: seen.append("sync")
            torch._C._cuda_clearCublasWorkspaces = lambda: seen.append("clear")
            _cli._release_torch_caches()
            assert seen == [], seen                     # CUDA not initialised
            state["initialised"] = True
            _cli._release_torch_caches()
            assert seen == ["sync", "clear"], seen
            def broken():
                raise RuntimeError("CUDA error")
            torch._C._cuda_clearCublasWorkspaces = broken
            _cli._release_torch_caches()
            assert seen == ["sync", "clear", "sync"], seen
            del torch._C._cuda_clearCublasWorkspaces    # an older PyTorch
            _cli._release_torch_caches()
            assert seen == ["sync", "clear", "sync"], seen
            print("ok")
            """
        )
        self.assertIn("ok", r.stdout)


def _cuda_torch():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@unittest.skipUnless(_cuda_torch(), "needs PyTorch with a CUDA device")
class RealTorchTest(unittest.TestCase):
    def test_tensors_come_from_tally(self):
        r = support.run_python(["-c", textwrap.dedent(
            """\
            import tally, torch
            tally.install()
            tally.patch_torch()
            with tally.stage("t"), tally.tag("x"):
                x = torch.empty(1 << 20, device="cuda")
            assert torch.cuda.memory_allocated() >= 4 << 20
            assert any(r["tag"] == "x" for r in tally.ledger())
            try:
                torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
            except RuntimeError as e:
                assert "out of memory" in str(e)
                print("oom caught")
            """)], conf="backend:cuda,leak_report:off")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("oom caught", r.stdout)


if __name__ == "__main__":
    unittest.main()
