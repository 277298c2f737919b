"""The README's measured pictures: Grad-CAM on digit canvases, date alignment.

Trains the recipes of `tests/test_pictures.py` (seed 0 by default), prints
the measured shares and writes the figures (and each model's explorer page)
to `--out`:

- `pictures_gradcam_canvas.png`: Grad-CAM, Grad-CAM++ and Score-CAM of the
  CBAM CNN on held-out 64 x 64 canvases, the digit's box drawn;
- `pictures_date_alignment.png`: the additive-attention RNN's alignment on
  a held-out date (Bahdanau's picture);
- `pictures_vit_rollout.png`: a ViT's attention rollout on the canvases
  (40 epochs: about 100 s on 2 idle cores; also the share of Gildenblat's
  filtered rollout).

    python benchmarks/meaningful_pictures.py --out docs/images
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from keras_attention import visualization as vis  # noqa: E402
from keras_attention.datasets import cxcywh_to_xyxy  # noqa: E402
from tests import test_pictures as recipes  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import describe  # noqa: E402


def draw_boxes(fig, boxes, size):
    """The box on every panel after the first (the image itself)."""
    from matplotlib.patches import Rectangle

    for ax, box in zip(fig.axes, boxes):
        if box is None:
            continue
        x0, y0, x1, y1 = cxcywh_to_xyxy(box) * size
        ax.add_patch(
            Rectangle((x0 - 0.5, y0 - 0.5), x1 - x0, y1 - y0, fill=False,
                      edgecolor="white", linewidth=1.5, linestyle="--")
        )


def gradcam_figure(out, seed):
    model, images, boxes, labels = recipes.canvas_classifier(seed)
    accuracy = model.evaluate(images, labels, verbose=0)[1]
    shares, maps = {}, {}
    for method, title in (("gradcam", "Grad-CAM"), ("gradcam++", "Grad-CAM++"),
                          ("scorecam", "Score-CAM")):
        cams = vis.grad_cam(model, images, labels, method=method, normalize=False)
        shares[title] = recipes.mass_inside(cams, boxes)
        maps[title] = cams
    print(f"Grad-CAM on canvases: accuracy {accuracy:.3f}, mass inside the box "
          + ", ".join(f"{k} {v:.3f}" for k, v in shares.items()), flush=True)
    index = 0
    fig = vis.plot_image_overlay(
        images[index], {k: v[index] for k, v in maps.items()}, alpha=0.45,
        title=f"digit {labels[index]}: share of the map inside the box over 100 "
        "held-out canvases: " + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()),
    )
    draw_boxes(fig, [None] + [boxes[index]] * 3, 64)
    fig.savefig(os.path.join(out, "pictures_gradcam_canvas.png"), bbox_inches="tight")
    vis.explore(model, images[index : index + 1],
                os.path.join(out, "pictures_gradcam_canvas.html"))
    return shares


def alignment_figure(out, seed):
    model = recipes.date_translator(seed)
    held_out, _ = recipes.date_splits(seed)[1]
    exact, mass = recipes.alignment_mass(model, held_out)
    print(f"date alignment: exact {exact:.3f}, mass on the determining "
          f"characters {mass:.3f}", flush=True)
    source = next(s for s in held_out if "," in s) if any("," in s for s in held_out) else held_out[0]
    text, attention = model.translate(source, return_attention=True, jit_compile=False)
    vis.plot_attention_heatmap(
        attention["weights"], attention["source_tokens"], attention["target_tokens"],
        title=f"{source!r} -> {text!r}: {mass:.0%} of the attention on the "
        "characters that decide (200 held-out dates)",
        path=os.path.join(out, "pictures_date_alignment.png"),
    )
    vis.explore(model, source, os.path.join(out, "pictures_date_alignment.html"))
    return mass


def rollout_figure(out, seed, epochs):
    from keras_attention.applications import VisionTransformer
    from keras_attention.datasets import load_digits_images

    (x_train, y_train), (x_test, y_test) = load_digits_images(seed=0)
    images, _ = recipes.digit_canvases(np.concatenate([x_train, x_train]), seed=0)
    labels = np.concatenate([y_train, y_train])
    held_out, boxes = recipes.digit_canvases(x_test[:100], seed=10_000)
    keras.utils.set_random_seed(seed)
    model = VisionTransformer(
        image_size=64, patch_size=8, num_classes=10, hidden_dim=64, depth=3,
        num_heads=4, mlp_dim=128, num_channels=1,
    )
    model.compile(optimizer=keras.optimizers.Adam(3e-3), jit_compile=True)
    model.fit(images, labels, epochs=epochs, batch_size=64, verbose=0)
    _, accuracy = model.evaluate(held_out, y_test[:100], verbose=0)
    rollout = vis.attention_rollout(model, held_out, upsample=True)
    share = recipes.mass_inside(rollout, boxes)
    area = float(np.mean([b[2] * b[3] for b in boxes]))
    # Gildenblat's filtering: the strongest head, the weakest 90 % dropped.
    filtered = recipes.mass_inside(
        vis.attention_rollout(
            model, held_out, upsample=True, head_fusion="max", discard_ratio=0.9
        ),
        boxes,
    )
    print(f"ViT rollout: accuracy {accuracy:.3f}, mass inside the box {share:.3f} "
          f"(filtered: {filtered:.3f}; box area {area:.3f})", flush=True)
    fig = vis.plot_image_overlay(
        held_out[0], {"attention rollout": rollout[0]}, alpha=0.45,
        title=f"{share:.0%} of the rollout inside the box (100 held-out canvases)",
    )
    draw_boxes(fig, [None, boxes[0]], 64)
    fig.savefig(os.path.join(out, "pictures_vit_rollout.png"), bbox_inches="tight")
    return share


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/images")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vit-epochs", type=int, default=40)
    parser.add_argument("--skip", nargs="*", default=[],
                        choices=["gradcam", "alignment", "rollout"])
    args = parser.parse_args()
    print(f"# {describe()}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    if "gradcam" not in args.skip:
        gradcam_figure(args.out, args.seed)
    if "alignment" not in args.skip:
        alignment_figure(args.out, args.seed)
    if "rollout" not in args.skip:
        rollout_figure(args.out, args.seed, args.vit_epochs)
    print(f"{time.time() - start:.0f} s, load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
