"""Reading an untrusted JSON trace file: plain or gzipped, with the size bounded before and after decompression.

``read_bounded(path, max_bytes)`` returns the file's bytes, decompressed
when it starts with gzip's magic bytes (the content decides, not the
extension). A file, or a decompressed stream, longer than ``max_bytes`` is
refused without reading the rest, so a gzip bomb costs at most
``max_bytes`` of memory. Errors are ``RequestError`` naming the file and
the request field (``option``).
"""

from __future__ import annotations

import gzip
import os
import zlib

from autograd_run.errors import RequestError

#: The largest trace (after decompression) read: 1 GiB.
MAX_TRACE_BYTES = 1 << 30
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20


def read_bounded(path: str, option: str, max_bytes: int = MAX_TRACE_BYTES) -> bytes:
    """The bytes of ``path`` (gunzipped when gzipped), at most ``max_bytes`` of them."""
    from autograd_run import untrusted
    try:
        f = untrusted.open_regular(path, max_bytes)  # a FIFO or /dev/zero is refused, not read
    except untrusted.Problem as p:
        raise RequestError(f"{path}: {p.what}", option) from None
    try:
        with f:
            head = f.read(2)
            if head != _GZIP_MAGIC:
                data = head + f.read(max_bytes - len(head) + 1)
                if len(data) > max_bytes:  # it grew since it was opened
                    raise RequestError(f"{path}: more than the limit of {max_bytes} bytes", option)
                return data
            f.seek(0)
            out = bytearray()
            with gzip.GzipFile(fileobj=f) as z:
                while True:
                    chunk = z.read(_CHUNK)
                    if not chunk:
                        break
                    out += chunk
                    if len(out) > max_bytes:
                        raise RequestError(f"{path}: decompresses to more than the limit of {max_bytes} bytes "
                                           "(refused: a gzip bomb, or a trace too large)", option)
            return bytes(out)
    except RequestError:
        raise
    except (OSError, EOFError, zlib.error) as exc:
        raise RequestError(f"{path}: cannot read: {exc}", option) from None
