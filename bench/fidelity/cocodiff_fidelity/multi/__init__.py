"""The multi-GPU measurement of measure_multi.py, by part: the rank's run and shared helpers
(runtime), timing (timing), collectives sweeps (collectives), the FLUX.1-dev model one rank
runs (flux), kernels (kernels), whole steps, breakdowns and profiles (steps), exchanges beside
other work (exchanges), the parts and their files (parts), and the flags (cli).

Importing any of them touches neither torch nor the process group: runtime.setup(args) does,
under torchrun. --cpu runs every part on gloo with a tiny model (tests/fidelity runs it when
torch is installed)."""
