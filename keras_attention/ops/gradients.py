"""`custom_gradient`: Keras's `ops.custom_gradient`, without TensorFlow's
process-wide registry entry per trace.

In a TensorFlow graph (a `tf.function`, so every Keras `fit`, `predict`
or XLA step) `tf.custom_gradient` registers each traced call's gradient
under a new name in TensorFlow's global gradient registry, which is never
emptied: the entry holds the gradient function, and through it the whole
traced graph, for the life of the process (tensorflow/tensorflow#27492,
#97697). A service that traced our layers again and again (new shapes,
models built and dropped) kept every one of those graphs, where Keras's
own attention layer (no custom gradient) kept none.

Here the gradient is set on the one op that carries it (as TensorFlow's
own `Graph._override_gradient_function` sets it, which its concrete
functions use for theirs), so it lives and dies with its graph; a
`GradientTape` inside the function takes it from the tape record, as
`tf.custom_gradient` does.
Eagerly, and on JAX, this is `keras.ops.custom_gradient`; on torch, an
`autograd.Function` like Keras's whose backward pass can be differentiated
again (`_torch_custom_gradient`), and under `torch.func`'s transforms one
of the new form, which they require (`_TorchTransformFunction`).

On TensorFlow this module also gives XLA's dynamic slice ops the
gradients TensorFlow lacks (`register_slice_gradients`), so that the
backward passes of the blocked and chunked paths, which write their
blocks with `keras.ops.slice_update`, can be differentiated again.
"""

import keras
from keras import ops


def custom_gradient(f):
    """`keras.ops.custom_gradient(f)` that leaves nothing behind in a
    TensorFlow graph (see the module's docstring).

    `f(*tensors)` returns `(result, grad)`, `grad(*upstream)` the
    gradients of the tensors (`None` for one without); no variables are
    read inside `f` (the attention cores take tensors only).
    """
    if keras.backend.backend() == "torch":
        return _torch_custom_gradient(f)
    keras_version = ops.custom_gradient(f)
    if keras.backend.backend() != "tensorflow":
        return keras_version

    def wrapped(*args):
        import tensorflow as tf

        graph = tf.compat.v1.get_default_graph()
        if tf.executing_eagerly() or graph._gradient_function_map:
            return keras_version(*args)  # eager: the tape alone, no registry
        return _graph_call(f, args)

    return wrapped


def _torch_custom_gradient(f):
    """Keras's torch `custom_gradient`, differentiable twice.

    Keras runs `f` inside `torch.autograd.Function.forward`, where torch
    records nothing: what the backward pass reads from the forward (the
    dense core's weights, the blocked path's output and log-sum-exp) is
    cut from the inputs, so a second-order gradient (a Hessian-vector
    product, a gradient penalty) lost every term through them, silently
    (the chunked path, which recomputes its weights, was right). When the
    backward pass is itself recorded (`create_graph=True`), it is here
    autodiff's of `f`'s forward, run again from the inputs: the same
    values, and a graph torch differentiates again.
    """
    def call(*args):
        if torch._C._are_functorch_transforms_active():
            return _TorchTransformFunction.apply(f, *args)
        return _TorchFunction.apply(f, *args)

    return call


