"""``python -m tally``: run a program under tally, and small tools around
tally's reports. ``python -m tally --help`` lists the commands."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib.util
import os
import runpy
import shutil
import subprocess
import sys
import traceback
from pathlib import Path
from typing import List, Optional

from . import _oom_shim, _reports, _stats
from ._lib import WRITE_FN, TallyError, call, has, library, library_path
from ._options import configure, options, options_text
from ._torch import install

DESCRIPTION = "tally: a caching GPU memory allocator that knows who owns every byte."

RUN_HELP = """\
Run a Python program with tally as PyTorch's CUDA allocator: tally is installed
before the program starts (so before any CUDA use), the program runs as
`python script.py args...` would (sys.argv set, __name__ == "__main__"), and
when it returns tally prints the memory summary of each device used and the
leak report (live blocks by tag, stage and device). The exit status is the
program's, or leak_exitcode when that is set, the program succeeded and
blocks are still live. Without PyTorch the program still runs, with tally's C
API loaded."""


class CliError(Exception):
    """A mistake in what the command was asked to do: printed as one line
    "tally: MESSAGE", the command exits with ``status``."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def _err(message: str) -> None:
    print(f"tally: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _held_diagnostics():
    """While the command sets tally up, the library's diagnostics lines are
    held back: if setting up fails, the command prints the error once (the
    library would have printed it too); if it succeeds, they are passed on."""
    held: List[bytes] = []
    sink = WRITE_FN(lambda _arg, text, length: held.append(ctypes.string_at(text, length)))
    lib = library()
    lib.tally_set_sink(sink, None)
    try:
        yield
    except BaseException:
        lib.tally_set_sink(WRITE_FN(), None)
        raise
    lib.tally_set_sink(WRITE_FN(), None)
    if held:
        sys.stderr.write(b"".join(held).decode("utf-8", "replace"))
        sys.stderr.flush()


def _init(confs=(), start: bool = True) -> None:
    """Apply each configuration, then (start) initialise tally, reading
    TALLY_CONF first; CliError naming the problem."""
    with _held_diagnostics():
        try:
            for conf in confs:
                configure(conf)
            if start:
                call("tally_init")
        except TallyError as e:
            raise CliError(str(e), 2) from None


def _exit_code(code) -> int:
    """The status Python would exit with for SystemExit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _import_torch() -> bool:
    """Import PyTorch if it is there. Done before libtally.so is loaded, so
    that the CUDA runtime PyTorch brings is the one tally binds to."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _install_torch(have_torch: bool) -> str:
    """Install tally into PyTorch if present; say what happened."""
    if not have_torch:
        return "PyTorch is not installed: running without tally's PyTorch allocator (the C API is loaded)"
    try:
        install()
    except TallyError as e:
        return f"{e}; running without tally's PyTorch allocator"
    return f"installed as PyTorch's CUDA allocator ({library_path()})"


def _release_torch_caches() -> None:
    """Free what PyTorch itself keeps until exit (cuBLAS workspaces), so it
    is not reported as the program's leak."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        try:
            torch.cuda.synchronize()
            clear()
        except RuntimeError:
            pass


def _used_devices() -> List[int]:
    if has("tally_backend_started") and not library().tally_backend_started():
        return []  # nothing allocated: do not start the backend (CUDA) to say so
    count = library().tally_device_count()
    used = [d for d in range(max(count, 0)) if _stats.max_memory_reserved(d) > 0]
    return used


def _print_exit_report(args) -> int:
    """Print the summary and leak report; return the live bytes."""
    sys.stdout.flush()
    out = sys.stderr
    if not args.quiet:
        used = _used_devices()
        for device in used:
            out.write(_stats.memory_summary(device))
        if not used:
            out.write("tally: no device memory was used\n")
        if args.ledger:
            out.write(_reports.ledger_text())
    live = sum(group["bytes"] for group in _reports.leaks())
    # The program has ended: these are its leaks, worded as at exit.
    out.write(_reports.leaks_text(full=not args.quiet, at_exit=True))
    if not live:
        out.write("tally: no leaks: every block was freed\n")
    out.flush()
    return live


def _check_runnable(args) -> None:
    """The script or module exists, as python itself checks before running
    anything (so no summary follows an error of the command line). For
    pkg.mod only pkg is looked up: finding pkg.mod would import pkg, and so
    run its code before tally is installed."""
    if args.module:
        top = args.module.partition(".")[0]
        sys.path.insert(0, os.getcwd())
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError) as e:
            raise CliError(f"run: cannot import {args.module}: {e}") from None
        finally:
            sys.path.pop(0)
        if spec is None:
            raise CliError(f"run: no module named {top}")
        return
    script = args.args[0]
    try:
        with open(script, "rb"):
            pass
    except OSError as e:
        raise CliError(f"run: cannot open {script}: {e.strerror}", 2) from None


def _check_report_path(path: str) -> None:
    """--report's folder exists and can be written, checked before the
    program runs (a CI job must not lose its report at the end of a run).
    A folder named with %r or %p is checked when the report is written."""
    folder = os.path.dirname(path) or "."
    if "%" in folder:
        return
    if not os.path.isdir(folder):
        raise CliError(f"run: --report {path}: cannot write there: no folder {folder}", 2)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CliError(f"run: --report {path}: cannot write there: folder {folder} is not writable", 2)


def _write_run_report() -> None:
    """Write report_path's report now, when the program has ended, and
    leave none for the library's exit (whose failure could not change the
    exit status): CliError if it cannot be written."""
    if not options().get("report_path"):
        return
    try:
        with _held_diagnostics():
            _reports.write_report(None)
    except TallyError as e:
        raise CliError(f"run: {e}") from None
    finally:
        configure({"report_path": ""})


def _runner_file(filename: str) -> bool:
    """A frame of the machinery that starts the program (this module,
    tally/__main__.py, runpy), not of the program itself (lib/ledger/pystack.c
    leaves the same frames out of recorded sites)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return (filename in (os.path.join(here, "_cli.py"), os.path.join(here, "__main__.py"), runpy.__file__,
                         "<frozen runpy>") or filename.endswith(os.sep + "runpy.py"))


