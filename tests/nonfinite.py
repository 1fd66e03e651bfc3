"""The float32 bit patterns a NaN/inf check must refuse, as one parametrization for the
kernels that check gradient rows (``pyrsia.shared.scatter``, the embedding worker's ``all_finite``)."""

from __future__ import annotations

import pytest

NON_FINITE_FLOAT32_BITS = pytest.mark.parametrize(
    "bits",
    [0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFFFFFFF],
    ids=["+inf", "-inf", "nan", "signalling-nan", "negative-nan"],
)
"""Use as a decorator: the test takes ``bits`` and writes it over one value of a float32 array
(``array.view(np.uint32)[where] = bits``)."""
