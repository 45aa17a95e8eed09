"""The summary's two loops over Python objects: compiled in ``engine/_core.c``, twins here.

``attr_codes(objs, name, identity)``
    each object's attribute ``name`` as the position of its value among the
    distinct values (first appearance order), compared by identity or by
    equality: ``(int64 codes, values)``.
``critical_path(nodes, gt, node, weight, start, order)``
    the longest chain of runs following next edges within a GraphTask (run
    ``k``: node ``nodes[node[k]]`` of GraphTask ``gt[k]``, ``weight[k]`` its
    queue wait plus duration, ``start[k]`` its start), visiting runs in
    ``order`` (latest start first; a successor counts only once visited);
    ties go to the first successor in next-edge order, and the path starts at
    the largest total, then the earliest start, then the first visited:
    ``(run indices root to leaf, total)``.

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


def attr_codes(objs: list, name: str, identity: bool = False) -> tuple[np.ndarray, list]:
    if core.attr_codes is None:
        return attr_codes_py(objs, name, identity)
    data, values = core.attr_codes(objs, name, identity)
    return np.frombuffer(data, dtype=np.int64), values


def critical_path(nodes: list, gt: np.ndarray, node: np.ndarray, weight: np.ndarray, start: np.ndarray,
                  order: np.ndarray) -> tuple[list[int], int]:
    if core.critical_path is None:
        return critical_path_py(nodes, gt, node, weight, start, order)
    arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in (gt, node, weight, start, order)]
    path, total = core.critical_path(nodes, *arrays)
    return path, total
