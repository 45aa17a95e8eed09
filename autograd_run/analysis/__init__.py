"""Pure functions over a Recording, or over what was read from files: summaries, samples, comparisons.

``summary``  a run's summary (wall, critical path, per-op and per-worker time);
``samples``  the same per pass (one top-level backward call), for ``--repeat`` and ``diff``;
``profile``  one run's comparable facts (``Profile``), from a recording or samples;
``diff``     two profiles compared: order, structure, time (with ``stats``' tests);
``stats``    the rank statistics ``diff`` uses (Mann-Whitney, Kendall's tau, Holm).
"""
