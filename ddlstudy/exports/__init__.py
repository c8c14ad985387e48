"""Runs in other tools' formats: TensorBoard's event files (``tensorboard``) and MLflow's
runs and models (``mlflow_runs``, ``mlflow_model``; ``ddlstudy.tracking`` is MLflow's store
and what a run logs to it live)."""
