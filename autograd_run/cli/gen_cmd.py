"""``autograd-run gen KIND -o FILE``: generate a graph file (``graphs.generators``).

Every kind takes ``--size`` (chain: ops; fanout: branches; mlp and
transformer: layers; random: op nodes) and ``--seed``; the other options
belong to one kind or two (the ``KIND_OPTIONS`` table), and giving one to a
kind it does not apply to is an error, not silently ignored. Sizes are
checked per option before anything is generated (a graph of more than
``MAX_NODES`` nodes is refused), and the generated document is loaded and
validated in memory before it is written: ``gen`` never writes a file that
``validate`` would reject. Old spellings of ``--size`` (``--n``,
``--nodes``, ``--layers``) still work, hidden from the help.
"""

from __future__ import annotations

import click
from click.core import ParameterSource

from autograd_run.cli.common import Whole, echo, graph_format
from autograd_run.errors import GraphFileError, UsageError

#: The largest graph gen writes (nodes, estimated before generating): the loader's limit. What it takes
#: in memory is checked against what the machine has before generating (``_check_memory``).
MAX_NODES = 20_000_000
#: From this many nodes a JSON graph is generated packed (``generators.Builder``: its nodes as JSON
#: text as they are made, ~140 bytes a node instead of ~900 as dicts).
PACK_FROM = 100_000
#: Bytes a node of each kind takes in a JSON file (measured at 1e5-1e6 nodes, rounded up): with the
#: load's own estimate, what gen needs to write and check the file.
FILE_BYTES_PER_NODE = {"chain": 140, "fanout": 140, "mlp": 155, "transformer": 175, "random": 170}

KINDS = ("chain", "fanout", "mlp", "transformer", "random")
#: What --size means, and its default, per kind.
SIZE = {"chain": ("ops", 100), "fanout": ("branches", 8), "mlp": ("hidden layers", 2),
        "transformer": ("layers", 2), "random": ("op nodes", 200)}
