"""The scheduling core compiled with mypyc: ``loader`` makes ``gpuquota.core`` load the compiled
build when it matches the sources (``python -m gpuquota.entrypoints.build_native`` makes it).
This package imports nothing: ``gpuquota/__init__.py`` installs the loader before anything
imports the core.
"""
