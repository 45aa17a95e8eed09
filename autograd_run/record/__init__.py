"""What a run did, recorded: the tracer hooks the engine calls and the Recording they fill.

``recorder``        the Recorder (a ``engine.tracer.Tracer``): the engine's events into an event log;
``event_log``       hot events as fixed-size records (the compiled core's twin);
``recording``       the Recording: nodes, slices, waits, threads, as columns;
``kernels``         loops over recording columns (compiled, with their Python twins);
``order_recorder``  the executed order only (golden orders, ``--order-out``).
"""
