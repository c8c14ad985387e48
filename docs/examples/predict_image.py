"""An exported model on images of your own: python predict_image.py model.pt IMAGE..."""
import json
import sys
from pathlib import Path

import torch
from PIL import Image
from torchvision.transforms import functional as F

from ddlstudy.models.trained import load

model = load(sys.argv[1]).eval()  # model.pt, from `ddlstudy export model RUN --out model.pt`
pre = json.loads(Path(sys.argv[1]).with_suffix(".usecase.json").read_text())["preprocessing"]
for name in sys.argv[2:]:
    image = F.resize(Image.open(name).convert("RGB"), pre["size"])  # the shorter side
    x = F.to_tensor(F.center_crop(image, pre["size"]))  # RGB values / 255
    if pre["mean"] is not None:
        x = F.normalize(x, pre["mean"], pre["std"])
    with torch.no_grad():
        print(name, pre["classes"][model(x[None]).argmax(1).item()])
