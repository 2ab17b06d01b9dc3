"""The embedded runtime: real engines that compute with a real model and move real bytes.

Subpackages: :mod:`dualpath_cli.runtime.model` (the numpy reference transformer).
"""
