"""The flags every prediction script shares."""
import argparse

from . import paths


def analysis_parser(doc=None):
    """A parser with the cocodiff binary (positional) and --out (default bench/fidelity/results)."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0] if doc else None)
    p.add_argument("cocodiff", help="the cocodiff binary (build/apps/cocodiff)")
    p.add_argument("--out", default=paths.RESULTS, help="where the results tables go")
    return p
