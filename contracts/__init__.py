"""Names and facts that cross layers: labels, annotations and variables (:mod:`.labels`), DNS
naming (:mod:`.naming`), the serving pods' request deadline (:mod:`.deadlines`), the
Triton/vLLM matrix reader (:mod:`.compat`) and the shared PromQL (:mod:`.promql`).

It imports nothing of this project, and (except :mod:`.promql`, which reads YAML) only the
standard library, so the policy pack's own virtualenv can import it too.
"""
