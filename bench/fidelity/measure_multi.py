#!/usr/bin/env python3
"""Multi-GPU ground truth for cocodiff's collective, host/device and step models.

Run under torchrun, one process per GPU (NCCL through torch.distributed):

    torchrun --standalone --nproc_per_node=4 bench/fidelity/measure_multi.py OUT \
        --transport nvlink --parts collectives,kernels,host,interference,steps

--transport picks NCCL's transport before the communicators exist: nvlink (NCCL's default, P2P
over NVLink/NVSwitch), shm (NCCL_P2P_DISABLE=1) or socket (NCCL_P2P_DISABLE=1
NCCL_SHM_DISABLE=1); the caller sets those variables, this script records them. Writes, into
OUT (rank 0 only):

  collectives_<transport>.csv   op,ranks,nodes,bytes,time_us,host_us,transport: nccl-tests'
                                sizes (all_to_all: bytes sent per rank; all_gather: bytes
                                received; reduce_scatter: bytes sent; sendrecv: bytes sent), time
                                per call of `iters` back-to-back calls between two CUDA events,
                                slowest rank; host_us the CPU time per call to issue them
  nccl_tests_<transport>.txt    the same sweeps printed in nccl-tests' format
  kernels.csv                   op,label,tokens,heads,k,n,flops,device_us,host_us: device time of
                                every kernel sequence a FLUX.1-dev block issues (replayed in a
                                CUDA graph, so the queue never drains) and the host time to issue
                                it in eager mode (CPU time per call, GPU kept ahead)
  interference_<transport>.json a GEMM, an attention and Q/K norm+RoPE with an NCCL all-to-all in
                                flight on another stream, each alone and together
  breakdown_<transport>.json    flat steps on 2 and more GPUs split into their blocking exchanges
                                (CUDA events around each, per rank) and the rest; how far the
                                ranks' work between two exchanges differs (segment_*)
  blocking_<transport>.json     an all-to-all between two compute kernels, waited for (as a step
                                issues it), against the same call back to back, by size
  hostbeside_<transport>.json   the host's time to issue small ops while an all-to-all (or, as
                                the control, a GEMM chain) runs on another stream, and idle
  callforms_<transport>.json    a step's image all-to-all between two GEMMs in four forms
                                (blocking or async+wait; fixed buffers or a fresh copy each call)
  chunks.json                   a rank's Q preparation whole and in head groups (chunk_prep)
  pace.json                     a 4,608-token block's kernels warm (as the tables), with the L2
                                cache flushed before each call, and replayed for seconds on end
  profile_<transport>.json      whole steps of every strategy with the GPU's kernels recorded
                                (torch.profiler): device time of compute and of NCCL's kernels
                                a step, slowest and fastest rank; rank 0's wall clock at the
                                profiler's start and after its stop, its teardown included (t0, t1)
  steps_<transport>.csv         whole FLUX.1-dev steps (random bf16 weights) of flat, v_first,
                                pipeline and cocodiff (V-First + pipelining) at each resolution,
                                on 1, 2 and 4 GPUs: median of timed steps, slowest rank
  steps_spans_<transport>.json  each of those cases' wall-clock span on rank 0 (Unix seconds,
                                warm-ups included), to line up with sampled GPU clocks
  hostx_<transport>.json        rank 0 alone: the host's cost of an exchange over a group of one
                                rank, part by part (the NCCL call async+wait, with its receive
                                buffer allocated, blocking), beside a RoPE and alone; CPU time of
                                the issuing thread and wall time per call, rounds and call by call
  env_<transport>.json          GPU, driver, CUDA, PyTorch, NCCL, host, transport, date

--cpu runs the same code on CPU with gloo and a tiny model (a test of the script, not a
measurement; tests/fidelity runs it where torch is installed).

The parts live in cocodiff_fidelity/multi/ (one module each for collectives, kernels, steps,
exchanges beside other work, the model and timing; parts.py names the files each writes).
"""
from cocodiff_fidelity.multi import cli, parts, runtime


def main(argv=None):
    runtime.setup(cli.parse(argv, __doc__))
    parts.run()


if __name__ == "__main__":
    main()
