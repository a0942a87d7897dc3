"""The metrics proxy sidecar: one ``/metrics`` with Triton's series and vLLM's multiprocess ones.

Run it with ``python -m runtime.metrics_proxy``. Its dashboard, alert rules and rollout-analysis
PromQL live in ``runtime.metrics_proxy.assets``.
"""
