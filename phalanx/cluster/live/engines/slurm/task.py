"""The batch script of one rank under ``--engine slurm`` (this file's text after a
``#!PYTHON -I`` line, then ``main(SPEC)``: ``slurm_executor.batch_script``).

Slurm runs it on the node it allocated; it:

1. blocks SIGTERM first thing (so a stop that comes during start-up waits for the rank to
   arm its checkpoint flag, as :class:`~phalanx.cluster.live.engines.base.RankProcess` does);
2. checks that Slurm gave the rank the devices the scheduler chose: ``SLURM_JOB_GPUS`` (the
   indices of the job's GRES on its node) must be the devices' numbers on their node, else
   the rank refuses to run (exit 3, its reason in the job's log);
3. sets ``CUDA_VISIBLE_DEVICES`` itself from those numbers (a cluster that confines a job
   to its devices renumbers them from 0: Slurm's numbering is kept there), and the node the
   rank records from ``SLURMD_NODENAME``, the node Slurm actually runs it on;
4. replaces itself with the rank's process (so Slurm's signals reach the rank itself).

It imports nothing but the standard library: no start-up cost before the block.
"""

import signal

if __name__ == "__main__":   # the batch script (an import, for a test, blocks nothing)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

import json  # noqa: E402, F401 - after the block, on purpose; json reads the spec
import os  # noqa: E402
import sys  # noqa: E402

MISPLACED = 3


def visible(expected: list[int], env: dict[str, str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a rank that expects devices ``expected`` (numbers on
    their node); raises ``RuntimeError`` when Slurm allocated others."""
    got = sorted(int(x) for x in env.get("SLURM_JOB_GPUS", "").split(",") if x.strip())
    if got != sorted(expected):
        raise RuntimeError(f"Slurm gave devices {got or 'none'} on node "
                           f"{env.get('SLURMD_NODENAME', '?')}, the scheduler chose {expected}")
    ours = ",".join(map(str, expected))
    slurm = env.get("CUDA_VISIBLE_DEVICES", ours)
    confined = slurm != env.get("SLURM_JOB_GPUS", "") and slurm.split(",") == [
        str(i) for i in range(len(expected))]
    return slurm if confined else ours


def main(spec: dict) -> None:
    env = dict(os.environ)
    try:
        cuda = visible(spec["local"], env)
    except RuntimeError as e:
        sys.stderr.write(f"phalanx: error: rank {spec['rank']} of {spec['job']}: {e}\n")
        sys.exit(MISPLACED)
    env.update(spec["env"])
    env.update(CUDA_VISIBLE_DEVICES=cuda, PHALANX_NODE=env.get("SLURMD_NODENAME", ""))
    os.chdir(spec["cwd"])
    if not spec["hold_term"]:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    argv = [spec["python"], *spec["argv"]]
    os.execve(argv[0], argv, env)

