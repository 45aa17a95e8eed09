"""The command-line flag of each request field (``RequestError.option``), for error messages: ``--costs``."""

FLAGS = {"output": "-o", "inputs": "--inputs", "inject_error": "--inject-error", "inject_nan": "--inject-nan",
         "trace_path": "--trace", "trace_format": "--trace-format", "trace_ranks": "--trace-ranks", "order_out": "--order-out", "expected_order": "--expect-order",
         "backend": "--backend", "devices": "--devices", "repeat": "--repeat", "spec": "--spec", "scale": "--scale", "costs": "--costs",
         "policy": "--policy", "placement": "--placement", "fail_on": "--fail-on",
         "trace": "--trace", "diff": "--diff", "around": "--around", "step": "--step", "costs_step": "--step",
         "steps": "--steps", "warmup": "--warmup", "timeout": "--timeout", "allow_unused": "--allow-unused",
         "profile_trace": "--profile-trace",
         "cache": "--cache", "scheduler": "--scheduler", "workers": "--workers", "out": "--out",
         "transfer": "--transfer", "batch": "--batch", "network": "--network", "world": "--world", "ddp": "--ddp",
         "fsdp": "--fsdp", "straggler": "--straggler", "memory_snapshot": "--memory-snapshot"}