#: The options (besides --size, --seed, -o) each kind takes, with their defaults.
KIND_OPTIONS = {
    "chain": {"op": "mul"},
    "fanout": {},
    "mlp": {"width": 16, "batch": 8, "in_features": None},
    "transformer": {"heads": 4, "seq_len": 16, "dim": 32, "devices": 0},
    "random": {"leaves": 40, "width": 4},
}
#: Hidden old spellings of --size, and the kinds they were for.
OLD_SIZE = {"n": ("--n", ("chain",)), "nodes": ("--nodes", ("random",)), "layers": ("--layers", ("mlp", "transformer"))}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _estimate_nodes(kind: str, size: int, o: dict) -> int:
    if kind == "chain":
        return size + 1
    if kind == "fanout":
        return 2 * size + 2
    if kind == "mlp":
        return 5 * size + 4
    if kind == "transformer":
        return size * (21 + 6 * o["heads"]) + 2
    # random: its op nodes, a leaf's AccumulateGrad each and the root, and an add for each value nobody consumed
    # (folded into the root): the leaves never drawn and about 1% of the op nodes (a few dozen more in a small
    # graph), 5% allowed here; the count made is checked before the file is written
    leaves = o["leaves"]
    return size + leaves + 1 + min(size + leaves, size // 20 + leaves + 64)


POSITIVE = Whole(1)


@click.command()
@click.argument("kind", type=click.Choice(KINDS))
@click.option("-o", "--output", required=True, metavar="FILE", help="Output file (.json, .yaml or .yml).")
@click.option("--size", type=POSITIVE, default=None, metavar="N",
              help="How big: chain: ops [100]; fanout: branches [8]; mlp: hidden layers [2]; transformer: "
                   "layers [2]; random: op nodes [200].")
@click.option("--op", type=click.Choice(["mul", "add"]), default=None, help="chain: the op  [default: mul]")
@click.option("--width", type=POSITIVE, default=None, metavar="N",
              help="mlp: hidden width [16]; random: tensor size [4].")
@click.option("--batch", type=POSITIVE, default=None, metavar="N", help="mlp: batch size  [default: 8]")
@click.option("--in-features", type=POSITIVE, default=None, metavar="N",
              help="mlp: input features  [default: the width]")
@click.option("--heads", type=POSITIVE, default=None, metavar="N", help="transformer: attention heads  [default: 4]")
@click.option("--seq-len", type=POSITIVE, default=None, metavar="N",
              help="transformer: sequence length  [default: 16]")
@click.option("--dim", type=POSITIVE, default=None, metavar="N",
              help="transformer: model width, a multiple of --heads  [default: 32]")
@click.option("--devices", type=Whole(0), default=None, metavar="K",
              help="transformer: spread the layers over K devices, cuda:0..K-1 (at most one per layer; 0: the "
                   "CPU)  [default: 0]")
@click.option("--leaves", type=POSITIVE, default=None, metavar="N", help="random: leaf variables  [default: 40]")
@click.option("--seed", type=Whole(0, 2**32 - 1, "0 to 2**32-1"), default=0, show_default=True, metavar="N",
              help="Seed (same seed, same file).")
@click.option("--n", "n", type=POSITIVE, default=None, hidden=True)
@click.option("--nodes", type=POSITIVE, default=None, hidden=True)
@click.option("--layers", type=POSITIVE, default=None, hidden=True)
@click.pass_context
def gen(ctx, kind, output, size, seed, **options):
    """Generate a graph file of KIND: chain, fanout, mlp, transformer or random.

    \b
    Examples:
      autograd-run gen chain --size 10000 -o chain.json
      autograd-run gen transformer --size 4 --devices 2 -o tf.json
      autograd-run gen random --size 500 --leaves 100 --seed 7 -o dag.yaml
    """
    from autograd_run.graphs.dump import dumps
    from autograd_run.graphs.generators import generate
    from autograd_run.graphs.load import loads_graph
    from autograd_run.outputs import atomic_write, check_output_path

    given = {k for k in ctx.params if ctx.get_parameter_source(k) is ParameterSource.COMMANDLINE}
    size = _size(kind, size, options, given)
    takes = KIND_OPTIONS[kind]
    stray = [k for k in sorted(given) if k in options and k not in takes and k not in OLD_SIZE]
    if stray:
        allowed = ", ".join(["--size", *(_flag(k) for k in takes), "--seed"])
        raise UsageError(f"{_flag(stray[0])} does not apply to gen {kind} (it takes {allowed})")
    o = {k: options[k] if options[k] is not None else default for k, default in takes.items()}
    _check(kind, size, o)
    fmt = graph_format(output)
    check_output_path(output, "output", [])
    n = _estimate_nodes(kind, size, o)
    _check_memory(kind, n, fmt)
    kw = _generator_args(kind, size, o, seed)
    doc = generate(kind, packed=fmt == "json" and n >= PACK_FROM, **kw)
    count = len(doc["nodes"])
    if count > MAX_NODES:  # (random only: its count is estimated)
        raise UsageError(f"--size: gen {kind} with these options makes {count:,} nodes; at most {MAX_NODES:,}")
    data = dumps(doc, fmt)
    del doc  # (a big graph's text is in memory twice otherwise while it is checked)
    try:  # what validate would say of the file, before it exists
        graph = loads_graph(data, output, fmt)
    except GraphFileError as exc:
        raise UsageError(f"gen {kind} with these options makes a graph that does not validate: {exc.what}") from None
    del graph
    atomic_write(output, data, "output")
    echo(f"{output}: {count} nodes")


def _size(kind: str, size: int | None, options: dict, given: set) -> int:
    """--size, or its old spelling for this kind; an old spelling for another kind is an error."""
    for key, (flag, kinds) in OLD_SIZE.items():
        if key not in given:
            continue
        if kind not in kinds:
            raise UsageError(f"{flag} does not apply to gen {kind}; its size is --size ({SIZE[kind][0]})")
        if size is not None and options[key] != size:
            raise UsageError(f"{flag} is the old spelling of --size: give one of them")
        size = options[key]
    return size if size is not None else SIZE[kind][1]


def _check(kind: str, size: int, o: dict) -> None:
    if kind == "transformer":
        if o["dim"] % o["heads"]:
            raise UsageError(f"--dim {o['dim']} must be a multiple of --heads {o['heads']}")
        k = o["devices"]
        if k > size:
            raise UsageError(f"--devices {k} is more than the {size} layer(s) to spread over them")
        from autograd_run.graphs.model import Device
        if k and Device.parse(f"cuda:{k - 1}") is None:
            raise UsageError(f"--devices {k}: graph files name at most cuda:0..cuda:255")
    n = _estimate_nodes(kind, size, o)
    if n > MAX_NODES:
        what = "--size" if kind != "random" or o["leaves"] <= size else "--leaves"
        raise UsageError(f"{what}: gen {kind} would make about {n:,} nodes; at most {MAX_NODES:,}")


def _check_memory(kind: str, n: int, fmt: str) -> None:
    """Before generating: the file's text, with the document it is written from (packed: its text in
    pieces; else ~1 KB a node of dicts), then with the load that checks it (the document is let go by
    then), must fit in what the machine has left."""
    from autograd_run.graphs import load
    from autograd_run.graphs.validate import format_bytes, memory_available
    file_bytes = FILE_BYTES_PER_NODE[kind] * n
    document = file_bytes if fmt == "json" and n >= PACK_FROM else 1000 * n
    loading = (load.JSON_BYTES_PER_BYTE * file_bytes + load.JSON_BYTES_PER_NODE * n if fmt == "json"
               else load.YAML_BYTES_PER_BYTE * file_bytes)
    need = file_bytes + max(document, loading)
    available = memory_available()
    if available is not None and need > available:
        raise UsageError(f"gen {kind} of about {n:,} nodes takes about {format_bytes(need)} of memory to write "
                         f"and check the file, and {format_bytes(available)} is available"
                         + (" (YAML takes about 8x more than JSON)" if fmt != "json" else ""))


def _generator_args(kind: str, size: int, o: dict, seed: int) -> dict:
    if kind == "chain":
        return dict(n=size, op=o["op"], seed=seed)
    if kind == "fanout":
        return dict(width=size, seed=seed)
    if kind == "mlp":
        return dict(layers=size, width=o["width"], batch=o["batch"], in_features=o["in_features"], seed=seed)
    if kind == "transformer":
        return dict(layers=size, heads=o["heads"], seq_len=o["seq_len"], dim=o["dim"], devices=o["devices"], seed=seed)
    return dict(nodes=size, leaves=o["leaves"], width=o["width"], seed=seed)
