"""``autograd-run``: the command line. One module per command on a shared base (``cli.common``,
``cli.terminal``, ``cli.flags``):

``run`` (the default: ``autograd-run GRAPH``)  ``run_cmd``      ``simulate``, ``calibrate``  ``sim_cmd``
``capture``, ``check``                         ``capture_cmd``  ``gen``                      ``gen_cmd``
``diff``                                       ``diff_cmd``     ``draw``                     ``draw_cmd``
``sweep``                                      ``sweep_cmd``    ``view``                     ``view_cmd``
``validate``, ``examples``                     here

Exit codes: 0 success; 1 the backward raised; 2 a usage or graph-file
error; 3 an order mismatch. Errors are printed as ``Error: ...`` on stderr,
never as a traceback (``--verbose`` shows a failing node's traceback).
"""

from __future__ import annotations

import sys

import click

from autograd_run.cli.common import OneShot, echo, error_line, escape, exit_now, max_memory_option, stdout_closed, write
from autograd_run.cli.flags import FLAGS
from autograd_run.cli.version import show_version
from autograd_run.errors import AutogradRunError, GraphFileError, RequestError

#: The commands defined in a module of their own: name -> (module in ``autograd_run.cli``, attribute).
COMMANDS = {"run": ("run_cmd", "run"), "gen": ("gen_cmd", "gen"), "simulate": ("sim_cmd", "simulate"),
            "calibrate": ("sim_cmd", "calibrate"), "capture": ("capture_cmd", "capture"),
            "check": ("capture_cmd", "check"), "view": ("view_cmd", "view"), "diff": ("diff_cmd", "diff"),
            "draw": ("draw_cmd", "draw"), "sweep": ("sweep_cmd", "sweep")}


class DefaultGroup(click.Group):
    """A group whose first argument, when it is not a command, is a graph to ``run``.

    A reader of stdout that goes away (``| head -1``) ends the command quietly with status 0: click
    itself turns that ``BrokenPipeError`` into exit status 1, so it is caught here first, around the
    parsing (``--help``, ``--version``) and the command.
    """

    def parse_args(self, ctx, args):
        if (args and args[0] not in self.commands and args[0] not in COMMANDS
                and args[0] not in ("--help", "-h", "--version")):  # "-": stdin
            args = ["run", *args]
        with _quiet_when_stdout_closes():
            return super().parse_args(ctx, args)

    def list_commands(self, ctx):
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx, name):
        """A command of its own module is imported when it is asked for (``validate`` does not load the engine,
        the simulator and the other commands: ~0.08 s of a small file's 0.45), its empty values refused then."""
        if name not in self.commands and name in COMMANDS:
            import importlib
            module, attr = COMMANDS[name]
            command = getattr(importlib.import_module(f"autograd_run.cli.{module}"), attr)
            _refuse_empty_values(name, command)
            self.add_command(command, name)
        return self.commands.get(name)

    def invoke(self, ctx):
        with _quiet_when_stdout_closes():
            return super().invoke(ctx)


class _quiet_when_stdout_closes:
    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is not None and issubclass(kind, BrokenPipeError):
            stdout_closed()
            raise click.exceptions.Exit(0)
        return False


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=show_version,
              help="Show the versions of the tool, Python, numpy, torch and cupy, and exit.")
def cli():
    """Replay and profile PyTorch-style backward graphs.

    \b
    Examples:
      autograd-run example:seed
      autograd-run graph.yaml --trace out.json
      autograd-run validate graph.json
      autograd-run gen mlp --size 4 -o mlp.json
    """


@cli.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--allow-python", is_flag=True,
              help="Accept python nodes (running them imports and calls code the file names).")
@max_memory_option
def validate(files, allow_python, max_memory):
    """Check graph files; print one line per valid file, `Error: ...` per problem.

    Checks everything `run` would refuse: syntax, schema, duplicate keys,
    edges and shapes, saved values against each op's declared kinds, side
    files, and the memory the graph needs to run.

    \b
    Example:
      autograd-run validate graph.yaml example:mlp
      autograd-run validate big.json --max-memory 16GiB
    """
    from autograd_run.cli.common import load_graph_arg
    failed = False
    for f in files:
        try:
            # one file: its graph lives until exit; with more, each is garbage once checked
            g = load_graph_arg(f, max_bytes=max_memory, allow_python=allow_python, check_data=True,
                               keep=len(files) == 1)
        except GraphFileError as exc:
            error_line(str(exc))
            failed = True
            continue
        devs = ", ".join(str(d) for d in g.devices)
        echo(f"{f}: {len(g.nodes)} nodes, {g.num_edges} edges, devices: {devs}, roots: {len(g.roots)}")
    if failed:
        sys.exit(2)


