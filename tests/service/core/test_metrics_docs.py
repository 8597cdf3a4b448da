"""Every Prometheus series the server defines is in docs/operation.md's table (a fresh user found one missing)."""

from __future__ import annotations

from prometheus_client import Counter
from prometheus_client.metrics import MetricWrapperBase

from service.core import metrics
from tests.conftest import ROOT


def test_every_series_of_service_core_metrics_is_in_the_operation_table() -> None:
    table = {line.split("|")[1].strip().strip("`") for line in (ROOT / "docs" / "operation.md").read_text().splitlines()
             if line.startswith("| `patchserve_")}  # fmt: skip
    defined = {  # describe(): the family's name, a counter's without "_total"
        f"{m.describe()[0].name}_total" if isinstance(m, Counter) else m.describe()[0].name
        for m in vars(metrics).values()
        if isinstance(m, MetricWrapperBase)
    }
    assert len(defined) >= 13
    assert defined <= table, f"not in docs/operation.md: {sorted(defined - table)}"
