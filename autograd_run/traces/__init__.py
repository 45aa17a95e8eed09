"""Trace files: writers of a Recording and readers of trace files, one module per format.

``trace_file``    the table from a path's ending to its writer (``write_trace``), and the ``TraceWriter``
                  interface a new format implements;
``layout``        what a trace shows of a Recording, whatever its encoding (titles, tracks, marks);
``chrome``        the Chrome JSON trace (plain or gzipped); ``pftrace``: Perfetto's protobuf trace;
``encode``        the writers' compiled inner loop (its Python twin);
``order``         order files (``--order-out``, golden orders);
``read_profile``  a run's profile from an order file, a Chrome trace or a JSON summary (for ``diff``);
``torch_profile`` PyTorch profiler traces (``export_chrome_trace``) as typed records;
``jsonfile``      bounded reading of (gzipped) JSON; ``viewer``: the local Perfetto UI server.
"""
