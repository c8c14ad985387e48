"""Runs in other tools' formats: TensorBoard's event files (``tensorboard``) and MLflow's
store, live logging, runs and models (``mlflow``)."""
