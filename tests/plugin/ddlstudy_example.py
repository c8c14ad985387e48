"""A strategy and a backend of one's own, from a package outside ddlstudy (docs/extending.md
shows this file). Its pyproject.toml declares them as entry points:

    [project.entry-points."ddlstudy.strategies"]
    cpu-loaders = "ddlstudy_example:CpuLoaders"
    [project.entry-points."ddlstudy.backends"]
    local-nodes = "ddlstudy_example:LocalNodes"
"""

from ddlstudy.backends import Backend
from ddlstudy.errors import Unavailable
from ddlstudy.machine.environment import usable_cores
from ddlstudy.strategies import Layout, Probe, Strategy, get_strategy
from ddlstudy.training.distributed import run_group
from ddlstudy.training.flat import exchange_step, flat_gradients
from ddlstudy.training.loaders import make_loaders
from ddlstudy.training.steps import make_scaler
from ddlstudy.training.worker import new_model, new_optimizer, train_worker


class CpuLoaders(Strategy):
    """One model on half the cores while DataLoader workers decode on the other half."""

    name = "cpu-loaders"
    summary = "one model on half the cores, loader processes decoding on the other half"
    accumulates = True  # its step is the shared one: --accumulate and fp16 work

    def layout(self, cfg):
        half = max(1, usable_cores() // 2)
        return Layout(threads_per_process=half, loader_workers=half)

    def label(self, layout):
        return f"{self.name} ({layout['threads_per_process']} threads)"

    def probes(self, cores, gpus):  # what `ddlstudy advise` times
        return [Probe(self.name, {"strategy": self.name}, cores)]

    def worker(self, job, link, device):  # one process's work, wherever a backend runs it
        cfg = job.cfg
        model = new_model(cfg, None if link.world == 1 else link.rank, device)
        optimizer = new_optimizer(model.parameters(), cfg)
        flat = flat_gradients(model)  # every .grad a view: the link averages it in place
        train, val = make_loaders(cfg, job.data, shard=link.shard,
                                  loader_workers=self.layout(cfg).loader_workers)
        step = exchange_step(model, optimizer, flat, link, cfg.global_batch, cfg.accumulate,
                             link.attach(model, flat, train),
                             scaler=make_scaler(cfg.precision, device.type))
        train_worker(job, link, model, optimizer, step, train, val, device=device)


class LocalNodes(Backend):
    """--nodes N nodes on this host, each one process running the strategy's worker, in
    one gloo process group."""

    name = "local-nodes"
    summary = "--nodes N nodes on this host, each a process of the strategy, over gloo"

    def check(self, cfg, strategy, resuming):
        if strategy.layout(cfg).processes > 1:
            raise Unavailable("--strategy", f"a {self.name} node is one process, and a "
                              f"{strategy.name} node runs several")

    def nodes(self, cfg):
        return cfg.nodes or 2

    def fit(self, job, env):
        strategy = get_strategy(job.cfg.strategy)
        run_group(strategy.worker, self.nodes(job.cfg), job,
                  strategy.layout(job.cfg).torch_threads)
        return []  # each node wrote its own resource samples into the run folder
