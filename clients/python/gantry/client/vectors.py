"""An `EmbedResponse`'s vectors as one (n, dim) float32 NumPy array (pure).

The client asks for FLOAT32_LE_BYTES: each vector is its row's little-endian float32 bytes, so
the array is the rows joined and viewed, with no Python float per value. A server that answers
FLOAT_LIST anyway (an older one, or a proxy that rewrote the request) is read from its values.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gantry.v1 import inference_pb2

FLOAT32_LE = np.dtype("<f4")


class MalformedVectors(ValueError):
    """A response whose vectors disagree with its `dim`: never returned as an array."""


def vectors_of(response: inference_pb2.EmbedResponse) -> npt.NDArray[np.float32]:
    """The response's vectors, one row each, as a (len(vectors), dim) float32 array."""
    dim = response.dim
    rows = len(response.vectors)
    if response.encoding == inference_pb2.VECTOR_ENCODING_FLOAT32_LE_BYTES:
        block = b"".join(vector.float32_le for vector in response.vectors)
        if len(block) != rows * dim * FLOAT32_LE.itemsize:
            raise MalformedVectors(f"{len(block)} bytes for {rows} vectors of dim {dim}")
        values = np.frombuffer(block, dtype=FLOAT32_LE)
    else:
        if any(len(vector.values) != dim for vector in response.vectors):
            raise MalformedVectors(f"a vector whose length is not dim {dim}")
        values = np.fromiter(
            (value for vector in response.vectors for value in vector.values),
            dtype=np.float32,
            count=rows * dim,
        )
    # Native float32 (a copy only on a big-endian machine); writable, as a caller expects.
    return values.astype(np.float32).reshape(rows, dim)
