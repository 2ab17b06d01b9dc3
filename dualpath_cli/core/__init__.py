"""Pure scheduling, cost models and layouts shared by runtime/ and sim/.

No threads, sockets, files, clocks or unseeded randomness may be used in this package.
"""
