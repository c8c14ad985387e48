"""The exchange: what averaging a gradient costs between nodes, measured between 2 MPI
ranks placed where the nodes will be, or predicted for a link between machines like this
one."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ddlstudy import reducers
from ddlstudy.hosts import rate_bits
from ddlstudy.reducers.compress import parse as parse_compress
from ddlstudy.tools.predict import Cost, fit, measure_sizes

COMPRESSORS = ("fp16", "topk:0.01")
"""The compressions advise weighs against the reducers."""


@dataclass(frozen=True)
class Exchange:
    """What averaging a gradient costs between nodes: each reducer's alpha-beta (predict's
    fit), and each compressor's alpha, compute per byte (gamma) and link per byte."""

    reduce: dict[str, Cost]
    compress: dict[str, tuple[float, float, float]]
    """spec -> (alpha s per message, gamma s per gradient byte, beta s per wire byte)."""
    link: str

    def seconds(self, method: str, n: int, nbytes: float) -> float:
        if n == 1:
            return 0.0
        if method in self.reduce:
            return self.reduce[method].seconds(method, n, nbytes)
        alpha, gamma, beta = self.compress[method]
        ratio = parse_compress(method).wire_ratio
        return (n - 1) * alpha + nbytes * (gamma + (n - 1) * ratio * beta)

    def record(self) -> dict[str, Any]:
        return {"link": self.link,
                "reduce": {r: {"alpha_s": c.alpha, "beta_s_per_byte": c.beta}
                           for r, c in self.reduce.items()},
                "compress": {s: {"alpha_s": a, "gamma_s_per_byte": g, "beta_s_per_byte": b}
                             for s, (a, g, b) in self.compress.items()}}


def measure_exchange(gradient_bytes: int, hosts: str | None, repeats: int = 3) -> Exchange:
    """Every reducer and compressor on the gradient's size (at most 16 MiB) and on 1/16 of
    it, between 2 ranks placed on ``hosts`` (this host if None)."""
    big = min(gradient_bytes // 4, 4 * 2**20)
    sizes = (big, max(big // 16, 1024))
    samples: dict[str, dict[int, float]] = {}
    for floats, ms in measure_sizes(list(sizes), 2, repeats, hosts, COMPRESSORS).items():
        for method, times in ms.items():
            samples.setdefault(method, {})[4 * floats] = statistics.median(times) / 1e3
    reduce = fit({r: samples[r] for r in reducers.REGISTRY})
    wire = reduce["allreduce"].beta  # between 2 ranks allreduce sends the buffer once
    compress = {}
    for spec in COMPRESSORS:
        (s1, t1), (s2, t2) = sorted(samples[spec].items())
        slope = max((t2 - t1) / (s2 - s1), 0.0)
        ratio = parse_compress(spec).wire_ratio
        compress[spec] = (max(t1 - s1 * slope, 0.0), max(slope - ratio * wire, 0.0), wire)
    return Exchange(reduce, compress, hosts or "this host (shared memory)")


def on_link(measured: Exchange, link: str) -> Exchange:
    """Separate machines like this one joined by ``link``: the fitted alphas and compute,
    beta = 8 / rate."""
    beta = 8 / rate_bits(link)
    return Exchange({r: Cost(c.alpha, beta) for r, c in measured.reduce.items()},
                    {s: (a, g, beta) for s, (a, g, _) in measured.compress.items()}, link)
