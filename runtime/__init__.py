"""Everything that runs inside the serving image.

The container entrypoint, model packages and publishing, the metrics proxy, the
OpenAI-compatible frontend, and the Python side of the per-request decoding constraints
(whose hot path is the native engine in ``runtime.constraints._engine``). Nothing here
imports Pulumi: the image installs this package without the ``deploy`` extra.
"""
