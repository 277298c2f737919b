"""The attention explorer: its data, its errors, and the page in a real browser.

The browser tests drive headless Chromium with selenium; they skip (with the
reason) only where selenium or a Chromium with its driver is not installed
(`.ci/run` installs Debian's `chromium` and `chromium-driver`).
"""

import base64
import io
import json
import os
import re
import shutil
import tempfile

import keras
import numpy as np
import pytest

from keras_attention import layers as ka_layers
from keras_attention.applications import DETR
from keras_attention.applications import GATNodeClassifier
from keras_attention.applications import TextClassifier
from keras_attention.applications import TextClassifierPreprocessor
from keras_attention.applications import VisionTransformer
from keras_attention.applications import node_classification_data
from keras_attention.datasets import load_karate_club
from keras_attention.datasets import make_detection_set
from keras_attention.visualization import explore
from keras_attention.visualization import explorer as explorer_lib

TOKENS = ["the", "cat", "sat", "on", "the", "mat"]


def token_model(num_layers=2, num_heads=4, length=6, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((length, 8))]
        + [
            ka_layers.MultiHeadAttention(num_heads, 4, name=f"mha_{i}")
            for i in range(num_layers)
        ],
        name="encoder",
    )


def tokens_input(length=6, seed=0):
    # Large inputs give peaked (not uniform) attention in an untrained layer.
    return 5 * np.random.default_rng(seed).standard_normal((1, length, 8))


def tiny_vit(seed=0):
    keras.utils.set_random_seed(seed)
    return VisionTransformer(
        image_size=16, patch_size=4, num_classes=3, hidden_dim=16, depth=2,
        num_heads=2, mlp_dim=16, num_channels=1,
    )


def bar_image():
    image = np.zeros((1, 16, 16, 1), "float32")
    image[0, 4:12, 6:10] = 1.0
    return image


def page_data(path):
    text = open(path, encoding="utf-8").read()
    match = re.search(
        r'<script type="application/json" id="data">(.*?)</script>', text, re.S
    )
    return json.loads(match.group(1))


def dequantised(layer):
    codes = np.frombuffer(base64.b64decode(layer["data"]), "uint8")
    scale = np.frombuffer(base64.b64decode(layer["scale"]), "<f4")
    codes = codes.reshape(layer["heads"], layer["rows"], layer["cols"])
    return codes / 255.0 * scale.reshape(layer["heads"], layer["rows"], 1)


# Data and errors (no browser) -----------------------------------------------


def test_sequence_page_holds_every_layer_and_head(tmp_path):
    model = token_model()
    path = explore(model, tokens_input(), tmp_path / "page.html", tokens=TOKENS)
    assert path == str(tmp_path / "page.html")
    data = page_data(path)
    assert data["kind"] == "sequence"
    assert [l["name"] for l in data["layers"]] == ["mha_0", "mha_1"]
    assert data["layers"][0]["queries"] == TOKENS
    from keras_attention.visualization import attention_maps

    expected = attention_maps(model, tokens_input())["mha_1"][0]
    # uint8 of each row over its maximum: within half a step of 1/255.
    np.testing.assert_allclose(
        dequantised(data["layers"][1]), expected, atol=expected.max() / 255
    )
    text = open(path, encoding="utf-8").read()
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert not re.search(r"(src|href)=\"(https?:)?//", text)


def test_text_classifier_page_labels_its_words(tmp_path):
    texts = ["a good film", "a bad film", "good acting", "bad plot"] * 20
    preprocessor = TextClassifierPreprocessor.from_texts(texts, 200, 12)
    model = TextClassifier(num_classes=2, preprocessor=preprocessor)
    data = page_data(explore(model, "a good film", tmp_path / "text.html"))
    layer = data["layers"][0]
    assert layer["keys"] == layer["queries"] == ["a", "good", "film"]
    assert layer["cols"] == 3  # padding cropped
    data = page_data(explore(model, ["good acting", "bad plot"], tmp_path / "t.html", index=1))
    assert data["layers"][0]["keys"] == ["bad", "plot"]


def test_translator_page_labels_source_and_output(tmp_path):
    from keras_attention.applications import TransformerTranslator

    keras.utils.set_random_seed(0)
    model = TransformerTranslator.from_preset("tiny")
    data = page_data(explore(model, "3 March 1998", tmp_path / "tr.html"))
    layers = {l["name"]: l for l in data["layers"]}
    source = list("3 march 1998")
    encoder = layers["encoder_block_0/self_attention"]
    assert encoder["queries"] == encoder["keys"] == source
    cross = next(l for l in data["layers"] if "cross" in l["name"])
    assert cross["keys"] == source
    decoder_self = next(
        l for l in data["layers"] if "decoder" in l["name"] and "self" in l["name"]
    )
    assert decoder_self["keys"][0] == "[START]"
    assert decoder_self["queries"] == cross["queries"]  # the tokens it writes
    assert decoder_self["keys"][1:] == cross["queries"][:-1]
    assert any("Translation of '3 March 1998'" in n for n in data["notes"])


