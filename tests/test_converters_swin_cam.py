"""Grad-CAM on a Swin converted from timm: a map of the image's size, not flat.

The Swin's last 4-D feature map is its last window attention's output, a
residual branch; Grad-CAM on it was negative everywhere (a constant map).
`find_cam_target` takes the block's output tokens, on its window grid.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the converters' tests need torch")
timm = pytest.importorskip("timm", reason="the converters' tests need timm")

from keras_attention.applications import VisionTransformer  # noqa: E402
from keras_attention.visualization import find_cam_target  # noqa: E402
from keras_attention.visualization import grad_cam  # noqa: E402


def _converted_swin():
    from timm.models import swin_transformer as timm_swin

    reference = timm_swin.SwinTransformer(
        img_size=32, patch_size=4, window_size=4, embed_dim=16, depths=(1, 1),
        num_heads=(2, 2), num_classes=5,
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.normal_(0.0, 0.2, generator=generator)
    return VisionTransformer.from_timm(reference.eval())


@pytest.mark.parametrize("method", ["gradcam", "gradcam++", "scorecam"])
def test_grad_cam_on_a_converted_swin(method):
    model = _converted_swin()
    images = np.random.RandomState(0).rand(2, 32, 32, 3).astype("float32")
    target = find_cam_target(model, images)
    assert target.path == "backbone/block_1_0" and target.grid_shape == (4, 4)
    maps = grad_cam(model, images, method=method)
    assert maps.shape == (2, 32, 32)
    assert np.all(np.isfinite(maps))
    for one in maps:
        assert one.std() > 0.05, "a constant map"
    small = grad_cam(model, images, method=method, expand=False)
    assert small.shape == (2, 4, 4)
