"""``autograd-run capture`` and ``check``: a real PyTorch backward graph into a file, and a replay against it."""

from __future__ import annotations

import os
import warnings

import click

from autograd_run.cli import capture_golden
from autograd_run.cli.common import Finite, Whole, echo, graph_format, max_memory_option
from autograd_run.errors import OrderMismatch, UsageError


@click.command()
@click.argument("script")
@click.option("-o", "--output", default=None, metavar="FILE", help="Graph file to write (.json or .yaml); tensors go to a .npz beside it.")
@click.option("--profile", is_flag=True,
              help="Also measure each node's cost with PyTorch's profiler (stored in the graph; `simulate` uses it).")
@click.option("--steps", type=Whole(1, 10_000), default=10, show_default=True, metavar="N",
              help="--profile: profiled backward calls (costs are their median).")
@click.option("--warmup", type=Whole(0, 10_000), default=3, show_default=True, metavar="N",
              help="--profile: backward calls before profiling.")
@click.option("--profile-trace", default=None, metavar="FILE",
              help="--profile: also keep the last profiled step's PyTorch profiler trace (Chrome JSON) here.")
@click.option("--order-out", default=None, metavar="FILE",
              help="Write PyTorch's executed order as a golden order (JSON Lines).")
@click.option("--expect-order", default=None, metavar="FILE",
              help="Compare PyTorch's executed order with a golden order (exit 3 with the first divergence).")
@click.option("--check", "check_replay", is_flag=True,
              help="Also replay the graph and compare order and gradients with PyTorch's (as `check`).")
