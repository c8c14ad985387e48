"""The sides of the findings' comparisons: the fastest configuration of a use case among
the rows a mask picks (``Best``), as measured (``Side``) and as projected onto other
hardware (``Best.projected``, with ``report.projection``'s model)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from ddlstudy.report.projection import Hardware, Speeds, project, serial_share
from ddlstudy.report.runs import KEY, LOCAL, is_baseline
from ddlstudy.report.tables import spread_of


@dataclass(frozen=True)
class Side:
    """The best configuration of one side of a comparison."""

    label: str
    images_per_s: float
    speedup: float | None
    spread: list[float]
    runs: pd.DataFrame  # its counted runs (rows of Report.runs)
    target: float | None = None  # its use case's target validation accuracy
    reached: str = ""  # how many of its runs reached it ('1/2'), '' without a target
    tta_s: float | None = None  # the median time to it, when every run reached it
    cut_short: bool = False  # its runs stopped their epochs early (--max-steps)
    metric: str = "accuracy"  # what its target is of ([train] target_metric)

    @property
    def goal(self) -> str:
        """Its target in words: '0.80' (of accuracy), '0.80 macro_f1'."""
        return f"{self.target:.2f}" + ("" if self.metric == "accuracy" else f" {self.metric}")


def cpu(t: pd.DataFrame) -> pd.Series:
    return t.gpus == 0


def local_cpu(t: pd.DataFrame) -> pd.Series:
    return (t.backend == LOCAL) & (t.gpus == 0)


class Best:
    """The fastest configuration of a use case among the rows a mask picks (``noisy``:
    the rows left out for their noisy runs, to say so where a side has no other)."""

    def __init__(self, rows: pd.DataFrame, runs: dict, noisy: pd.DataFrame,
                 by_id: dict[str, dict]) -> None:
        self.rows, self.runs, self.noisy, self.by_id = rows, runs, noisy, by_id

    def __call__(self, usecase: str, mask, reached: bool = False) -> Side | None:
        """The fastest configuration ``mask`` picks (``reached``: of those whose every run
        reached the use case's target accuracy)."""
        t = self.rows[self.rows.usecase == usecase]
        t = t[mask(t)]
        if reached:
            t = t[t.time_to_target_s.notna()]
        if t.empty:
            return None
        r = t.loc[t.images_per_s.idxmax()]
        mine = self.runs.get(tuple(r[k] for k in KEY), pd.DataFrame())
        first = self.by_id.get(mine.run.iloc[0]) if len(mine) else None
        cut = bool(((first or {}).get("config") or {}).get("max_steps"))
        return Side(r.config, float(r.images_per_s),
                    None if pd.isna(r.speedup) else float(r.speedup), spread_of(mine), mine,
                    number(r.target), r.reached or "", number(r.time_to_target_s), cut,
                    r.target_metric if isinstance(r.target_metric, str) else "accuracy")

    def manifest(self, row: pd.Series) -> dict | None:
        """The manifest of a configuration's first counted run."""
        runs = self.runs.get(tuple(row[k] for k in KEY))
        return self.by_id.get(runs.run.iloc[0]) if runs is not None and len(runs) else None

    def speeds(self, usecase: str) -> Speeds | None:
        """What projections of ``usecase`` start from: its baseline's images/s and the
        serial share its cpu-intraop run shows (None without both)."""
        t = self.rows[self.rows.usecase == usecase]
        base, intra = t[is_baseline(t)], t[(t.strategy == "cpu-intraop") & local_cpu(t)]
        if base.empty or intra.empty:
            return None
        row = intra.loc[intra.images_per_s.idxmax()]
        m = self.manifest(row) or {}
        threads = int((m.get("strategy") or {}).get("threads_per_process") or 1)
        cores = int((m.get("host") or {}).get("usable_cores") or threads)
        r1 = float(base.images_per_s.iloc[0])  # threads beyond the cores add none
        return Speeds(r1, serial_share(min(threads, cores), float(row.images_per_s) / r1))

    def why_no_speeds(self, usecase: str) -> str:
        """Why ``speeds`` has nothing for ``usecase``: the runs it needs did not run, or ran
        and were left out as noisy (then how busy their host was, and how to count them)."""
        quiet = self.rows[self.rows.usecase == usecase]
        noisy = self.noisy[self.noisy.usecase == usecase]
        left, missing = [], []
        for what, mask in NEEDED.items():
            if not mask(quiet).any():
                (left if mask(noisy).any() else missing).append((what, noisy[mask(noisy)]))
        said = []
        if left:
            busy = busy_words([s for _, rows in left for s in rows.status])
            said.append(f"{' and '.join(what for what, _ in left)} ran, but "
                        f"{'were' if len(left) > 1 else 'was'} left out as noisy (other "
                        f"processes used{busy} their host while "
                        f"{'they' if len(left) > 1 else 'it'} ran); `ddlstudy report "
                        f"--include-noisy` counts them")
        if missing:
            said.append(f"it needs {' and '.join(what for what, _ in missing)} (how a "
                        f"process's speed grows with its threads)")
        return "; ".join(said)

    def projected(self, usecase: str, mask, speeds: Speeds,
                  hardware: Hardware) -> tuple[str, float] | None:
        """The configuration (among those ``mask`` picks) fastest on ``hardware``, and its
        projected images/s."""
        t = self.rows[self.rows.usecase == usecase]
        out = None
        for _, row in t[mask(t)].iterrows():
            m = self.manifest(row)
            rate = project(m, float(row.images_per_s), speeds, hardware) if m else None
            if rate and (out is None or rate > out[1]):
                out = (row.config, rate)
        return out

    def missing(self, usecase: str, mask, what: str) -> str:
        """Why a side of ``usecase`` has no figures: no completed run, or only noisy ones."""
        t = self.noisy[self.noisy.usecase == usecase]
        t = t[mask(t)]
        if t.empty:
            return f"no completed {what}"
        return (f"no completed {what} on a quiet host: {int(t.runs.sum())} ran, left out as "
                f"noisy (other processes used{busy_words(t.status)} their host while they "
                f"ran); `ddlstudy report --include-noisy` counts them")


NEEDED = {"the sequential baseline": is_baseline,
          "the cpu-intraop run": lambda t: (t.strategy == "cpu-intraop") & local_cpu(t)}
"""What a projection starts from (``Best.speeds``), by name."""


def busy_words(statuses) -> str:
    """' up to 1.6 cores of' (what other processes used of a host at most) from noisy
    configurations' statuses ('noisy (others 1.2-1.6 cores)'), ' ' where none says."""
    cores = [float(c) for s in statuses
             for c in re.findall(r"[0-9.]+", (re.search(r"others ([0-9.-]+) cores", s or "")
                                             or ["", ""])[1])]
    return f" up to {max(cores):.1f} cores of" if cores else ""


def number(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)
