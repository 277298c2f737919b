"""Export a model to each format and run the artefact with its own runtime.

`run_exported(model, inputs, format, folder)` writes `model.export(...)` and
returns the list of what the exported artefact computes on `inputs` (its
outputs, in an order that depends on the format), run by the format's
own runtime, not by Keras: the SavedModel's `serve` signature
(TensorFlow), onnxruntime for ONNX, and the LiteRT interpreter
(`ai_edge_litert`) for `.tflite` files.
"""

import os

import numpy as np

FORMATS = ("tf_saved_model", "onnx", "litert")
SUFFIX = {"tf_saved_model": "", "onnx": ".onnx", "litert": ".tflite"}


def _as_list(inputs):
    return list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]


def run_exported(model, inputs, format, folder):
    path = os.path.join(str(folder), f"model_{format}{SUFFIX[format]}")
    model.export(path, format=format, verbose=False)
    items = [np.asarray(x) for x in _as_list(inputs)]
    if format == "tf_saved_model":
        import tensorflow as tf

        loaded = tf.saved_model.load(path)
        args = items if len(items) > 1 else items[:1]
        if isinstance(inputs, (list, tuple)):
            result = loaded.serve(list(items))
        else:
            result = loaded.serve(*args)
        return _all(result)
    if format == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(path)
        feeds = {spec.name: x for spec, x in zip(session.get_inputs(), items)}
        return session.run(None, feeds)
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path)
    details = interpreter.get_input_details()
    # LiteRT orders the inputs by its own names; match them by shape and
    # dtype first, then by position.
    order = _match_inputs(details, items)
    for detail, x in zip(details, order):
        if tuple(detail["shape"]) != x.shape:
            interpreter.resize_tensor_input(detail["index"], x.shape)
    interpreter.allocate_tensors()
    for detail, x in zip(details, order):
        interpreter.set_tensor(detail["index"], x.astype(detail["dtype"]))
    interpreter.invoke()
    return [
        interpreter.get_tensor(detail["index"])
        for detail in interpreter.get_output_details()
    ]


def _all(result):
    if isinstance(result, dict):
        return [np.asarray(result[k]) for k in sorted(result)]
    if isinstance(result, (list, tuple)):
        return [np.asarray(r) for r in result]
    return [np.asarray(result)]


def by_shape(outputs, shape):
    """The one output of `outputs` with this shape (formats order differently)."""
    found = [np.asarray(o) for o in outputs if tuple(np.shape(o)) == tuple(shape)]
    assert len(found) == 1, (shape, [np.shape(o) for o in outputs])
    return found[0]


def _match_inputs(details, items):
    """`items` reordered to the interpreter's inputs, by rank, dtype and shape.

    LiteRT lists a signature's inputs in its own order (often by name).
    """
    if len(items) == 1:
        return items
    left = list(range(len(items)))
    ordered = []
    for detail in details:
        signature = tuple(detail.get("shape_signature", detail["shape"]))

        def fits(i):
            x = items[i]
            return (
                x.ndim == len(signature)
                and np.dtype(x.dtype).kind == np.dtype(detail["dtype"]).kind
                and all(s in (-1, d) for s, d in zip(signature, x.shape))
            )

        matches = [i for i in left if fits(i)]
        assert matches, (detail["name"], signature, [x.shape for x in items])
        ordered.append(items[matches[0]])
        left.remove(matches[0])
    return ordered
