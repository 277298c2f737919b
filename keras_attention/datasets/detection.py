"""Generated object-detection images: digits or shapes on a blank canvas.

Objects are scikit-learn digits (8x8, upscaled to a random size) or filled
shapes (square, circle, triangle), drawn at random positions on a black
canvas. Each object is drawn inside its own square patch and the patches of
one image never overlap, so the objects never overlap either. A pixel is ink
when it is nonzero; the box of an object is the tight bounding box of its
ink.

Boxes are normalised `(cx, cy, w, h)` with pixel edges as coordinates: an
object whose ink spans rows `r0..r1` and columns `c0..c1` (inclusive) has
`cx = (c0 + c1 + 1) / 2 / S`, `w = (c1 + 1 - c0) / S`, and the same for `cy`,
`h` with rows. `cxcywh_to_xyxy` turns them into `(x0, y0, x1, y1)` corners,
and `box_to_mask` into the pixels they cover.
"""

import collections

import numpy as np

from keras_attention.datasets.images import resize_images
from keras_attention.datasets.images import stratified_split

PAD_LABEL = -1
SHAPE_NAMES = ("square", "circle", "triangle")
DIGIT_NAMES = tuple(str(i) for i in range(10))

DetectionSet = collections.namedtuple(
    "DetectionSet", ["images", "boxes", "labels", "num_objects"]
)
DetectionSet.__doc__ = """A batch of detection images.

Fields:
    images: float32 `(N, S, S, C)` in [0, 1].
    boxes: float32 `(N, max_objects, 4)`, normalised `(cx, cy, w, h)`;
        padding rows are zeros.
    labels: int32 `(N, max_objects)`; padding is `PAD_LABEL` (-1).
    num_objects: int32 `(N,)`, the number of real objects per image.
"""


def _positive_int(name, value, minimum=1):
    if not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(
            f"Received an invalid value for argument `{name}`, expected an "
            f"integer >= {minimum}. Received: {name}={value}"
        )


def _load_digits(split):
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")
    labels = digits.target.astype("int32")
    if split is None:
        return images, labels
    if split not in ("train", "test"):
        raise ValueError(
            "Received an invalid value for argument `digit_split`, expected "
            f"None, 'train' or 'test'. Received: digit_split={split}"
        )
    # The same split as `load_digits_images()` with its defaults.
    train, test = stratified_split(labels, 0.2, seed=0)
    chosen = train if split == "train" else test
    return images[chosen], labels[chosen]


def _scale_digit(digit, size, ink_threshold):
    patch = resize_images(digit[None, :, :, None], size, "bilinear")[0, :, :, 0]
    # Bilinear upscaling leaves faint halos; dropping them keeps the box on
    # the visible stroke.
    return np.where(patch >= ink_threshold, np.clip(patch, 0, 1), 0.0)


def _draw_digit(digits, labels, size, ink_threshold, rng):
    """`(patch, label)` of a random digit scaled to `size` pixels.

    A digit whose scaled patch keeps no ink (a tiny `size`: a "0" shrunk
    to one pixel is its empty centre) would have no box; another digit is
    drawn instead.
    """
    for _ in range(100):
        choice = int(rng.integers(len(digits)))
        patch = _scale_digit(digits[choice], size, ink_threshold)
        if (patch > 0).any():
            return patch, labels[choice]
    raise ValueError(
        f"No digit keeps any ink when scaled to {size}x{size} pixels with "
        f"ink_threshold={ink_threshold}; raise the smallest `object_scale` "
        "or lower `ink_threshold`."
    )


def _draw_shape(shape, size, intensity):
    centres = np.arange(size) + 0.5
    y, x = np.meshgrid(centres, centres, indexing="ij")
    if shape == 0:  # square
        inside = np.ones((size, size), bool)
    elif shape == 1:  # circle
        half = size / 2
        inside = (x - half) ** 2 + (y - half) ** 2 <= half**2
    else:  # triangle, apex up
        inside = np.abs(x - size / 2) <= y / 2
    return np.where(inside, intensity, 0.0).astype("float32")


def _tight_box(ink, image_size):
    rows = np.flatnonzero(ink.any(axis=1))
    cols = np.flatnonzero(ink.any(axis=0))
    r0, r1, c0, c1 = rows[0], rows[-1], cols[0], cols[-1]
    return np.array(
        [
            (c0 + c1 + 1) / 2 / image_size,
            (r0 + r1 + 1) / 2 / image_size,
            (c1 + 1 - c0) / image_size,
            (r1 + 1 - r0) / image_size,
        ],
        dtype="float32",
    )


