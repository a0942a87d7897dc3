"""The Pulumi stack program and its per-region configuration.

``__main__.py`` reads one stack's configuration into a typed model and composes the
components; ``Pulumi.<env>-<region>.yaml`` files hold each region stack's settings.
"""
