"""``autograd-run draw``: the DOT we write (golden for the seed graph), what Graphviz makes of it (a
well-formed SVG with every node id, a PNG that is not blank), colours by time and change, big
graphs cut down with a note, and hostile ids that cannot break out of their strings."""

import importlib.util
import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from autograd_run.draw import view
from autograd_run.draw.colors import CHANGE, TIME
from autograd_run.graphs.load import load_graph
from builders import chain, cost, doc, fan, graph, leaf, mul, node, run_cli

GOLDEN = Path(__file__).parent / "golden"
HAVE_DOT = shutil.which("dot") is not None and importlib.util.find_spec("graphviz") is not None
needs_dot = pytest.mark.skipif(not HAVE_DOT, reason="needs Graphviz's dot program and the graphviz package "
                                                    "(make test installs them where it can)")
SVG = "{http://www.w3.org/2000/svg}"


def draw(capsys, *args):
    code, out, err = run_cli(["draw", *args], capsys)
    return code, out, err


def dot_nodes(text: str) -> dict[str, dict]:
    """DOT node statements ``nK [...]`` by the node's id (the second label line), with their attributes."""
    out = {}
    for m in re.finditer(r'^\s*(n\d+) \[(.*)\];$', text, re.M):
        attrs = dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|[^,\]]+)', m.group(2)))
        label = attrs["label"].strip('"').split("\\n")
        out[label[-1]] = attrs
    return out


def test_seed_dot_matches_the_golden_file(tmp_path, capsys):
    out = tmp_path / "seed.dot"
    code, stdout, err = draw(capsys, "example:seed", "-o", str(out), "--saved")
    assert code == 0, err
    assert stdout == f"{out}: 5 boxes for 5 nodes\n"
    assert out.read_text() == (GOLDEN / "draw_seed.dot").read_text()


@needs_dot
def test_svg_is_well_formed_and_shows_every_node_id(tmp_path, capsys):
    out = tmp_path / "mlp.svg"
    code, _, err = draw(capsys, "example:mlp", "-o", str(out), "--saved")
    assert code == 0, err
    root = ET.parse(out).getroot()
    assert root.tag == SVG + "svg"
    texts = {t.text for t in root.iter(SVG + "text")}
    assert {n.id for n in load_graph("example:mlp").nodes} <= texts


@needs_dot
def test_png_is_an_image_with_a_drawing(tmp_path, capsys):
    Image = pytest.importorskip("PIL.Image", reason="Pillow reads the PNG (the test extra installs it)")
    out = tmp_path / "p.png"
    code, _, err = draw(capsys, "example:pipeline", "-o", str(out), "--simulate")
    assert code == 0, err
    with Image.open(out) as im:
        assert im.format == "PNG"
        w, h = im.size
        assert w > 200 and h > 200
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20)
    assert len(colours) > 20                           # boxes, clusters, text, the colour bar
    white = sum(c for c, px in colours if px == (255, 255, 255))
    assert white < 0.97 * w * h                        # not blank
    # the colour bar's darkest red is in the picture
    dark = tuple(int(TIME[-1][i:i + 2], 16) for i in (1, 3, 5))
    assert any(px == dark for _, px in colours)


@needs_dot
def test_html_page_embeds_the_svg(tmp_path, capsys):
    out = tmp_path / "seed.html"
    code, _, err = draw(capsys, "example:seed", "-o", str(out))
    assert code == 0, err
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<?xml" not in page and "<svg" in page
    assert "<title>example:seed: 5 nodes</title>" in page


def branches(b2_us=300, b1_us=600):
    return doc(cost("r", ["b1", "b2"], 200, seq=3),
               cost("b1", ["acc_x"], b1_us, seq=2, device="cuda:0"),
               cost("b2", ["acc_x"], b2_us, seq=1, device="cuda:1"),
               leaf("x", [2]))


def write(tmp_path, name, d):
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return str(p)


def test_simulated_times_colour_the_nodes_and_bold_the_critical_path(tmp_path, capsys):
    g = write(tmp_path, "g.json", branches(300, 6000))
    out = tmp_path / "g.dot"
    code, _, err = draw(capsys, g, "-o", str(out), "--simulate=--policy pytorch")
    assert code == 0, err
    text = out.read_text()
    nodes = dot_nodes(text)
    assert nodes["b1"]["fillcolor"] == f'"{TIME[-1]}"'               # the slowest node: darkest
    assert nodes["b2"]["fillcolor"] != nodes["b1"]["fillcolor"]
    assert "penwidth" in nodes["b1"] and "penwidth" not in nodes["b2"]   # r -> b1 -> acc_x is critical
    assert "run time" in nodes["b1"]["tooltip"] and "queue wait" in nodes["b1"]["tooltip"]
    assert "legend [shape=plaintext" in text and "rank=sink" in text
    # clusters by device
    assert 'label="cuda:0"' in text and 'label="cuda:1"' in text and 'label="cpu"' in text