def test_translator_page_labels_decoder_layers_when_lengths_are_equal(tmp_path):
    # Before: with source_length == target_length the decoder layers were
    # told apart by their shape, so their rows (and the decoder's own keys)
    # were labelled with the source and cut to its length.
    from keras_attention.applications import TransformerTranslator
    from keras_attention.applications import TranslationPreprocessor

    keras.utils.set_random_seed(0)
    model = TransformerTranslator(
        TranslationPreprocessor(source_length=16, target_length=16),
        num_layers=1, hidden_dim=16, num_heads=2, intermediate_dim=16,
    )
    data = page_data(explore(model, "3 March 1998", tmp_path / "tr.html"))
    layers = {l["name"]: l for l in data["layers"]}
    source = list("3 March 1998")
    encoder = layers["encoder_block_0/self_attention"]
    assert encoder["queries"] == encoder["keys"] == source
    cross = layers["decoder_block_0/cross_attention"]
    decoder_self = layers["decoder_block_0/self_attention"]
    assert cross["keys"] == source
    assert cross["queries"] != source[: len(cross["queries"])]
    assert decoder_self["queries"] == cross["queries"]  # the tokens it writes
    assert decoder_self["keys"][0] == "[START]"
    assert decoder_self["keys"][1:] == cross["queries"][:-1]


def test_large_model_page_stays_small(tmp_path):
    # 12 layers x 12 heads on 197 tokens, as ViT-B/16 at 224 pixels.
    model = token_model(num_layers=12, num_heads=12, length=197)
    path = explore(model, tokens_input(197), tmp_path / "big.html")
    size = os.path.getsize(path)
    assert size < 20e6, size
    data = page_data(path)
    assert len(data["layers"]) == 12 and data["layers"][0]["rows"] == 197
    assert not data["notes"]
    # Over max_tokens the tokens are cut, and the page says so.
    data = page_data(explore(model, tokens_input(197), tmp_path / "cut.html", max_tokens=50))
    assert data["layers"][0]["rows"] == 50
    assert any("first 50 of 197" in note for note in data["notes"])
    # Over max_megabytes, evenly spaced layers are kept, and the page says so.
    data = page_data(explore(model, tokens_input(197), tmp_path / "few.html", max_megabytes=3))
    assert [l["name"] for l in data["layers"]][0] == "mha_0"
    assert 1 < len(data["layers"]) < 12
    assert any("of the 12 attention layers are shown" in n for n in data["notes"])


def test_image_page_has_rollout_and_cams(tmp_path):
    data = page_data(explore(tiny_vit(), bar_image(), tmp_path / "vit.html"))
    assert data["kind"] == "image"
    assert data["layers"][0]["grid"] == [4, 4] and data["layers"][0]["classToken"]
    assert data["rollout"]["rows"] == 17
    assert [c["name"] for c in data["cams"]] == ["Grad-CAM", "Grad-CAM++", "Score-CAM"]
    assert data["image"]["width"] == 16


def tiny_swin(seed=0):
    keras.utils.set_random_seed(seed)
    return VisionTransformer(
        image_size=16, patch_size=2, num_classes=3, hidden_dim=8,
        depth=[2, 1], num_heads=2, mlp_dim=16, num_channels=1,
        attention="local_window", window_size=4,
    )


def test_swin_page_shows_its_window_attention_on_the_grid(tmp_path):
    from keras_attention.visualization import attention_maps
    from keras_attention.visualization import window_attention_on_grid

    model = tiny_swin()
    path = explore(model, bar_image(), tmp_path / "swin.html", cam_methods=())
    data = page_data(path)
    assert [l["grid"] for l in data["layers"]] == [[8, 8], [8, 8], [4, 4]]
    assert "rollout" not in data  # layers of different sizes
    assert any("outside its window" in note for note in data["notes"])
    shifted = attention_maps(model, bar_image())["backbone/block_0_1/attention"]
    expected = window_attention_on_grid(shifted, 8, 8, 4, 2)[0]
    np.testing.assert_allclose(
        dequantised(data["layers"][1]), expected, atol=expected.max() / 255
    )


