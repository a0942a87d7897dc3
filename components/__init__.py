"""Pulumi ``ComponentResource``s of the platform, one concept per module.

Each module holds one component and its frozen ``*Args`` dataclass: GPU node groups, the FSx
for Lustre model cache, model services, cluster add-ons, rollouts, and the region platform
that composes them. Components never call a provider at import time.
"""
