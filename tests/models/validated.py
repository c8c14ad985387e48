"""USECASE RUNS_DIR MODEL: the validation set's image files and the classes the exported
MODEL gives them through the run's own validation loader, as JSON (test_recipe)."""

import json
import sys

import torch

from ddlstudy.config import RunConfig, load_usecase
from ddlstudy.data import prepare_data
from ddlstudy.models.trained import load
from ddlstudy.runner import resolve
from ddlstudy.training.loaders import val_loader

usecase, runs_dir, model_file = sys.argv[1:4]
torch.set_num_threads(1)
cfg = resolve(RunConfig(usecase=load_usecase(usecase), runs_dir=runs_dir, sample_hz=0))
plan = prepare_data(cfg)
model = load(model_file).eval()
classes = json.loads(open(model_file.removesuffix(".pt") + ".usecase.json").read())[
    "preprocessing"]["classes"]
with torch.no_grad():
    validated = [classes[i] for images, _ in val_loader(cfg, plan)
                 for i in model(images).argmax(1).tolist()]
print(json.dumps({"files": [str(plan.images.root / rel) for rel, _ in plan.val],
                  "classes": validated}))
