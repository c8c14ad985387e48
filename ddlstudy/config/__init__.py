"""What to train and how: use cases (TOML), the run configuration, the run options.

Every config is a frozen, keyword-only dataclass: pydantic checks a file's values against
its fields (``config.schema``), its ``__post_init__`` checks ranges and the rules between
fields, and either names the offending key, so a bad TOML key or CLI flag is refused before
anything starts.
"""

from ddlstudy.config.loading import (
    available_usecases,
    load_usecase,
    resolve_usecase_path,
    usecase_from_dict,
    with_overrides,
)
from ddlstudy.config.paths import (
    DEFAULT_DATASETS_DIR,
    DEFAULT_RUNS_DIR,
    HOME,
    REPO_ROOT,
    USECASES_DIR,
)
from ddlstudy.config.recipe import TARGET_METRICS
from ddlstudy.config.run import (
    HEAPS,
    MIN_PROBE_SECONDS,
    PRECISIONS,
    PROBE_SECONDS,
    REFAULT_PROBE_SECONDS,
    WARMUP_STEPS,
    Effective,
    RunConfig,
)
from ddlstudy.config.spark import SPARK_SYNCS, spark_slots
from ddlstudy.config.usecase import (
    Arch,
    BadImagePolicy,
    DataSpec,
    ModelSpec,
    TrainSpec,
    UseCase,
)

__all__ = ["DEFAULT_DATASETS_DIR", "DEFAULT_RUNS_DIR", "HEAPS", "HOME", "MIN_PROBE_SECONDS",
           "PRECISIONS",
           "PROBE_SECONDS", "REFAULT_PROBE_SECONDS", "WARMUP_STEPS",
           "REPO_ROOT", "SPARK_SYNCS", "TARGET_METRICS", "USECASES_DIR", "Arch", "BadImagePolicy",
           "DataSpec", "Effective", "ModelSpec", "RunConfig", "TrainSpec", "UseCase",
           "available_usecases", "load_usecase", "resolve_usecase_path", "spark_slots",
           "usecase_from_dict", "with_overrides"]