def _print_program_error() -> None:
    """The program's exception as Python prints it for `python script.py`:
    the runner's frames (which come first) left out."""
    exc_type, exc, tb = sys.exc_info()
    while tb is not None and _runner_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(exc_type, exc, tb)


def _cmd_run(args) -> int:
    if not args.module and not args.args:
        raise CliError("run: give a script (or -m module) to run", 2)
    _check_runnable(args)
    if args.report:
        _check_report_path(args.report)
    have_torch = _import_torch()
    # TALLY_CONF is checked here (the library would only say so at its first
    # allocation), but the backend is not started before the program runs, so
    # that it can still set CUDA_VISIBLE_DEVICES.
    with _held_diagnostics():
        try:
            configure(os.environ.get("TALLY_CONF", ""))
        except TallyError as e:
            raise CliError(f"TALLY_CONF: {e}", 2) from None
    _init(list(args.conf) + ([{"report_path": args.report}] if args.report else []), start=False)
    _err(_install_torch(have_torch))

    saved_argv, saved_path = sys.argv[:], sys.path[:]
    code = 0
    try:
        if args.module:
            sys.argv = [args.module] + list(args.args)
            sys.path.insert(0, os.getcwd())
            runpy.run_module(args.module, run_name="__main__", alter_sys=True)
        else:
            script = args.args[0]
            sys.argv = list(args.args)
            # As `python script.py` does: the script's folder comes first.
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        _print_program_error()
        code = 130
    except BaseException:  # the program's own error: reported as Python would
        _print_program_error()
        code = 1
    finally:
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path

    gc.collect()
    _release_torch_caches()
    live = _print_exit_report(args)
    leak_exitcode = int(options().get("leak_exitcode", "0") or 0)
    if code == 0 and live and leak_exitcode:
        code = leak_exitcode
    try:
        _write_run_report()
    except CliError as e:
        _err(str(e))
        code = code or e.status
    # This report replaces the one the library would print at exit. The
    # library's exit status rule (leak_exitcode) stays in force there for a
    # program that succeeded; for one that failed it is turned off, or the
    # library's exit would replace the failure's status with the leak code.
    configure({"leak_report": "off", **({"leak_exitcode": "0"} if code else {})})
    return code