def capture(script, output, profile, steps, warmup, profile_trace, order_out, expect_order, check_replay):
    """Capture a PyTorch backward graph: SCRIPT.py[:FUNC] (FUNC defaults to `main`).

    FUNC takes no arguments and returns the outputs (a tensor, e.g. a loss, or a
    list), or `(outputs, names)` with names a mapping of leaves (e.g.
    `dict(model.named_parameters())`), or a dict with keys `outputs`, `names`,
    `inputs` (tensors to take gradients for), `grad_outputs` and `parameters`
    (the model: its parameters in registration order, and, for a model wrapped
    in DistributedDataParallel, DDP's settings, for `simulate --ddp captured`;
    `autograd_run.capture.one_process_group()` starts the one-rank gloo group
    DDP needs, ended after FUNC returns).

    With --profile, FUNC runs again for each step (--warmup steps, then
    --steps rounds of one timed step and one under torch.profiler), and each
    node's measured cost (the median of its evaluate_function span, and of
    its kernels per stream on a GPU) is stored in the graph with the device,
    PyTorch version and date.

    Golden orders: `--order-out` writes PyTorch's own executed order (the
    order file of `run --order-out`, with each node's identity across
    processes: name and rank among the graph's nodes of that name counted
    from the loss, or the leaf's name; and the PyTorch version);
    `--expect-order` compares it with one (exit 3 with the first divergence
    and the ready set at that pop).

    \b
    Example:
      autograd-run capture model.py:main -o model.json
      autograd-run check model.json
      autograd-run capture model.py:main -o model.json --profile --steps 20
      autograd-run simulate model.json       # uses the measured costs
      autograd-run capture model.py:main --order-out golden.jsonl
      autograd-run capture model.py:main --expect-order golden.jsonl --check
    """
    import importlib.util
    import runpy
    from autograd_run.capture import from_torch
    path, _, func = script.partition(":")
    func = func or "main"
    if not os.path.isfile(path):
        raise UsageError(f"{path}: " + ("not a regular file (a folder, a device or a FIFO)" if os.path.exists(path)
                                         else "no such file"))
    if not (output or order_out or expect_order or check_replay):
        raise UsageError("give -o FILE, --order-out FILE, --expect-order FILE or --check")
    written: dict[str, str] = {}  # what this capture writes: never an input, no two at one path
    if output:
        graph_format(output)
        capture_golden.claim(written, output, "output", "the graph", [path, expect_order])
        capture_golden.claim(written, os.path.splitext(output)[0] + ".npz", "output", "the graph's .npz",
                             [path, expect_order])
    if profile and not output:
        raise UsageError("--profile stores the measured costs in the graph file: give -o FILE")
    from click.core import ParameterSource
    given = click.get_current_context().get_parameter_source
    if not profile and (profile_trace or any(given(o) is not ParameterSource.DEFAULT for o in ("steps", "warmup"))):
        raise UsageError("--steps, --warmup and --profile-trace go with --profile")
    if profile_trace:
        capture_golden.claim(written, profile_trace, "profile_trace", "the profiler trace", [path, expect_order])
    golden = capture_golden.prepare(path, written, order_out, expect_order)
    if importlib.util.find_spec("torch") is None:
        raise UsageError("capture needs PyTorch, which is not installed: pip install 'autograd-run[torch]'")
    from autograd_run.capture.distributed import end_process_group
    click.get_current_context().call_on_close(end_process_group)  # the group one_process_group() started
    namespace = _user_call(path, "running the script", lambda: runpy.run_path(path, run_name="__autograd_run_capture__"))
    from autograd_run.capture.inner import register_script
    register_script("__autograd_run_capture__", path, namespace)  # its custom Functions: replayed from the file
    fn = namespace.get(func)
    if not callable(fn):
        raise UsageError(f"{path}: no function {func!r}" if func not in namespace else
                         f"{path}: {func!r} is not a function (it is of type {type(fn).__name__})")
    result = _user_call(path, f"{func}()", fn)
    if isinstance(result, dict) and "outputs" not in result:
        raise UsageError(f"{path}: {func}() returned a dict without 'outputs'")
    outputs, kw = _split(result)
    with warnings.catch_warnings():  # told below from meta.hooks, once and plainly
        warnings.filterwarnings("ignore", message="(tensor hooks (are not part|held as data)|module backward hooks)")
        if order_out or expect_order or check_replay:
            doc = capture_golden.finish(outputs, kw, output, order_out, expect_order, check_replay, golden,
                                        _describe, f"{path}: {func}()")
        else:
            try:
                doc = from_torch(outputs, path=output, **kw)
            except (ValueError, RuntimeError, TypeError) as exc:
                raise UsageError(f"{path}: {func}() returned what cannot be captured: {exc}") from exc
            echo(_describe(output, doc))
    hooks = doc.get("meta", {}).get("hooks")
    if hooks:
        from autograd_run.capture.hooks import warning_text
        text = warning_text(hooks)
        echo(f"{'Warning' if 'runs without them' in text else 'Note'}: {text}", err=True)
    opaque = [n for n in doc["nodes"] if n.get("op") == "opaque"]
    python = [n for n in doc["nodes"] if n.get("op") == "python"]
    if output and python:  # `run` and `check` refuse the file without --allow-python: say so now
        calls = sorted({str(n.get("attrs", {}).get("function") or n.get("attrs", {}).get("callable") or n["name"])
                        for n in python})
        echo(f"Note: {len(python)} node{'s' if len(python) > 1 else ''} kept as Python code that the replay calls "
             f"({', '.join(calls[:3])}{', ...' if len(calls) > 3 else ''}): run and check them with "
             "--allow-python", err=True)
    if output:
        for n in opaque[:5]:
            echo(f"  opaque {n['id']} {n['name']}: {n.get('attrs', {}).get('reason', '')}")
        if len(opaque) > 5:
            echo(f"  ... and {len(opaque) - 5} more opaque nodes")
    if profile:
        from autograd_run.capture.profile import profile_capture
        from autograd_run.cli.render import fmt_ns
        def forward():  # the program's forward again: each profiled step is a real step
            outs, more = _split(_user_call(path, f"{func}()", fn))
            return outs, more.get("grad_outputs"), more.get("inputs")
        try:
            measured = profile_capture(output, doc, forward, steps=steps, warmup=warmup, keep_trace=profile_trace)
        except (ValueError, RuntimeError) as exc:
            raise UsageError(f"profiling failed: {type(exc).__name__}: {exc}") from exc
        cov = measured.get("coverage", {})
        wall = measured["backward_wall_ns"]
        echo(f"{output}: measured {len(measured['nodes'])} of {len(doc['nodes'])} nodes over {steps} profiled "
             f"backward calls on {measured['device']}; PyTorch's backward without the profiler: "
             f"{fmt_ns(wall['median'])} (median of {wall['runs']}, {wall['faults_median']:,.0f} minor page faults a "
             "call)" + (f"; {cov.get('matched', 0)} nodes matched" if cov else ""))


