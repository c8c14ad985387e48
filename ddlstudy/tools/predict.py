"""`ddlstudy predict`: an alpha-beta model of data-parallel training, fitted from what was
measured, that predicts epoch time, speedup and scaling efficiency from 1 to 256 nodes.

    ddlstudy predict runs/scale [--hosts emulated] [--links 1gbit,10gbit,25gbit]

A step on N nodes with global batch B (strong scaling) costs

    t(N) = (B / N) / r  +  m(N) * alpha + f(N) * S * beta

- r: one node's training images/s, from the folder's one-node run of the use case
  (steady images/s, so the warm-up steps are left out);
- S: the gradient's bytes (4 per parameter of the use case's model);
- alpha, beta: each reducer's latency per message and time per byte, fitted by timing the
  reducer on two buffer sizes between 2 MPI ranks placed as the runs were (``--hosts``);
- m(N), f(N): the messages and buffer-sizes on a reducer's critical path at N nodes
  (each reducer's ``terms``, in its file in ``ddlstudy/reducers/``; p: the largest power
  of two <= N; the terms in brackets when N is not one):

  ==================  ===============  ==================
  reducer             m(N)             f(N)
  ==================  ===============  ==================
  allreduce (MPICH)   2 log2 p (+2)    2 (p-1)/p (+2)
  ring-allreduce      2 (N-1)          2 (N-1)/N
  parameter-server    2 (N-1)          2 (N-1)
  ring-reduce         2 (N-1)          2 (N-1)
  step-wise           N-1              N-1
  ==================  ===============  ==================

An epoch is ceil(images / B) steps plus the one-node validation time / N. The exchange
follows the backward pass (as every reducer does without ``--bucket-mb``); ``overlap``
gives the other bound, where it hides behind the backward pass (2/3 of the compute), and
is what runs with ``--bucket-mb`` are checked against. Links other than the measured one
keep the fitted alpha and take beta = 8 / rate.

Pipeline and hybrid runs in the folder are checked against the pipeline's own model
(``pipeline_model``: their stages' passes in schedule order on shared cores).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ddlstudy import reducers
from ddlstudy.backends.mpi.launch import placement, require_mpiexec
from ddlstudy.backends.mpi.leftovers import Leftovers
from ddlstudy.config.limits import most
from ddlstudy.errors import ConfigError, UsageError
from ddlstudy.files import write_outputs
from ddlstudy.machine.environment import python_module
from ddlstudy.reducers import terms
from ddlstudy.tools import pipeline_model

REDUCERS = tuple(reducers.REGISTRY)
DEFAULT_NODES = (1, 2, 3, 4, 8, 16, 32, 64, 128, 256)
BACKWARD_SHARE = 2 / 3
"""Of a step's compute, the backward pass (about twice the forward's work)."""


@dataclass(frozen=True)
class Cost:
    """One reducer's fitted latency (s per message) and inverse bandwidth (s per byte)."""

    alpha: float
    beta: float

    def seconds(self, reducer: str, n: int, nbytes: float) -> float:
        m, f = terms(reducer, n)
        return m * self.alpha + f * nbytes * self.beta


def fit(samples: dict[str, dict[int, float]]) -> dict[str, Cost]:
    """Alpha and beta per reducer from its median seconds at two buffer sizes (2 ranks)."""
    costs = {}
    for reducer, by_bytes in samples.items():
        (s1, t1), (s2, t2) = sorted(by_bytes.items())[:1] + sorted(by_bytes.items())[-1:]
        m, f = terms(reducer, 2)
        beta = max((t2 - t1) / (f * (s2 - s1)), 0.0)
        alpha = max((t1 - f * s1 * beta) / m, 0.0)
        costs[reducer] = Cost(alpha, beta)
    return costs


