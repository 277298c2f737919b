"""How the applications compile: defaults, XLA or not, decoding loops.

- `CompileDefaults`: `compile` with each application's defaults
  (`compile_defaults()`), and `compile_from_config` so that a loaded
  model is compiled again;
- `xla_slower_here(model)`: the rule that keeps XLA off where it would
  be slower (half precision on a CPU; torch);
- `CompiledLoops`: the translators' and the causal LM's decoding loops,
  traced again when the model's variables change.
"""

import threading

import keras

from keras_attention._config import backend_neutral_compile_config


class CompiledLoops:
    """A task's decoding loops by key (translators, the causal LM).

    `build()` gives the `keras.ops` loop; with `jit_compile` it runs as
    `tf.function(jit_compile=True)` on TensorFlow and under `jax.jit` on
    JAX (torch runs it as it is). A traced function keeps the variables it
    was traced with, and `enable_lora` and `quantize` add or replace
    variables, so every loop is traced again once the model's variables
    change. Under `jax.jit` the variables' values are arguments of each
    call (`_jax_jit`), so new values (`fit`, `set_weights`) are seen.
    """

    # The loops kept, the least recently used dropped first: a service that
    # decodes many batch sizes and lengths kept every one (each holding its
    # traced graph).
    MAX_LOOPS = 32

    def __init__(self):
        self._loops, self._weights = {}, None
        # Requests decoded from several threads share the loops: one
        # builds a key's loop, the others wait for it (each built its own
        # before, and the table changed under their reads).
        self._lock = threading.RLock()

    def get(self, model, key, build, jit_compile, variables=()):
        """The loop of `key`; `variables`: state the loop reads besides the
        model's (a sampler's seeds), given to `jax.jit` with them."""
        with self._lock:
            weights = tuple(id(v) for v in model.weights)
            if weights != self._weights:
                self._loops.clear()
                self._weights = weights
            function = self._loops.pop(key, None)  # back in as the most recent
            if function is None:
                function = build()
                if jit_compile and keras.backend.backend() == "tensorflow":
                    import tensorflow as tf

                    function = tf.function(function, jit_compile=True)
                elif jit_compile and keras.backend.backend() == "jax":
                    function = _jax_jit(function, [*model.variables, *variables])
            self._loops[key] = function
            while len(self._loops) > self.MAX_LOOPS:
                del self._loops[next(iter(self._loops))]
            return function


def _jax_jit(function, variables):
    """`function` under `jax.jit`, the variables' values passed at each call.

    Inside, a `StatelessScope` maps each variable to its value (traced, not
    a constant); the values the loop assigns (a sampler's seed state) come
    back out of the scope and are assigned after the call, as running it
    without jit would.
    """
    import jax

    variables = list({id(v): v for v in variables}.values())

    def stateless(values, *args):
        mapping = list(zip(variables, values))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            given = [scope.get_current_value(v) for v in variables]
            outputs = function(*args)
        updated = {}  # the variables assigned in the loop
        for i, v in enumerate(variables):
            value = scope.get_current_value(v)
            if value is not given[i]:
                updated[i] = value
        return outputs, updated

    compiled = jax.jit(stateless)

    def call(*args):
        outputs, updated = compiled([v.value for v in variables], *args)
        for i, value in updated.items():
            variables[i].assign(value)
        return outputs

    return call


def xla_slower_here(model):
    """Whether XLA would train this model slower than graph mode here.

    On a CPU, TensorFlow's XLA backend computes bfloat16 and float16
    products without the CPU's half-precision units (oneDNN in graph mode
    uses them): a `mixed_bfloat16` attention layer at 2,048 tokens ran
    0.53x of its float32 speed under XLA and 1.62x in graph mode on an
    AVX512-BF16 machine (BENCHMARKS.md, "Speed per machine", bfloat16). So
    a half-precision model on a CPU compiles without XLA unless
    `jit_compile` is given.

    torch has no XLA: Keras's `jit_compile=True` there is `torch.compile`,
    which recompiled a tiny translator's step for every batch shape (far
    slower than eager on a CPU), so the applications'
    XLA default runs eagerly on torch, as the README's backend table says.
    """
    if keras.backend.backend() == "torch":
        return True
    if keras.backend.backend() != "tensorflow":
        return False
    compute = keras.backend.standardize_dtype(model.dtype_policy.compute_dtype)
    if compute not in ("bfloat16", "float16"):
        return False
    import tensorflow as tf

    return not tf.config.list_logical_devices("GPU")


class DefaultJitCompile:
    """`jit_compile=None` is the application's default, saved as one.

    `default_jit_compile(jit_compile, default)` gives the value to compile
    with: `default` for `None`, except where XLA would be slower here (a
    bfloat16/float16 model on a CPU, and any model on torch:
    `xla_slower_here`). A default is saved as `None`, so the backend that
    loads the file decides (XLA on TensorFlow and JAX, eager on torch); a
    value given is kept as given. `compile_from_config` compiles a loaded
    model again (optimizer state included), which Keras leaves to a class
    that overrides `compile`.
    """

    def default_jit_compile(self, jit_compile, default):
        self._default_jit_compile = jit_compile is None
        if jit_compile is None:
            jit_compile = default
            if jit_compile and xla_slower_here(self):
                jit_compile = False
        return jit_compile

    def get_compile_config(self):
        config = super().get_compile_config()
        if config and getattr(self, "_default_jit_compile", False):
            config["jit_compile"] = None
        return config

    def compile_from_config(self, config):
        # Keras skips it for a class that overrides `compile`; ours takes
        # Keras's arguments. A file saved on torch names torch's optimizer.
        config = backend_neutral_compile_config(config)
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built:
            self.optimizer.build(self.trainable_variables)


class CompileDefaults(DefaultJitCompile):
    """`compile` with each application's defaults, and `compile_from_config`.

    `optimizer`, `loss` and `weighted_metrics` given as `"auto"`, and
    `jit_compile=None`, take the values of `compile_defaults()`, which
    subclasses implement (except that a bfloat16/float16 model on a CPU,
    and any model on torch, compile without XLA: `xla_slower_here`).
    Metrics default to `weighted_metrics`, so that a
    `sample_weight` (a split's mask) weighs them too; Keras 3 updates
    `metrics=` without it. So `metrics=` given to `compile` come *beside*
    the default weighted metrics, not in their place (keras names a
    weighted one `weighted_<name>` when the names collide: with
    `metrics=["accuracy"]`, `accuracy` counts every example and
    `weighted_accuracy` the weighted ones); `weighted_metrics=None` drops
    the defaults. Keras leaves `compile_from_config` to a class that
    overrides `compile`; ours takes the same arguments, so a loaded model is
    compiled again (optimizer state included).
    """

    def compile_defaults(self):
        """`{"optimizer", "loss", "weighted_metrics", "jit_compile"}`."""
        raise NotImplementedError

    def compile(
        self,
        optimizer="auto",
        loss="auto",
        metrics=None,
        weighted_metrics="auto",
        jit_compile=None,
        **kwargs,
    ):
        """`keras.Model.compile` with the defaults of `compile_defaults()`
        (`metrics=` are added to the default `weighted_metrics`; see the
        class docstring)."""
        defaults = self.compile_defaults()
        given = dict(
            optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics
        )
        for name, value in given.items():
            if isinstance(value, str) and value == "auto":
                given[name] = defaults[name]
        jit_compile = self.default_jit_compile(
            jit_compile, defaults.get("jit_compile", "auto")
        )
        super().compile(
            metrics=metrics, jit_compile=jit_compile, **given, **kwargs
        )

