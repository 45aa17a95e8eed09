"""One configuration of a graph given as an options string (``diff --a``, ``draw --simulate``).

``"--no-multithreading --repeat 10"`` (or ``"run ..."``) is a run with the
``run`` command's options; ``"simulate --policy fifo"`` a simulation with
the ``simulate`` command's. The string is parsed by those commands' own
parsers, so every flag means what it means there; options that write files
or choose output are refused (a side only measures).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import click

from autograd_run.errors import UsageError

#: Options a side may not carry (they write files, choose what is printed, or stop a run part way).
_REFUSED = {"trace_path": "--trace", "order_out": "--order-out", "expect_order": "--expect-order",
            "json_out": "--json", "compare": "--compare", "verbose": "--verbose", "open_trace": "--open",
            "fmt": "--format", "summary": "--summary/--no-summary", "slack": "--slack", "timeout": "--timeout"}

#: Options a side would take and then not apply (its ``RunOptions``/``SimOptions`` have no place for them): given,
#: they were ignored without a word, and ``diff --a 'simulate --ddp ...' --b simulate`` compared two identical
#: simulations. Refused, by kind.
_NOT_APPLIED = {
    "run": {"trace_format": "--trace-format", "max_memory": "--max-memory", "memory": "--memory/--no-memory",
            "memory_limit": "--memory-limit", "memory_snapshot": "--memory-snapshot"},
    "simulate": {"trace_format": "--trace-format", "trace_ranks": "--trace-ranks", "ddp": "--ddp", "fsdp": "--fsdp",
                 "world": "--world", "network": "--network", "straggler": "--straggler",
                 "memory": "--memory/--no-memory", "memory_limit": "--memory-limit",
                 "memory_snapshot": "--memory-snapshot"},
}


@dataclass
class Side:
    #: ``run`` or ``simulate``.
    kind: str
    #: The options string as given (for labels).
    text: str
    #: The parsed parameters of the ``run`` or ``simulate`` command.
    params: dict

    @property
    def repeat(self) -> int:
        return self.params.get("repeat", 1) if self.kind == "run" else 1

    def run_options(self, repeat: int = 1, order_ready: bool = False):
        """``RunOptions`` of a run side (one pass by default), recording the order and the profile."""
        from autograd_run.session import RunOptions
        p = self.params
        inputs = [s for s in p["inputs"].split(",") if s] if p["inputs"] is not None else None
        return RunOptions(mode=p["mode"], inputs=inputs, allow_unused=p["allow_unused"],
                          retain_graph=p["retain_graph"],
                          create_graph=p["create_graph"], multithreading=not p["no_multithreading"],
                          devices=p.get("backend") or p.get("backend_old") or "auto", anomaly=p["anomaly"], inject_error=p["inject_error"],
                          inject_nan=p["inject_nan"], repeat=repeat, seed=p["seed"],
                          allow_python=p["allow_python"], profile=True, samples=True, record_order=True,
                          order_ready=order_ready, costs=p["costs"], costs_step=p["step"])

    def sim_options(self):
        """``SimOptions`` of a simulation side."""
        from autograd_run.sim.session import SimOptions
        p = self.params
        return SimOptions(spec=p["spec"], devices=p["devices"],
                          placement=p["placement"] or ("greedy" if p["devices"] else "keep"), policy=p["policy"],
                          scale=p["scale"], costs=p["costs"], step=p["step"], slack_top=0, detail=False)


def parse_side(text: str, flag: str, default_kind: str = "run") -> Side:
    """Parse ``text`` (``[run|simulate] OPTIONS``); a ``UsageError`` naming ``flag`` when it is wrong."""
    try:
        args = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    kind = default_kind
    if args and args[0] in ("run", "simulate"):
        kind = args.pop(0)
    if any(a in ("-h", "--help", "--version") for a in args):
        raise UsageError(f"{flag}: help is not an option of a side; see `autograd-run {kind} --help`")
    if kind == "run":
        from autograd_run.cli.run_cmd import run as command
    else:
        from autograd_run.cli.sim_cmd import simulate as command
    try:
        ctx = command.make_context(f"{flag} {kind}", ["GRAPH", *args], resilient_parsing=False)
    except click.ClickException as exc:
        raise UsageError(f"{flag}: {exc.format_message()}") from None
    from click.core import ParameterSource
    params = dict(ctx.params)
    if kind == "run":
        from autograd_run.cli.run_cmd import run_mode
        try:
            params["mode"] = run_mode(params.pop("grad_mode"), params.pop("backward_mode"))
        except UsageError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    for p in command.params:
        if p.name in _REFUSED and ctx.get_parameter_source(p.name) not in (ParameterSource.DEFAULT, None):
            raise UsageError(f"{flag}: {_REFUSED[p.name]} is not available here (a side only measures)")
        if p.name in _NOT_APPLIED[kind] and ctx.get_parameter_source(p.name) not in (ParameterSource.DEFAULT, None):
            raise UsageError(f"{flag}: {_NOT_APPLIED[kind][p.name]} is not available here (a side is the backward "
                             f"pass's own timing; `autograd-run {kind}` applies it)")
    return Side(kind, text, params)
