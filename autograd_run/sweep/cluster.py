"""Running batches of grid points on Dask distributed: an embedded LocalCluster, or an existing scheduler.

``connect(scheduler, workers)`` yields a ``Client``: with no scheduler, a
``LocalCluster`` of ``workers`` processes (one thread each: the work holds
the GIL) listening on 127.0.0.1 only, sized to the machine by default; with
``tcp://HOST:PORT``, that scheduler's workers (set up with ``dask scheduler``
and ``dask worker``). Before any work the workers' tool fingerprints are
compared with the client's: a worker that runs other code (or cannot import
``autograd_run`` at all) stops the sweep with a clear message.

``run_batches`` sends each graph once (or sends only its path, for a
filesystem the workers share), submits one task per batch, largest graphs
first, and reports each batch as it completes. A worker process that dies is
replaced by its nanny and its tasks are rescheduled by Dask (a batch fails
only after it has killed ``distributed.scheduler.allowed-failures`` workers);
on ``KeyboardInterrupt`` every unfinished task is cancelled and the
interruption re-raised, the finished results having been reported already.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import Callable, Iterator

from autograd_run.errors import RequestError, UsageError
from autograd_run.sweep.evaluate import error_text, hold, make_payload, run_batch
from autograd_run.sweep.fingerprint import tool_fingerprint

MISSING = ("the sweep runs on Dask distributed, which is not installed: "
           "pip install 'autograd-run[sweep]' (or run in this process with --workers 0)")
CONNECT_TIMEOUT_S = 10.0
WORKER_WAIT_S = 60


def require_distributed():
    """The ``distributed`` module, or a usage error saying how to install it."""
    try:
        import distributed
    except ImportError:
        raise UsageError(MISSING) from None
    return distributed


def check_distributed() -> None:
    """A usage error saying how to install ``distributed`` when it is not, without importing it (0.5 s with
    the pandas it imports): a sweep answered from the cache alone never needs it."""
    import importlib.util
    if importlib.util.find_spec("distributed") is None:
        raise UsageError(MISSING)


def default_workers() -> int:
    """One worker process per CPU this process may use."""
    from autograd_run.engine.threads import usable_cpus
    return usable_cpus()


@contextmanager
def _quiet(verbose: bool):
    """Dask's own warnings (a worker restarted, a slow event loop) stay off stderr unless ``verbose``."""
    logger = logging.getLogger("distributed")
    level = logger.level
    if not verbose:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


#: Schemes whose location is ``HOST:PORT`` (Dask's ``distributed.comm`` backends).
HOST_PORT_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
ADDRESS_FORM = "tcp://HOST:PORT"


def check_scheduler_address(address: str) -> None:
    """Refuse (``RequestError`` on ``scheduler``) what cannot be a Dask scheduler address, by its text alone:
    no connection, no DNS, not even Dask's import (a sweep answered from the cache checks it too). It follows
    ``distributed.comm``'s parsing: ``[SCHEME://]LOCATION``, the scheme ``tcp`` when none is given, and
    ``HOST:PORT`` (``[IPv6]:PORT``) for the TCP-like schemes; a scheme of a plugin (an entry point in
    ``distributed.comm.backends``) is left to that plugin to parse when connecting."""
    def bad(why: str):
        raise RequestError(f"{address} is not a Dask scheduler address: {why} (expected {ADDRESS_FORM})",
                           "scheduler")

    if not address:
        bad("it is empty")
    if any(c.isspace() or not c.isprintable() for c in address):
        bad("it holds blanks or control characters")
    scheme, sep, loc = address.rpartition("://")
    if not sep:
        scheme = "tcp"
    if scheme == "inproc":
        if not loc:
            bad("no location after inproc://")
        return
    if scheme not in HOST_PORT_SCHEMES:
        if scheme and _plugin_scheme(scheme):
            return
        raise RequestError(f"{address} is not a Dask scheduler address: unknown scheme {scheme!r} (known: "
                           f"{', '.join(HOST_PORT_SCHEMES)}, inproc; as in {ADDRESS_FORM})", "scheduler")
    if loc.startswith("["):  # [IPv6]:PORT
        host, close, tail = loc[1:].partition("]")
        if not close or (tail and not tail.startswith(":")):
            bad("an IPv6 host is written [ADDRESS]:PORT")
        port = tail[1:] if tail else None
    else:
        host, colon, port = loc.rpartition(":")
        if not colon:
            host, port = port, None
        elif ":" in host:
            bad("an IPv6 host needs brackets, as in [::1]:8786")
    if not host:
        bad("no host")
    if port is None or port == "":
        bad("no port number")
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        bad(f"the port {port} is not a number in [1, 65535]")