def _check_arguments(
    num_images, image_size, max_objects, min_objects, object_scale, kind,
    channels, ink_threshold,
):
    """`make_detection_set`'s checks; returns the object scale `(low, high)`."""
    _positive_int("num_images", num_images, minimum=0)
    _positive_int("image_size", image_size)
    _positive_int("max_objects", max_objects)
    _positive_int("min_objects", min_objects, minimum=0)
    if min_objects > max_objects:
        raise ValueError(
            "Received an invalid value for argument `min_objects`, expected "
            f"at most max_objects={max_objects}. Received: "
            f"min_objects={min_objects}"
        )
    low, high = (int(v) for v in object_scale)
    if not 1 <= low <= high <= image_size:
        raise ValueError(
            "Received an invalid value for argument `object_scale`, expected "
            f"(smallest, largest) with 1 <= smallest <= largest <= "
            f"image_size={image_size}. Received: object_scale={object_scale}"
        )
    if min_objects * low * low > image_size * image_size:
        raise ValueError(
            f"{min_objects} objects of at least {low}x{low} pixels cannot fit "
            f"on a {image_size}x{image_size} canvas. Received: "
            f"min_objects={min_objects}, object_scale={object_scale}"
        )
    if kind not in ("digits", "shapes"):
        raise ValueError(
            "Received an invalid value for argument `kind`, expected "
            f"'digits' or 'shapes'. Received: kind={kind}"
        )
    if not 0.0 <= ink_threshold < 1.0:
        raise ValueError(
            "Received an invalid value for argument `ink_threshold`, expected "
            f"a float in [0, 1). Received: ink_threshold={ink_threshold}"
        )
    if channels not in (1, 3):
        raise ValueError(
            "Received an invalid value for argument `channels`, expected 1 "
            f"or 3. Received: channels={channels}"
        )
    return low, high


def make_detection_set(
    num_images,
    image_size=64,
    max_objects=4,
    min_objects=1,
    seed=0,
    object_scale=(12, 28),
    kind="digits",
    channels=1,
    digit_split=None,
    ink_threshold=0.1,
):
    """Generates images with several objects and their boxes and classes.

    Each image gets a number of objects drawn uniformly from
    `[min_objects, max_objects]`; each object a square patch whose side is
    drawn uniformly from `object_scale` (inclusive) and a random free
    position (patches never overlap). When an image has no room left,
    it keeps the objects placed so far if they are at least `min_objects`,
    else it is drawn again.

    Args:
        num_images: number of images `N`.
        image_size: canvas side `S` in pixels.
        max_objects: most objects per image; the box and label arrays are
            padded to this many.
        min_objects: fewest objects per image.
        seed: seed of the generator.
        object_scale: `(smallest, largest)` patch side in pixels.
        kind: `"digits"` (classes 0-9, scikit-learn digits) or `"shapes"`
            (classes 0 square, 1 circle, 2 triangle).
        channels: 1 (grey) or 3 (each object gets a random colour).
        digit_split: `None` for all 1,797 digits, `"train"` or `"test"` for
            the digits of the matching side of `load_digits_images()`'s
            default split, so held-out images show unseen digit instances.
        ink_threshold: upscaled digit pixels below this become 0.

    Returns:
        A `DetectionSet(images, boxes, labels, num_objects)`.

    Example:

    >>> data = make_detection_set(2, image_size=48, max_objects=3)
    >>> data.images.shape, data.boxes.shape, data.labels.shape
    ((2, 48, 48, 1), (2, 3, 4), (2, 3))
    """
    low, high = _check_arguments(
        num_images, image_size, max_objects, min_objects, object_scale, kind,
        channels, ink_threshold,
    )
    if kind == "digits":
        digits, digit_labels = _load_digits(digit_split)

    rng = np.random.default_rng(seed)
    images = np.zeros((num_images, image_size, image_size, channels), "float32")
    boxes = np.zeros((num_images, max_objects, 4), "float32")
    labels = np.full((num_images, max_objects), PAD_LABEL, "int32")
    num_objects = np.zeros((num_images,), "int32")
    for index in range(num_images):
        for _attempt in range(100):
            wanted = int(rng.integers(min_objects, max_objects + 1))
            # Occupied pixels of this image's patches.
            taken = np.zeros((image_size, image_size), bool)
            placed = []
            for _ in range(wanted):
                size = int(rng.integers(low, high + 1))
                for _try in range(50):
                    top, left = rng.integers(0, image_size - size + 1, size=2)
                    window = taken[top : top + size, left : left + size]
                    if not window.any():
                        break
                else:
                    break
                taken[top : top + size, left : left + size] = True
                placed.append((int(top), int(left), size))
            if len(placed) >= min_objects:
                break
        else:
            raise ValueError(
                f"Could not place {min_objects} objects on image {index}; "
                "lower `min_objects` or `object_scale`. Received: "
                f"min_objects={min_objects}, object_scale={object_scale}, "
                f"image_size={image_size}"
            )
        canvas = np.zeros((image_size, image_size), "float32")
        colours = []
        for slot, (top, left, size) in enumerate(placed):
            if kind == "digits":
                patch, label = _draw_digit(
                    digits, digit_labels, size, ink_threshold, rng
                )
            else:
                label = int(rng.integers(len(SHAPE_NAMES)))
                patch = _draw_shape(label, size, rng.uniform(0.5, 1.0))
            canvas[top : top + size, left : left + size] = patch
            ink = np.zeros((image_size, image_size), bool)
            ink[top : top + size, left : left + size] = patch > 0
            boxes[index, slot] = _tight_box(ink, image_size)
            labels[index, slot] = label
            colours.append(rng.uniform(0.3, 1.0, size=3))
        num_objects[index] = len(placed)
        if channels == 1:
            images[index, :, :, 0] = canvas
        else:
            for (top, left, size), colour in zip(placed, colours):
                region = canvas[top : top + size, left : left + size, None]
                images[index, top : top + size, left : left + size] = (
                    region * colour
                )
    return DetectionSet(images, boxes, labels, num_objects)


