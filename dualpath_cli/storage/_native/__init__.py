"""The native block reader's C source (``reader.c``) and, where setup.py built it at install
time, its library (``_reader.<python ABI tag>.so``), loaded by
:mod:`dualpath_cli.storage.native` with ctypes (it is not a Python module)."""
