"""The link between data-parallel ranks, as ``simulate --network`` takes it.

Four forms:

- ``alpha_us=A,gbps=B[,channels=C]``: one link for every world size (latency
  per message in us, bandwidth per rank in GB/s: NCCL's "bus bandwidth",
  the rate the ring's ``2 (p - 1) / p`` factor applies to; collectives in
  flight at once);
- a shipped link: ``nvlink-h100`` (NVLink 4 through NVSwitch inside a node),
  ``ib-ndr`` (InfiniBand NDR across nodes), ``roce-200``: nominal figures
  from data sheets, each file's ``source`` says which and what is assumed
  (the per-message latency); they have not been measured here;
- ``local-gloo``: measured here by ``autograd-run calibrate --gloo`` (one link
  per world size measured; processes on one host share its cores, so the
  link depends on how many there are);
- a JSON file of the same shape as ``local-gloo``'s (untrusted: bounded and
  checked, every problem named with its place)::

    {"name": "...", "channels": 1, "source": "...",
     "links": {"2": {"alpha_us": 600, "gbps": 1.2, "channels": 2}, "4": {...}}}

(``"backend": "gloo"``: reduce-scatters cost an all-reduce of the whole buffer, as
gloo runs them; ``"nccl"`` or none: a reduce-scatter; ``channels`` at the top: every
link's unless the link gives its own;
``during_compute``: a collective's speed while the compute runs, 1 when
unsaid, see ``collectives.Link``).

A file may give one ``link`` for every world size instead of ``links``.
``Network.link_for(world)`` is the link measured at that world size, else at
the nearest one measured (and a note that says so).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

from autograd_run.errors import RequestError
from autograd_run.outputs import cache_dir
from autograd_run.parallel.collectives import MAX_WORLD, Link

#: Calibrated here: the name and the file in the user cache folder.
LOCAL_GLOO = "local-gloo"
LOCAL_GLOO_FILE = "local-gloo-network.json"
MAX_NETWORK_FILE_BYTES = 1 << 20
MAX_LINKS = 4096


def local_gloo_path() -> str:
    return cache_dir(LOCAL_GLOO_FILE)


@dataclass
class Network:
    name: str
    #: world size -> link (0: every world size)
    links: dict[int, Link]
    source: str = ""
    notes: list[str] = field(default_factory=list)

    def link_for(self, world: int) -> tuple[Link, str | None]:
        """The link for ``world`` ranks and, when it was measured at another size, a note saying which."""
        if world in self.links:
            return self.links[world], None
        if 0 in self.links:
            return self.links[0], None
        near = min(self.links, key=lambda w: (abs(math.log(w) - math.log(world)), w))
        return self.links[near], (f"{self.name}: no link measured at {world} ranks; using the one measured at "
                                  f"{near} (processes on one host share its cores: expect a larger error)")


#: The range a link's figures may take (a file or ``--network``): wide enough for any real link (a
#: 1000-s latency, 1 KB/s to 1 PB/s), narrow enough that a simulated time stays a 64-bit count of ns.
LINK_RANGE = {"alpha_us": (0.0, 1e9), "gbps": (1e-6, 1e6)}


def link_value_problem(key: str, v) -> str | None:
    """Why ``v`` is no value for a link's ``key`` (``LINK_RANGE``), or None."""
    low, high = LINK_RANGE[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not low <= v <= high:
        return f"must be a number from {low:g} to {high:g}"
    return None


#: The collective backends a network file may name: gloo's reduce-scatter is an all-reduce of the whole buffer,
#: NCCL's (the default) a reduce-scatter.
BACKENDS = ("gloo", "nccl")


def _is_date_time(v) -> bool:
    """Whether ``v`` is an ISO 8601 date and time (``measured``: ``datetime.isoformat``'s text)."""
    import datetime
    if not isinstance(v, str) or len(v) > 64:
        return False
    try:
        datetime.datetime.fromisoformat(v)
    except ValueError:
        return False
    return True


#: The fields of one link in a network file: its figures, and what ``calibrate --gloo`` records of their fit
#: (read by nobody here; kept for the reader of the file).
LINK_FIELDS = frozenset(("alpha_us", "gbps", "channels", "during_compute",
                         "fit_worst", "pair_over_one", "repeat_spread", "points"))


def from_dict(doc, where: str) -> Network:
    """A network document (see the module docstring), checked as untrusted data."""
    def bad(place: str, what: str):
        return RequestError(f"{where}: at {place}: {what}", "network")
    if not isinstance(doc, dict):
        raise bad("$", "a network file is a JSON object")
    unknown = sorted(set(doc) - {"name", "backend", "channels", "link", "links", "source", "measured"})
    if unknown:
        raise bad(f"$.{unknown[0]}", "unknown field (fields: name, backend, channels, link, links, source, "
                                     "measured)")
    for key, what in (("name", "a string"), ("source", "a string (where the figures come from)")):
        if key in doc and not isinstance(doc[key], str):
            raise bad(f"$.{key}", f"must be {what}, got {repr(doc[key])[:40]}")
    if "measured" in doc and not _is_date_time(doc["measured"]):
        raise bad("$.measured", "must be the date and time the links were measured (ISO 8601, as calibrate --gloo "
                                f"writes it: 2025-01-31T12:00:00+00:00), got {repr(doc['measured'])[:40]}")
    if "backend" in doc and doc["backend"] not in BACKENDS:
        raise bad("$.backend", f"must be {' or '.join(map(repr, BACKENDS))} (gloo runs a reduce-scatter as an "
                               f"all-reduce of the whole buffer), got {repr(doc['backend'])[:40]}")
    channels = doc.get("channels", 1)
    if not (isinstance(channels, int) and not isinstance(channels, bool) and 1 <= channels <= 64):
        raise bad("$.channels", f"must be a whole number from 1 to 64, got {str(channels)[:40]!r}")
    if "link" in doc and "links" in doc:
        raise bad("$.link", "give link (every world size) or links (per world size), not both")
    links = {"0": doc["link"]} if "link" in doc else doc.get("links")
    if not isinstance(links, dict) or not links:
        raise bad("$.links", "must be an object of world size -> {alpha_us, gbps}")
    if len(links) > MAX_LINKS:
        raise bad("$.links", f"{len(links)} links is more than the limit of {MAX_LINKS}")
    out: dict[int, Link] = {}
    for key, link in links.items():
        place = "$.link" if "link" in doc else f"$.links[{key[:20]!r}]"
        if "link" not in doc and not (key.isascii() and key.isdigit() and len(key) <= len(str(MAX_WORLD))
                                      and key[0] != "0" and int(key) <= MAX_WORLD):
            raise bad(place, f"a world size is a whole number from 1 to {MAX_WORLD}, without leading zeros")
        if not isinstance(link, dict):
            raise bad(place, "must be an object with alpha_us and gbps")
        extra = sorted(set(link) - LINK_FIELDS)
        if extra:
            raise bad(f"{place}.{str(extra[0])[:40]}", f"unknown field (fields: {', '.join(sorted(LINK_FIELDS))})")
        ch = link.get("channels", channels)
        if not (isinstance(ch, int) and not isinstance(ch, bool) and 1 <= ch <= 64):
            raise bad(f"{place}.channels", f"must be a whole number from 1 to 64, got {str(ch)[:40]!r}")
        share = link.get("during_compute", 1.0)
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise bad(f"{place}.during_compute", f"must be a number in (0, 1], got {str(share)[:40]!r}")
        values = {}
        for k in ("alpha_us", "gbps"):
            v = link.get(k)
            why = link_value_problem(k, v)
            if why:
                raise bad(f"{place}.{k}", f"{why}, got {str(v)[:40]!r}")
            values[k] = float(v)
        out[int(key)] = Link(values["alpha_us"], values["gbps"] * 1e9, str(doc.get("name", where))[:80], ch,
                             float(share), str(doc.get("source", ""))[:300],
                             "allreduce" if doc.get("backend") == "gloo" else "reduce-scatter")
    name = doc.get("name", os.path.basename(where))
    return Network(str(name)[:80], out, str(doc.get("source", ""))[:300])


#: Shipped links (``parallel/networks/NAME.json``): nominal figures, each with its source.
SHIPPED_NETWORKS = ("nvlink-h100", "ib-ndr", "roce-200")


def load_network(ref: str) -> Network:
    """A shipped link by name, ``local-gloo`` (calibrated here) or a JSON network file."""
    if ref in SHIPPED_NETWORKS:
        from importlib import resources
        text = resources.files("autograd_run.parallel").joinpath("networks").joinpath(f"{ref}.json").read_text()
        return from_dict(json.loads(text), ref)
    if ref == LOCAL_GLOO:
        path = local_gloo_path()
        if not os.path.lexists(path):
            raise RequestError("no local-gloo network yet: run `autograd-run calibrate --gloo` first", "network")
        if not os.path.isfile(path):  # a folder, a link to a device or to nothing
            raise RequestError(f"{path}: the local-gloo network's file is not a regular file (run `autograd-run "
                               "calibrate --gloo` again after removing it)", "network")
    else:
        path = ref
        if os.path.exists(path) and not os.path.isfile(path):
            raise RequestError(f"{ref}: not a regular file (a folder, a device or a FIFO)", "network")
        if not os.path.isfile(path):
            raise RequestError(f"{ref}: not KEY=VALUE pairs (alpha_us=A,gbps=B), a shipped link "
                               f"({', '.join(SHIPPED_NETWORKS)}), {LOCAL_GLOO}, nor a file", "network")
    from autograd_run import untrusted
    try:
        doc = untrusted.load_json(untrusted.read_regular_file(path, MAX_NETWORK_FILE_BYTES))
    except untrusted.Problem as p:
        raise RequestError(f"{path}: {p.what}", "network") from None
    except (ValueError, RecursionError) as exc:
        raise RequestError(f"{path}: not a valid network file: {str(exc)[:300]}", "network") from None
    net = from_dict(doc, path)
    if ref == LOCAL_GLOO:
        net.name = LOCAL_GLOO
    return net
