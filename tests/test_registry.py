"""The registry: names, lookup errors, serialization, entry-point plugins."""

import importlib
import os
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest

import keras_attention
from keras_attention import registry

BUILTIN = {"additive", "scaled_dot_product", "multi_head"}


def test_builtin_names_and_get():
    assert BUILTIN <= set(keras_attention.names())
    layer = keras_attention.get("multi_head", num_heads=2, key_dim=4)
    assert isinstance(layer, keras_attention.layers.MultiHeadAttention)
    assert layer.num_heads == 2


def test_unknown_name_lists_the_known_names():
    with pytest.raises(ValueError, match="multi_head") as info:
        keras_attention.get("flash_attention")
    assert "flash_attention" in str(info.value)


def test_register_rejects_non_layers_and_bad_names():
    with pytest.raises(ValueError, match="name"):
        keras_attention.register("")
    with pytest.raises(ValueError, match="keras.layers.Layer"):
        keras_attention.register("not_a_layer")(object)


def test_registered_layer_loads_from_keras_file_without_custom_objects(tmp_path):
    @keras_attention.register("test_scaled_identity")
    class ScaledIdentity(keras.layers.Layer):
        def __init__(self, factor=2.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def call(self, x):
            return x * self.factor

        def get_config(self):
            return {**super().get_config(), "factor": self.factor}

    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras_attention.get("test_scaled_identity", factor=3.0)(inputs))
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_allclose(loaded(np.ones((1, 3))), 3.0)


def test_registering_a_name_twice_warns():
    @keras_attention.register("test_twice")
    class First(keras.layers.Layer):
        pass

    with pytest.warns(UserWarning, match="test_twice"):

        @keras_attention.register("test_twice")
        class Second(keras.layers.Layer):
            pass

    assert keras_attention.get_class("test_twice") is Second


def write_plugin(root, dist, module, source, entry_points):
    """A plugin distribution on `root`: its module and its .dist-info metadata."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "\n".join(f"{name} = {value}" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[keras_attention.layers]\n{lines}\n")


GOOD_PLUGIN = """
    import keras
    import keras_attention

    @keras_attention.register("test_plugin_gate")
    class PluginGate(keras.layers.Layer):
        def call(self, x):
            return x * keras.ops.sigmoid(x)

    class Unregistered(keras.layers.Layer):
        def call(self, x):
            return -x
