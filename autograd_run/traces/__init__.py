"""Tracing: recorders for the engine's hooks, the Chrome trace writer, summaries."""