def _describe(output: str, doc: dict) -> str:
    """The line a written capture is reported with."""
    opaque = sum(1 for n in doc["nodes"] if n.get("op") == "opaque")
    nested = sum(1 for n in doc["nodes"] if n.get("op") == "checkpoint")
    return (f"{output}: {len(doc['nodes'])} nodes, {len(doc['variables'])} leaves"
            + (f", {nested} checkpoint(s) with their nested graphs" if nested else "")
            + (f", {opaque} opaque (no rule)" if opaque else "")
            + f"; PyTorch reference: {len(doc['meta']['reference']['order'])} nodes run")


def _split(result):
    """FUNC's result as (outputs, from_torch keywords)."""
    kw = {}
    if isinstance(result, dict):
        outputs = result.get("outputs")
        kw = {k: result[k] for k in ("names", "inputs", "grad_outputs", "parameters") if k in result}
    elif isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict):
        outputs, kw["names"] = result
    else:
        outputs = result
    return outputs, kw


@click.command()
@click.argument("graph", metavar="FILE")
@click.option("--rtol", type=Finite(0), default=None, metavar="TOL",
              help="Relative tolerance  [default: by the lowest precision on the way to each leaf: 1e-6 for "
                   "float64, 1e-4 for float32, 1e-2 for float16]")
@click.option("--atol", type=Finite(0), default=None, metavar="TOL",
              help="Absolute tolerance  [default: by precision: 1e-9, 1e-6, 1e-3]")
@click.option("--allow-opaque", is_flag=True,
              help="Pass although ops without a rule (opaque nodes) keep some gradients from being compared.")
@click.option("--allow-python", is_flag=True,
              help="Allow python nodes (custom autograd.Functions captured with their backward) to import and "
                   "run their code.")
@max_memory_option
def check(graph, rtol, atol, allow_opaque, allow_python, max_memory):
    """Replay a captured graph and compare order and gradients with PyTorch's reference.

    Exit 0 when they agree, 3 otherwise (also when opaque nodes keep a gradient
    from being compared, unless --allow-opaque).

    \b
    Example:
      autograd-run check model.json --rtol 1e-5
    """
    from autograd_run.capture.check import check_graph
    from autograd_run.cli.render import columns
    from autograd_run.cli.terminal import PlainTable as Table, make_console, plain
    from autograd_run.cli.common import load_graph_arg
    g = load_graph_arg(graph, max_bytes=max_memory, allow_python=allow_python, keep=True)
    report = check_graph(g, rtol, atol, allow_opaque=allow_opaque, allow_python=allow_python)
    console = make_console()
    if report.order_ok:
        console.print(plain(f"order: {report.order_len[1]} nodes, same as PyTorch"))
    else:
        d = report.divergence
        console.print(plain(f"order: differs at position {d['position']}: expected {d['expected']}, got {d['got']}"))
    if report.note:
        console.print(plain(report.note))
    if report.grads:
        t = columns(Table(title="gradients against PyTorch"), ("leaf", "id"), ("max abs err", "num"),
                    ("max rel err", "num"), ("tolerance (rtol, atol)", "text"), ("ok", "text"))
        for g in report.grads:
            tol = "-" if g.rtol is None else f"{g.rtol:g}, {g.atol:.3g}" + (f" ({g.precision})" if g.precision else "")
            ok = "-" if not g.compared else ("yes" if g.ok else "NO") + ("*" if g.rounding_of is not None else "")
            t.add_row(g.name, "-" if g.max_abs is None else f"{g.max_abs:.3g}",
                      "-" if g.max_rel is None else f"{g.max_rel:.3g}", tol, ok + (f" ({g.note})" if g.note else ""))
        console.print(t)
        floored = [g for g in report.grads if g.rounding_of is not None]
        if floored:
            from autograd_run.capture.check import ATOL_SHARE
            g = floored[0]
            console.print(plain(
                f"* {len(floored)} leaf gradient(s) within {g.precision}'s rounding: the absolute tolerance is "
                f"{ATOL_SHARE.get(g.precision, 1e-5):g} of the largest gradient the same node gives its leaves "
                f"(up to {max(x.rounding_of for x in floored):.3g}). A gradient that is zero in exact arithmetic "
                "(a BatchNorm's bias before another BatchNorm) is the rounding of large terms, in PyTorch's "
                "backward as in the replay; --atol sets a fixed one."))
    if not report.ok:
        why = ("opaque nodes keep gradients from being compared (--allow-opaque accepts that)"
               if report.order_ok and all(g.ok for g in report.grads if g.compared) else
               "replay differs from the PyTorch reference")
        raise OrderMismatch(f"{graph}: {why}")


