"""A tensor-parallel rank process's entry point: `python -m inference.parallel.rank_process`, started by rank 0
(`ranks.RankProcess`) with `rank_main`'s arguments pickled on its stdin. Being its own main module, it never
imports the script that built the engine (see ranks.py for why)."""

import pickle
import sys

from inference.parallel.ranks import rank_main

if __name__ == "__main__":
    rank_main(*pickle.load(sys.stdin.buffer))
