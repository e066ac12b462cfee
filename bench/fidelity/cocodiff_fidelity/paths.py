"""Where the repository's files are: its root (COCODIFF_ROOT, else two folders above
bench/fidelity), the measurements, the cluster presets and the results tables."""
import os

ROOT = os.environ.get("COCODIFF_ROOT") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
CONFIGS = os.path.join(ROOT, "configs")
MEASUREMENTS = os.path.join(CONFIGS, "measurements")
CLUSTERS = os.path.join(CONFIGS, "clusters")
QUICKSTART = os.path.join(CONFIGS, "quickstart.toml")
RESULTS = os.path.join(ROOT, "bench", "fidelity", "results")


def measurement(*parts):
    """A path under configs/measurements/ (machine folder, file)."""
    return os.path.join(MEASUREMENTS, *parts)


def cluster(preset):
    """configs/clusters/PRESET.toml."""
    return os.path.join(CLUSTERS, f"{preset}.toml")
