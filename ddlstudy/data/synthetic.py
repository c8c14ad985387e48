"""Seeded synthetic fire / smoke / no-fire scenes (numpy + Pillow only).

Every image is drawn from its own ``default_rng(SeedSequence([seed, class_id, index]))``,
so any shard can be made alone, in any order, and the bytes are the same run to run. The
background (sky, clouds, ground, buildings) is shared by all classes so that it is no cue;
fire is 1-3 flames with a glow and often smoke; smoke is 1-2 grey plumes drifting in the
wind; no-fire carries hard negatives (orange lamps, autumn foliage, fog, low cloud banks).
Camera effects (exposure, sensor noise, blur) come last. ``difficulty`` shrinks and fades
the fire and smoke and adds look-alikes; ``label_noise`` files some scenes under a wrong
class. Calibrated so that a small CNN learns the task well but not perfectly.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageFilter

CLASSES = ("fire", "smoke", "nofire")

_SKIES = {  # top colour, horizon colour, cloud colour
    "day": ((60, 120, 200), (175, 205, 235), (245, 245, 250)),
    "overcast": ((115, 120, 128), (185, 188, 192), (150, 152, 158)),
    "sunset": ((55, 40, 95), (245, 150, 85), (230, 150, 150)),
    "night": ((5, 8, 25), (35, 40, 65), (45, 48, 60)),
}
_GROUNDS = ((70, 110, 45), (110, 90, 60), (95, 95, 95), (40, 55, 35), (150, 135, 100))
# black -> dark red -> orange -> yellow -> white, the colour of a flame by its heat.
_FIRE_RAMP_T = np.array([0.0, 0.3, 0.6, 0.85, 1.0])
_FIRE_RAMP = np.array([(20, 0, 0), (190, 25, 0), (250, 120, 0), (255, 215, 60), (255, 250, 220)],
                      dtype=np.float32)


def render_scene(kind: str, rng: np.random.Generator, size: int,
                 difficulty: float = 0.5) -> Image.Image:
    """Draw one ``size`` x ``size`` RGB scene of ``kind`` (fire, smoke or nofire)."""
    img = _background(rng, size)
    hard_negative_p = 0.8 * difficulty if kind == "nofire" else 0.3 * difficulty
    if rng.random() < hard_negative_p:
        _hard_negatives(img, rng, size)
    # Harder: smaller, fainter fire and smoke (scale 1.4 at difficulty 0, 0.45 at 1).
    scale = 1.4 - 0.95 * difficulty
    if kind == "fire":
        if rng.random() < 0.6:
            _smoke(img, rng, size, scale, plumes=1)
        _fire(img, rng, size, scale)
    elif kind == "smoke":
        _smoke(img, rng, size, scale, plumes=int(rng.integers(1, 3)))
    elif kind != "nofire":
        raise ValueError(f"unknown scene kind {kind!r}")
    return _camera(img, rng)


def render_image(seed: int, class_id: int, index: int, size: int, difficulty: float,
                 label_noise: float) -> Image.Image:
    """The image filed as ``index`` of class ``class_id``; identical whoever draws it."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, class_id, index]))
    kind = CLASSES[class_id]
    if label_noise and rng.random() < label_noise:
        kind = CLASSES[(class_id + int(rng.integers(1, len(CLASSES)))) % len(CLASSES)]
    return render_scene(kind, rng, size, difficulty)


# --- building blocks ----------------------------------------------------------------------

def fractal_noise(rng: np.random.Generator, h: int, w: int, cells: tuple[int, int] = (4, 4),
                  octaves: int = 4, persistence: float = 0.5) -> np.ndarray:
    """Value noise in [0, 1]: random grids upsampled bicubically, octave on octave.

    ``cells`` is the (rows, cols) of the coarsest grid; fewer rows than columns stretches
    the noise vertically (flame tongues).
    """
    out = np.zeros((h, w), dtype=np.float32)
    amp, total = 1.0, 0.0
    for octave in range(octaves):
        gy, gx = (c * 2**octave + 2 for c in cells)
        grid = rng.random((gy, gx), dtype=np.float32)
        out += amp * np.asarray(Image.fromarray(grid, mode="F").resize((w, h), Image.BICUBIC))
        total += amp
        amp *= persistence
    out /= total
    lo, hi = out.min(), out.max()
    return (out - lo) / (hi - lo + 1e-6)