def measure_reducers(floats: int, nodes: int, repeats: int, hosts: str | None = None,
                     compress: tuple[str, ...] = ()) -> dict[str, list[float]]:
    """Milliseconds of every reducer (and of every compressor in ``compress``) on a buffer
    of ``floats`` between ``nodes`` ranks."""
    return measure_sizes([floats], nodes, repeats, hosts, compress)[floats]


def measure_sizes(sizes: list[int], nodes: int, repeats: int, hosts: str | None = None,
                  compress: tuple[str, ...] = ()) -> dict[int, dict[str, list[float]]]:
    """``measure_reducers`` on each of ``sizes`` (floats), in one MPI launch."""
    mpiexec = require_mpiexec()
    where, netmod = placement(hosts, nodes)
    with subprocess.Popen([mpiexec, *where, "-n", str(nodes),
                           *python_module("ddlstudy.tools.bench.reduce"), "--floats",
                           ",".join(map(str, sizes)), "--repeats", str(repeats), "--compress",
                           ",".join(compress)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=os.environ | netmod) as proc:
        leftovers = Leftovers(proc.pid)  # MPICH's shm and hydra's /tmp file, however it ends
        leftovers.start()
        try:
            stdout, stderr = proc.communicate()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            leftovers.remove()
    if proc.returncode != 0:
        raise UsageError(f"mpiexec failed ({proc.returncode}): {stderr.strip()[-500:]}")
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {line["floats"]: line["ms"] for line in lines}


def calibrate(gradient_bytes: int, hosts: str | None, repeats: int = 5) -> dict[str, Cost]:
    """Time every reducer on the gradient and on 1/16 of it, between 2 ranks."""
    samples: dict[str, dict[int, float]] = {r: {} for r in REDUCERS}
    sizes = [gradient_bytes // 4, max(gradient_bytes // 64, 1024)]
    for floats, by_reducer in measure_sizes(sizes, 2, repeats, hosts).items():
        for reducer, ms in by_reducer.items():
            if reducer in samples:
                samples[reducer][4 * floats] = statistics.median(ms) / 1e3
    return fit(samples)


@dataclass(frozen=True)
class Node:
    """What one node does, from a one-node run."""

    usecase: str
    images_per_s: float
    train_images: int
    batch: int
    val_s: float
    gradient_bytes: int
    run: str

    def step_s(self, cost: Cost, reducer: str, n: int, batch: int, overlap: bool = False,
               nbytes: float | None = None) -> float:
        compute = math.ceil(batch / n) / self.images_per_s
        exchange = cost.seconds(reducer, n, self.gradient_bytes if nbytes is None else nbytes)
        if overlap:
            return compute + max(0.0, exchange - BACKWARD_SHARE * compute)
        return compute + exchange

    def epoch_s(self, cost: Cost, reducer: str, n: int, batch: int,
                overlap: bool = False) -> float:
        steps = math.ceil(self.train_images / batch)
        return steps * self.step_s(cost, reducer, n, batch, overlap) + self.val_s / n


def _gradient_bytes(manifest: dict) -> int:
    """The float32 gradient the run's nodes averaged: its recorded model's weights (a run
    from before models were recorded: its use case's, rebuilt from its config)."""
    from ddlstudy.config import usecase_from_dict
    from ddlstudy.models import facts

    recorded = (manifest.get("model") or {}).get("parameters")
    if recorded:
        return 4 * int(recorded)
    raw = {k: v for k, v in manifest["config"]["usecase"].items() if k != "source"}
    uc = usecase_from_dict(raw)
    return facts(uc.model, len(uc.classes)).gradient_bytes


def one_node(manifests: list[dict]) -> Node:
    """The one-node run the model starts from: MPI with one node, else a local run."""
    done = [m for m in manifests if m.get("status") == "completed" and m.get("epochs")]
    ones = [m for m in done if m["backend"].get("nodes", 1) == 1]
    # The node the multi-node runs ran: their most common local strategy, under MPI.
    many = [m["strategy"]["name"] for m in done if m["backend"].get("nodes", 1) > 1]
    usual = max(set(many), key=many.count) if many else None
    ones.sort(key=lambda m: (m["strategy"]["name"] != usual,
                             m["backend"].get("name") != "mpi"))
    if not ones:
        raise UsageError("predict needs a completed one-node run in the folder (e.g. "
                         "ddlstudy run --backend mpi --nodes 1 ...) to measure a node's speed")
    m = ones[0]
    epochs = m["epochs"]
    rate = statistics.median(e["steady_images_per_s"] for e in epochs)
    try:
        images, batch = epochs[-1]["train_images"], (m.get("effective") or {})["global_batch"]
        val_s = statistics.median(float(e["val_time_s"]) for e in epochs)
    except (KeyError, TypeError, ValueError):
        images = batch = val_s = None
    if not rate > 0 or not images or not batch or val_s is None:
        raise UsageError(f"run {m['id']} ({m['path']}) records no images/s, images or batch "
                         "to measure a node's speed by; give a folder with a run that "
                         "trained, from this version of ddlstudy")
    return Node(usecase=m["usecase"], images_per_s=rate, train_images=images, batch=batch,
                val_s=val_s, gradient_bytes=_gradient_bytes(m), run=m["id"])


def validate(node: Node, costs: dict[str, Cost], manifests: list[dict]) -> list[dict]:
    """Predicted against measured steady images/s for every multi-node MPI run."""
    rows = []
    for m in manifests:
        b = m.get("backend", {})
        if (m.get("status") != "completed" or b.get("name") != "mpi" or m["usecase"]
                != node.usecase or b.get("nodes", 1) < 2 or m["config"].get("compress",
                                                                         "none") != "none"):
            continue
        n, reducer = b["nodes"], b.get("reduce")
        batch = (m.get("effective") or {}).get("global_batch")
        measured = statistics.median(e["steady_images_per_s"] for e in m["epochs"] or [{
            "steady_images_per_s": 0}])
        if reducer not in costs or not batch or not measured > 0:
            continue  # nothing to compare a prediction with
        overlap = bool(m["config"].get("bucket_mb"))
        predicted = batch / node.step_s(costs[reducer], reducer, n, batch, overlap)
        rows.append({"run": m["id"], "nodes": n, "reduce": reducer, "batch": batch,
                     "overlap": overlap,
                     "measured_images_per_s": round(measured, 1),
                     "predicted_images_per_s": round(predicted, 1),
                     "error_percent": round(100 * (predicted / measured - 1), 1)})
    return sorted(rows, key=lambda r: (r["reduce"], r["nodes"]))


def parse_list(flag: str, text: str, kind=int) -> list:
    try:
        values = [kind(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(flag, f"{text!r}; give comma-separated values") from None
    if kind is int and not all(0 < v <= most("predicted_nodes") for v in values):
        raise ConfigError(flag, f"{text!r}; every value must be positive and at most "
                          f"{most('predicted_nodes'):g}")
    return values


def predict(runs_dir: Path, hosts: str | None, nodes: list[int], links: list[str],
            batches: list[int] | None, repeats: int = 5) -> dict:
    from ddlstudy.hosts import rate_bits
    from ddlstudy.report import load_runs

    for link in links:
        rate_bits(link, "--links")  # a bad rate is refused before anything is measured
    manifests = load_runs(runs_dir)
    node = one_node(manifests)
    costs = calibrate(node.gradient_bytes, hosts, repeats)
    scenarios = {"measured": costs} | {
        link: {r: Cost(c.alpha, 8 / rate_bits(link)) for r, c in costs.items()}
        for link in links}
    batches = batches or [node.batch]
    one = {b: node.epoch_s(costs["allreduce"], "allreduce", 1, b) for b in batches}
    table = []
    for link, link_costs in scenarios.items():
        for reducer, cost in link_costs.items():
            for batch in batches:
                for n in nodes:
                    for overlap in (False, True):
                        epoch = node.epoch_s(cost, reducer, n, batch, overlap)
                        table.append({"link": link, "reduce": reducer, "batch": batch,
                                      "nodes": n, "overlap": overlap,
                                      "epoch_s": epoch, "speedup": one[batch] / epoch,
                                      "scaling_efficiency": one[batch] / epoch / n})
    return {"node": node.__dict__,
            "costs": {r: {"alpha_s": c.alpha, "beta_s_per_byte": c.beta,
                          "bandwidth_gbit_s": 8e-9 / c.beta if c.beta else None}
                      for r, c in costs.items()},
            "hosts": hosts, "validation": validate(node, costs, manifests), "table": table,
            "pipelines": pipeline_model.validate(manifests)}


def published() -> list[dict]:
    """Horovod (Sergeev & Del Balso 2018): 128 servers of 4 Pascal GPUs on 25 Gbit RoCE,
    scaling efficiency 90 % for ResNet-101 and 68 % for VGG-16. The per-GPU speeds are
    inputs (tf_cnn_benchmarks-era P100 figures, batch 64): ResNet-101 ~130 images/s and
    VGG-16 ~150. Servers reduce their 4 GPUs internally, so the ring runs between 128
    servers, each step's compute being one GPU's batch of 64."""
    rows = []
    for model, params, speed, reported in (("ResNet-101", 44_549_160, 130.0, 0.90),
                                           ("VGG-16", 138_357_544, 150.0, 0.68)):
        node = Node(model, speed, 0, 64, 0.0, 4 * params, "")
        cost = Cost(alpha=20e-6, beta=8 / 25e9)
        one = node.step_s(cost, "ring-allreduce", 1, 64)
        row = {"model": model, "reported_efficiency": reported}
        for overlap in (False, True):
            step = node.step_s(cost, "ring-allreduce", 128, 64 * 128, overlap)
            row["overlap" if overlap else "no_overlap"] = round(one / step, 3)
        rows.append(row)
    return rows


def markdown(result: dict, nodes_shown: tuple[int, ...] = (1, 2, 3, 4, 16, 64, 256)) -> str:
    node = result["node"]
    lines = [f"one node ({node['run']}): {node['images_per_s']:.1f} images/s, "
             f"{node['train_images']} images an epoch, batch {node['batch']}, gradient "
             f"{node['gradient_bytes'] / 1e6:.1f} MB",
             "", "fitted between 2 ranks" + (f" on {result['hosts']}" if result["hosts"]
                                            else " on this host") + ":",
             "| reducer | alpha (us) | bandwidth (Gbit/s) |", "|---|---|---|"]
    for r, c in result["costs"].items():
        bw = f"{c['bandwidth_gbit_s']:.2f}" if c["bandwidth_gbit_s"] else "inf"
        lines.append(f"| {r} | {1e6 * c['alpha_s']:.0f} | {bw} |")
    if result["validation"]:
        lines += ["", "predicted against measured (steady images/s):",
                  "| run | nodes | reducer | measured | predicted | error |",
                  "|---|---|---|---|---|---|"]
        for v in result["validation"]:
            lines.append(f"| {v['run']} | {v['nodes']} | {v['reduce']}"
                         f"{' (buckets, overlap bound)' if v['overlap'] else ''} | "
                         f"{v['measured_images_per_s']} | {v['predicted_images_per_s']} | "
                         f"{v['error_percent']:+.1f} % |")
    lines += pipeline_model.markdown(result.get("pipelines") or [])
    shown = [n for n in nodes_shown if any(r["nodes"] == n for r in result["table"])]
    lines += ["", "predicted scaling efficiency (images/s / (nodes x one node's); no "
              "overlap), batch "
              f"{node['batch']}:", "| link | reducer | " + " | ".join(map(str, shown)) + " |",
              "|---|---|" + "---|" * len(shown)]
    for link in dict.fromkeys(r["link"] for r in result["table"]):
        for reducer in REDUCERS:
            cells = {r["nodes"]: r["scaling_efficiency"] for r in result["table"]
                     if r["link"] == link and r["reduce"] == reducer and not r["overlap"]
                     and r["batch"] == node["batch"]}
            lines.append(f"| {link} | {reducer} | "
                         + " | ".join(f"{cells[n]:.0%}" for n in shown) + " |")
    lines += ["", "published (Horovod, 128 servers x 4 GPUs, 25 Gbit): model with and "
              "without overlap against the reported efficiency",
              "| model | reported | predicted, no overlap | predicted, full overlap |",
              "|---|---|---|---|"]
    for p in published():
        lines.append(f"| {p['model']} | {p['reported_efficiency']:.0%} | "
                     f"{p['no_overlap']:.0%} | {p['overlap']:.0%} |")
    return "\n".join(lines)


def figure(result: dict):
    """Speedup against nodes (log-log) per reducer, one panel per link; the measured runs
    as points on the measured link's panel. Each reducer has its own marker and line
    style, the later drawn smaller, and the legend (one for the row, below it) names those
    that coincide: the parameter server costs what the ring reduce does, and a line drawn
    over another reads as a missing one."""
    import pandas as pd
    from matplotlib.figure import Figure

    table = pd.DataFrame(result["table"])
    batch = result["node"]["batch"]
    table = table[(table["batch"] == batch) & ~table["overlap"]]
    links = list(dict.fromkeys(table["link"]))
    fig = Figure(figsize=(4.2 * len(links), 4.4), layout="constrained")
    axes = fig.subplots(1, len(links), squeeze=False, sharey=True)[0]
    for ax, link in zip(axes, links, strict=True):
        for i, reducer in enumerate(REDUCERS):
            part = table[(table["link"] == link) & (table["reduce"] == reducer)]
            ax.plot(part["nodes"], part["speedup"], marker="osD^v"[i % 5], fillstyle="none",
                    markersize=9 - i, linestyle=["-", "--", "-.", ":"][i % 4], label=reducer,
                    zorder=3)
        top = table["nodes"].max()
        ax.plot([1, top], [1, top], color="grey", linewidth=0.8, label="ideal")
        if link == "measured":
            one = result["node"]["images_per_s"]
            for v in result["validation"]:
                ax.scatter(v["nodes"], v["measured_images_per_s"] / one, color="black",
                           marker="x", zorder=5, label="measured run")
        ax.set(xscale="log", yscale="log", xlabel="nodes", title=f"link: {link}")
    axes[0].set_ylabel(f"predicted speedup (batch {batch})")
    entries: dict = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    fig.legend(list(entries.values()), list(entries), loc="outside lower center",
               fontsize=7, ncols=min(len(entries), 3 * len(links)),
               title=coinciding(table), title_fontsize=7)
    return fig


def coinciding(table) -> str | None:
    """The reducers whose predicted speedups are the same on every link and node count,
    as a note ('drawn on top of each other: parameter-server, ring-reduce')."""
    series: dict[tuple, list[str]] = {}
    for reducer in REDUCERS:
        part = table[table["reduce"] == reducer].sort_values(["link", "nodes"])
        series.setdefault(tuple(round(v, 9) for v in part["speedup"]), []).append(reducer)
    groups = [", ".join(names) for names in series.values() if len(names) > 1]
    return f"drawn on top of each other: {'; '.join(groups)}" if groups else None


def write(result: dict, out: Path) -> list[Path]:
    """predict.json, predict.md and the figure, each written whole, or none of them (a
    full disk: said in one line naming --out)."""
    fig = figure(result)
    record = json.dumps(result | {"published": published()}, indent=2) + "\n"
    files = {out / "predict.json": lambda f: f.write(record.encode()),
             out / "predict.md": lambda f: f.write((markdown(result) + "\n").encode()),
             **{out / f"predict.{ext}": lambda f, ext=ext: fig.savefig(f, format=ext, dpi=120)
                for ext in ("png", "svg")}}
    write_outputs("--out", files)
    return list(files)