def _cmd_info(args) -> int:
    have_torch = _import_torch()
    torch = sys.modules.get("torch") if have_torch else None
    _init()
    print(f"tally {library().tally_version().decode()}")
    print(f"library: {library_path()}")
    backend = library().tally_backend_name().decode()
    chosen = options().get("backend", "auto")
    # The library says why only when a driver is there but unusable; here the
    # choice is always explained.
    if chosen == "auto" and backend == "host":
        backend += " (backend:auto: no usable CUDA driver, so simulated devices in host memory)"
    elif chosen == "auto":
        backend += " (backend:auto: the CUDA driver works)"
    print(f"backend: {backend}")
    print(f"devices: {library().tally_device_count()}")
    # What tally.install() would make an out-of-memory raise (building the
    # shim now if torch is there and it is not cached yet).
    if has("tally_torch_set_oom_raiser"):
        kind, detail = _oom_shim.install(torch)
    else:
        raises = library().tally_torch_oom_raises() if has("tally_torch_oom_raises") else 0
        kind, detail = (_oom_shim.RUNTIME_ERROR if raises else _oom_shim.NULL), "an older libtally.so"
    print(f"out-of-memory in PyTorch: {_oom_shim.describe(kind, detail)}")
    if torch is not None:
        print(f"PyTorch: {torch.__version__} (CUDA {torch.version.cuda})")
    else:
        print("PyTorch: not installed")
    return 0


def _cmd_options(args) -> int:
    _init()
    if args.explain:
        sys.stdout.write(options_text())
    else:
        print(",".join(f"{key}:{value}" for key, value in options().items()))
    return 0


def _cmd_snapshot(args) -> int:
    try:
        doc = _reports.load_report(args.report)
    except ValueError as e:
        raise CliError(f"snapshot: {e}") from None
    out = args.output or str(Path(args.report).with_suffix(".pickle"))
    try:
        _reports.dump_snapshot(out, doc)
    except OSError as e:
        raise CliError(f"snapshot: cannot write {out}: {e.strerror}") from None
    traces = sum(len(t) for t in _reports.snapshot_from_report(doc)["device_traces"])
    segments = len(doc.get("segments", []))
    html = f"{Path(out).stem}.html"
    if traces:
        print(f"tally: wrote {out} ({segments} segments, {traces} trace events); "
              f"view it with: python -m torch.cuda._memory_viz trace_plot {out} -o {html}")
    else:
        print(f"tally: wrote {out} ({segments} segments, no trace events: the report has no timeline, "
              f"record one with TALLY_CONF=timeline:true); "
              f"view the segments with: python -m torch.cuda._memory_viz segment_plot {out} -o {html}")
    return 0


