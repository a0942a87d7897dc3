"""Joins the sources into one exposition: one family per name, each sample name in one family."""

from __future__ import annotations

from runtime.metrics_proxy.exposition import Encoder, Family, Layout, Template

__all__ = ["MergedTemplates", "merge_families"]


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


class MergedTemplates:
    """The sources' layouts merged (as ``merge_families``) and compiled, once per change.

    A scrape then only fills the compiled template with its values; the merge, the
    de-duplication and the encoding of names and labels run again only when a source's
    layout is a different object than in the previous scrape.
    """

    def __init__(self, encoder: Encoder) -> None:
        self._encoder = encoder
        self._layouts: tuple[Layout, ...] = ()
        self._templates: dict[bool, Template] = {}

    def template(self, layouts: tuple[Layout, ...], openmetrics: bool) -> Template:
        """The template for the sources' ``layouts`` in priority order; positions continue
        from one layout to the next, as the values of the sources are concatenated."""
        if len(layouts) != len(self._layouts) or any(
            a is not b for a, b in zip(layouts, self._layouts, strict=False)
        ):
            self._layouts, self._templates = layouts, {}
        template = self._templates.get(openmetrics)
        if template is None:
            sources, offset = [], 0
            for layout in layouts:
                sources.append(layout.shifted(offset))
                offset += sum(len(f.samples) for f in layout.families)
            merged, _ = merge_families(sources)
            template = self._encoder.compile(Layout(tuple(merged)), openmetrics)
            self._templates[openmetrics] = template
        return template
