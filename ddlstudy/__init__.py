"""ddlstudy: study deep-learning parallelism from a single node to many.

    ddlstudy dataset make --usecase tiny
    ddlstudy run --usecase tiny --strategy sequential
    ddlstudy report runs/
"""

__version__ = "0.1.0"
