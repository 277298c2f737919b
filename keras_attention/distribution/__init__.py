"""Distribution helpers: layout maps for `keras.distribution` (JAX backend).

`layout_map(model, mesh)` shards the projections of every registry
attention layer of a model over the mesh's model axis (attention heads,
Megatron style: the input projections column-parallel, the output
row-parallel), in
the manner of keras-hub's `Backbone.get_layout_map`; with
`keras.distribution.ModelParallel(layout_map=..., batch_dim_name="data")`
the batch is split over the data axis. Tested on 8 virtual CPU devices
against one device (`tests/test_sharding.py`).
"""

from keras_attention.distribution.layout import layout_map
from keras_attention.distribution.layout import projection_kernels
from keras_attention.distribution.multi_worker import fit
from keras_attention.distribution.multi_worker import free_ports
from keras_attention.distribution.multi_worker import multi_worker_strategy
from keras_attention.distribution.multi_worker import tf_config