"""


def test_plugins_are_found_through_entry_points(tmp_path, monkeypatch):
    write_plugin(
        tmp_path, "ka_good_plugin", "ka_good_plugin", GOOD_PLUGIN,
        {"gate": "ka_good_plugin", "test_plugin_negate": "ka_good_plugin:Unregistered"},
    )
    (tmp_path / "ka_broken_plugin.py").write_text("raise RuntimeError('boom')\n")
    info = tmp_path / "ka_broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ka_broken_plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[keras_attention.layers]\nbroken = ka_broken_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = keras_attention.discover_plugins(force=True)
    assert "gate" in loaded and "test_plugin_negate" in loaded
    assert "broken" not in loaded
    messages = [str(w.message) for w in caught]
    assert any("broken" in m and "ka_broken_plugin" in m and "boom" in m for m in messages)
    # The library keeps working, and finds the plugin layers by name.
    assert {"test_plugin_gate", "test_plugin_negate"} <= set(keras_attention.names())
    assert BUILTIN <= set(keras_attention.names())
    x = np.array([[1.0, -2.0]], "float32")
    np.testing.assert_allclose(keras_attention.get("test_plugin_negate")(x), -x)
    assert "ka_good_plugin" in registry.origins()["test_plugin_negate"]


def test_plugin_that_takes_a_builtin_name_warns_and_names_itself(tmp_path, monkeypatch):
    original = keras_attention.get_class("additive")
    source = """
        import keras
        import keras_attention

        @keras_attention.register("additive")
        class Impostor(keras.layers.Layer):
            pass
    """
    write_plugin(tmp_path, "ka_impostor", "ka_impostor", source, {"impostor": "ka_impostor"})
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.warns(UserWarning, match="ka_impostor"):
            keras_attention.discover_plugins(force=True)
        # The library keeps working: the built-in name keeps its layer.
        assert keras_attention.get_class("additive") is original
        assert registry.origins()["additive"] == "keras_attention"
    finally:
        keras_attention.register("additive")(original)


def test_a_built_in_name_is_not_taken_over_by_another_package():
    original = keras_attention.get_class("multi_head")

    class Mine(keras.layers.Layer):
        pass

    Mine.__module__ = "my_package.layers"
    try:
        with pytest.warns(UserWarning, match="unregister"):
            assert keras_attention.register("multi_head")(Mine) is Mine
        assert keras_attention.get_class("multi_head") is original
    finally:
        keras_attention.register("multi_head")(original)


def test_two_classes_of_one_name_in_one_package_are_refused(tmp_path):
    """keras would key both `ka_same>Attention` and load a `.keras` file of
    the first as the second."""

    def attention(module, factor):
        cls = type("Attention", (keras.layers.Layer,), {
            "call": lambda self, x: x * factor, "__module__": module,
        })
        return cls

    first = keras_attention.register("test_same_first")(attention("ka_same.one", 2.0))
    second = attention("ka_same.two", 3.0)
    with pytest.raises(ValueError, match="package.*ka_same>Attention"):
        keras_attention.register("test_same_second")(second)
    assert "test_same_second" not in keras_attention.names()
    # Its own package: both load as themselves.
    keras_attention.register("test_same_second", package="ka_same.two")(second)
    for cls, factor in ((first, 2.0), (second, 3.0)):
        inputs = keras.Input((2,))
        path = str(tmp_path / f"{factor}.keras")
        keras.Model(inputs, cls()(inputs)).save(path)
        loaded = keras.saving.load_model(path)
        np.testing.assert_allclose(loaded(np.ones((1, 2))), factor)
    # A class defined again (a reloaded module) replaces its former self.
    keras_attention.register("test_same_first")(attention("ka_same.one", 2.0))
    for name in ("test_same_first", "test_same_second"):
        registry.unregister(name)


def test_registry_arguments_are_checked():
    class Layer(keras.layers.Layer):
        pass

    with pytest.raises(ValueError, match="`package`.*package=3"):
        keras_attention.register("test_bad_package", package=3)(Layer)
    with pytest.raises(ValueError, match="`name`.*name=\\['multi_head'\\]"):
        keras_attention.get_class(["multi_head"])
    with pytest.raises(ValueError, match="`kind`.*kind='image'"):
        registry.names_of_kind("image")
    assert "test_bad_package" not in keras_attention.names()


def test_an_entry_point_that_is_not_a_module_or_layer_warns(tmp_path, monkeypatch):
    source = """
        def helper():
            return 1
    """
    write_plugin(
        tmp_path, "ka_helper_plugin", "ka_helper_plugin", source,
        {"helper": "ka_helper_plugin:helper"},
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(UserWarning, match="'helper' \\(ka_helper_plugin\\).*neither"):
        loaded = keras_attention.discover_plugins(force=True)
    assert "helper" not in loaded


def test_plugins_are_not_imported_with_the_library(tmp_path):
    write_plugin(
        tmp_path, "ka_lazy_plugin", "ka_lazy_plugin",
        "import sys\nsys.modules['ka_lazy_marker'] = True\n" + textwrap.dedent(GOOD_PLUGIN),
        {"lazy": "ka_lazy_plugin"},
    )
    code = (
        "import sys, keras_attention\n"
        "assert 'ka_lazy_marker' not in sys.modules, 'plugin imported at import time'\n"
        "assert 'test_plugin_gate' in keras_attention.names()\n"
        "assert 'ka_lazy_marker' in sys.modules\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ok" in result.stdout


CLAIMANT = """
    import keras
    import keras_attention

    @keras_attention.register("test_claimed")
    class Claimant(keras.layers.Layer):
        def call(self, x):
            return x * {factor}
