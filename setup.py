"""Build hook for the one thing pyproject.toml cannot declare: the native block reader.

``dualpath_cli/storage/_native/reader.c`` is built as an *optional* extension: where no C
compiler (or libc headers) is available the build is skipped with a warning and ``pip
install`` still succeeds; dualpath then compiles the source at run time if it can, else
reads through the pure-Python path (dualpath_cli/storage/native.py says which, once, at
WARNING, and ``dualpath storage bench`` shows it). The library is plain C loaded with
ctypes: it needs no Python headers. All metadata lives in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dualpath_cli.storage._native._reader",
            sources=["dualpath_cli/storage/_native/reader.c"],
            extra_compile_args=["-O2", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
