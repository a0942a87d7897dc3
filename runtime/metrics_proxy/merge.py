"""Joins the sources into one exposition: one family per name, each sample name in one family.

The reference for the native ``_metrics.BodyWriter``, which applies the same rules as it writes.
"""

from __future__ import annotations

from runtime.metrics_proxy.exposition import Family

__all__ = ["merge_families"]


def merge_families(sources: list[list[Family]]) -> tuple[list[Family], list[str]]:
    """Merge sources in priority order; return the families and the names dropped as duplicates.

    A family name present in an earlier source hides it in later ones: vLLM's multiprocess
    files (all processes, all families) come before Triton's bridge, which forwards only part
    of them. A sample name another family already uses is dropped too; repeated series are
    dropped when encoding (``Encoder``), after the pod's labels are applied.
    """
    owner: dict[str, str] = {}  # sample name -> family name
    merged: dict[str, Family] = {}
    dropped: list[str] = []
    for families in sources:
        for fam in families:
            if fam.name in merged:
                dropped.append(fam.name)
                continue
            kept = [s for s in fam.samples if owner.setdefault(s.name, fam.name) == fam.name]
            if kept or not fam.samples:
                merged[fam.name] = Family(fam.name, fam.type, fam.help, kept)
    return list(merged.values()), dropped
