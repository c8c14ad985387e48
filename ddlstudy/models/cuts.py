"""Where a pipeline may cut a model, for any model torch.fx can trace.

A model's *units* are its modules in the order it registers them, plain ``nn.Sequential``
containers opened (AlexNet's ``features.0`` ... ``classifier.6``; ResNet's ``conv1``,
``layer1.0``, ...). Traced with the units as leaves, the forward pass is a list of
*layers* (the graph's calls: the units, and the functions between them, such as
``flatten``), and a stage may begin at layer i only where exactly one value computed before
it is needed after it (one activation flows on: the input of a residual block's add is not
a place to cut). For the paper's networks the layers are the old ``features``, ``avgpool``,
``flatten``, ``classifier`` list, index for index, so ``--stage-starts`` means what it
meant. ``Layers`` builds each stage as a module of its own over the model's own units (the
same parameters, the same buffers).
"""

from __future__ import annotations

import time

import torch
from torch import fx, nn

from ddlstudy.errors import ConfigError

CALLS = ("call_module", "call_function", "call_method")
LONG_PASS_S = 0.25
"""A piece's pass (or optimizer step) this long is timed once, not ``repeats`` times: its
spread between repeats is a few per cent, and VGG16's pieces on one core would spend half
a minute on repeats before the pipeline's first step."""


def unit_names(model: nn.Module) -> list[str]:
    """The model's units: its modules in registration order, plain Sequentials opened."""
    out: list[str] = []

    def walk(prefix: str, module: nn.Module) -> None:
        for name, child in module.named_children():
            if type(child).forward is nn.Sequential.forward and isinstance(child, nn.Sequential):
                walk(f"{prefix}{name}.", child)
            else:
                out.append(f"{prefix}{name}")

    walk("", model)
    return out


class _UnitTracer(fx.Tracer):
    def __init__(self, units: set[str]) -> None:
        super().__init__()
        self.units = units

    def is_leaf_module(self, module: nn.Module, qualname: str) -> bool:
        return qualname in self.units or super().is_leaf_module(module, qualname)


class Layers:
    """A model traced into its layers, and the points a stage may start at."""

    def __init__(self, model: nn.Module, name: str = "the model") -> None:
        self.model = model
        try:
            graph = _UnitTracer(set(unit_names(model))).trace(model)
        except Exception as exc:  # noqa: BLE001 - any model's Python
            raise ConfigError("--strategy", f"a pipeline cuts {name} where torch.fx traces "
                              f"it, and it cannot be traced ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200]}); train it with a data-"
                              f"parallel strategy (cpu-processes, cpu-threads)") from None
        self.graph = fx.GraphModule(model, graph)
        self.nodes = [n for n in graph.nodes if n.op in CALLS]
        self.input = next(n for n in graph.nodes if n.op == "placeholder")
        self.output = next(n for n in graph.nodes if n.op == "output").args[0]
        self.starts = [0] + [i for i in range(1, len(self.nodes)) if self._flows(i)]
        """The layers a stage may start at."""

    def __len__(self) -> int:
        return len(self.nodes)

    def _crossing(self, i: int) -> set[fx.Node]:
        """The values made before layer i (the input too) that layer i or later needs."""
        before = {self.input, *self.nodes[:i]}
        after = [*self.nodes[i:]]
        needed = {a for n in after for a in n.all_input_nodes} | {self.output}
        return {n for n in needed if n in before}

    def _owned(self, nodes: list[fx.Node]) -> set[str]:
        """The modules and attributes (parameters used directly) ``nodes`` use."""
        return {n.target for n in nodes if n.op == "call_module"} | {
            a.target for n in nodes for a in n.all_input_nodes if a.op == "get_attr"}

    def _flows(self, i: int) -> bool:
        """One value flows past layer i, and no module or parameter is used on both sides
        (each stage owns its own)."""
        shared = self._owned(self.nodes[:i]) & self._owned(self.nodes[i:])
        return len(self._crossing(i)) == 1 and not shared

    def check(self, starts: list[int]) -> None:
        """Refuse stage starts a single activation does not flow through."""
        bad = [s for s in starts if s not in self.starts]
        if bad:
            raise ConfigError("--stage-starts", f"a stage cannot start at layer {bad[0]}: more "
                              f"than one value flows past it; start stages at layers of "
                              f"{self.starts}")

    def stage(self, starts: list[int], index: int) -> fx.GraphModule:
        """Stage ``index`` of the model cut at ``starts``: a module of the model's own
        layers from its start to the next, taking one tensor and giving one."""
        start = starts[index]
        end = starts[index + 1] if index + 1 < len(starts) else len(self.nodes)
        (entering,) = self._crossing(start)
        leaving = self.output if end == len(self.nodes) else next(iter(self._crossing(end)))
        graph, env = fx.Graph(), {}
        env[entering] = graph.placeholder("x")

        def value(n: fx.Node) -> fx.Node:  # a parameter used directly: fetched in the stage
            if n not in env and n.op == "get_attr":
                env[n] = graph.get_attr(n.target)
            return env[n]

        for node in self.nodes[start:end]:
            env[node] = graph.node_copy(node, value)
        graph.output(env[leaving])
        first = self.nodes[start]
        if index and first.op == "call_module":  # its input is a leaf autograd must not
            unit = self.model.get_submodule(first.target)  # see changed in place
            if getattr(unit, "inplace", False):
                unit.inplace = False
        return fx.GraphModule(self.graph, graph)

    def step_costs(self, x: torch.Tensor, micro: int, optimizer, repeats: int = 3
                   ) -> list[dict[str, float]]:
        """What each piece between two places a stage may start (``starts``) costs in one
        pipeline step of ``micro`` micro-batches like ``x``: its forward and backward on a
        micro-batch (best of ``repeats``, after a first pass that allocates; one pass where
        it takes ``LONG_PASS_S`` or more) and its
        optimizer's step (``optimizer(params)``, once per step), in seconds, with
        ``step_s`` = micro x (forward + backward) + optimizer: what the cuts balance.

        The model trains (dropout on); the pieces' inputs are the activations the pieces
        before them give.
        """
        pieces = [self.stage(self.starts, k) for k in range(len(self.starts))]
        out, h = [], x
        for k, piece in enumerate(pieces):
            h = h.detach().requires_grad_(k > 0)
            fwd, bwd, y = _best(piece, h, repeats)
            params = [p for p in piece.parameters() if p.requires_grad]
            opt_s = 0.0
            if params:
                opt = optimizer(params)
                opt_s = _timed(opt.step)  # the first allocates the momentum buffers
                for _ in range(repeats if opt_s < LONG_PASS_S else 0):
                    opt_s = min(opt_s, _timed(opt.step))
                opt.zero_grad(set_to_none=True)
            out.append({"forward_s": fwd, "backward_s": bwd, "optimizer_s": opt_s,
                        "step_s": micro * (fwd + bwd) + opt_s})
            h = y.detach()
        return out


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _best(piece: nn.Module, h: torch.Tensor, repeats: int
          ) -> tuple[float, float, torch.Tensor]:
    """``piece``'s best forward and backward seconds on ``h`` (the first pass untimed, one
    timed pass where it is long), and its output."""
    fwd = bwd = float("inf")
    for i in range(repeats + 1):
        start = time.perf_counter()
        y = piece(h)
        mid = time.perf_counter()
        if y.requires_grad:
            y.backward(torch.ones_like(y) / y.numel())
        end = time.perf_counter()
        if i:
            fwd, bwd = min(fwd, mid - start), min(bwd, end - mid)
            if fwd + bwd >= LONG_PASS_S:
                break
    return fwd, bwd, y