"""


def test_a_name_two_plugins_claim_is_refused_until_chosen(tmp_path, monkeypatch):
    # Which plugin's class a saved application's `attention="test_claimed"`
    # meant cannot be told: neither wins by the order of sys.path.
    for dist, factor in (("ka_claim_one", 2.0), ("ka_claim_two", 3.0)):
        root = tmp_path / dist
        root.mkdir()
        write_plugin(root, dist, dist, CLAIMANT.format(factor=factor), {dist: dist})
        monkeypatch.syspath_prepend(str(root))
    try:
        with pytest.warns(UserWarning, match="claimed by two plugins.*ka_claim_"):
            keras_attention.discover_plugins(force=True)
        with pytest.raises(ValueError, match="ambiguous.*'test_claimed'") as raised:
            keras_attention.get("test_claimed")
        assert "ka_claim_one" in str(raised.value) and "ka_claim_two" in str(raised.value)
        with pytest.raises(ValueError, match="ambiguous"):
            registry.build("test_claimed")
        # A registration outside discovery chooses.
        import ka_claim_two

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "replaced", if it was not first
            keras_attention.register("test_claimed")(ka_claim_two.Claimant)
        x = np.ones((1, 2), "float32")
        np.testing.assert_allclose(keras_attention.get("test_claimed")(x), 3.0)
    finally:
        registry.unregister("test_claimed")


def test_a_plugin_that_fails_halfway_leaves_no_name(tmp_path, monkeypatch):
    source = """
        import keras
        import keras_attention

        @keras_attention.register("test_half_first")
        class First(keras.layers.Layer):
            pass

        raise ImportError("a dependency is missing")
    """
    write_plugin(tmp_path, "ka_half", "ka_half", source, {"half": "ka_half"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(UserWarning, match="could not load.*half.*dependency"):
        loaded = keras_attention.discover_plugins(force=True)
    assert "half" not in loaded
    assert "test_half_first" not in keras_attention.names()
    assert "test_half_first" not in registry.origins()


def test_an_unknown_name_in_an_application_points_at_plugins():
    # A saved application whose plugin is not installed names the cause.
    from keras_attention.applications import VisionTransformer

    with pytest.raises(ValueError, match="attention='test_gone'.*plugin.*keras_attention.layers"):
        VisionTransformer(image_size=8, patch_size=4, num_classes=2, attention="test_gone")
    with pytest.raises(ValueError, match="attention='graph'$"):
        VisionTransformer(image_size=8, patch_size=4, num_classes=2, attention="graph")


def paused_plugin(tmp_path, monkeypatch, module, entry, body):
    """A plugin module that, once its import starts, sets `importing` and
    waits for `proceed` before `body` (its registrations): a thread can
    act while another imports it. Returns `(importing, proceed)`."""
    import builtins
    import threading

    source = (
        "import keras\nimport keras_attention\n\nIMPORTING.set()\n"
        "PROCEED.wait(10)\n\n" + textwrap.dedent(body)
    )
    write_plugin(tmp_path, module, module, source, {entry: module})
    monkeypatch.syspath_prepend(str(tmp_path))
    importing, proceed = threading.Event(), threading.Event()
    monkeypatch.setattr(builtins, "IMPORTING", importing, raising=False)
    monkeypatch.setattr(builtins, "PROCEED", proceed, raising=False)
    monkeypatch.delitem(sys.modules, module, raising=False)
    return importing, proceed


def test_discovery_beside_a_direct_import_of_the_plugin_does_not_hang(
    tmp_path, monkeypatch
):
    # One thread imports a plugin's module itself (it then holds Python's
    # import lock of that module, and its `register` wants the registry);
    # another discovers plugins, which imports the same module. Discovery
    # held the registry's lock while importing: both threads hung.
    import threading

    importing, proceed = paused_plugin(tmp_path, monkeypatch, "ka_slow", "slow", """
        @keras_attention.register("test_slow_plugin")
        class Slow(keras.layers.Layer):
            def call(self, x):
                return x
    """)
    importer = threading.Thread(target=importlib.import_module, args=("ka_slow",),
                                daemon=True)
    importer.start()
    assert importing.wait(10)

    def discover():
        keras_attention.discover_plugins(force=True)

    discoverer = threading.Thread(target=discover, daemon=True)
    discoverer.start()
    discoverer.join(0.5)  # discovery now waits for the module's import
    proceed.set()
    importer.join(20)
    discoverer.join(20)
    assert not importer.is_alive() and not discoverer.is_alive(), "deadlock"
    assert "test_slow_plugin" in keras_attention.names()
    registry.unregister("test_slow_plugin")


def test_a_registration_in_another_thread_during_discovery_keeps_its_origin(
    tmp_path, monkeypatch
):
    # The plugin being imported was one process-wide value: a class the
    # user registered meanwhile was recorded as the plugin's, and a
    # plugin that then failed took the user's name away with its own.
    import threading

    importing, proceed = paused_plugin(tmp_path, monkeypatch, "ka_failing", "failing", """
        @keras_attention.register("test_failing_plugin_layer")
        class Mine(keras.layers.Layer):
            pass

        raise ImportError("a dependency is missing")
    """)

    def discover():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            keras_attention.discover_plugins(force=True)

    discoverer = threading.Thread(target=discover, daemon=True)
    discoverer.start()
    assert importing.wait(10)

    @keras_attention.register("test_users_layer_meanwhile")
    class UsersLayer(keras.layers.Layer):
        pass

    proceed.set()
    discoverer.join(20)
    try:
        assert registry.origins()["test_users_layer_meanwhile"] == __name__.split(".")[0]
        assert keras_attention.get_class("test_users_layer_meanwhile") is UsersLayer
        assert "test_failing_plugin_layer" not in keras_attention.names()
    finally:
        registry.unregister("test_users_layer_meanwhile")


def test_a_clash_refuses_only_its_name(tmp_path, monkeypatch, capsys):
    # The CLI's listing and the attention maps looked every name up: one
    # name two plugins claim broke both, for every model.
    for dist, factor in (("ka_clash_one", 2.0), ("ka_clash_two", 3.0)):
        root = tmp_path / dist
        root.mkdir()
        write_plugin(root, dist, dist, CLAIMANT.format(factor=factor).replace(
            "test_claimed", "test_clash_listed"), {dist: dist})
        monkeypatch.syspath_prepend(str(root))
    from keras_attention import cli
    from keras_attention import visualization

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            keras_attention.discover_plugins(force=True)
        assert "test_clash_listed" in registry.refused()
        assert cli.main(["list"]) == 0
        out = capsys.readouterr().out
        assert "test_clash_listed" in out and "(refused)" in out
        assert "spatial" in out and "Presets" in out
        import ka_clash_two

        assert ka_clash_two.Claimant in registry.classes()
        inputs = keras.Input((4, 8))
        outputs = keras_attention.get("multi_head", num_heads=1, key_dim=4)(inputs, inputs)
        maps = visualization.attention_maps(keras.Model(inputs, outputs), np.ones((1, 4, 8)))
        assert len(maps) == 1
    finally:
        registry.unregister("test_clash_listed")


def test_a_plugin_does_not_take_a_name_the_users_code_registered(tmp_path, monkeypatch):
    class Mine(keras.layers.Layer):
        pass

    keras_attention.register("test_users_choice")(Mine)
    write_plugin(tmp_path, "ka_later", "ka_later", CLAIMANT.replace(
        "test_claimed", "test_users_choice").format(factor=2.0), {"later": "ka_later"})
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.warns(UserWarning, match="does not take a name registered by your code"):
            keras_attention.discover_plugins(force=True)
        assert keras_attention.get_class("test_users_choice") is Mine
        assert "test_users_choice" not in registry.refused()
    finally:
        registry.unregister("test_users_choice")


def test_a_failed_plugin_leaves_the_names_of_a_plugin_it_imported(tmp_path, monkeypatch):
    # Plugin `ka_user_of_dep` imports plugin `ka_dep` and then fails: the
    # rollback took `ka_dep`'s name too, and credited it to the wrong one.
    write_plugin(tmp_path, "ka_dep", "ka_dep", """
        import keras
        import keras_attention

        @keras_attention.register("test_dep_layer")
        class DepLayer(keras.layers.Layer):
            pass
    """, {"dep": "ka_dep"})
    write_plugin(tmp_path, "aa_user_of_dep", "aa_user_of_dep", """
        import ka_dep

        raise ImportError("a dependency is missing")
    """, {"user": "aa_user_of_dep"})
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.warns(UserWarning, match="could not load.*user"):
            loaded = keras_attention.discover_plugins(force=True)
        assert "dep" in loaded and "user" not in loaded
        assert "test_dep_layer" in keras_attention.names()
        assert "'dep' (ka_dep)" in registry.origins()["test_dep_layer"]
    finally:
        registry.unregister("test_dep_layer")


def test_names_are_words_and_an_entry_point_names_a_registered_class_too(
    tmp_path, monkeypatch
):
    class Layer(keras.layers.Layer):
        pass

    for bad in (" ", "multi head", " multi_head", "a>b", "x" * 101, "1st"):
        with pytest.raises(ValueError, match="`name`"):
            keras_attention.register(bad)(Layer)
    with pytest.raises(ValueError, match="unknown.*'test_never_registered'"):
        keras_attention.unregister("test_never_registered")
    # An entry point naming a class registered under another name: it is
    # reported as loaded, so its name finds the class too.
    write_plugin(tmp_path, "ka_alias", "ka_alias", """
        import keras
        import keras_attention

        @keras_attention.register("test_alias_own")
        class Fancy(keras.layers.Layer):
            pass
    """, {"test_alias_entry": "ka_alias:Fancy"})
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert "test_alias_entry" in keras_attention.discover_plugins(force=True)
        assert keras_attention.get_class("test_alias_entry") is keras_attention.get_class(
            "test_alias_own"
        )
    finally:
        for name in ("test_alias_entry", "test_alias_own"):
            registry.unregister(name)


def test_an_alias_of_a_built_in_class_is_the_users():
    keras_attention.register("test_mha_alias")(keras_attention.layers.MultiHeadAttention)
    try:
        assert registry.origins()["test_mha_alias"] == __name__.split(".")[0]
    finally:
        registry.unregister("test_mha_alias")


def test_registering_a_built_in_again_keeps_its_origin():
    # Credited to the calling package, the built-in became the test's own.
    original = keras_attention.get_class("additive")
    keras_attention.register("additive")(original)
    assert registry.origins()["additive"] == "keras_attention"
