"""Joins the sources into one list of families: one family per name, each sample name in one
family, each series once, every series carrying the pod's labels."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

__all__ = ["Source", "merge_families"]

Source = tuple[Iterable[Metric], bool]
"""A source's families, and whether each of its families holds every series at most once."""


def merge_families(
    sources: Sequence[Source], constant_labels: tuple[tuple[str, str], ...]
) -> tuple[list[Metric], list[int]]:
    """Merge ``sources`` in priority order and label every sample with ``constant_labels``.

    A family name present in an earlier source hides it in later ones: the proxy's own
    families come first, then vLLM's multiprocess files (all processes, all families), then
    Triton, whose bridge forwards only part of vLLM's. A sample name another family already
    uses is dropped too, and so is a series (name and labels) already written. The pod's
    labels win over a source's label of the same name, which is kept as ``exported_<name>``.
    Returns the families and, per source, how many of its families were hidden.
    """
    constant = dict(constant_labels)
    constant_names = constant.keys()
    owner: dict[str, str] = {}  # sample name -> family name
    names: set[str] = set()
    hidden: list[int] = []
    merged: list[Metric] = []
    for families, unique in sources:
        dropped = 0
        for fam in families:
            name = fam.name
            if name in names:
                dropped += 1
                continue
            clash = any(not constant_names.isdisjoint(s.labels) for s in fam.samples)
            # Series can repeat only where the source repeats them or an exported_ name it
            # carries meets a renamed one; only those families pay for the check.
            check = not unique or clash
            seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
            samples = []
            for s in fam.samples:
                sample_name = s.name
                if owner.setdefault(sample_name, name) != name:
                    continue
                labels = _exported(s.labels, constant) if clash else {**s.labels, **constant}
                if check:
                    key = (sample_name, frozenset(labels.items()))
                    if key in seen:
                        continue
                    seen.add(key)
                samples.append(Sample(sample_name, labels, s.value, s.timestamp, s.exemplar))
            if samples or not fam.samples:
                names.add(name)
                out = Metric(name, fam.documentation, fam.type, fam.unit)
                out.samples = samples
                merged.append(out)
        hidden.append(dropped)
    return merged, hidden


def _exported(labels: dict[str, str], constant: dict[str, str]) -> dict[str, str]:
    """``labels`` under the pod's, each clashing one kept as ``exported_<name>`` (or
    ``exported_exported_<name>``...), as Prometheus keeps a scraped label a target label
    overwrites: series that only it told apart would otherwise become one."""
    out = {**labels, **constant}
    for name in constant:
        value = labels.get(name)
        if value:  # an empty label is no label
            exported = f"exported_{name}"
            while out.get(exported):
                exported = f"exported_{exported}"
            out[exported] = value
    return out
