"""The measurement files of configs/measurements/ read back as the fidelity scripts use them."""
import csv
import glob
import json
import os

from . import paths


def measured_files(pattern):
    """Sorted paths of configs/measurements/PATTERN (a glob: "h[12]00x*/breakdown_*.json")."""
    return sorted(glob.glob(os.path.join(paths.MEASUREMENTS, pattern)))


def machine_of(path):
    """The measurement folder (machine, lease) a file lies in: "h100x4-repeat"."""
    return os.path.basename(os.path.dirname(path))


def read_csv(path):
    """Every row of a CSV file as a dict."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_steps(machines="h[12]00x*"):
    """Every measured step of configs/measurements/MACHINES/steps_*.csv: {(machine, transport,
    gpus, resolution, strategy): [median_ms of each row]} (a step measured in several launches
    has a row from each)."""
    measured = {}
    for path in measured_files(os.path.join(machines, "steps_*.csv")):
        machine = machine_of(path)
        for r in read_csv(path):
            measured.setdefault((machine, r["transport"], int(r["gpus"]), int(r["resolution"]), r["strategy"]),
                                []).append(float(r["median_ms"]))
    return measured
