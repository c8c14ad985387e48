"""One `ddlstudy run`: check, resolve, prepare the data, open the run folder, train through
the backend, close it (``run``); ``start`` launches the backend's processes first where it
has its own launcher; ``ddlstudy.records.manifests`` reads manifests back into configs."""

from ddlstudy.records.manifests import resume_config
from ddlstudy.runner.checks import preflight, resolve
from ddlstudy.runner.lifecycle import STUDY_ENV, RunFailed, run, start

__all__ = ["STUDY_ENV", "RunFailed", "preflight", "resolve", "resume_config", "run", "start"]
