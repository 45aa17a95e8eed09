"""The summary's two loops over Python objects: compiled in ``engine/_core.c``, twins here.

``attr_codes(objs, name, identity)``
    each object's attribute ``name`` as the position of its value among the
    distinct values (first appearance order), compared by identity or by
    equality: ``(int64 codes, values)``.
``node_columns(nodes)``
    each node's id and name (lists), seq (uint64), stream (int64) and -1
    where its id is its name (else 0): ``(ids, names, seq, stream, same)``.
``input_shape_codes(nodes)``
    each node's input shapes (a tuple of shape tuples) as a code among the
    distinct ones: ``(int64 codes, shapes)``.
``critical_path(nodes, gt, node, weight, start, order)``
    the longest chain of runs following next edges within a GraphTask (run
    ``k``: node ``nodes[node[k]]`` of GraphTask ``gt[k]``, ``weight[k]`` its
    queue wait plus duration, ``start[k]`` its start), visiting runs in
    ``order`` (latest start first; a successor counts only once visited);
    ties go to the first successor in next-edge order, and the path starts at
    the largest total, then the earliest start, then the first visited:
    ``(run indices root to leaf, total)``: the indices an int64 array (the twin makes a list, which the
    wrapper turns into one).

Both give what ``summary``'s reference implementation (over typed records)
computes; the compiled ones are used where the core is built.
"""

from __future__ import annotations

import numpy as np

from autograd_run.engine import core


def attr_codes_py(objs: list, name: str, identity: bool) -> tuple[np.ndarray, list]:
    seen: dict = {}
    values: list = []
    codes = np.empty(len(objs), dtype=np.int64)
    for i, o in enumerate(objs):
        v = getattr(o, name)
        key = id(v) if identity else v
        c = seen.get(key)
        if c is None:
            c = seen[key] = len(values)
            values.append(v)
        codes[i] = c
    return codes, values


def critical_path_py(nodes: list, gt: np.ndarray, node: np.ndarray, weight: np.ndarray, start: np.ndarray,
                     order: np.ndarray) -> tuple[list[int], int]:
    pos = {id(n): i for i, n in enumerate(nodes)}
    runs: dict[tuple, int] = {}
    best: dict[int, int] = {}
    succ: dict[int, int] = {}
    first = -1
    for k in order.tolist():
        g = int(gt[k])
        top, nxt = 0, -1
        for e in nodes[node[k]].next:
            if e is None:
                continue
            t = pos.get(id(e[0]))
            if t is None:
                continue
            k2 = runs.get((g, t))
            if k2 is not None and best[k2] > top:
                top, nxt = best[k2], k2
        best[k] = int(weight[k]) + top
        succ[k] = nxt
        runs[(g, int(node[k]))] = k
        if first < 0 or best[k] > best[first] or (best[k] == best[first] and start[k] < start[first]):
            first = k
    if first < 0:
        return [], 0
    path, k = [], first
    while k >= 0:
        path.append(k)
        k = succ[k]
    return path, best[first]


def node_columns_py(nodes: list) -> tuple:
    ids = [n.id for n in nodes]
    names = [n.name for n in nodes]
    seq = np.array([n.seq for n in nodes], dtype=np.uint64)
    stream = np.array([n.stream for n in nodes], dtype=np.int64)
    same = np.array([-1 if a == b else 0 for a, b in zip(ids, names)], dtype=np.int64)
    return ids, names, seq, stream, same


def node_columns(nodes: list) -> tuple:
    if core.node_columns is None:
        return node_columns_py(nodes)
    ids, names, seq, stream, same = core.node_columns(nodes)
    return (ids, names, np.frombuffer(seq, dtype=np.uint64), np.frombuffer(stream, dtype=np.int64),
            np.frombuffer(same, dtype=np.int64))


def node_rows_py(table: list, objs: list) -> np.ndarray:
    """The row in ``table`` of each object of ``objs`` (by identity; its first row), -1 where absent."""
    rows: dict = {}
    for i, n in enumerate(table):
        rows.setdefault(id(n), i)
    return np.array([rows.get(id(o), -1) for o in objs], dtype=np.int64)


def node_rows(table: list, objs: list) -> np.ndarray:
    if core.node_rows is None:
        return node_rows_py(table, objs)
    return np.frombuffer(core.node_rows(table, objs), dtype=np.int64)


def node_edges_py(nodes: list) -> tuple[np.ndarray, np.ndarray]:
    """Every next edge between two nodes of ``nodes`` as (producer rows, consumer rows): nodes in order,
    each node's edges in order; a node listed twice is its first row."""
    rows: dict = {}
    for i, n in enumerate(nodes):
        rows.setdefault(id(n), i)
    src: list[int] = []
    dst: list[int] = []
    for j, n in enumerate(nodes):
        for e in n.next:
            if e is not None:
                d = rows.get(id(e[0]))
                if d is not None:
                    src.append(j)
                    dst.append(d)
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64)


def node_edges(nodes: list) -> tuple[np.ndarray, np.ndarray]:
    if core.node_edges is None:
        return node_edges_py(nodes)
    src, dst = core.node_edges(nodes)
    return np.frombuffer(src, dtype=np.int64), np.frombuffer(dst, dtype=np.int64)


def input_shape_codes_py(nodes: list) -> tuple[np.ndarray, list]:
    seen: dict = {}
    codes = np.empty(len(nodes), dtype=np.int64)
    for i, n in enumerate(nodes):
        key = tuple(tuple(m.shape) for m in n.inputs)
        c = seen.get(key)
        if c is None:
            c = seen[key] = len(seen)
        codes[i] = c
    return codes, list(seen)


def input_shape_codes(nodes: list) -> tuple[np.ndarray, list]:
    if core.input_shape_codes is None:
        return input_shape_codes_py(nodes)
    data, shapes = core.input_shape_codes(nodes)
    return np.frombuffer(data, dtype=np.int64), shapes


def attr_codes(objs: list, name: str, identity: bool = False) -> tuple[np.ndarray, list]:
    if core.attr_codes is None:
        return attr_codes_py(objs, name, identity)
    data, values = core.attr_codes(objs, name, identity)
    return np.frombuffer(data, dtype=np.int64), values


def critical_path(nodes: list, gt: np.ndarray, node: np.ndarray, weight: np.ndarray, start: np.ndarray,
                  order: np.ndarray) -> tuple[np.ndarray, int]:
    if core.critical_path is None:
        path, total = critical_path_py(nodes, gt, node, weight, start, order)
        return np.asarray(path, dtype=np.int64), total
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in (gt, node, weight, start, order)]
    path, total = core.critical_path(nodes, *arrays)
    return np.frombuffer(path, dtype=np.int64), total
