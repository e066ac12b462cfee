#!/usr/bin/env python3
"""The fidelity scripts (bench/fidelity/) without a GPU: every module imports without doing
anything, and the results tables regenerate byte for byte from the shipped measurements.

Usage: fidelity_scripts_test.py [--cocodiff BUILD/apps/cocodiff] [unittest options]
Without --cocodiff the tables that need the emulator are skipped (each says so), and without torch
measure_multi.py's CPU run (MultiCpuSmokeTest).
"""
import argparse
import csv
import difflib
import glob
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BENCH = os.path.join(ROOT, "bench", "fidelity")
MODELS = os.path.join(BENCH, "models")
RESULTS = os.path.join(BENCH, "results")
COCODIFF = None  # set from --cocodiff

# Run in a fresh interpreter per module: imports MODULE with sys.argv holding no arguments and
# fails if the import parses flags, prints, writes or opens a file for writing, starts a process
# or imports torch.
GUARD = r"""
import builtins, io, os, subprocess, sys
module, paths = sys.argv[1], sys.argv[2:]
sys.path[:0] = paths
sys.argv = [module]
done = []
real_open = builtins.open
def guarded_open(file, mode="r", *a, **k):
    if any(c in mode for c in "wax+"):
        done.append(f"open({file!r}, {mode!r})")
    return real_open(file, mode, *a, **k)
def refused(name):
    def call(*a, **k):
        done.append(f"{name}{a[:1]}")
        raise RuntimeError(f"{name} at import")
    return call
builtins.open = guarded_open
subprocess.Popen = refused("subprocess.Popen")
os.system = refused("os.system")
os.makedirs = refused("os.makedirs")
out, err = io.StringIO(), io.StringIO()
sys.stdout, sys.stderr = out, err
try:
    m = __import__(module, fromlist=["*"])
except BaseException as ex:  # SystemExit from argparse included
    done.append(f"raised {ex!r}")
sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
if out.getvalue() or err.getvalue():
    done.append(f"printed {(out.getvalue() + err.getvalue())[:200]!r}")
if "torch" in sys.modules:
    done.append("imported torch")
if done:
    print("; ".join(done))
    sys.exit(1)
"""


