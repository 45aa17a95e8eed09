"""Order files (``traces.order``): comparing orders pass by pass and per worker, reading and writing."""

import json

import pytest

from autograd_run.errors import RequestError
from autograd_run.traces.order import compare_orders, read_order, write_order


def rows(ids, pass_=None, thread="MainThread"):
    """Order rows for node ids (a space-separated string); ``thread`` per row when a list."""
    ids = ids.split()
    threads = thread if isinstance(thread, list) else [thread] * len(ids)
    out = [{"position": k, "id": i, "name": i.upper(), "seq": len(ids) - k, "thread": th}
           for k, (i, th) in enumerate(zip(ids, threads))]
    if pass_ is not None:
        for r in out:
            r["pass"] = pass_
    return out


def passes(*orders):
    """Rows of consecutive passes, one order string each."""
    return [r for k, ids in enumerate(orders) for r in rows(ids, pass_=k)]


def test_equal_orders_agree():
    assert compare_orders(rows("a b c"), rows("a b c"), per_worker=False) is None


def test_the_first_difference_is_found_by_id():
    d = compare_orders(rows("a b c"), rows("a c b"), per_worker=False)
    assert (d.position, d.expected["id"], d.got["id"], d.pass_index, d.thread) == (1, "b", "c", 0, None)
    assert d.describe() == "order differs at position 1: expected b (B, seq 2), got c (C, seq 2)"


def test_a_run_that_stops_early_differs_at_its_end():
    d = compare_orders(rows("a b c"), rows("a b"), per_worker=False)
    assert d.position == 2 and d.got is None
    assert d.describe().endswith("got (end of order)")


def test_rows_without_a_pass_are_the_first_pass():
    assert compare_orders(rows("a b"), rows("a b", pass_=0), per_worker=False) is None


def test_one_golden_pass_is_compared_with_every_pass_of_the_run():
    golden = rows("a b c")
    assert compare_orders(golden, passes("a b c", "a b c", "a b c"), per_worker=False) is None
    d = compare_orders(golden, passes("a b c", "a b c", "a c b"), per_worker=False)
    assert (d.pass_index, d.position, d.expected["id"], d.got["id"]) == (2, 1, "b", "c")
    assert "at position 1 in pass 2:" in d.describe()


def test_a_golden_of_several_passes_is_compared_pass_by_pass():
    golden = passes("a b c", "a c b", "b a c")
    assert compare_orders(golden, passes("a b c", "a c b", "b a c"), per_worker=False) is None
    d = compare_orders(golden, passes("a b c", "a b c", "b a c"), per_worker=False)
    assert (d.pass_index, d.position) == (1, 1)


def test_a_golden_of_two_passes_against_a_run_of_three_says_so():
    d = compare_orders(passes("a b", "a b"), passes("a b", "a b", "a b"), per_worker=False)
    assert d is not None and d.position == 0
    assert "the golden order has 2 passes, the run 3" in d.describe()


def test_per_worker_compares_each_workers_own_sequence():
    """Workers interleave freely: only each worker's own sequence must match.

        golden:  a(w0) x(w1) b(w0) y(w1)
        run:     x(w1) a(w0) y(w1) b(w0)
    """
    golden = rows("a x b y", thread=["w0", "w1", "w0", "w1"])
    run = rows("x a y b", thread=["w1", "w0", "w1", "w0"])
    assert compare_orders(golden, run, per_worker=True) is None
    assert compare_orders(golden, run, per_worker=False).position == 0


def test_a_per_worker_divergence_names_the_worker():
    golden = rows("a x b y", thread=["w0", "w1", "w0", "w1"])
    run = rows("a y b x", thread=["w0", "w1", "w0", "w1"])
    d = compare_orders(golden, run, per_worker=True)
    assert (d.thread, d.position, d.expected["id"], d.got["id"]) == ("w1", 0, "x", "y")
    assert "position 0 of worker 'w1'" in d.describe()


def test_per_worker_comparison_is_also_pass_by_pass():
    threads = ["w0", "w1"]
    golden = rows("a x", thread=threads)
    run = rows("a x", pass_=0, thread=threads) + rows("x a", pass_=1, thread=threads[::-1])
    assert compare_orders(golden, run, per_worker=True) is None
    bad = run + rows("a y", pass_=2, thread=threads)
    d = compare_orders(golden, bad, per_worker=True)
    assert (d.pass_index, d.thread, d.got["id"]) == (2, "w1", "y")


