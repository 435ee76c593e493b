"""Scraping a real `/metrics` endpoint in tests: the text Prometheus reads, parsed as it does."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from gantry.common.metrics import setup_metrics


def metrics_port() -> int:
    """The pytest process's one metrics endpoint (installed once; every in-process service of
    every test records into it, so tests compare scrapes before and after what they do)."""
    endpoint = setup_metrics("gantry-tests", address="127.0.0.1:0")
    assert endpoint is not None and endpoint.port is not None
    return endpoint.port


@dataclass(frozen=True)
class Scrape:
    """Every sample of one scrape: (sample name, sorted labels) -> value."""

    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples named `name` whose labels include `labels` (0 when none)."""
        wanted = set(labels.items())
        return sum(
            value
            for (sample, sample_labels), value in self.samples.items()
            if sample == name and wanted <= set(sample_labels)
        )

    def series(self, name: str) -> set[tuple[tuple[str, str], ...]]:
        return {labels for (sample, labels) in self.samples if sample == name}


def _scrape_blocking(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode("utf-8")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return Scrape(samples)


async def scrape(port: int) -> Scrape:
    """One scrape over HTTP, off the event loop (the services under test run on it)."""
    return await asyncio.to_thread(_scrape_blocking, port)
