"""Measured node costs, from a file or from the graph: which file format, which profile run is which node.

``measured``       ``load_costs`` (a PyTorch profile, autograd-run's own trace, or costs stored in a graph
                   file) -> ``MeasuredCosts``, and what a profile's costs are made of (``ProfileUse``);
``profile_match``  which backward node run of a PyTorch profile is which node of a graph.

Below the simulator: what the matching needs from it (the order PyTorch's engine runs the graph's
AccumulateGrad nodes in) is handed in by the caller (``sim.order.predicted_order``).
"""