def _blend(img: np.ndarray, colour: np.ndarray | tuple, alpha: np.ndarray) -> None:
    a = np.clip(alpha, 0, 1)[..., None]
    img *= 1 - a
    img += a * np.asarray(colour, dtype=np.float32)


def _jitter(rng: np.random.Generator, colour: tuple, amount: float = 18) -> np.ndarray:
    return np.clip(np.asarray(colour, np.float32) + rng.normal(0, amount, 3), 0, 255)


def _blur(field: np.ndarray, radius: float) -> np.ndarray:
    peak = float(field.max())
    if peak <= 0:
        return field
    as_l = Image.fromarray((field / peak * 255).astype(np.uint8), mode="L")
    return np.asarray(as_l.filter(ImageFilter.GaussianBlur(radius)), np.float32) / 255 * peak


def _background(rng: np.random.Generator, s: int) -> np.ndarray:
    sky_name = rng.choice(list(_SKIES))
    top, horizon_c, cloud_c = (_jitter(rng, c) for c in _SKIES[sky_name])
    horizon = int(s * rng.uniform(0.55, 0.8))
    img = np.zeros((s, s, 3), np.float32)
    t = np.linspace(0, 1, horizon, dtype=np.float32)[:, None]
    img[:horizon] = (top * (1 - t) + horizon_c * t)[:, None, :]
    clouds = fractal_noise(rng, s, s, cells=(2, 3))
    cover = rng.uniform(0.45, 0.85)
    cloud_alpha = np.clip((clouds - cover) * 3, 0, 1) * rng.uniform(0.4, 0.9)
    cloud_alpha[horizon:] = 0
    _blend(img, cloud_c, cloud_alpha)
    ground_c = _jitter(rng, _GROUNDS[rng.integers(len(_GROUNDS))], 12)
    if sky_name == "night":
        ground_c *= 0.35
    texture = fractal_noise(rng, s - horizon, s, cells=(2, 8))
    img[horizon:] = ground_c * (0.7 + 0.6 * texture[..., None])
    _buildings(img, rng, s, horizon, dark=sky_name == "night")
    return img


def _buildings(img: np.ndarray, rng: np.random.Generator, s: int, horizon: int,
               dark: bool) -> None:
    colour = _jitter(rng, (25, 25, 30) if dark else (70, 70, 80), 10)
    for _ in range(int(rng.integers(0, 5))):
        w = int(s * rng.uniform(0.06, 0.2))
        x0 = int(rng.integers(0, max(1, s - w)))
        top = int(horizon - s * rng.uniform(0.05, 0.3))
        img[max(0, top):horizon + 1, x0:x0 + w] = colour


def _grid(s: int) -> tuple[np.ndarray, np.ndarray]:
    ys, xs = np.mgrid[0:s, 0:s].astype(np.float32)
    return ys, xs


def _fire(img: np.ndarray, rng: np.random.Generator, s: int, scale: float) -> None:
    ys, xs = _grid(s)
    heat = np.zeros((s, s), np.float32)
    for _ in range(int(rng.integers(1, 4))):
        h = s * rng.uniform(0.18, 0.45) * scale
        w = h * rng.uniform(0.35, 0.6)
        cx = s * rng.uniform(0.15, 0.85)
        base = s * rng.uniform(0.6, 0.95)
        v = (base - ys) / h  # 0 at the base, 1 at the tip
        radius = np.clip(1 - v, 0, 1) ** 0.7 * np.clip(v * 5 + 0.3, 0, 1) ** 0.5
        tongues = fractal_noise(rng, s, s, cells=(2, 6))  # stretched vertically
        sway = (tongues - 0.5) * w * 1.2 * np.clip(v, 0, 1)  # tongues lick sideways up high
        u = np.abs(xs - cx + sway) / (w / 2)
        envelope = np.clip(1 - u / (radius + 1e-3), 0, 1) * (v > -0.05) * (v < 1)
        flame = envelope**0.6 * (0.2 + 1.3 * tongues) - 0.35 * np.clip(v, 0, 1)
        heat = np.maximum(heat, np.clip(flame, 0, 1))
    strength = rng.uniform(0.75, 1.0) * (0.6 + 0.4 * scale)
    colour = np.stack([np.interp(heat, _FIRE_RAMP_T, _FIRE_RAMP[:, c]) for c in range(3)], -1)
    glow = _blur(heat, s * 0.05)
    img += glow[..., None] * np.array([120, 55, 10], np.float32) * strength
    _blend(img, colour, np.clip(heat * 2.5, 0, 1) * strength)