def place_digit_on_canvas(
    digit,
    canvas_size=64,
    scale=None,
    top_left=None,
    seed=0,
    ink_threshold=0.1,
):
    """Draws one digit on a blank canvas and returns it with its box.

    Meant for localisation checks such as Grad-CAM: the saliency of a
    classifier should fall inside the returned box.

    Args:
        digit: a digit image `(h, w)` or `(h, w, 1)` in [0, 1], for example
            one of `load_digits_images()`'s images.
        canvas_size: canvas side `S` in pixels.
        scale: side of the drawn digit in pixels; the digit's own size when
            `None`.
        top_left: `(row, column)` of the digit's top-left corner; random
            (from `seed`) when `None`.
        seed: seed used when `top_left` is `None`.
        ink_threshold: upscaled pixels below this become 0.

    Returns:
        `(canvas, box)`: float32 `(S, S, 1)` and the normalised
        `(cx, cy, w, h)` tight box of the ink, float32 `(4,)`.

    Example:

    >>> canvas, box = place_digit_on_canvas(np.eye(8), 32, top_left=(4, 8))
    >>> box.tolist()
    [0.375, 0.25, 0.25, 0.25]
    """
    digit = np.asarray(digit, dtype="float32")
    if digit.ndim == 3 and digit.shape[-1] == 1:
        digit = digit[..., 0]
    if digit.ndim != 2 or not (digit > 0).any():
        raise ValueError(
            "Received an invalid value for argument `digit`, expected a "
            "non-blank image (h, w) or (h, w, 1). "
            f"Received: shape={digit.shape}"
        )
    if scale is not None and scale != digit.shape[0]:
        _positive_int("scale", scale)
        digit = _scale_digit(digit, scale, ink_threshold)
    height, width = digit.shape
    if height > canvas_size or width > canvas_size:
        raise ValueError(
            "Received an invalid value for argument `canvas_size`, expected "
            f"at least the digit size {digit.shape}. Received: "
            f"canvas_size={canvas_size}"
        )
    if top_left is None:
        rng = np.random.default_rng(seed)
        top = int(rng.integers(0, canvas_size - height + 1))
        left = int(rng.integers(0, canvas_size - width + 1))
    else:
        top, left = (int(v) for v in top_left)
        if not (
            0 <= top <= canvas_size - height
            and 0 <= left <= canvas_size - width
        ):
            raise ValueError(
                "Received an invalid value for argument `top_left`, expected "
                "a position that keeps the digit on the canvas. Received: "
                f"top_left={top_left}"
            )
    canvas = np.zeros((canvas_size, canvas_size, 1), "float32")
    canvas[top : top + height, left : left + width, 0] = np.clip(digit, 0, 1)
    return canvas, _tight_box(canvas[..., 0] > 0, canvas_size)


def cxcywh_to_xyxy(boxes):
    """Converts `(..., 4)` boxes `(cx, cy, w, h)` to `(x0, y0, x1, y1)`."""
    boxes = np.asarray(boxes, dtype="float32")
    centre, size = boxes[..., :2], boxes[..., 2:]
    return np.concatenate([centre - size / 2, centre + size / 2], axis=-1)


def box_to_mask(box, image_size):
    """Pixels `(S, S)` (bool) inside one normalised `(cx, cy, w, h)` box."""
    x0, y0, x1, y1 = np.round(cxcywh_to_xyxy(box) * image_size).astype(int)
    mask = np.zeros((image_size, image_size), bool)
    mask[max(y0, 0) : max(y1, 0), max(x0, 0) : max(x1, 0)] = True
    return mask