def test_the_ready_set_explains_a_difference():
    run = rows("a c b")
    run[1]["ready"] = [["c", 0, 3], ["b", 0, 2]]
    d = compare_orders(rows("a b c"), run, per_worker=False)
    text = d.describe()
    assert "ready set at that pop" in text
    assert [line.split()[0] for line in text.splitlines()[2:]] == ["c", "b"]
    assert text.splitlines()[2].endswith("<- popped")


def test_written_orders_read_back_without_ready_sets(tmp_path):
    p = tmp_path / "o.jsonl"
    rs = passes("a b", "b a")
    rs[0]["ready"] = [["a", 0, 2]]
    write_order(str(p), rs)
    assert all("ready" not in json.loads(line) for line in p.read_text().splitlines())
    back = read_order(str(p))
    assert [(r["id"], r["pass"]) for r in back] == [("a", 0), ("b", 0), ("b", 1), ("a", 1)]
    assert compare_orders(back, rs, per_worker=False) is None


@pytest.mark.parametrize("line,message", [
    ('{"id": "a", "pass": -1}', "line 2: 'pass' must be a non-negative integer"),
    ('{"id": "a", "pass": true}', "line 2: 'pass' must be a non-negative integer"),
    ('{"id": "a", "pass": "1"}', "line 2: 'pass' must be a non-negative integer"),
    ('{"name": "a"}', "line 2: each line needs an object with a string 'id'"),
    ('["a"]', "line 2: each line needs an object with a string 'id'"),
    ("{oops", "line 2: not JSON"),
    # the per-worker comparison groups rows by thread and sorts the threads: each was a TypeError
    ('{"id": "a", "thread": ["w"]}', "line 2: 'thread' must be a string, got list"),
    ('{"id": "a", "thread": 5}', "line 2: 'thread' must be a string, got 5"),
    ('{"id": "a", "thread": null}', "line 2: 'thread' must be a string, got null"),
    ('{"id": "a", "seq": -3}', "line 2: 'seq' must be a non-negative integer or null, got -3"),  # the value said
    ('{"id": "a", "position": -1}', "line 2: 'position' must be a non-negative integer, got -1"),
    ('{"id": "a", "name": {"x": 1}}', "line 2: 'name' must be a string, got dict"),
])
def test_a_malformed_order_file_names_the_line(tmp_path, line, message):
    p = tmp_path / "o.jsonl"
    p.write_text('{"id": "ok"}\n' + line + "\n")
    with pytest.raises(RequestError) as info:
        read_order(str(p))
    assert message in str(info.value) and info.value.option == "expected_order"


def test_an_order_file_that_is_not_text_is_refused(tmp_path):
    p = tmp_path / "o.jsonl"
    p.write_bytes(b'{"id": "\xff"}\n')
    with pytest.raises(RequestError, match="not UTF-8"):
        read_order(str(p))


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_an_empty_order_file_is_refused_not_compared(tmp_path, text):
    """An empty --expect-order file or golden was an order of no node: every run "differed" at position 0, exit 3
    (a hostile review)."""
    p = tmp_path / "o.jsonl"
    p.write_text(text)
    with pytest.raises(RequestError, match=r"o.jsonl: the file is empty \(an order file has a line per node run\)"):
        read_order(str(p))


def test_a_hostile_order_line_is_refused_with_its_line(tmp_path):
    """A line nested 100,000 deep was a traceback (RecursionError is no ValueError); a number of 5,000 digits showed
    Python's advice about sys.set_int_max_str_digits (a hostile review of the inputs besides graph files)."""
    good = json.dumps({"id": "a", "name": "A"})
    for line, why in (("[" * 100_000 + "]" * 100_000, "line 2: not an order row: nested too deeply"),
                      ('{"id": "b", "seq": ' + "9" * 5000 + "}", "line 2: a number of more than 4300 digits")):
        p = tmp_path / "o.jsonl"
        p.write_text(good + "\n" + line + "\n")
        with pytest.raises(RequestError) as e:
            read_order(str(p))
        assert str(e.value).endswith(why), str(e.value)


def test_a_long_id_is_quoted_cut_in_a_divergence():
    """A million-character id from an order file made a megabyte of message: quoted, it is cut and its length said."""
    long = "N" * 1_000_000
    d = compare_orders(rows("a b"), [dict(rows("a b")[0]), dict(rows("a b")[1], id=long)], per_worker=False)
    text = d.describe()
    assert len(text) < 1000 and "... (1,000,000 characters)" in text
