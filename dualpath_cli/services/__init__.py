"""Services that drive the embedded runtime: the agentic runner and the bench main job.

Why a package: these use a started system (:mod:`dualpath_cli.cluster.system`) and the
runtime/ world below it, so they sit in the services layer; front-ends (``dualpath bench``,
``bench/runtime.py``) import them, and runtime/ never does.
"""
