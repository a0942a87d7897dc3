"""Joins the sources into one exposition: one family per name, no series twice, pod labels."""

from __future__ import annotations

from runtime.metrics_proxy.exposition import Family, LabelSet, Sample

__all__ = ["merge_families"]


def _relabel(samples: list[Sample], constant: LabelSet, names: frozenset[str]) -> list[Sample]:
    if not constant:
        return samples
    out = []
    for s in samples:
        labels = s.labels
        if any(k in names for k, _ in labels):
            # The pod's identity wins over a source's label of the same name.
            labels = tuple(kv for kv in labels if kv[0] not in names)
        out.append(Sample(s.name, labels + constant, s.value))
    return out


def merge_families(
    sources: list[list[Family]], constant_labels: LabelSet
) -> tuple[list[Family], list[str]]:
    """Merge sources in priority order; return the families and the names dropped as duplicates.

    A family name present in an earlier source hides it in later ones: vLLM's multiprocess
    files (all processes, all families) come before Triton's bridge, which forwards only part
    of them. Any sample name or series that would still repeat is dropped.
    """
    names = frozenset(k for k, _ in constant_labels)
    owner: dict[str, str] = {}  # sample name -> family name
    seen: set[tuple[str, LabelSet]] = set()
    merged: dict[str, Family] = {}
    dropped: list[str] = []
    for families in sources:
        for fam in families:
            if fam.name in merged:
                dropped.append(fam.name)
                continue
            kept = []
            for s in _relabel(fam.samples, constant_labels, names):
                if owner.setdefault(s.name, fam.name) != fam.name:
                    continue
                key = (s.name, s.labels)
                if key not in seen:
                    seen.add(key)
                    kept.append(s)
            if kept or not fam.samples:
                merged[fam.name] = Family(fam.name, fam.type, fam.help, kept)
    return list(merged.values()), dropped