def _smoke(img: np.ndarray, rng: np.random.Generator, s: int, scale: float, plumes: int) -> None:
    ys, xs = _grid(s)
    for _ in range(plumes):
        height = s * rng.uniform(0.35, 0.75) * (0.5 + 0.5 * scale)
        sx, sy = s * rng.uniform(0.15, 0.85), s * rng.uniform(0.55, 0.9)
        wind = rng.uniform(-0.7, 0.7)
        spread = rng.uniform(0.2, 0.45)
        v = np.clip((sy - ys) / height, 0, 1.2)
        centre = sx + wind * height * v**1.5
        half = s * (0.035 + spread * v) * (0.6 + 0.4 * scale)
        warp = fractal_noise(rng, s, s, cells=(3, 3)) - 0.5
        u = np.abs(xs - centre + warp * half * 1.6) / half
        body = np.clip(1.3 - u, 0, 1) ** 0.5 * np.clip(1.1 - v, 0, 1) ** 0.4 * (ys <= sy)
        density = np.clip(body * (0.8 + 0.8 * fractal_noise(rng, s, s, cells=(3, 3))), 0, 1)
        # Easier: darker smoke, further from the greys of clouds and fog (at most 110 from
        # scale 1.2 up, 170 from 0.6 down).
        grey = rng.uniform(45, 170 - 100 * float(np.clip(scale - 0.6, 0, 0.6)))
        colour = np.array([grey, grey, grey]) + rng.normal(0, 8, 3)
        _blend(img, colour, density * rng.uniform(0.8, 1.0) * (0.5 + 0.5 * scale))


def _hard_negatives(img: np.ndarray, rng: np.random.Generator, s: int) -> None:
    """Things that look a little like fire or smoke but are neither."""
    ys, xs = _grid(s)
    kinds = rng.permutation(["lamps", "foliage", "fog", "cloudbank"])[: int(rng.integers(1, 3))]
    for kind in kinds:
        if kind == "lamps":
            for _ in range(int(rng.integers(1, 5))):
                r = s * rng.uniform(0.01, 0.035)
                cy, cx = s * rng.uniform(0.3, 0.9), s * rng.uniform(0.05, 0.95)
                d = np.sqrt((ys - cy) ** 2 + (xs - cx) ** 2) / r
                colour = _jitter(rng, (255, 170, 60), 20)
                _blend(img, colour, np.clip(1.5 - d, 0, 1))
                img += (np.exp(-d / 2.5) * 0.35)[..., None] * colour
        elif kind == "foliage":
            patch = fractal_noise(rng, s, s, cells=(4, 4))
            mask = np.clip((patch - 0.6) * 5, 0, 1) * (ys > s * rng.uniform(0.45, 0.7))
            _blend(img, _jitter(rng, (200, 90, 20), 25), mask * 0.85)
        elif kind == "fog":
            _blend(img, _jitter(rng, (190, 190, 195), 10), np.full((s, s), rng.uniform(0.2, 0.5)))
        else:
            band_y, band_h = s * rng.uniform(0.35, 0.7), s * rng.uniform(0.05, 0.15)
            shape = np.exp(-(((ys - band_y) / band_h) ** 2))
            texture = fractal_noise(rng, s, s, cells=(2, 6))
            _blend(img, _jitter(rng, (160, 160, 165), 15), shape * (0.3 + 0.6 * texture))


def _camera(img: np.ndarray, rng: np.random.Generator) -> Image.Image:
    img *= rng.uniform(0.75, 1.25)  # exposure
    img += rng.normal(0, rng.uniform(1, 8), img.shape).astype(np.float32)  # sensor noise
    out = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), mode="RGB")
    if rng.random() < 0.3:
        out = out.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.2)))
    return out
