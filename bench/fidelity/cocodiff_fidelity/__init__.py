"""The fidelity scripts' shared code: where the repository's files are (paths), the measurement
files read back (readers), cocodiff's phantom runs (phantom), the results tables written
(report), torch imported on first use (lazy), and the multi-GPU measurement (multi/).

The scripts beside this folder (bench/fidelity/*.py) are thin programs over it: each parses its
flags in main() and runs nothing at import. Nothing here imports torch at import time, so every
module loads on a machine without it (tests/fidelity imports them all).
"""