def _plugin_scheme(scheme: str) -> bool:
    """Whether an installed package registers a ``distributed`` comm backend for ``scheme``."""
    from importlib.metadata import entry_points
    try:
        return any(True for _ in entry_points(group="distributed.comm.backends", name=scheme))
    except Exception:
        return False


def _open_client(distributed, target, **kwargs):
    """``distributed.Client(target, **kwargs)``, closed here when it fails to start. A Client that raises while
    connecting (a malformed address, an unknown scheme: a ValueError, which Dask does not clean up after) is
    left half-made, its event loop running: it would be closed only when the collector frees it, late and
    from a finalizer, which then waits for its own timeout (20 s) and prints a traceback. So the object is
    made first and started as a second step, keeping a reference to close it properly on failure."""
    client = distributed.Client.__new__(distributed.Client)
    try:
        client.__init__(target, **kwargs)
    except BaseException:
        _discard(client)
        raise
    return client


def _discard(client) -> None:
    """Close a Client whose start failed, whatever state it was left in, without raising."""
    try:
        if getattr(client, "status", "newly-created") not in ("closed", "newly-created"):
            client.close(timeout=5)
    except Exception:
        pass
    finally:
        client.status = "closed"  # nothing left for its finalizer to do
        if not hasattr(client, "_Client__loop"):  # failed before the finalizer's own check could be set up
            client._Client__loop = None
        runner = getattr(client, "_loop_runner", None)  # a Client that Dask closed itself keeps its loop thread
        if runner is not None:
            try:
                runner.stop()
            except Exception:
                pass


@contextmanager
def connect(scheduler: str | None, workers: int | None, verbose: bool = False,
            timeout_s: float = CONNECT_TIMEOUT_S) -> Iterator[tuple[object, str]]:
    """(client, description) for an existing scheduler or a new LocalCluster; closed on exit."""
    distributed = require_distributed()
    with _quiet(verbose):
        cluster = None
        try:
            if scheduler:
                check_scheduler_address(scheduler)
                try:
                    client = _open_client(distributed, scheduler, timeout=f"{timeout_s}s", set_as_default=False)
                except Exception as exc:  # refused, timed out, or a backend that fails (ucx: removed from Dask)
                    why = str(exc) if isinstance(exc, (OSError, TimeoutError, ValueError)) else error_text(exc)
                    raise RequestError(f"cannot reach the Dask scheduler at {scheduler}: {why}", "scheduler") from None
            else:
                n = workers or default_workers()
                cluster = _local_cluster(distributed, n, verbose)
                client = _open_client(distributed, cluster, set_as_default=False)
        except BaseException:
            if cluster is not None:
                cluster.close(timeout=20)
            raise
        try:
            try:
                client.wait_for_workers(1, timeout=WORKER_WAIT_S)
            except (TimeoutError, OSError):
                raise RequestError(f"no worker joined the scheduler at {scheduler} within {WORKER_WAIT_S} s",
                                   "scheduler") from None
            check_workers(client)
            n = len(client.scheduler_info(n_workers=-1)["workers"])
            desc = f"{scheduler}, {n} workers" if scheduler else f"LocalCluster, {n} worker processes"
            yield client, desc
        finally:
            client.close(timeout=10)
            if cluster is not None:
                cluster.close(timeout=20)


#: The embedded cluster has no dashboard to show profiles or GIL contention, so the workers do not sample
#: them: for this pure-Python, CPU-bound work that sampling only takes GIL time from the points.
QUIET_WORKERS = {"distributed.worker.profile.enabled": False, "distributed.admin.system-monitor.gil.enabled": False}