def package_modules():
    """Every module of the cocodiff_fidelity package, dotted."""
    out = []
    for path in sorted(glob.glob(os.path.join(BENCH, "cocodiff_fidelity", "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, BENCH)[:-len(".py")].split(os.sep)
        if rel[-1] == "__init__":
            rel = rel[:-1]
        out.append(".".join(rel))
    return out


def scripts(folder):
    return sorted(os.path.basename(p)[:-len(".py")] for p in glob.glob(os.path.join(folder, "*.py")))


class ImportsTest(unittest.TestCase):
    """No module parses flags, prints, writes, starts a process or imports torch at import."""

    def check_imports(self, modules, paths):
        self.assertTrue(modules)
        for module in modules:
            with self.subTest(module=module):
                p = subprocess.run([sys.executable, "-c", GUARD, module, *paths],
                                   capture_output=True, text=True, cwd=ROOT)
                self.assertEqual(p.returncode, 0, f"importing {module}: {p.stdout}{p.stderr}")

    def test_package_modules(self):
        self.check_imports(package_modules(), [BENCH])

    def test_scripts(self):
        self.check_imports(scripts(BENCH), [BENCH])

    def test_model_scripts(self):
        self.check_imports(scripts(MODELS), [MODELS, BENCH])

    def test_guard_catches_work_at_import(self):
        """The guard itself: a module that parses its flags at import fails it."""
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "eager.py"), "w") as f:
                f.write("import argparse\np = argparse.ArgumentParser()\np.add_argument('x')\np.parse_args()\n")
            p = subprocess.run([sys.executable, "-c", GUARD, "eager", d], capture_output=True, text=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("SystemExit", p.stdout)

    def test_every_script_has_a_guarded_main(self):
        for folder in (BENCH, MODELS):
            for name in scripts(folder):
                if name == "bench_common":
                    continue  # the model scripts' shared helpers, not a program
                with self.subTest(script=name):
                    with open(os.path.join(folder, name + ".py")) as f:
                        text = f.read()
                    self.assertIn("\ndef main(", text)
                    self.assertIn('\nif __name__ == "__main__":\n    main()', text)


class NcclTestsTextTest(unittest.TestCase):
    """measure_multi's nccl-tests text agrees with its CSV: every shipped nccl_tests_*.txt row is
    nccl_row of the same CSV row (times within the CSV's 3 decimals' rounding)."""

    def test_rows(self):
        sys.path.insert(0, BENCH)
        from cocodiff_fidelity.multi.collectives import nccl_row
        checked = 0
        for path in sorted(glob.glob(os.path.join(ROOT, "configs/measurements/*/collectives_*.csv"))):
            tr = os.path.basename(path)[len("collectives_"):-len(".csv")]
            text = os.path.join(os.path.dirname(path), f"nccl_tests_{tr}.txt")
            if not os.path.exists(text):
                continue
            with open(path) as f:
                rows = list(csv.DictReader(f))
            with open(text) as f:
                shipped = [l for l in f.read().split("\n") if l and not l.startswith("#")]
            self.assertEqual(len(rows), len(shipped), text)
            for r, line in zip(rows, shipped):
                w = int(r["ranks"])
                busf = 1.0 if r["op"] == "sendrecv" else (w - 1) / w
                mine = nccl_row(int(r["bytes"]), r["op"], float(r["time_us"]), busf).split()
                theirs = line.split()
                self.assertEqual(mine[:5], theirs[:5], line)  # size, count, type, redop, root
                self.assertEqual(mine[8:], theirs[8:], line)
                for a, b in zip(mine[5:8], theirs[5:8]):  # time, algbw, busbw
                    self.assertLessEqual(abs(float(a) - float(b)), 0.011 + 1e-4 * float(b), line)
                checked += 1
        self.assertGreater(checked, 1000)


def run_script(script, args, out):
    """Runs bench/fidelity/SCRIPT with ARGS, its results into OUT; fails on a non-zero exit."""
    p = subprocess.run([sys.executable, os.path.join(BENCH, script), *args, "--out", out],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} exited {p.returncode}:\n{p.stderr[-3000:]}")


class TablesTestCase(unittest.TestCase):
    """Results tables regenerated from configs/measurements/ are the shipped ones, byte for byte."""

    def assert_same_files(self, out, names, shipped_dir=RESULTS):
        for name in names:
            with self.subTest(table=name):
                with open(os.path.join(out, name), "rb") as f:
                    mine = f.read()
                with open(os.path.join(shipped_dir, name), "rb") as f:
                    shipped = f.read()
                if mine != shipped:
                    diff = difflib.unified_diff(shipped.decode(errors="replace").splitlines(),
                                                mine.decode(errors="replace").splitlines(),
                                                "shipped", "regenerated", n=0, lineterm="")
                    self.fail(f"{name} differs from the shipped table:\n" + "\n".join(list(diff)[:12]))


class TablesTest(TablesTestCase):
    """The tables made without the emulator."""

    def test_host_counts(self):
        with tempfile.TemporaryDirectory() as out:
            ref = os.path.join(out, "reference_host.csv")
            run_script(os.path.join("models", "host_counts.py"), ["--reference", ref], out)
            self.assert_same_files(out, ["host_counts.txt", "host_counts.json"])
            self.assert_same_files(out, ["reference_host.csv"],
                                   os.path.join(ROOT, "configs", "measurements", "h200x1-hostprofile"))



# The tables that run the emulator and take seconds, each as its README command makes it:
# (script, arguments after COCODIFF, results' base name). host_fidelity.py (minutes) and
# fit_inductor.py (a fit of tens of seconds) are left to their commands.
EMULATOR_TABLES = [
    ("models_fidelity.py", [], "models_fidelity"),
    ("models_fidelity.py", ["--measured", "h200x1-video", "--name", "video_fidelity"], "video_fidelity"),
    ("models_fidelity.py", ["--preset", "hgx-h100", "--measured", "h100x1-models,h100x1-models3", "--name",
                            "models_fidelity_h100"], "models_fidelity_h100"),
    ("models_fidelity.py", ["--measured", "h200x1-graph", "--framework", "compiled", "--name", "graph_fidelity"],
     "graph_fidelity"),
    ("models_fidelity.py", ["--measured", "h200x1-compiled", "--framework", "inductor", "--name",
                            "inductor_fidelity"], "inductor_fidelity"),
    ("models_fidelity.py", ["--measured", "h200x1-compiled-graphs", "--framework", "inductor", "--set",
                            "cluster.device.host.inductor.launch_us=0", "--name", "inductor_graphs_fidelity"],
     "inductor_graphs_fidelity"),
    ("chunks_fidelity.py", [], "chunks_fidelity"),
    ("breakdown_fidelity.py", [], "breakdown_fidelity"),
    ("profile_fidelity.py", [], "profile_fidelity"),
    ("pace_fidelity.py", [], "pace_fidelity"),
    ("steps_fidelity.py", [], "steps_fidelity"),
]


class EmulatorTablesTest(TablesTestCase):
    """The tables that run the emulator (--cocodiff)."""

    def test_tables(self):
        if COCODIFF is None:
            self.skipTest("needs --cocodiff")
        only = os.environ.get("COCODIFF_FIDELITY_TABLE")  # one table (ctest runs each apart)
        if only is not None and only not in [name for _, _, name in EMULATOR_TABLES]:
            self.fail(f"COCODIFF_FIDELITY_TABLE={only}: no such table")
        for script, args, name in EMULATOR_TABLES:
            if only is not None and name != only:
                continue
            with self.subTest(table=name), tempfile.TemporaryDirectory() as out:
                run_script(script, [COCODIFF, *args], out)
                written = sorted(os.listdir(out))
                self.assertTrue(written and all(f.startswith(name + ".") for f in written), written)
                self.assert_same_files(out, written)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MultiCpuSmokeTest(unittest.TestCase):
    """measure_multi.py --cpu: every part on 2 ranks over gloo with a tiny model, started as
    torchrun starts them (one process per rank, the rendezvous in the environment). What each
    file holds is checked, not its times."""

    PARTS = ("collectives,kernels,host,interference,steps,breakdown,blocking,hostbeside,callforms,"
             "chunks,hostx,concurrency,profile,pace")
    FILES = {"blocking_socket.json", "breakdown_socket.json", "callforms_socket.json", "chunks.json",
             "collectives_socket.csv", "concurrency_socket.json", "env_socket.json", "hostbeside_socket.json",
             "hostx_socket.json", "interference_socket.json", "kernels.csv", "nccl_tests_socket.txt",
             "pace.json", "profile_socket.json", "steps_socket.csv", "steps_spans_socket.json"}

    def run_ranks(self, out, n=2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(n),
                   OMP_NUM_THREADS="1")
        cmd = [sys.executable, os.path.join(BENCH, "measure_multi.py"), out, "--cpu", "--transport", "socket",
               "--parts", self.PARTS, "--resolutions", "32", "--max-bytes", "8192", "--steps", "2",
               "--deadline-s", "600"]
        procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(n)]
        logs = [p.communicate(timeout=600)[0] for p in procs]
        for r, (p, log) in enumerate(zip(procs, logs)):
            self.assertEqual(p.returncode, 0, f"rank {r}:\n{log[-3000:]}")

    def test_every_part(self):
        if importlib.util.find_spec("torch") is None:
            self.skipTest("torch is not installed")
        with tempfile.TemporaryDirectory() as out:
            self.run_ranks(out)
            self.assertEqual(set(os.listdir(out)), self.FILES)
            with open(os.path.join(out, "steps_socket.csv")) as f:
                steps = [(r["strategy"], r["gpus"]) for r in csv.DictReader(f)]
            self.assertEqual(steps, [("flat", "1"), ("flat", "2"), ("v_first", "2"), ("pipeline", "2"),
                                     ("cocodiff", "2")])
            with open(os.path.join(out, "collectives_socket.csv")) as f:
                coll = list(csv.DictReader(f))
            self.assertEqual(len(coll), 4 * 4)  # four ops, 1-8 KiB by 2x
            self.assertTrue(all(float(r["time_us"]) > 0 and r["ranks"] == "2" for r in coll))
            with open(os.path.join(out, "nccl_tests_socket.txt")) as f:
                self.assertEqual(sum(1 for l in f if l.strip() and not l.startswith("#")), len(coll))
            with open(os.path.join(out, "kernels.csv")) as f:
                kernels = list(csv.DictReader(f))
            self.assertTrue(any(r["device_us"] for r in kernels) and any(r["host_us"] for r in kernels))
            with open(os.path.join(out, "breakdown_socket.json")) as f:
                self.assertEqual(list(json.load(f)["cases"]), ["2x32"])
            with open(os.path.join(out, "profile_socket.json")) as f:
                self.assertEqual(list(json.load(f)["cases"]),
                                 ["1x32xflat", "2x32xflat", "2x32xv_first", "2x32xpipeline", "2x32xcocodiff"])


def main():
    global COCODIFF
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--cocodiff")
    p.add_argument("--skip-code-without-torch", type=int,
                   help="exit with this code at once when torch is not installed (CTest's SKIP_RETURN_CODE)")
    a, rest = p.parse_known_args()
    if a.skip_code_without_torch is not None and importlib.util.find_spec("torch") is None:
        print("torch is not installed: skipped")
        sys.exit(a.skip_code_without_torch)
    COCODIFF = os.path.abspath(a.cocodiff) if a.cocodiff else None
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
