"""Renames the variable paths of a shipped `.weights.h5` file in place.

Keras 3 weight files address each variable by its path (container lists by
the snake-cased class name, sublayers by attribute name). When a refactor
renames a class or a sublayer, the numbers stay valid and only the paths
move; this rewrites them, so the preset loads with identical outputs.

    python benchmarks/convert_preset_weights.py detr_blocks \
        keras_attention/presets/detr_digits.weights.h5

Each conversion is a list of `(old, new)` path-component renames applied
under a prefix; conversions are idempotent (a path already renamed is left
alone), so running one twice or after a merge is safe.
"""

import argparse
import re

import h5py

# detr_blocks: DETR's own ResidualBlock / DETREncoderLayer / DETRDecoderLayer
# became the shared blocks of keras_attention/applications/blocks.py.
CONVERSIONS = {
    "detr_blocks": [
        (
            r"^backbone/blocks/residual_block(_\d+)?/",
            r"backbone/blocks/residual_attention_block\1/",
            {
                "bn1": "norm1",
                "bn2": "norm2",
                "shortcut": "projection",
                "shortcut_bn": "projection_norm",
                "attention": "attention_layer",
            },
        ),
        (
            r"^encoder_layers/detr_encoder_layer(_\d+)?/",
            r"encoder_layers/transformer_encoder_block\1/",
            {
                "self_attention": "attention_layer",
                "norm1": "attention_norm",
                "norm2": "mlp_norm",
                "ffn_in": "mlp_hidden",
                "ffn_out": "mlp_output",
            },
        ),
        (
            r"^decoder_layers/detr_decoder_layer(_\d+)?/",
            r"decoder_layers/transformer_decoder_block\1/",
            {
                "norm1": "self_attention_norm",
                "norm2": "cross_attention_norm",
                "norm3": "mlp_norm",
                "ffn_in": "mlp_hidden",
                "ffn_out": "mlp_output",
            },
        ),
    ],
}


def new_path(path, rules):
    for pattern, replacement, sublayers in rules:
        match = re.match(pattern, path)
        if match is None:
            continue
        prefix = match.expand(replacement)
        rest = path[match.end():].split("/")
        rest[0] = sublayers.get(rest[0], rest[0])
        return prefix + "/".join(rest)
    return path


def convert(filename, conversion):
    rules = CONVERSIONS[conversion]
    with h5py.File(filename, "r+") as f:
        datasets = []
        f.visititems(
            lambda name, obj: datasets.append(name)
            if isinstance(obj, h5py.Dataset)
            else None
        )
        moved = 0
        for name in datasets:
            target = new_path(name, rules)
            if target != name:
                f.move(name, target)
                moved += 1
        # Drop the groups the moves left empty.
        groups = []
        f.visititems(
            lambda name, obj: groups.append(name)
            if isinstance(obj, h5py.Group)
            else None
        )
        for name in sorted(groups, key=len, reverse=True):
            if name in f and len(f[name]) == 0:
                del f[name]
    return moved


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("conversion", choices=sorted(CONVERSIONS))
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    for filename in args.files:
        print(f"{filename}: {convert(filename, args.conversion)} variables moved")


if __name__ == "__main__":
    main()