def _find_cli() -> Optional[str]:
    """The tally command-line tool: $TALLY_CLI, else the one a pip install
    puts inside the package (tally/bin/tally), else the build tree's beside
    the library (build/bin/tally), else `tally` on PATH."""
    env = os.environ.get("TALLY_CLI")
    if env:
        return env
    for candidate in (Path(__file__).resolve().parent / "bin" / "tally",
                      Path(library_path()).resolve().parent.parent / "bin" / "tally"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("tally")


def _run_cli(command: str, args: List[str]) -> int:
    """Run `tally COMMAND ARGS...` (the C tool) and return its status: its
    output, errors and exit status are the command's own."""
    cli = _find_cli()
    if not cli:
        raise CliError(f"{command}: the tally command-line tool was not found (build it with `make`, "
                       "or set TALLY_CLI to its path)", 2)
    sys.stdout.flush()
    try:
        return subprocess.call([cli, command, *args])
    except OSError as e:
        raise CliError(f"{command}: cannot run {cli}: {e.strerror}", 2) from None


# The tally command's own subcommands (tools/tally_cli.c): `python -m tally
# COMMAND ...` runs them as they are, so a pip-only user has the whole tool,
# with the same help, messages and exit status.
TOOL_COMMANDS = {
    "summary": "the torch.cuda.memory_summary table of a report or memory_stats dump (runs `tally summary`)",
    "ledger": "ownership by tag x stage x device, stages, live blocks (runs `tally ledger`)",
    "merge": "merge per-rank JSON reports into one table (runs `tally merge`)",
    "plot": "memory over time, stacked by tag, as SVG or HTML (runs `tally plot`)",
    "tune": "replay a trace, PyTorch snapshot or report under candidate allocator settings and recommend one "
            "(runs `tally tune`)",
    "version": "print the version (runs `tally version`)",
}
PY_COMMANDS = ("run", "info", "options", "snapshot")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tally", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")

    run = sub.add_parser("run", help="run a Python program under tally and report at exit",
                         description=RUN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--conf", action="append", default=[], metavar="KEY:VALUE,...",
                     help="tally configuration (TALLY_CONF syntax), applied on top of TALLY_CONF; repeatable")
    run.add_argument("--report", metavar="PATH",
                     help="also write the JSON report at exit (report_path; %%r is the rank, %%p the pid)")
    run.add_argument("--ledger", action="store_true", help="also print the ledger table and stage history")
    run.add_argument("--quiet", action="store_true", help="print only the leak SUMMARY line at exit")
    run.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m MODULE does")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="script.py args...",
                     help="the program and its arguments")
    run.set_defaults(func=_cmd_run)

    info = sub.add_parser("info", help="print the library's version, path, backend and devices")
    info.set_defaults(func=_cmd_info)

    opts = sub.add_parser("options", help="print the configuration in effect as a TALLY_CONF value",
                          description="Print the configuration in effect as one line that is a TALLY_CONF "
                                      "value configuring the same thing.")
    opts.add_argument("--explain", action="store_true", help="one key:value line per key, with its help")
    opts.set_defaults(func=_cmd_options)

    snap = sub.add_parser("snapshot", help="convert a JSON report to a PyTorch memory snapshot pickle")
    snap.add_argument("report", help="a JSON report written by tally (report_path or tally.write_report)")
    snap.add_argument("-o", "--output", help="the pickle to write (default: the report's name with .pickle)")
    snap.set_defaults(func=_cmd_snapshot)

    for name, text in TOOL_COMMANDS.items():
        # main() hands these to the C tool before parsing (their options and
        # help are the tool's: `python -m tally NAME --help`).
        tool = sub.add_parser(name, add_help=False, help=text)
        tool.add_argument("tool_args", nargs=argparse.REMAINDER, metavar="...", help="passed to the tool as they are")
    return parser


def _unknown_command(name: str) -> int:
    """As the tally command says it: one line naming the nearest command,
    then where the help is; exit status 2."""
    import difflib

    commands = list(PY_COMMANDS) + list(TOOL_COMMANDS)
    near = difflib.get_close_matches(name, commands, n=1, cutoff=0.6)
    hint = f"did you mean '{near[0]}'? " if near else ""
    _err(f"unknown command '{name}' ({hint}commands: {', '.join(commands)})")
    print("Try 'python -m tally --help'.", file=sys.stderr)
    return 2


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and (argv[0] in TOOL_COMMANDS or argv[0] == "--version"):
        try:
            return _run_cli(argv[0], argv[1:])
        except CliError as e:
            _err(str(e))
            return e.status
    if argv[:1] and not argv[0].startswith("-") and argv[0] not in PY_COMMANDS:
        return _unknown_command(argv[0])
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except CliError as e:
        _err(str(e))
        return e.status
    except (ImportError, TallyError) as e:
        if os.environ.get("TALLY_DEBUG"):
            raise
        _err(str(e))
        return 2
    except Exception as e:  # tally's own failure: one line; TALLY_DEBUG=1 shows the traceback
        if os.environ.get("TALLY_DEBUG"):
            raise
        _err(f"{args.command}: {type(e).__name__}: {e} (TALLY_DEBUG=1 shows where)")
        return 1