if keras.backend.backend() == "torch":
    import torch

    # At module level, as Keras's: `torch.compile` cannot trace a class
    # statement.
    class _TorchFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, f, *args):
            ctx.f = f
            ctx.save_for_backward(*args)
            result, ctx.grad_fn = f(*args)
            return result

        @staticmethod
        def backward(ctx, upstream):
            args = ctx.saved_tensors
            if not torch.is_grad_enabled():
                grads = ctx.grad_fn(*args, upstream=upstream)
                return (None,) + (grads if isinstance(grads, tuple) else (grads,))
            wanted = [a for a in args if a.requires_grad]
            result, _ = ctx.f(*args)
            found = iter(torch.autograd.grad(
                result, wanted, upstream, create_graph=True, allow_unused=True
            ))
            return (None,) + tuple(
                next(found) if a.requires_grad else None for a in args
            )

    class _TorchTransformFunction(torch.autograd.Function):
        """The same under `torch.func` (`grad`, `vmap`, `jacrev`, `jvp`,
        `hessian`), which takes only a Function of the new form (its
        context set apart from `forward`). The backward runs the forward
        again for what its own backward reads (the context holds tensors
        only); forward mode is `torch.func.jvp` of the forward; `vmap`
        maps all three (`generate_vmap_rule`)."""

        generate_vmap_rule = True

        @staticmethod
        def forward(f, *args):
            return f(*args)[0]

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.f = inputs[0]
            ctx.save_for_backward(*inputs[1:])
            ctx.save_for_forward(*inputs[1:])

        @staticmethod
        def backward(ctx, upstream):
            args = ctx.saved_tensors
            grads = ctx.f(*args)[1](*args, upstream=upstream)
            return (None,) + (grads if isinstance(grads, tuple) else (grads,))

        @staticmethod
        def jvp(ctx, _, *tangents):
            args = ctx.saved_tensors
            # The float inputs (a mask has no tangent).
            moving = [i for i, a in enumerate(args) if a.is_floating_point()]

            def forward(*values):
                full = list(args)
                for i, value in zip(moving, values):
                    full[i] = value
                return ctx.f(*full)[0]

            return torch.func.jvp(
                forward,
                tuple(args[i] for i in moving),
                tuple(
                    torch.zeros_like(args[i]) if tangents[i] is None else tangents[i]
                    for i in moving
                ),
            )[1]


def register_slice_gradients():
    """Registers gradients for TensorFlow's `XlaDynamicUpdateSlice` and
    `XlaDynamicSlice` ops where TensorFlow has none.

    Keras's TensorFlow backend computes `keras.ops.slice_update` with
    `XlaDynamicUpdateSlice`, for which TensorFlow 2.21 registers no
    gradient: code that differentiates it fails with a `LookupError`. Our
    blocked and chunked paths write their blocks with it in their own
    backward passes, so a second-order gradient through them (a
    Hessian-vector product, a gradient penalty) failed. Both ops are
    linear in their tensor inputs, and their gradients are each other:
    `update(x, u, i)` sends `dy` to `x` with the window zeroed and to `u`
    as the window; `slice(x, i)` sends `dy` into a zero tensor at the
    window. Indices get none. Both ops clamp the window into the tensor
    in the same way, so the pair agrees for any indices.

    An op that already has a gradient (a later TensorFlow) keeps its own.
    Called once when this module is imported on the TensorFlow backend.
    """
    if keras.backend.backend() != "tensorflow":
        return
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.python import xla
    from tensorflow.python.framework import ops as tf_ops

    def update_grad(op, dy):
        update, indices = op.inputs[1], op.inputs[2]
        d_operand = xla.dynamic_update_slice(dy, tf.zeros_like(update), indices)
        d_update = xla.dynamic_slice(dy, indices, tf.shape(update))
        return d_operand, d_update, None

    def slice_grad(op, dy):
        operand, indices = op.inputs[0], op.inputs[1]
        d_operand = xla.dynamic_update_slice(tf.zeros_like(operand), dy, indices)
        return d_operand, None, None

    for name, grad in (("XlaDynamicUpdateSlice", update_grad),
                       ("XlaDynamicSlice", slice_grad)):
        try:
            tf_ops.gradient_registry.lookup(name)
        except LookupError:
            tf_ops.RegisterGradient(name)(grad)


register_slice_gradients()


def _graph_call(f, args):
    import tensorflow as tf
    from tensorflow.python.eager import record

    args = [tf.convert_to_tensor(a) for a in args]
    result, grad_fn = f(*args)
    flat = tf.nest.flatten(result)
    count = len(flat)

    def tape_grad(*upstream):
        grads = grad_fn(*upstream[:count])
        grads = list(grads) if isinstance(grads, (list, tuple)) else [grads]
        return [None] * count + grads  # one per input of the IdentityN

    def op_grad(unused_op, *upstream):
        return tape_grad(*upstream)

    originals = flat + args
    outputs = tf.identity_n(originals)
    # What `graph._override_gradient_function({"IdentityN": op_grad})`
    # sets as the op is made; set after, because a forward accumulator
    # (`tf.autodiff.ForwardAccumulator`) computes the new op's JVP while it
    # is made, calling a function, and that call enters the override again
    # (which TensorFlow asserts against). Its JVP is then the identity's,
    # through the forward ops `f` ran.
    outputs[0].op._gradient_function = op_grad
    record.record_operation(f.__name__, outputs, originals, tape_grad)
    return tf.nest.pack_sequence_as(result, outputs[:count])
