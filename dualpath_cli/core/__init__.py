"""Pure scheduling, cost models, layouts and reference-model facts shared by runtime/ and sim/.

No threads, sockets, files, clocks or unseeded randomness may be used in this package.
"""
