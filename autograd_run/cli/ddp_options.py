"""``simulate --ddp KEY=V,... --world N --network alpha_us=A,gbps=B``: the options of a data-parallel simulation."""

from __future__ import annotations

import math

from autograd_run.errors import UsageError
from autograd_run.parallel.buckets import MAX_CAP_MB
from autograd_run.parallel.collectives import Link

DDP_KEYS = {"bucket_cap_mb": f"a size in MiB > 0, at most {MAX_CAP_MB:g}",
            "first_bucket_mb": f"a size in MiB > 0, at most {MAX_CAP_MB:g}",
            "find_unused_parameters": "true or false",
            "static_graph": "true or false", "gradient_as_bucket_view": "true or false",
            "iteration": "first or steady"}
NETWORK_KEYS = {"alpha_us": "the latency of one message, us (0 to 1e9)",
                "gbps": "the bandwidth one rank sends at, GB/s (1e-6 to 1e6)",
                "channels": "collectives in flight at once, a whole number from 1 to 64"}


def whole_in(value: str, low: int, high: int) -> int | None:
    """``value`` as a whole number from ``low`` to ``high`` (ASCII digits only), else None. ``str.isdigit``
    alone lets through what ``int`` refuses (``'²'``) and digit strings past ``int``'s limit (4300 digits):
    a traceback, not a usage error."""
    if not (value.isascii() and value.isdigit()) or len(value.lstrip("0")) > len(str(high)):
        return None
    n = int(value)
    return n if low <= n <= high else None


def _pairs(text: str, option: str, keys: dict) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not value.strip():
            raise UsageError(f"{option}: {item!r} is not KEY=VALUE (keys: {', '.join(keys)})")
        if key not in keys:
            raise UsageError(f"{option}: unknown key {key!r} (keys: {', '.join(keys)})")
        if key in out:
            raise UsageError(f"{option}: {key} given twice")
        out[key] = value.strip()
    return out


def _number(option: str, key: str, value: str, low: float, strict: bool, high: float = math.inf) -> float:
    try:
        x = float(value)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or (x <= low if strict else x < low) or x > high:
        raise UsageError(f"{option}: {key} must be {DDP_KEYS.get(key) or NETWORK_KEYS[key]}, got {value!r}")
    return x


def _bool(option: str, key: str, value: str) -> bool:
    if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise UsageError(f"{option}: {key} must be true or false, got {value!r}")
    return value.lower() in ("true", "1", "yes")


def parse_ddp(text: str, option: str = "--ddp") -> dict:
    """``bucket_cap_mb=25,find_unused_parameters=false,...`` (or ``defaults``; ``captured[,KEY=V...]``: the
    graph file's ``ddp`` section, the keys given overriding it) -> keyword arguments of ``sim.ddp.simulate_ddp``
    (with ``captured``: True, resolved against the graph by ``captured_ddp``). ``option``: the option named in
    the errors (``--compare`` for its ``bucket_cap_mb=...`` values)."""
    head, _, rest = text.strip().partition(",")
    captured = head.strip() == "captured"
    if captured:
        text = rest
    raw = {} if text.strip() in ("defaults", "") else _pairs(text, option, DDP_KEYS)
    out: dict = {"captured": True} if captured else {}
    for key in ("bucket_cap_mb", "first_bucket_mb"):
        if key in raw:
            out[key] = _number(option, key, raw[key], 0.0, True, MAX_CAP_MB)
            if out[key] * (1 << 20) < 1:
                raise UsageError(f"{option}: {key} must be at least one byte, got {raw[key]!r}")
    for key in ("find_unused_parameters", "static_graph", "gradient_as_bucket_view"):
        if key in raw:
            out[key] = _bool(option, key, raw[key])
    if "iteration" in raw:
        if raw["iteration"] not in ("first", "steady"):
            raise UsageError(f"{option}: iteration must be first or steady, got {raw['iteration']!r}")
        out["iteration"] = raw["iteration"]
    return out


