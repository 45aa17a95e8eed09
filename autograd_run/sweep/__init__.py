"""Sweeps: many graphs x device counts x placements x policies x machine specs x cost scalings, on Dask.

Modules, in the order a sweep uses them:

``spec``         the sweep spec (YAML file or command-line values), checked as untrusted input
``grid``         graphs found and hashed, machine specs read, the points expanded
``fingerprint``  the tool's fingerprint and each point's cache key
``cache``        results on disk, one JSON file per point
``evaluate``     the per-point work (simulate or run), batched per task; runs on the workers
``cluster``      Dask distributed: LocalCluster or a scheduler, graphs sent once, batches submitted
``runner``       ``run_sweep(grid, SweepOptions) -> SweepReport``
``results``      ranking, CSV, Parquet, JSON; ``plots``: wall time against device count per graph

Only ``cluster`` imports Dask, and only when a sweep runs there; ``plots``
imports matplotlib only when drawing (both come with ``autograd-run[sweep]``).
See docs/sweep.md.
"""
