"""Run as a plain process (MPI's singleton world): a rank whose MPI call failed names a
rank on its host that died (reaped, or a zombie its launcher has not reaped yet), and
nothing for an error that is not MPI's or while every neighbour lives. Prints one JSON
line.

    python tests/mpi/check_cause.py
"""

import json
import subprocess
import sys

from mpi4py import MPI

from ddlstudy.backends.mpi import MpiEnvironment

env = MpiEnvironment(MPI.COMM_WORLD)
broken = MPI.Exception(MPI.ERR_OTHER)
alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
reaped = subprocess.Popen([sys.executable, "-c", "pass"])
reaped.wait()
zombie = subprocess.Popen([sys.executable, "-c", "pass"])
zombie_pid = zombie.pid
while True:  # ended, not reaped (Popen does not wait until asked)
    with open(f"/proc/{zombie_pid}/stat") as stat:
        if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
            break
result = {}
env.neighbours = {1: alive.pid, 2: reaped.pid}
result["reaped"] = env.cause(broken)
result["not MPI's"] = env.cause(ValueError("a bug of rank 0's own"))
env.neighbours = {1: alive.pid, 3: zombie_pid}
result["zombie"] = env.cause(broken)
env.neighbours = {1: alive.pid}
result["all alive"] = env.cause(broken)
alive.kill()
print(json.dumps(result | {"pids": [alive.pid, reaped.pid, zombie_pid]}))
