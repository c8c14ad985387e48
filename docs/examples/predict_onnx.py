"""An exported ONNX model on images of your own, without PyTorch (numpy, Pillow and
onnxruntime): python predict_onnx.py model.onnx IMAGE..."""
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime
from PIL import Image

session = onnxruntime.InferenceSession(sys.argv[1])  # `ddlstudy export model ... --format onnx`
pre = json.loads(Path(sys.argv[1]).with_suffix(".usecase.json").read_text())["preprocessing"]
size = pre["size"]
for name in sys.argv[2:]:
    image = Image.open(name).convert("RGB")
    w, h = image.size  # the shorter side to size, as torchvision's Resize(size) does
    if min(w, h) != size:
        image = image.resize((size, int(size * h / w)) if w <= h else (int(size * w / h), size),
                             Image.BILINEAR)
    left, top = round((image.width - size) / 2), round((image.height - size) / 2)
    x = np.asarray(image.crop((left, top, left + size, top + size)), np.float32) / 255
    if pre["mean"] is not None:
        x = (x - np.float32(pre["mean"])) / np.float32(pre["std"])
    logits = session.run(["logits"], {"images": x.transpose(2, 0, 1)[None]})[0]
    print(name, pre["classes"][logits.argmax()])