def test_graph_page_keeps_the_nodes_nearest_node_0(tmp_path):
    graph = load_karate_club(seed=0)
    prepared = node_classification_data(graph)
    keras.utils.set_random_seed(0)
    model = GATNodeClassifier(
        num_features=prepared.inputs[0].shape[-1],
        num_classes=int(np.max(prepared.labels)) + 1,
    )
    data = page_data(explore(model, prepared.inputs, tmp_path / "g.html", max_nodes=10))
    edges = np.asarray(prepared.inputs[1][0])
    neighbours = set(edges[0][edges[1] == 0].tolist())
    kept = data["nodes"]["ids"]
    assert len(kept) == 10 and 0 in kept
    assert set(kept) - {0} <= neighbours  # node 0 has 16 neighbours
    assert any("10 nodes nearest node 0" in n for n in data["notes"])
    coefficients = np.frombuffer(base64.b64decode(data["layers"][0]["data"]), "<f4")
    assert len(coefficients) == len(data["edges"]["source"]) * data["layers"][0]["heads"]
    # Every node kept: the model's own coefficients, as float32 (they were
    # 256 steps of [0, 1]: a hub's, about 1/degree each, fell to 0).
    data = page_data(explore(model, prepared.inputs, tmp_path / "all.html", max_nodes=34))
    first = np.frombuffer(base64.b64decode(data["layers"][0]["data"]), "<f4")
    expected = np.asarray(model.attention_scores(prepared.inputs)[0], "float32")
    np.testing.assert_allclose(first.reshape(expected.shape), expected, rtol=1e-6)


def test_graph_page_of_layers_with_and_without_self_loops(tmp_path):
    # The self loops were read from the first layer alone: a second one
    # without them (or the other order) failed with an IndexError.
    nodes, edges = keras.Input((3,)), keras.Input((None,), dtype="int32")
    x = np.random.default_rng(0).random((6, 3)).astype("float32")
    e = np.array([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 5, 0, 0]], "int32")
    for loops in ((True, False), (False, True)):
        keras.utils.set_random_seed(0)
        h = ka_layers.GraphAttention(4, num_heads=2, add_self_loops=loops[0],
                                     name="first")([nodes, edges])
        h = ka_layers.GraphAttention(2, num_heads=1, add_self_loops=loops[1],
                                     name="second")([h, edges])
        model = keras.Model([nodes, edges], h)
        data = page_data(explore(model, [x, e], tmp_path / "g.html"))
        assert len(data["edges"]["source"]) == 7 + 6
        without = "second" if loops[0] else "first"
        for layer in data["layers"]:
            values = np.frombuffer(base64.b64decode(layer["data"]), "<f4")
            values = values.reshape(13, layer["heads"])
            if layer["name"] == without:
                assert not values[7:].any()
        assert any(f"{without} adds no self loops" in n for n in data["notes"])


def test_image_page_of_a_one_output_classifier_and_of_chosen_layers(tmp_path):
    # One sigmoid output read as a softmax over one logit: "class 0 (p = 1)"
    # for every image. A rollout through the chosen layers said "all".
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16, 16, 1))
    x = keras.layers.Conv2D(4, 3, padding="same")(inputs)
    x = ka_layers.CBAM(reduction=2)(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))
    p = float(model(bar_image())[0, 0])
    data = page_data(explore(model, bar_image(), tmp_path / "b.html", cam_methods=()))
    assert data["predicted"] == ("class 1" if p >= 0.5 else "class 0")
    assert data["probability"] == pytest.approx(max(p, 1 - p), abs=1e-4)
    data = page_data(explore(tiny_vit(), bar_image(), tmp_path / "v.html",
                             layers=[1], cam_methods=()))
    assert data["rollout"]["through"] == "the 1 chosen layer"
    swin = VisionTransformer(
        image_size=16, patch_size=2, num_classes=3, hidden_dim=8, depth=[2],
        num_heads=2, mlp_dim=16, num_channels=1, attention="local_window",
        window_size=4,
    )
    data = page_data(explore(swin, bar_image(), tmp_path / "s.html", cam_methods=()))
    assert "rollout" not in data  # as attention_rollout: none through windows


def test_nan_weights_are_noted(tmp_path):
    image = np.full((1, 16, 16, 1), np.nan, "float32")
    data = page_data(explore(tiny_vit(), image, tmp_path / "n.html", cam_methods=()))
    assert any("NaN or infinite" in n for n in data["notes"])


def test_no_registry_layer_is_an_error(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="no attention layer of the registry"):
        explore(model, np.ones((1, 4)), tmp_path / "x.html")
    assert not os.listdir(tmp_path)