def _local_cluster(distributed, n: int, verbose: bool):
    """``n`` worker processes, one thread each, on 127.0.0.1 only (the HTTP endpoint on a free port there too)."""
    import dask
    with dask.config.set(QUIET_WORKERS):  # a nanny hands its configuration to the worker process it starts
        return distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                                        dashboard_address="127.0.0.1:0",
                                        silence_logs=logging.DEBUG if verbose else logging.CRITICAL,
                                        preload=["autograd_run.sweep.worker_setup"])


def check_workers(client) -> None:
    """Refuse workers that cannot import autograd_run, or that run other code than this client."""
    mine = tool_fingerprint()
    try:
        theirs = client.run(tool_fingerprint)
    except Exception as exc:
        raise UsageError("the Dask workers cannot run autograd-run's sweep (install autograd-run[sweep] where "
                         f"they run): {error_text(exc)}") from None
    other = {addr: fp for addr, fp in theirs.items() if fp != mine}
    if other:
        addr, fp = sorted(other.items())[0]
        raise UsageError(f"the worker at {addr} runs another autograd-run ({fp}) than this client ({mine}): "
                         "install the same version and code on the client and every worker")


def worker_threads(client) -> int:
    return sum(w.get("nthreads", 1) for w in client.scheduler_info(n_workers=-1)["workers"].values()) or 1


#: How often a batch whose finished result was lost with its worker is waited for again before it is an error.
LOST_WAITS = 3


def run_batches(client, grid, batches: list[tuple[int, list]], send: bool,
                done: Callable[[int, dict | None, str | None], None]) -> None:
    """Run ``batches`` ((graph index, points)) on the cluster; ``done(batch index, result, error)`` per batch.

    Each graph is sent once (when ``send``), every batch of it referring to that one piece of data.
    """
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    order = sorted(range(len(batches)), key=lambda i: -grid.graphs[batches[i][0]].size * len(batches[i][1]))
    payloads: dict[int, object] = {}
    futures = {}
    try:
        for i in order:
            gi, points = batches[i]
            if gi not in payloads:
                try:
                    payload = make_payload(grid.graphs[gi], send)
                except Exception as exc:
                    payloads[gi] = exc
                else:
                    # A task that returns the payload, not scattered data: the scheduler keeps the task, so a
                    # copy lost with a dead worker is made again instead of failing every batch of the graph.
                    key = f"autograd-run-graph-{gi}-{os.urandom(4).hex()}"
                    payloads[gi] = client.submit(hold, payload, pure=False, key=key) if send else payload
            if isinstance(payloads[gi], Exception):
                done(i, None, error_text(payloads[gi]))
                continue
            key = f"autograd-run-sweep-{i}-{os.urandom(4).hex()}"
            fut = client.submit(run_batch, payloads[gi], points, pure=False, key=key)
            futures[fut] = i
        waits: dict = {}  # future -> how often it was waited for again after its result was lost
        pending = as_completed(list(futures), loop=client.loop)
        for fut in pending:
            if fut.status == "lost" and waits.get(fut, 0) < LOST_WAITS:
                # done, but its result was on a worker that died before it was fetched: the scheduler computes
                # it again (the client still holds the future), so it is waited for again
                waits[fut] = waits.get(fut, 0) + 1
                pending.add(fut)
                continue
            i = futures.pop(fut)
            if fut.status == "finished":
                done(i, fut.result(), None)
                continue
            exc = fut.exception() if fut.status == "error" else None
            if isinstance(exc, KilledWorker):
                done(i, None, "the worker process running these points died repeatedly (killed, or out of memory?)")
            else:
                done(i, None, error_text(exc) if exc is not None else f"the task was {fut.status}")
            fut.release()
    except BaseException:
        pending = list(futures)
        if pending:
            client.cancel(pending, force=True)
        raise
    finally:
        sent = [p for p in payloads.values() if not isinstance(p, Exception) and send]
        if sent:
            try:
                client.cancel(sent, force=True)
            except Exception:
                pass
