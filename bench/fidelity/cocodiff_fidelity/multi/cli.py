"""measure_multi.py's flags."""
import argparse


def parser(doc=None):
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0] if doc else None)
    p.add_argument("out")
    p.add_argument("--transport", default="nvlink", choices=["nvlink", "shm", "socket"])
    p.add_argument("--parts", default="collectives,kernels,host,interference,steps")
    p.add_argument("--worlds", default="")  # step/collective world sizes; default 1..world by 2x
    p.add_argument("--resolutions", default="1024,2048")
    p.add_argument("--strategies", default="flat,v_first,pipeline,cocodiff")
    p.add_argument("--max-bytes", type=int, default=1 << 30)
    p.add_argument("--ops", default="all_to_all,all_gather,reduce_scatter,sendrecv")
    p.add_argument("--steps", type=int, default=4)  # timed steps after 2 warm-ups
    p.add_argument("--deadline-s", type=float, default=540)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--unaligned", action="store_true")  # collectives: blocks of any whole element count
    # steps: a 1-GPU step exchanges as a multi-GPU one does, over a group of one rank (the exchanges'
    # host cost on one rank, no peer to wait for); its rows go to steps1x_<transport>.csv
    p.add_argument("--one-rank-exchange", action="store_true")
    # with --one-rank-exchange: each exchange a copy on the compute stream instead of NCCL (the
    # control: the same tensors and kernels, no collective); steps1c_<transport>.csv
    p.add_argument("--exchange-copy", action="store_true")
    return p


def parse(argv=None, doc=None):
    """The flags, checked against each other."""
    p = parser(doc)
    a = p.parse_args(argv)
    if a.exchange_copy and not a.one_rank_exchange:
        p.error("--exchange-copy replaces the exchanges of --one-rank-exchange steps: give both")
    return a