def parse_network(text: str):
    """``alpha_us=A,gbps=B[,channels=C]``, ``local-gloo`` or a network file -> ``parallel.networks.Network``."""
    from autograd_run.parallel.networks import Network, load_network
    if "=" not in text:
        return load_network(text.strip())
    raw = _pairs(text, "--network", NETWORK_KEYS)
    missing = [k for k in ("alpha_us", "gbps") if k not in raw]
    if missing:
        raise UsageError(f"--network: give {' and '.join(missing)} (e.g. --network alpha_us=10,gbps=12)")
    from autograd_run.parallel.networks import link_value_problem
    values = {}
    for key in ("alpha_us", "gbps"):
        try:
            values[key] = float(raw[key])
        except ValueError:
            values[key] = math.nan
        why = link_value_problem(key, values[key])
        if why:
            raise UsageError(f"--network: {key} {why}, got {raw[key][:40]!r}")
    alpha, gbps = values["alpha_us"], values["gbps"]
    channels = 1
    if "channels" in raw:
        channels = whole_in(raw["channels"], 1, 64)
        if channels is None:
            raise UsageError(f"--network: channels must be {NETWORK_KEYS['channels']}, got {raw['channels'][:40]!r}")
    return Network("given", {0: Link(alpha, gbps * 1e9, "given", channels)})


def parse_straggler(text: str, world: int) -> tuple[int, float]:
    """``rank=R,slowdown=S`` -> (R, S): one rank whose backward is S times slower (S from 1 to 100)."""
    raw = _pairs(text, "--straggler", {"rank": "a rank below --world", "slowdown": "a factor from 1 to 100"})
    missing = [k for k in ("rank", "slowdown") if k not in raw]
    if missing:
        raise UsageError(f"--straggler: give {' and '.join(missing)} (e.g. --straggler rank=3,slowdown=1.2)")
    rank = whole_in(raw["rank"], 0, world - 1)
    if rank is None:
        raise UsageError(f"--straggler: rank must be a whole number below the world size {world}, "
                         f"got {raw['rank'][:40]!r}")
    try:
        factor = float(raw["slowdown"])
    except ValueError:
        factor = math.nan
    if not (1.0 <= factor <= 100.0):
        raise UsageError(f"--straggler: slowdown must be a factor from 1 to 100, got {raw['slowdown']!r}")
    return rank, factor


def captured_ddp(graph, options: dict) -> dict:
    """``--ddp captured,...``: the graph's recorded DDP settings under the options given."""
    from autograd_run.errors import RequestError
    if not options.get("captured"):
        return options
    if graph.ddp is None:
        # (the file is at fault, not the flag: the line names the file first, as for any file without a part asked for)
        raise RequestError(f"{graph.source}: no ddp section for --ddp captured: capture the model wrapped in "
                           "DistributedDataParallel (from_torch(..., parameters=ddp_model)) or give --ddp KEY=V,...")
    keep = {k: graph.ddp[k] for k in ("bucket_cap_mb", "bucket_cap_mb_list", "find_unused_parameters",
                                      "static_graph", "gradient_as_bucket_view") if k in graph.ddp}
    if "bucket_cap_mb" in options:  # a cap given here replaces DDP's per-bucket limits too
        keep.pop("bucket_cap_mb_list", None)
    return {**keep, **{k: v for k, v in options.items() if k != "captured"}}


FSDP_KEYS = {"prefetch": "all-gathers issued ahead, a whole number from 0 to 64 (FSDP's default: 1)",
             "replicate": "HSDP's replicas, a whole number that divides --world",
             "reshard_after_forward": "true or false (every unit but the root)",
             "blocking": "true or false (collectives block the compute: the CPU's way; default: by device)"}


def _whole(option: str, key: str, value: str, low: int, high: int, what: str) -> int:
    n = whole_in(value, low, high)
    if n is None:
        raise UsageError(f"{option}: {key} must be {what}, got {value[:40]!r}")
    return n


def parse_fsdp(text: str) -> dict:
    """``prefetch=1,replicate=2,...`` (``captured`` or ``defaults``: as the graph's ``fsdp`` section says) ->
    keyword arguments of ``sim.fsdp.simulate_fsdp``."""
    head, _, rest = text.strip().partition(",")
    if head.strip() in ("captured", "defaults"):
        text = rest
    raw = _pairs(text, "--fsdp", FSDP_KEYS) if text.strip() else {}
    out: dict = {}
    if "prefetch" in raw:
        out["prefetch"] = _whole("--fsdp", "prefetch", raw["prefetch"], 0, 64, FSDP_KEYS["prefetch"])
    if "replicate" in raw:
        out["replicate"] = _whole("--fsdp", "replicate", raw["replicate"], 1, 1 << 20, FSDP_KEYS["replicate"])
    for key in ("reshard_after_forward", "blocking"):
        if key in raw:
            out[key] = _bool("--fsdp", key, raw[key])
    return out