def test_trace_and_costs_colour_by_their_times(tmp_path, capsys):
    # b1 sleeps 30 ms: the slowest node even when a loaded machine stretches the others' sleeps
    g = write(tmp_path, "g.json", branches(300, 30_000))
    trace = tmp_path / "t.json"
    code, _, err = run_cli([g, "--trace", str(trace), "--no-summary"], capsys)
    assert code == 0, err
    for flag in ("--trace", "--costs"):
        out = tmp_path / f"{flag[2:]}.dot"
        code, _, err = draw(capsys, g, "-o", str(out), flag, str(trace))
        assert code == 0, err
        nodes = dot_nodes(out.read_text())
        assert nodes["b1"]["fillcolor"] == f'"{TIME[-1]}"' and "penwidth" in nodes["b1"]
    assert "cost" in dot_nodes((tmp_path / "costs.dot").read_text())["b1"]["tooltip"]


def test_diff_colours_by_change(tmp_path, capsys):
    files = []
    for name, us in (("a", 300), ("b", 3000)):
        code, out, err = run_cli(["simulate", write(tmp_path, f"{name}.json", branches(us)), "--json"], capsys)
        assert code == 0, err
        p = tmp_path / f"s{name}.json"
        p.write_text(out)
        files.append(str(p))
    out = tmp_path / "d.dot"
    code, _, err = draw(capsys, str(tmp_path / "a.json"), "-o", str(out), "--diff", *files)
    assert code == 0, err
    nodes = dot_nodes(out.read_text())
    assert nodes["b2"]["fillcolor"] == f'"{CHANGE[-1]}"'      # the slower node: darkest red
    assert nodes["b1"]["fillcolor"] == f'"{CHANGE[4]}"'       # unchanged: the middle white
    assert "untested" in nodes["b2"]["tooltip"]


HOSTILE = 'x"];evil[label="pwn\\N</text><script>alert(1)</script>&amp;\n[red]'


@pytest.fixture
def hostile(tmp_path):
    d = doc(node("sum", "SumBackward0", seq=2, next=[HOSTILE], inputs=[[]], saved={"self_sym_sizes": [2]}),
            mul(HOSTILE, "acc", 2.0, seq=1, shape=[2]),
            leaf("a", [2], id="acc"))
    return write(tmp_path, "h.json", d)


def test_hostile_ids_stay_inside_their_strings(tmp_path, capsys, hostile):
    out = tmp_path / "h.dot"
    code, _, err = draw(capsys, hostile, "-o", str(out), "--saved")
    assert code == 0, err
    text = out.read_text()
    assert "evil[" not in text.replace('evil[label=\\"', "")    # never a statement of its own
    assert "<" not in text.replace("<<table", "").replace("<tr>", "") and "\n[red]" not in text
    assert len(dot_nodes(text)) == 3


@needs_dot
def test_hostile_ids_make_a_well_formed_svg_showing_the_id_as_text(tmp_path, capsys, hostile):
    out = tmp_path / "h.svg"
    code, _, err = draw(capsys, hostile, "-o", str(out))
    assert code == 0, err
    root = ET.parse(out).getroot()
    assert not [e for e in root.iter() if e.tag.endswith("script")]
    texts = [t.text for t in root.iter(SVG + "text")]
    # shown as written: the newline visible as \n, cut at the label length
    assert any(t.startswith('x"];evil[label="pwn\\N</text><script>alert(1)</script>&amp;\\n') for t in texts)


def test_around_keeps_the_neighbourhood_and_marks_the_cut(tmp_path, capsys):
    g = write(tmp_path, "c.json", doc(*chain(100)))
    out = tmp_path / "c.dot"
    code, stdout, err = draw(capsys, g, "-o", str(out), "--around", "mul50", "--depth", "2")
    assert code == 0, err
    nodes = dot_nodes(out.read_text())
    assert set(nodes) == {"mul48", "mul49", "mul50", "mul51", "mul52"}
    assert "dashed" in nodes["mul52"]["style"] and "dashed" in nodes["mul48"]["style"]
    assert "dashed" not in nodes["mul50"]["style"]
    assert "5 of 101 nodes: those within 2 edges of mul50; 2 edges to nodes not shown" in stdout


def test_a_long_chain_collapses_to_its_ends_and_a_middle(tmp_path):
    g = graph(doc(*chain(200)))
    v = view.collapse(view.whole(g), 10, [g.by_id["mul199"]])
    assert [len(it.nodes) for it in v.items] == [1, 199, 1]
    assert v.items[0].nodes[0].id == "mul199" and v.items[2].nodes[0].id == "acc_x"
    assert v.notes == ["199 nodes in chains (one next node each) drawn as 1 box", "201 boxes collapsed to 3 (--max-nodes 10)"]