def test_wrong_input_shape_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"cannot be called on inputs of shape \(1, 6, 5\)") as info:
        explore(token_model(), np.ones((1, 6, 5)), tmp_path / "x.html")
    assert len(str(info.value)) <= 800
    # Keras appends the call's arguments, whole input arrays: left out.
    from keras_attention.visualization._explorer_data import brief

    keras_error = ValueError("Input 0 is incompatible.\n\nArguments received by "
                             "Functional.call():\n  • inputs=" + "1.0 " * 2000)
    assert brief(keras_error) == "Input 0 is incompatible."
    assert len(brief(ValueError("x" * 5000))) < 700
    with pytest.raises(ValueError, match="expected images"):
        explore(tiny_vit(), np.ones((16, 16, 1)), tmp_path / "x.html", kind="image")
    # A graph's arrays as an image: ours, not NumPy's "setting an array
    # element with a sequence".
    with pytest.raises(ValueError, match=r"expected images.*\(4, 3\)"):
        explore(tiny_vit(), [np.ones((4, 3)), np.ones((2, 5))], tmp_path / "x.html",
                kind="image")
    assert not os.listdir(tmp_path)


def test_layer_and_index_out_of_range_are_errors(tmp_path):
    model = token_model()
    with pytest.raises(ValueError, match=r"`layers`, expected indices below 2.*layers=\[5\]"):
        explore(model, tokens_input(), tmp_path / "x.html", layers=[5])
    with pytest.raises(ValueError, match="`layers`.*layers='nope'"):
        explore(model, tokens_input(), tmp_path / "x.html", layers="nope")
    with pytest.raises(ValueError, match="`index`.*index=3"):
        explore(model, tokens_input(), tmp_path / "x.html", index=3)
    data = page_data(explore(model, tokens_input(), tmp_path / "one.html", layers=[-1]))
    assert [l["name"] for l in data["layers"]] == ["mha_1"]


def test_more_tokens_than_positions_is_an_error(tmp_path):
    # Before: the labels were dropped without a word (positions shown).
    model = token_model()
    with pytest.raises(ValueError, match=r"`tokens`, expected at most 6 labels.*7 labels"):
        explore(model, tokens_input(), tmp_path / "x.html", tokens=TOKENS + ["."])
    with pytest.raises(ValueError, match="`target_tokens`, expected at most 6"):
        explore(model, tokens_input(), tmp_path / "x.html", target_tokens=list("abcdefgh"))
    assert not (tmp_path / "x.html").exists()