@cli.command()
def examples():
    """List the graphs shipped with autograd-run (use them as `example:NAME`).

    \b
    Example:
      autograd-run examples
      autograd-run example:pipeline --trace pipeline.json
    """
    from importlib import resources
    from autograd_run.graphs.load import example_names
    folder = resources.files("autograd_run.graphs").joinpath("examples")
    for name in example_names():
        first = ""
        for ext in (".yaml", ".json"):
            f = folder.joinpath(name + ext)
            if f.is_file():
                for line in f.read_text().splitlines():
                    if line.startswith("#"):
                        first = line.lstrip("# ").strip()
                        break
        write(f"example:{name:<12} {first}")



#: Options whose empty value means something: a side with the command's defaults (``--a ''``), and
#: those with a message of their own (``--inputs ''``: no inputs given).
EMPTY_OK = {("diff", "side_a"), ("diff", "side_b"), ("draw", "simulate_opts"), ("run", "inputs"), ("diff", "fail_on")}


def _not_empty(ctx, param, value):
    """An option or argument given an empty value (``--trace "$OUT"`` with OUT unset) is an error, not
    "no trace"."""
    if value == "" or (isinstance(value, tuple) and "" in value):
        raise click.BadParameter("an empty value (an unset shell variable?)", ctx, param)
    return value


def _refuse_empty_values(name: str, command: click.Command) -> None:
    """Every string option and argument of ``command`` (bar ``EMPTY_OK``) refuses an empty value."""
    for param in command.params:
        if (not getattr(param, "is_flag", False) and (name, param.name) not in EMPTY_OK and param.callback is None
                and isinstance(param.type, click.types.StringParamType)):
            param.callback = _not_empty


for _name, _command in cli.commands.items():
    _refuse_empty_values(_name, _command)


#: numpy's floating-point warnings (an overflowing float16 gradient, 0/0 in a rule): the results show
#: them (inf, NaN; anomaly mode names the node), so they are not repeated as warnings on stderr.
NUMPY_WARNINGS = r"(overflow|underflow|invalid value|divide by zero) encountered"


def main(argv=None):
    """The ``autograd-run`` command. Without ``argv`` (the console script, ``python -m autograd_run``) it
    runs this process's own command line, and the process ends with it: the command may then keep
    what it loads until exit (``cli.common.load_graph_arg``). With ``argv`` (a caller's own list, as
    in tests) it is one call among others, and leaves the process as it found it."""
    import warnings
    warnings.filterwarnings("ignore", message=NUMPY_WARNINGS, category=RuntimeWarning)
    shot = OneShot() if argv is None else None
    try:
        cli.main(args=argv, prog_name="autograd-run", standalone_mode=False, obj=shot)
    except click.exceptions.Abort:
        error_line("aborted")
        sys.exit(130)
    except click.ClickException as exc:
        if not isinstance(exc, click.exceptions.NoArgsIsHelpError):  # that one's message is our help text
            exc.message = escape(exc.message)  # click quotes some values with repr, not all (No such option: ...)
        exc.show()
        sys.exit(exc.exit_code)
    except RequestError as exc:
        flag = FLAGS.get(exc.option or "")
        error_line(f"{flag}: {exc}" if flag else str(exc))
        sys.exit(exc.exit_code)
    except AutogradRunError as exc:
        error_line(str(exc))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        error_line("interrupted")
        sys.exit(130)
    except BrokenPipeError:  # the reader of stdout went away: quietly, as other command-line tools
        stdout_closed()
        sys.exit(0)
    except SystemExit:
        raise
    if shot is not None:
        exit_now(shot, 0)  # (a simulation's millions of objects: not freed one by one)
    sys.exit(0)


if __name__ == "__main__":
    main()
