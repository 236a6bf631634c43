"""In-memory cache of lowered groups across graphs and configurations.

LTC already compiles a graph once per graph hash; this cache serves the same
group again when LTC hands it over anew (another graph containing it, a
return to an earlier configuration): key = (group graph text, input
signature, configuration key, guard values).
"""
from __future__ import annotations

import hashlib

import torch

from . import metrics

_entries: dict[tuple, list] = {}  # key -> LoweredGroups differing in guard values


def group_key(graph: torch._C.Graph, inputs: list[torch.Tensor], config_key: str) -> tuple:
    text = hashlib.sha256(str(graph).encode()).hexdigest()
    signature = tuple((tuple(t.shape), tuple(t.stride()), t.dtype, t.device.type) for t in inputs)
    return text, signature, config_key


def lookup(key: tuple, inputs: list[torch.Tensor]):
    for lowered in _entries.get(key, ()):
        if all(inputs[i].item() == v for i, v in lowered.guards):
            metrics.count_cache("hit")
            return lowered
    metrics.count_cache("miss")
    return None


def store(key: tuple, lowered) -> None:
    _entries.setdefault(key, []).append(lowered)
