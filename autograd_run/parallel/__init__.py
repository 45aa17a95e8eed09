"""Data-parallel backward: how DDP and FSDP2 group and communicate a backward's gradients.

``buckets``  DDP's gradient buckets, assigned as DistributedDataParallel and its C++ Reducer assign them
             (initially and when rebuilt in gradient-ready order).
"""
