"""Colour scales for pictures: time (light yellow to dark red) and change (blue faster, red slower).

``Scale`` maps a value to a fill colour (linear, or logarithmic for
times spread over decades) and draws its colour bar as a Graphviz
HTML-like label, whose text is only numbers and fixed words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: ColorBrewer YlOrRd (9 classes): short times light, long times dark red.
TIME = ("#ffffcc", "#ffeda0", "#fed976", "#feb24c", "#fd8d3c", "#fc4e2a", "#e31a1c", "#bd0026", "#800026")
#: ColorBrewer RdBu (9 classes) reversed: faster blue, unchanged white, slower red.
CHANGE = ("#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7", "#fddbc7", "#f4a582", "#d6604d", "#b2182b")
#: Nodes without a value (not run, not in the input).
NO_VALUE = "#ffffff"


def fmt_ns(ns: float) -> str:
    ns = float(ns)
    if abs(ns) >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if abs(ns) >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def fmt_bytes(n: float) -> str:
    """Bytes as the colour bar and tooltips show them (``graphs.validate.format_bytes``, signed)."""
    from autograd_run.graphs.validate import format_bytes
    return ("-" if n < 0 else "") + format_bytes(int(abs(n)))


def _rgb(h: str) -> tuple[int, int, int]:
    return int(h[1:3], 16), int(h[3:5], 16), int(h[5:7], 16)


def interpolate(stops: tuple[str, ...], t: float) -> str:
    """The colour at ``t`` in [0, 1] along ``stops``."""
    t = min(1.0, max(0.0, t))
    x = t * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    a, b = _rgb(stops[i]), _rgb(stops[i + 1])
    return "#" + "".join(f"{round(p + (q - p) * f):02x}" for p, q in zip(a, b))


def text_colour(fill: str) -> str:
    """Black on light fills, white on dark ones."""
    r, g, b = _rgb(fill)
    return "#000000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#ffffff"


@dataclass
class Scale:
    """``kind`` ``time`` (ns, from ``low`` to ``high``) or ``change`` (relative, symmetric around 0)."""

    kind: str
    low: float
    high: float
    log: bool = False
    title: str = ""

    @staticmethod
    def for_values(kind: str, values: list[float], log: bool = False, title: str = "") -> "Scale":
        vals = [v for v in values if v is not None and math.isfinite(v)]
        if kind == "change":
            top = min(1.0, max([abs(v) for v in vals] + [0.05]))
            return Scale(kind, -top, top, False, title)
        low = min(vals) if vals else 0.0
        high = max(vals) if vals else 1.0
        if log:
            low = max(low, 1.0)
            high = max(high, low * 10)
        else:
            low = 0.0
            high = high if high > 0 else 1.0
        return Scale(kind, low, high, log, title)

    def position(self, v: float) -> float:
        if self.kind == "change":
            return (v - self.low) / (self.high - self.low)
        if self.log:
            v = max(v, self.low)
            return (math.log10(v) - math.log10(self.low)) / (math.log10(self.high) - math.log10(self.low))
        return min(1.0, max(0.0, (v - self.low) / (self.high - self.low))) if self.high > self.low else 0.0

    def colour(self, v: float | None) -> str:
        if v is None or not math.isfinite(v):
            return NO_VALUE if v is None else interpolate(CHANGE if self.kind == "change" else TIME, 1.0)
        return interpolate(CHANGE if self.kind == "change" else TIME, self.position(v))

    def label(self, v: float) -> str:
        if self.kind == "bytes":
            return fmt_bytes(v)
        return f"{v:+.0%}" if self.kind == "change" else fmt_ns(v)

    def bar(self, cells: int = 12) -> str:
        """The colour bar as a Graphviz HTML-like label: the title, the colours, the end values."""
        stops = CHANGE if self.kind == "change" else TIME
        row = "".join(f'<td bgcolor="{interpolate(stops, k / (cells - 1))}" width="14" height="12"></td>'
                      for k in range(cells))
        half = cells // 2
        ends = (f'<td colspan="{half}" align="left">{_html(self.label(self.low))}</td>'
                f'<td colspan="{cells - half}" align="right">{_html(self.label(self.high))}</td>')
        scale = " (log scale)" if self.log else ""
        return (f'<<table border="0" cellborder="0" cellspacing="0" cellpadding="1">'
                f'<tr><td colspan="{cells}">{_html(self.title + scale)}</td></tr><tr>{row}</tr><tr>{ends}</tr>'
                f'</table>>')


def _html(text: str) -> str:
    """Text for a Graphviz HTML-like label."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
            .replace("\n", " "))