def _user_call(path: str, what: str, call):
    """Run the user's code; its failure is shown as the user's error (type, message, and where in their
    file), a usage error (exit 2), not a traceback of ours.

    Meanwhile ``os._exit`` ends nothing: called on the main thread it is that error; on another thread, that
    thread ends quietly and the call is the same error once it returns. The working folder is put back
    afterwards (the outputs' paths are the user's, relative to where the command was typed), and a process the
    user's code forked ends where the call returns in it (it would otherwise go on running this command)."""
    import threading
    import traceback

    pid, cwd, exits = os.getpid(), os.getcwd(), []

    def no_exit(code):  # os._exit would end this process with the user's status and nothing written
        if threading.current_thread() is threading.main_thread():
            raise _UserExit(code)
        exits.append(code)
        raise SystemExit(code)  # (a thread's SystemExit ends it without a traceback)
    real_exit, os._exit = os._exit, no_exit
    threads = set(threading.enumerate())
    try:
        result = call()
        if exits:
            raise _UserExit(exits[0])
        return result
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:
        raise UsageError(f"{path}: {what} exited (SystemExit: {exc.code})") from None
    except _UserExit as exc:
        where = "" if not exits else " on a thread of its own"
        raise UsageError(f"{path}: {what} called os._exit({exc.args[0]!r}){where}: nothing was captured") from None
    except BaseException as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == os.path.abspath(path)]
        where = f" (line {frames[-1].lineno})" if frames else ""
        raise UsageError(f"{path}: {what} raised {type(exc).__name__}: {exc}{where}") from None
    finally:
        os._exit = real_exit
        if os.getpid() != pid:  # a child the user's code forked, back in this command's code: it ends here
            real_exit(0)
        _back_to(cwd)
        left = [t for t in threading.enumerate() if t not in threads and not t.daemon and t.is_alive()]
        if left:
            names = ", ".join(t.name for t in left[:3]) + (", ..." if len(left) > 3 else "")
            echo(f"Note: {path}: {what} left {len(left)} thread{'s' if len(left) > 1 else ''} running ({names}): "
                 "this command ends when they do (Ctrl-C stops it)", err=True)


def _back_to(cwd: str) -> None:
    """Back into ``cwd`` where the user's code moved out of it (``os.chdir``)."""
    try:
        if os.getcwd() == cwd:
            return
    except OSError:  # the folder it moved into is gone
        pass
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise UsageError(f"cannot return to the folder the command started in ({cwd}): {exc.strerror}") from None


class _UserExit(BaseException):
    """The user's code called ``os._exit`` (``_user_call``)."""
