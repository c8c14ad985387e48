"""MLflow, in one place: its store (``store``: tracking URIs, experiments, runs found again by
their tags), what a run logs to it while it trains (``live``, the ``mlflow`` watcher), and
what is exported when a run or a study ends or on `ddlstudy export mlflow` (``runs``, with
the trained model through ``model``)."""
