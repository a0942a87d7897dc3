"""The metrics proxy sidecar: one ``/metrics`` with Triton's series and vLLM's multiprocess ones.

Run it with ``python -m runtime.metrics_proxy``; ``docs/metrics-proxy.md`` describes it. Its
dashboard, alert rules and rollout-analysis PromQL live in ``contracts.promql``.
"""
