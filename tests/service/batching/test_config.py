"""The batching configuration (service/batching/config.py): its bounds and the manifest's overrides."""

from __future__ import annotations

import pytest

from service.batching.config import BatchingConfig

pytestmark = pytest.mark.anyio


def test_config_refuses_values_out_of_range_and_manifest_overrides_replace_only_what_they_name() -> None:
    config = BatchingConfig(8, 0.002, 256, 30.0)
    assert config.override(max_batch_size=2, max_queue_delay=None) == BatchingConfig(2, 0.002, 256, 30.0)
    for bad in ({"max_batch_size": 0}, {"queue_size": 0}, {"max_queue_delay": -1.0}, {"request_timeout": 0.0}):
        with pytest.raises(ValueError):
            config.override(**bad)