def test_repeated_siblings_collapse_to_one_box(tmp_path):
    g = graph(doc(fan("f", [f"m{k}" for k in range(40)], seq=50),
                  *[mul(f"m{k}", "acc_x", 2.0, seq=k, shape=[2]) for k in range(40)],
                  leaf("x", [2])))
    v = view.collapse(view.whole(g), 10, [g.by_id["f"]])
    assert sorted(len(it.nodes) for it in v.items) == [1, 1, 40]
    assert any("40 nodes repeated as siblings" in n for n in v.notes)


def test_what_does_not_fit_becomes_one_box_said_so(tmp_path):
    g = graph(doc(fan("f", [f"m{k}" for k in range(30)], seq=50),
                  *[mul(f"m{k}", f"acc_x{k}", 2.0, seq=k, shape=[2]) for k in range(30)],
                  *[leaf(f"x{k}", [2]) for k in range(30)]))
    v = view.collapse(view.whole(g), 5, [g.by_id["f"]])
    assert len(v.items) <= 5 and v.items[-1].kind == "rest"
    assert any("farthest from the roots drawn as one box" in n for n in v.notes)


def test_without_dot_the_error_names_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))       # no dot program on the path
    if importlib.util.find_spec("graphviz") is None:
        expected = "pip install 'autograd-run[draw]'"
    else:
        expected = "install the graphviz system package (apt-get install graphviz"
    code, _, err = draw(capsys, "example:seed", "-o", str(tmp_path / "x.svg"))
    assert code == 2 and err.startswith("Error: -o: ") and expected in err
    assert not (tmp_path / "x.svg").exists()


@pytest.mark.parametrize("args, message", [
    (["-o", "x.pdf"], "-o: x.pdf: the output must end in .dot, .svg, .png or .html"),
    (["-o", "x.dot", "--trace", "a", "--costs", "b"], "--trace, --simulate, --costs and --diff: choose one"),
    (["-o", "x.dot", "--depth", "3"], "--depth goes with --around"),
    (["-o", "x.dot", "--depth", "2"], "--depth goes with --around"),
    (["-o", "x.dot", "--color-by", "duration"], "--color-by and --log-scale need --trace or --simulate"),
    (["-o", "x.dot", "--around", "nope"], "--around: no node 'nope' in example:seed"),
    (["-o", "x.dot", "--color-by", "wait"], "--color-by and --log-scale need --trace or --simulate"),
    (["-o", "x.dot", "--simulate=--bogus"], "--simulate: No such option '--bogus'"),
    (["-o", "x.dot", "--simulate=run"], "--simulate takes the options of `simulate`"),
    (["-o", "x.dot", "--costs", "t.json", "--color-by", "wait"], "--color-by goes with --trace or --simulate"),
    (["-o", "x.dot", "--diff", "a", "b", "--color-by", "start"], "--color-by goes with --trace or --simulate"),
])
def test_refused_requests_exit_2(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = draw(capsys, "example:seed", *args)
    assert code == 2 and err.startswith(f"Error: {message}"), err


def test_the_output_never_overwrites_an_input(tmp_path, capsys):
    g = write(tmp_path, "g.json", branches())
    trace = tmp_path / "t.json"
    assert run_cli([g, "--trace", str(trace), "--no-summary"], capsys)[0] == 0
    before = trace.read_bytes(), Path(g).read_bytes()
    for target, name in ((trace, "t.svg"), (Path(g), "g.dot")):
        link = tmp_path / name
        link.symlink_to(target)
        code, _, err = draw(capsys, g, "-o", str(link), "--trace", str(trace))
        assert code == 2 and err.startswith(f"Error: -o: {link}: is an input of this run"), err
    assert (trace.read_bytes(), Path(g).read_bytes()) == before


def test_a_trace_of_another_graph_is_refused(tmp_path, capsys):
    trace = tmp_path / "t.json"
    run_cli(["example:mlp", "--trace", str(trace), "--no-summary"], capsys)
    code, _, err = draw(capsys, "example:seed", "-o", str(tmp_path / "x.dot"), "--trace", str(trace))
    assert code == 2 and err.startswith(f"Error: --trace: {trace}: no node of example:seed has a time there")


def test_a_graph_from_stdin(tmp_path):
    """draw takes - as run and simulate do (it said: -: no such file); diff, which reads GRAPH once per side,
    says why it cannot."""
    from cli_proc import cli
    seed = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "autograd_run", "graphs",
                        "examples", "seed.yaml")
    with open(seed, "rb") as f:
        data = f.read()
    p = cli(["draw", "-", "-o", tmp_path / "s.dot"], input=data)
    assert (p.code, p.err) == (0, "") and 'label="&lt;stdin&gt;: 5 nodes' in (tmp_path / "s.dot").read_text()
    p = cli(["diff", "-", "--a", "--repeat 2"], input=data)
    assert (p.code, p.err) == (2, "Error: -: GRAPH is read once per side; give it as a file, not on stdin\n")