def test_unwritable_path_is_an_error(tmp_path):
    model = token_model()
    with pytest.raises(ValueError, match="`path`.*existing folder"):
        explore(model, tokens_input(), tmp_path / "missing" / "x.html")
    with pytest.raises(ValueError, match="`path`.*not a folder"):
        explore(model, tokens_input(), tmp_path)
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        with pytest.raises(ValueError, match="`path`.*writable"):
            explore(model, tokens_input(), locked / "x.html")


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken_replace(source, target):
        raise OSError("disk full")

    monkeypatch.setattr(explorer_lib.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        explore(token_model(), tokens_input(), tmp_path / "x.html")
    assert not os.listdir(tmp_path)


def test_existing_page_is_replaced_whole(tmp_path):
    path = tmp_path / "x.html"
    path.write_text("old")
    explore(token_model(), tokens_input(), path)
    assert page_data(path)["kind"] == "sequence"
    assert os.listdir(tmp_path) == ["x.html"]


# In the browser ----------------------------------------------------------------


def _find_browser():
    try:
        from selenium import webdriver  # noqa: F401
    except ImportError:
        return None, "selenium is not installed (pip install selenium)"
    for binary in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(binary)
        if found:
            break
    else:
        return None, "no Chromium found (apt-get install chromium chromium-driver)"
    driver = shutil.which("chromedriver")
    if driver is None:
        return None, "no chromedriver found (apt-get install chromium-driver)"
    return (found, driver), None


@pytest.fixture(scope="module")
def browser():
    from_path, reason = _find_browser()
    if from_path is None:
        pytest.skip(f"browser tests need headless Chromium: {reason}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = from_path
    profile = tempfile.mkdtemp(prefix="explorer-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync",
        "--window-size=1300,1000", f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability(
        "goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"}
    )
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def open_page(browser, path):
    browser.get_log("browser")  # drop what earlier pages logged
    browser.get_log("performance")
    url = "file://" + os.path.abspath(path)
    browser.get(url)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    requests = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            params = message["params"]
            # The browser's own pages (chrome://resources of a new tab)
            # show up in the same log: count what our page asked for.
            if params.get("documentURL", url) == url:
                requests.append(params["request"]["url"])
    outside = [
        u for u in requests
        if u != url and not u.startswith(("data:", "chrome:", "devtools:"))
    ]
    assert not outside, outside
    return browser


def no_console_errors(browser):
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def drawing(browser, selector):
    """What a canvas shows (as a data URL), or an SVG's markup."""
    return browser.execute_script(
        "const n = document.querySelector(arguments[0]);"
        "return n.toDataURL ? n.toDataURL() : n.outerHTML;",
        selector,
    )


def choose(browser, select_id, value):
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("id", select_id)).select_by_value(value)


def hover(browser, element, x=None, y=None):
    from selenium.webdriver.common.action_chains import ActionChains

    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    chain = ActionChains(browser)
    if x is None:
        chain.move_to_element(element)
    else:
        chain.move_to_element_with_offset(element, x, y)
    chain.perform()


def assert_not_blank(browser, name):
    from PIL import Image

    png = browser.get_screenshot_as_png()
    folder = os.environ.get("EXPLORER_SCREENSHOTS")
    if folder:  # to look at the pages: EXPLORER_SCREENSHOTS=dir pytest ...
        with open(os.path.join(folder, f"{name}.png"), "wb") as f:
            f.write(png)
    picture = Image.open(io.BytesIO(png)).convert("RGB")
    pixels = np.asarray(picture).reshape(-1, 3).astype(int)
    colours = len(np.unique(pixels[::7], axis=0))
    # Text and frames are grey; the drawings are in colour.
    coloured = ((pixels.max(-1) - pixels.min(-1)) > 40).mean()
    assert colours > 100 and coloured > 0.01, (colours, coloured)


def test_sequence_page_in_browser(browser, tmp_path):
    path = explore(token_model(), tokens_input(), tmp_path / "seq.html", tokens=TOKENS)
    open_page(browser, path)
    assert_not_blank(browser, "sequence")
    assert browser.title == "Attention of encoder"
    assert len(browser.find_elements("css selector", "#model canvas")) == 8
    lines, heat = drawing(browser, "#lines"), drawing(browser, "#heatmap")
    choose(browser, "layer", "0")
    assert drawing(browser, "#lines") != lines
    assert drawing(browser, "#heatmap") != heat
    lines, heat = drawing(browser, "#lines"), drawing(browser, "#heatmap")
    choose(browser, "head", "2")
    assert drawing(browser, "#lines") != lines
    assert drawing(browser, "#heatmap") != heat
    # Hovering a query token keeps only its lines and colours the keys.
    lines = drawing(browser, "#lines")
    token = browser.find_elements("css selector", "#queries .token")[1]
    hover(browser, token)
    assert "active" in token.get_attribute("class")
    assert drawing(browser, "#lines") != lines
    shaded = browser.execute_script(
        "return [...document.querySelectorAll('#keys .token')]"
        ".filter((n) => n.style.background !== '').length"
    )
    assert shaded == len(TOKENS)
    # A click in the model view selects that layer and head.
    browser.find_elements("css selector", "#model canvas")[5].click()
    assert browser.find_element("id", "layer").get_attribute("value") == "1"
    assert browser.find_element("id", "head").get_attribute("value") == "1"
    no_console_errors(browser)


def test_control_characters_in_tokens_are_visible_in_browser(browser, tmp_path):
    # Before: a newline token (a causal LM's line end) was drawn as an
    # empty row: only spaces were made visible.
    tokens = ["1", "\n", "\t", "März 日本"]
    path = explore(token_model(length=4), tokens_input(4), tmp_path / "ctl.html", tokens=tokens)
    open_page(browser, path)
    shown = browser.execute_script(
        "return [...document.querySelectorAll('#queries .token')].map((n) => n.textContent)"
    )
    assert shown == ["1", "\u240a", "\u2409", "M\u00e4rz\u2423\u65e5\u672c"]
    no_console_errors(browser)


def test_html_in_tokens_and_title_is_text_in_browser(browser, tmp_path):
    # "<!--" in a token or the title was written as "<\\!--", no JSON
    # escape: JSON.parse failed and the page stayed blank. A title holding
    # "__SCRIPT__" got the whole script pasted into it.
    tokens = ["<b>", "a&b", "\"q'", "</script>", "<!--", "-->"]
    title = "x <!-- y __SCRIPT__"
    path = explore(token_model(), tokens_input(), tmp_path / "html.html",
                   tokens=tokens, title=title)
    text = open(path, encoding="utf-8").read()
    assert "<!--" not in text.split('id="data">', 1)[1].split("</script>", 1)[0]
    assert page_data(path)["title"] == title
    open_page(browser, path)
    assert browser.title == title
    shown = browser.execute_script(
        "return [...document.querySelectorAll('#queries .token')].map((n) => n.textContent)"
    )
    assert shown == tokens
    no_console_errors(browser)


def test_image_page_in_browser(browser, tmp_path):
    path = explore(tiny_vit(), bar_image(), tmp_path / "vit.html")
    open_page(browser, path)
    assert_not_blank(browser, "image")
    assert len(browser.find_elements("css selector", "#cams canvas")) == 4
    main = browser.find_element("id", "main")
    before = drawing(browser, "#main")
    hover(browser, main, -main.size["width"] // 3, -main.size["height"] // 3)
    first_patch = drawing(browser, "#main")
    assert first_patch != before
    assert "patch (0, 0)" in browser.find_element("id", "querytext").text
    hover(browser, main, main.size["width"] // 3, main.size["height"] // 3)
    assert drawing(browser, "#main") != first_patch
    assert "patch (3, 3)" in browser.find_element("id", "querytext").text
    shown = drawing(browser, "#main")
    choose(browser, "head", "1")
    assert drawing(browser, "#main") != shown
    shown = drawing(browser, "#main")
    choose(browser, "layer", "0")
    assert drawing(browser, "#main") != shown
    no_console_errors(browser)


def test_swin_page_in_browser(browser, tmp_path):
    path = explore(tiny_swin(), bar_image(), tmp_path / "swin.html", cam_methods=())
    open_page(browser, path)
    assert_not_blank(browser, "image")
    # Opened on the 4 x 4 stage, the query was set on the first layer's
    # 8 x 8 grid: "patch (9, 0)", a patch that does not exist, and row 15
    # drawn. Now the centre of the image on each layer's own grid.
    assert "patch (2, 2)" in browser.find_element("id", "querytext").text
    main = browser.find_element("id", "main")
    near = int(main.size["width"] * 0.45)  # from the centre to a corner patch
    for layer, last in (("1", 7), ("2", 3)):  # shifted 8 x 8; the 4 x 4 stage
        choose(browser, "layer", layer)
        hover(browser, main, -near, -near)
        corner = drawing(browser, "#main")
        assert "patch (0, 0)" in browser.find_element("id", "querytext").text
        hover(browser, main, near, near)
        assert drawing(browser, "#main") != corner
        assert f"patch ({last}, {last})" in browser.find_element("id", "querytext").text
    # The same point of the image on the other grid: the 8 x 8 stage's
    # bottom-right patch, not the 4 x 4 one's flat index 15 read there.
    choose(browser, "layer", "1")
    assert "patch (7, 7)" in browser.find_element("id", "querytext").text
    no_console_errors(browser)
    browser.save_screenshot(str(tmp_path / "swin.png"))


def test_detection_page_in_browser(browser, tmp_path):
    keras.utils.set_random_seed(0)
    data = make_detection_set(2, image_size=32, max_objects=2, seed=0)
    model = DETR(num_classes=10, num_queries=4, hidden_dim=32, backbone_filters=(16, 32))
    path = explore(model, data.images[:1], tmp_path / "detr.html", score_threshold=0.0)
    open_page(browser, path)
    assert_not_blank(browser, "detection")
    items = browser.find_elements("css selector", "#objects li")
    assert len(items) == 4
    assert len(browser.find_elements("css selector", "#each canvas")) == 4
    plain = drawing(browser, "#main")
    # Hovering a box on the picture shows its query's attention.
    box = page_data(path)["objects"][0]["box"]
    main = browser.find_element("id", "main")
    scale = main.size["width"] / 32
    centre = [(box[0] + box[2]) / 2 * scale, (box[1] + box[3]) / 2 * scale]
    hover(browser, main, centre[0] - main.size["width"] / 2, centre[1] - main.size["height"] / 2)
    assert browser.find_elements("css selector", "#objects li.active")
    with_attention = drawing(browser, "#main")
    assert with_attention != plain
    choose(browser, "head", "0")
    hover(browser, browser.find_elements("css selector", "#objects li")[0])
    assert drawing(browser, "#main") != with_attention
    # The threshold slider hides boxes.
    browser.execute_script(
        "const s = document.getElementById('threshold'); s.value = '1';"
        "s.dispatchEvent(new Event('input'));"
    )
    assert not browser.find_elements("css selector", "#each canvas")
    no_console_errors(browser)


def test_graph_page_in_browser(browser, tmp_path):
    graph = load_karate_club(seed=0)
    prepared = node_classification_data(graph)
    keras.utils.set_random_seed(0)
    model = GATNodeClassifier(
        num_features=prepared.inputs[0].shape[-1],
        num_classes=int(np.max(prepared.labels)) + 1,
    )
    path = explore(
        model, prepared.inputs, tmp_path / "gat.html",
        node_labels=np.asarray(graph.labels),
    )
    open_page(browser, path)
    assert_not_blank(browser, "graph")
    assert len(browser.find_elements("css selector", "#graph circle")) == 34
    edges = drawing(browser, "#graph")
    choose(browser, "head", "3")
    assert drawing(browser, "#graph") != edges
    edges = drawing(browser, "#graph")
    choose(browser, "layer", "1")
    assert drawing(browser, "#graph") != edges
    choose(browser, "layer", "0")
    node = browser.find_element("css selector", "#graph circle[data-node='0']")
    hover(browser, node)
    dimmed = browser.execute_script(
        "return [...document.querySelectorAll('#graph circle')]"
        ".filter((c) => c.getAttribute('opacity') === '0.25').length"
    )
    degree = int((np.asarray(prepared.inputs[1][0])[1] == 0).sum())
    assert dimmed == 34 - 1 - degree
    rows = browser.find_elements("css selector", "#neighbours tr")
    assert len(rows) == min(25, degree + 1)  # its neighbours and itself
    no_console_errors(browser)


# The command and the demo's report ------------------------------------------------


def test_explore_command(tmp_path, capsys):
    from keras_attention import cli

    model_path, input_path = tmp_path / "model.keras", tmp_path / "x.npy"
    token_model().save(model_path)
    np.save(input_path, tokens_input())
    page = tmp_path / "page.html"
    code = cli.main(
        ["explore", str(model_path), str(input_path), "--out", str(page),
         "--layers", "1", "--tokens", " ".join(TOKENS)]
    )
    assert code == cli.EXIT_OK, capsys.readouterr().err
    data = page_data(page)
    assert [l["name"] for l in data["layers"]] == ["mha_1"]
    assert data["layers"][0]["keys"] == TOKENS
    capsys.readouterr()
    assert cli.main(["explore", str(tmp_path / "no.keras"), str(input_path)]) == cli.EXIT_USAGE
    assert "MODEL: no such file" in capsys.readouterr().err
    assert cli.main(["explore", str(model_path), "some words"]) == cli.EXIT_USAGE
    assert "no text preprocessor" in capsys.readouterr().err
    np.save(input_path, np.ones((1, 6, 3)))
    assert cli.main(["explore", str(model_path), str(input_path)]) == cli.EXIT_FAILED
    assert "cannot be called on inputs of shape (1, 6, 3)" in capsys.readouterr().err
    np.save(input_path, tokens_input())
    code = cli.main(
        ["explore", str(model_path), str(input_path), "--layers", "7",
         "--out", str(tmp_path / "other.html")]
    )
    assert code == cli.EXIT_USAGE
    assert "`--layers`" in capsys.readouterr().err
    assert not (tmp_path / "other.html").exists()


def test_explore_command_checks_out_before_loading_the_model(tmp_path, capsys, monkeypatch):
    # Before: the model was loaded first, then explore's `path` check failed
    # with exit 1 (naming `path`, not --out); a missing folder was an error
    # where `convert`, `run` and `demo` make it.
    from keras_attention import cli

    model_path, input_path = tmp_path / "model.keras", tmp_path / "x.npy"
    token_model().save(model_path)
    np.save(input_path, tokens_input())
    (tmp_path / "afile").write_text("in the way")
    loads = []
    load_model = keras.saving.load_model
    monkeypatch.setattr(
        keras.saving, "load_model", lambda *a, **k: loads.append(a) or load_model(*a, **k)
    )
    for out, message in ((tmp_path / "afile" / "x.html", "--out: cannot make the folder"),
                         (tmp_path, "--out: expected a file, not the folder")):
        code = cli.main(["explore", str(model_path), str(input_path), "--out", str(out)])
        assert code == cli.EXIT_USAGE
        assert message in capsys.readouterr().err
    assert loads == []
    page = tmp_path / "new" / "page.html"
    code = cli.main(["explore", str(model_path), str(input_path), "--out", str(page)])
    assert code == cli.EXIT_OK, capsys.readouterr().err
    assert page.is_file()


def test_explore_command_unreadable_files_are_usage_errors(tmp_path, capsys):
    from keras_attention import cli

    model_path, input_path = tmp_path / "model.keras", tmp_path / "x.npy"
    token_model().save(model_path)
    np.save(input_path, tokens_input())
    code = cli.main(
        ["explore", str(model_path), str(input_path), "--node-labels",
         str(tmp_path / "none.npy")]
    )
    assert code == cli.EXIT_USAGE
    assert "--node-labels: no such file" in capsys.readouterr().err
    (tmp_path / "bad.png").write_text("not an image")
    code = cli.main(["explore", str(model_path), str(tmp_path / "bad.png")])
    assert code == cli.EXIT_USAGE
    assert "INPUT: cannot read" in capsys.readouterr().err


def test_explore_command_reads_text_for_text_models(tmp_path, capsys):
    from keras_attention import cli

    texts = ["a good film", "a bad film", "good acting", "bad plot"] * 20
    preprocessor = TextClassifierPreprocessor.from_texts(texts, 200, 12)
    model = TextClassifier(num_classes=2, preprocessor=preprocessor)
    model(preprocessor(texts[:2]))
    model.save(tmp_path / "text.keras")
    page = tmp_path / "text.html"
    code = cli.main(["explore", str(tmp_path / "text.keras"), "a bad film", "--out", str(page)])
    assert code == cli.EXIT_OK, capsys.readouterr().err
    assert page_data(page)["layers"][0]["keys"] == ["a", "bad", "film"]


def test_report_html_holds_each_explorer(browser, tmp_path):
    from keras_attention import recipes
    from keras_attention import reports
    from keras_attention.visualization import plot_attention_heatmap

    picture = str(tmp_path / "map.png")
    plot_attention_heatmap(np.eye(3), path=picture)
    page = explore(token_model(), tokens_input(), tmp_path / "seq_explorer.html", tokens=TOKENS)
    results = [
        recipes.Result("translation", "transformer", {"bleu": 0.5}, [picture, page], 3.0, "dates")
    ]
    path = reports.write_report_html(results, str(tmp_path), 10.0, 20.0)
    text = open(path, encoding="utf-8").read()
    assert "data:image/png;base64," in text and "<iframe" in text
    open_page(browser, path)
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, 10).until(
        lambda b: b.execute_script(
            "const d = document.querySelector('iframe.explorer').contentDocument;"
            "return d && d.querySelectorAll('#model canvas').length === 8;"
        )
    )
    no_console_errors(browser)


def test_large_page_in_browser(browser, tmp_path):
    # 12 layers x 12 heads on 197 tokens: loads and redraws in seconds.
    import time

    model = token_model(num_layers=12, num_heads=12, length=197)
    path = explore(model, tokens_input(197), tmp_path / "big.html")
    start = time.time()
    open_page(browser, path)
    assert len(browser.find_elements("css selector", "#model canvas")) == 144
    lines = drawing(browser, "#lines")
    choose(browser, "layer", "0")
    hover(browser, browser.find_elements("css selector", "#queries .token")[3])
    assert drawing(browser, "#lines") != lines
    assert time.time() - start < 30
    no_console_errors(browser)


def test_explore_command_reads_an_image_file(tmp_path, capsys):
    from matplotlib.image import imsave

    from keras_attention import cli

    tiny_vit().save(tmp_path / "vit.keras")
    picture = np.zeros((40, 40))
    picture[10:30, 15:25] = 1.0
    imsave(tmp_path / "digit.png", picture, cmap="gray")
    page = tmp_path / "vit.html"
    code = cli.main(
        ["explore", str(tmp_path / "vit.keras"), str(tmp_path / "digit.png"), "--out", str(page)]
    )
    assert code == cli.EXIT_OK, capsys.readouterr().err
    data = page_data(page)
    assert data["kind"] == "image"
    assert (data["image"]["height"], data["image"]["width"]) == (16, 16)  # resized


def test_negative_weights_are_named_in_the_notes(tmp_path):
    # The non-local block's "dot" mode has weights below 0 (half of them
    # here): the page drew them as 0 without a word.
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 4))
    x = ka_layers.NonLocalBlock(mode="dot", name="nl")(inputs)
    model = keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))
    image = np.random.default_rng(0).standard_normal((1, 8, 8, 4)).astype("float32")
    path = explore(model, image, tmp_path / "nl.html", cam_methods=())
    notes = page_data(path)["notes"]
    assert any(note.startswith("nl: some weights are negative (down to -") for note in notes), notes
    plain = explore(token_model(), tokens_input(), tmp_path / "seq.html")
    assert not any("negative" in note for note in page_data(plain)["notes"])
